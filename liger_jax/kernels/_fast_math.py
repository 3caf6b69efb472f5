"""Transcendentals at the GPU's approximate-instruction speed, exact under Triton's interpreter.

``tl.exp`` already lowers to ``ex2.approx``; ``tl.log`` lowers to libdevice's accurate ``logf`` (a polynomial of
~20 instructions), which makes the divergence kernels compute-bound. :func:`fast_log` is ``lg2.approx`` times ln 2
on the GPU (libdevice's ``fast_logf``): ``lg2.approx`` errs by at most 2^-22.6 (PTX ISA), ~1e-7 in the natural log,
beyond the result's fp32 rounding; subnormal inputs flush to zero, so callers floor their argument at the smallest
normal. The interpreter has no libdevice: there it is ``tl.log``, so the CPU tests see the exact function and the
GPU tests the approximation.
"""

import triton
import triton.language as tl
from triton.language.extra import libdevice

# Whether this process builds interpreter kernels: Triton decides it when a kernel is decorated, from the same knob.
INTERPRETED = tl.constexpr(bool(triton.knobs.runtime.interpret))


@triton.jit
def fast_log(x):
    """Natural log of fp32 ``x`` (normal, > 0): ``lg2.approx`` on the GPU, ``tl.log`` in the interpreter."""
    if INTERPRETED:
        return tl.log(x)
    else:
        return libdevice.fast_logf(x)
