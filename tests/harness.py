"""What every op test shares: the implementations under test, random inputs, tolerances, gradient checks."""

import jax
import jax.numpy as jnp
import numpy as np

from liger_jax import runtime

# The kernel implementation this machine runs: Triton's interpreter on CPU, the GPU kernels on a GPU.
KERNEL_IMPLEMENTATION = runtime.default_implementation() if runtime.default_implementation() != "xla" else "interpret"
# The XLA reference is an implementation too and runs the same suite.
IMPLEMENTATIONS = (KERNEL_IMPLEMENTATION, "xla")

DTYPES = (jnp.float32, jnp.bfloat16, jnp.float16)

# (atol, rtol) against a float64 oracle. fp32: accumulation over a few thousand terms stays well inside 1e-5.
# bf16 (eps 2^-7) and fp16 (eps 2^-10): about one eps, two roundings of an O(1) value.
TOLERANCES = {
    jnp.dtype(jnp.float32): (1e-5, 1e-5),
    jnp.dtype(jnp.bfloat16): (1e-2, 1e-2),
    jnp.dtype(jnp.float16): (1.5e-3, 1.5e-3),
}


def tolerance(dtype) -> dict[str, float]:
    """``atol``/``rtol`` keywords for comparing a ``dtype`` result with a float64 oracle."""
    atol, rtol = TOLERANCES[jnp.dtype(dtype)]
    return {"atol": atol, "rtol": rtol}


def least_precise(*dtypes):
    """The dtype with the largest machine epsilon: a result that passed through all of ``dtypes`` is this precise."""
    return max((jnp.dtype(d) for d in dtypes if d is not None), key=lambda d: jnp.finfo(d).eps)


def assert_close(actual, expected, dtype) -> None:
    """Asserts ``actual`` (any dtype) matches the float64 ``expected`` within ``dtype``'s tolerance."""
    np.testing.assert_allclose(
        np.asarray(actual, dtype=np.float64), np.asarray(expected, dtype=np.float64), **tolerance(dtype)
    )


def assert_close_trees(actual, expected, dtype) -> None:
    """:func:`assert_close` leaf by leaf over two pytrees of the same structure."""
    jax.tree.map(lambda a, e: assert_close(a, e, dtype), actual, expected)


def random_normal(seed: int, shape, dtype, scale: float = 1.0) -> jax.Array:
    """Standard-normal draws (times ``scale``) rounded to ``dtype``; every test draws its own seed."""
    return (scale * jax.random.normal(jax.random.key(seed), shape, jnp.float64)).astype(dtype)


def as_float64(*arrays):
    """The same values in float64, for the oracle."""
    return tuple(jnp.asarray(a, jnp.float64) for a in arrays)


def vjp_under_jit(fn, primals, cotangent):
    """``(out, grads)`` of ``fn`` at ``primals`` pulled back with ``cotangent``, all under ``jax.jit``."""

    @jax.jit
    def run(primals, cotangent):
        out, pullback = jax.vjp(fn, *primals)
        return out, pullback(cotangent)

    return run(tuple(primals), cotangent)
