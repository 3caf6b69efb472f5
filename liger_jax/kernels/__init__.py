"""``@triton.jit`` kernels, one file per op family. Nothing here imports jax.

Loop trip counts are ``tl.constexpr``: Triton's interpreter (the CPU path) turns runtime int arguments into
one-element arrays, which recent numpy refuses to use as a Python loop bound.
"""
