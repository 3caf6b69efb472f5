"""Sparsemax's own math: the projection's defining properties, the threshold τ, the Jacobian, ties, rows that take
the kernels' support iteration many steps, finite differences. Values and gradients against the float64 oracle,
axes, dtypes, tilings and the rest are in tests/test_activations.py."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

import liger_jax
from liger_jax.ops import _tiling
from tests import activation_oracles, harness


def _sparsemax(implementation):
    return lambda x: liger_jax.sparsemax(x, implementation=implementation)


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
def test_output_is_the_projection_onto_the_simplex(implementation):
    x = harness.random_normal(1, (8, 50), jnp.float32, scale=0.5)
    y = np.asarray(jax.jit(_sparsemax(implementation))(x), np.float64)
    x = np.asarray(x, np.float64)
    support = y > 0
    # Sparse, but not a one-hot: the support has several entries and leaves most out.
    assert (support.sum(axis=-1) > 1).all() and (support.sum(axis=-1) < 25).all()
    # On the simplex.
    assert (y >= 0).all()
    np.testing.assert_allclose(y.sum(axis=-1), 1.0, atol=1e-6)
    # The threshold: τ = (Σ_S x - 1) / |S| shifts the support (y = x - τ there) and bounds the rest (x ≤ τ).
    tau = ((x * support).sum(axis=-1, keepdims=True) - 1.0) / support.sum(axis=-1, keepdims=True)
    np.testing.assert_allclose(np.where(support, x - tau, 0.0), y, atol=1e-6)
    assert (np.where(support, -np.inf, x) <= tau + 1e-6).all()
    np.testing.assert_allclose(tau, activation_oracles.sparsemax_threshold(x), atol=1e-6)


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
def test_jacobian_projects_onto_the_support(implementation):
    # J = diag(s) - s sᵀ / |S|: jax.jacrev pulls back every basis cotangent through the custom_vjp.
    x = harness.random_normal(2, (11,), jnp.float32, scale=0.6)
    jacobian = np.asarray(jax.jit(jax.jacrev(_sparsemax(implementation)))(x), np.float64)
    expected = activation_oracles.sparsemax_jacobian(np.asarray(x, np.float64))
    assert 2 < np.trace(expected) < 11 - 2, "support of several entries, not all"
    np.testing.assert_allclose(jacobian, expected, atol=1e-6)


# Rows with tied entries, and their exact sparsemax.
TIES = {
    "three tied maxima": ([2.0, 2.0, 2.0, 0.0, -1.0, 0.5, 1.0], [1 / 3, 1 / 3, 1 / 3, 0, 0, 0, 0]),
    "all equal": ([0.25] * 7, [1 / 7] * 7),
    "tied at the edge of the support": ([1.0, 0.75, 0.75, 0.0, 0.0, -2.0, 0.1], [0.5, 0.25, 0.25, 0, 0, 0, 0]),
    # τ = 1: the second pair sits exactly on the threshold, outside the support.
    "two tied pairs": ([1.5, 1.5, 1.0, 1.0, -0.5, -0.5, 0.0], [0.5, 0.5, 0, 0, 0, 0, 0]),
}


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_ties_are_treated_alike(implementation, dtype):
    x = jnp.asarray([row for row, _ in TIES.values()], dtype)
    dy = harness.random_normal(3, x.shape, dtype)
    y, (dx,) = harness.vjp_under_jit(_sparsemax(implementation), (x,), dy)
    x64, dy64 = np.asarray(x, np.float64), np.asarray(dy, np.float64)
    for row, (_, exact) in enumerate(TIES.values()):
        harness.assert_close(y[row], exact, dtype)
        for value in np.unique(x64[row]):
            assert len(set(np.asarray(y[row])[x64[row] == value])) == 1, "tied entries get the same probability"
    harness.assert_close(dx, activation_oracles.sparsemax_pullback(x64, dy64), dtype)


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
def test_rows_whose_support_iteration_takes_several_steps(implementation):
    # Every entry starts within 1 of the max: the support iteration starts on all 200 entries and takes 4 to 6 steps
    # to shrink it to the solution's (20 to 132 entries); a random row of 4096 takes 2 to 7.
    ramp = 1.0 - np.geomspace(1e-3, 1.0, 200)
    x = jnp.asarray(np.stack([ramp, ramp[::-1], 0.1 * ramp, np.linspace(0.0, 0.999, 200)]), jnp.float32)
    dy = harness.random_normal(4, x.shape, jnp.float32)
    y, (dx,) = harness.vjp_under_jit(_sparsemax(implementation), (x,), dy)
    x64 = np.asarray(x, np.float64)
    harness.assert_close(y, activation_oracles.sparsemax(x64), jnp.float32)
    harness.assert_close(dx, activation_oracles.sparsemax_pullback(x64, np.asarray(dy, np.float64)), jnp.float32)


@pytest.mark.parametrize("tiling", [None, *harness.FORCED_TILINGS])
@pytest.mark.parametrize("shift", [-40.0, 40.0])
def test_shifting_a_row_leaves_its_sparsemax(tiling, shift):
    # y(x + c) = y(x): the threshold moves with the row. Far from 0 (τ* near ±40), a first τ that is not a lower bound
    # of the solution (a set's size or sum dropped or negated) gives another support.
    x = harness.random_normal(10, harness.FORCED_TILING_SHAPE, jnp.float32, scale=0.5)
    override = harness.FORCED_TILINGS[tiling] if tiling else _tiling.TilingOverride()
    with _tiling.overridden(override):
        shifted = jax.jit(_sparsemax(harness.KERNEL_IMPLEMENTATION))(x + shift)
    expected = activation_oracles.sparsemax(np.asarray(x, np.float64))
    np.testing.assert_allclose(np.asarray(shifted, np.float64), expected, atol=2e-5)  # fp32 ulp at 40: 3.8e-6


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
def test_finite_differences(implementation):
    # Steps far smaller than every entry's distance from τ, so no step crosses the support's edge.
    x = harness.random_normal(5, (4, 9), jnp.float32)
    if implementation == "xla":
        check_grads(jax.jit(_sparsemax("xla")), (jnp.asarray(x, jnp.float64),), order=1, modes=["rev"], eps=1e-6)
    else:
        check_grads(jax.jit(_sparsemax(implementation)), (x,), order=1, modes=["rev"], atol=2e-3, rtol=2e-3)


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
def test_masked_entries_at_minus_infinity_get_zero_and_leave_the_rest_a_sparsemax(implementation):
    # Masked logits: a -inf entry is outside every support, and the rest is the sparsemax of the finite entries.
    x = np.asarray(harness.random_normal(6, (3, 37), jnp.float32), np.float64)
    masked = np.zeros(x.shape, bool)
    masked[0, ::2], masked[1, 1:], masked[2, 30:] = True, True, True
    x_masked = jnp.asarray(np.where(masked, -np.inf, x), jnp.float32)
    dy = harness.random_normal(7, x.shape, jnp.float32)
    y, (dx,) = harness.vjp_under_jit(_sparsemax(implementation), (x_masked,), dy)
    for row in range(3):
        kept = ~masked[row]
        harness.assert_close(y[row][kept], activation_oracles.sparsemax(x[row][kept]), jnp.float32)
        pullback = activation_oracles.sparsemax_pullback(x[row][kept], np.asarray(dy, np.float64)[row][kept])
        harness.assert_close(dx[row][kept], pullback, jnp.float32)
    np.testing.assert_array_equal(np.asarray(y)[masked], 0.0)
    np.testing.assert_array_equal(np.asarray(dx)[masked], 0.0)


@pytest.mark.parametrize(
    ("shape", "block_rows"), [((111, 200), None), ((111, 200), 16), ((1, 7), None)], ids=["8_rows", "16_rows", "one"]
)
def test_programs_walking_row_tiles_with_the_next_one_prefetched(shape, block_rows):
    # Prefetching forced (the rule does not prefetch yet) on small tiles: 111 rows in 14 tiles of 8 (3 interpreter
    # programs walk 5 each: the last tile partial, one past the end) or in 7 of 16 (3 each), and a single row (its
    # program prefetches a tile past the end).
    x = harness.random_normal(8, shape, jnp.float32, scale=2.0)
    dy = harness.random_normal(9, shape, jnp.float32)
    with _tiling.overridden(_tiling.TilingOverride(prefetch=True, block_rows=block_rows)):
        y, (dx,) = harness.vjp_under_jit(_sparsemax(harness.KERNEL_IMPLEMENTATION), (x,), dy)
    x64 = np.asarray(x, np.float64)
    harness.assert_close(y, activation_oracles.sparsemax(x64), jnp.float32)
    harness.assert_close(dx, activation_oracles.sparsemax_pullback(x64, np.asarray(dy, np.float64)), jnp.float32)


def test_the_forward_walks_row_tiles_only_where_prefetching_is_forced():
    # Not yet timed on a GPU: the rule launches one tile a program; forced, resident programs of 32 warps in all per
    # multiprocessor walk the tiles (column blocks never prefetch).
    rule, forced = _tiling.row_tiling(32768, walks_tiles=True), _tiling.TilingOverride(prefetch=True)
    assert not rule.prefetch and rule.num_warps == 32
    for n_cols, warps in ((32768, 32), (16384, 16), (4096, 4)):
        tiling = _tiling.row_tiling(n_cols, walks_tiles=True, override=forced)
        assert tiling.prefetch and (tiling.num_warps, tiling.programs_per_sm) == (warps, 32 // warps)
    assert not _tiling.row_tiling(65536, walks_tiles=True, override=forced).prefetch
