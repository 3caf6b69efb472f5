"""What every op test shares: the implementations under test, random inputs, tolerances, gradient checks."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from liger_jax import runtime
from liger_jax.ops import _tiling

# The kernel implementation this machine runs: Triton's interpreter on CPU, the GPU kernels on a GPU.
KERNEL_IMPLEMENTATION = runtime.default_implementation() if runtime.default_implementation() != "xla" else "interpret"
# The XLA reference is an implementation too and runs the same suite.
IMPLEMENTATIONS = (KERNEL_IMPLEMENTATION, "xla")

DTYPES = (jnp.float32, jnp.bfloat16, jnp.float16)

# Row-kernel tilings the rule never picks at test sizes, forced with _tiling.overridden on FORCED_TILING_SHAPE:
# column blocks of 64 walked by one program a row (a 200-column row in 4 blocks, the last one partial; 111 rows make
# 4 row tiles of 32, so each of the interpreter's programs adds two of them into its partial sums, the last tile
# partial); blocks of 32 shared by 3 programs a row in the backward, sharing their row sums (7 blocks, 3 a split: the
# last split's block partial, then two past the row's end); and one tile per row without prefetching the next one.
FORCED_TILINGS = {
    "column_blocks": _tiling.TilingOverride(block_d=64, column_splits=1),
    "column_splits": _tiling.TilingOverride(block_d=32, column_splits=3),
    "no_prefetch": _tiling.TilingOverride(prefetch=False),
}
# The norms' backward (RMSNorm, fused add+RMSNorm, LayerNorm) also sums the next row tile's statistics ahead where it
# walks column blocks: with one program a row and with three splits, as above.
NORM_BACKWARD_TILINGS = FORCED_TILINGS | {
    "sums_ahead": _tiling.TilingOverride(block_d=64, column_splits=1, sums_ahead=True),
    "sums_ahead_splits": _tiling.TilingOverride(block_d=32, column_splits=3, sums_ahead=True),
}
FORCED_TILING_SHAPE = (111, 200)

# (x dtype, param dtype, module dtype) for Flax drop-in tests: flax promotes these three into the output dtype.
FLAX_DTYPE_CASES = [
    (jnp.float32, jnp.float32, None),
    (jnp.bfloat16, jnp.float32, None),
    (jnp.bfloat16, jnp.bfloat16, None),
    (jnp.float32, jnp.float32, jnp.bfloat16),
    (jnp.float16, jnp.float32, jnp.float16),
]

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
    """Standard-normal draws (times ``scale``) rounded to ``dtype``; every test draws its own seed.

    Drawn by numpy: ``jax.random`` compiles a program per shape (~0.3 s each on the 2-core CI machine).
    """
    draws = scale * np.random.default_rng(seed).standard_normal(shape)
    return jnp.asarray(draws, jnp.float64).astype(dtype)


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


def assert_vjp_matches_reference(op, reference, primals, cotangent, dtype) -> None:
    """Asserts ``op``'s outputs and gradients (under jit, pulled back with ``cotangent``) match ``reference``'s at
    the float64 copies of ``primals``, within ``dtype``'s tolerance, and that each gradient has its primal's dtype.
    """
    out, grads = vjp_under_jit(op, primals, cotangent)
    expected_out, pullback = jax.vjp(reference, *as_float64(*primals))
    expected_grads = pullback(jax.tree.map(lambda c: jnp.asarray(c, jnp.float64), cotangent))
    assert [g.dtype for g in grads] == [p.dtype for p in primals], "each gradient must have its primal's dtype"
    assert_close_trees(out, expected_out, dtype)
    assert_close_trees(grads, expected_grads, dtype)


def assert_vjp_matches_reference_over_sums(op, reference, primals, cotangent, dtype, terms: dict[int, int]) -> None:
    """:func:`assert_vjp_matches_reference` for ops whose weight gradients sum over many elements: the gradient of
    primal ``i`` in ``terms`` gets an absolute tolerance of ``atol · √terms[i]``, as an fp32 sum of n unit terms is
    off by about √n · eps (Triton's interpreter sums in order, like numpy along a non-contiguous axis)."""
    out, grads = vjp_under_jit(op, primals, cotangent)
    expected_out, pullback = jax.vjp(reference, *as_float64(*primals))
    expected_grads = pullback(jax.tree.map(lambda c: jnp.asarray(c, jnp.float64), cotangent))
    assert [g.dtype for g in grads] == [p.dtype for p in primals], "each gradient must have its primal's dtype"
    assert_close_trees(out, expected_out, dtype)
    atol, rtol = TOLERANCES[jnp.dtype(dtype)]
    for i, (got, want) in enumerate(zip(grads, expected_grads, strict=True)):
        scaled = atol * np.sqrt(terms.get(i, 1))
        np.testing.assert_allclose(np.asarray(got, np.float64), np.asarray(want, np.float64), atol=scaled, rtol=rtol)


def assert_checkpoint_gives_the_same_gradients(loss, primals) -> None:
    """Asserts ``jax.checkpoint(loss)`` (kernels re-run in the backward pass) has ``loss``'s gradients, up to
    XLA fusing the surrounding fp32 arithmetic differently."""
    argnums = tuple(range(len(primals)))
    plain = jax.jit(jax.grad(loss, argnums=argnums))(*primals)
    remat = jax.jit(jax.grad(jax.checkpoint(loss), argnums=argnums))(*primals)
    jax.tree.map(lambda r, p: np.testing.assert_allclose(r, p, atol=1e-6, rtol=1e-6), remat, plain)


def assert_bitwise_deterministic(fn, *args) -> None:
    """Asserts two runs of ``jax.jit(fn)`` give bitwise equal results (no atomics in the reductions)."""
    first, second = jax.jit(fn)(*args), jax.jit(fn)(*args)
    np.testing.assert_equal(jax.tree.map(np.asarray, second), jax.tree.map(np.asarray, first))


def assert_all_finite(*trees) -> None:
    """Asserts every element is finite: outputs start as NaN under the interpreter, so unwritten ones show."""
    for leaf in jax.tree.leaves(trees):
        assert np.isfinite(np.asarray(leaf, dtype=np.float64)).all()


def assert_call_raises(error, match: str, op, shapes, dtypes=jnp.float32, **kwargs) -> None:
    """Asserts ``op`` raises ``error`` matching ``match`` on ``jnp.ones`` operands of ``shapes`` (None passes None).

    ``dtypes`` is one dtype for every operand or one per operand; ``kwargs`` go to ``op``, with the kernel
    implementation unless they name another.
    """
    dtypes = dtypes if isinstance(dtypes, (tuple, list)) else (dtypes,) * len(shapes)
    operands = [None if shape is None else jnp.ones(shape, dtype) for shape, dtype in zip(shapes, dtypes, strict=True)]
    with pytest.raises(error, match=match):
        op(*operands, **({"implementation": KERNEL_IMPLEMENTATION} | kwargs))
