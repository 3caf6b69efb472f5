"""RMSNorm: every implementation against the float64 reference, values and gradients."""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

import liger_jax
from liger_jax.ops import _tiling
from tests import harness

# (rows..., D): a single row, D not a power of two, rows not a multiple of any block, 3-D, rank 1, wide rows.
SHAPES = [(1, 64), (37, 123), (3, 7, 96), (100,), (6, 1000)]
CASTING_MODES = ["llama", "gemma", "none"]


def _inputs(seed, shape, dtype, scale_dtype=None):
    x = harness.random_normal(seed, shape, dtype)
    scale = harness.random_normal(seed + 1, shape[-1:], scale_dtype or dtype)
    return x, scale


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", harness.DTYPES)
@pytest.mark.parametrize("casting_mode", CASTING_MODES)
@pytest.mark.parametrize("offset", [0.0, 1.0])
def test_forward_matches_float64_reference(implementation, shape, dtype, casting_mode, offset):
    x, scale = _inputs(len(shape) + 10 * int(offset), shape, dtype)
    y = jax.jit(
        lambda x, scale: liger_jax.rms_norm(
            x, scale, offset=offset, casting_mode=casting_mode, implementation=implementation
        )
    )(x, scale)
    expected = liger_jax.rms_norm_reference(
        *harness.as_float64(x, scale), offset=offset, casting_mode=casting_mode, rounding_dtype=dtype
    )
    chex.assert_shape(y, shape)
    chex.assert_type(y, dtype)
    harness.assert_close(y, expected, dtype)


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", harness.DTYPES)
@pytest.mark.parametrize("casting_mode", CASTING_MODES)
def test_gradients_match_float64_reference(implementation, shape, dtype, casting_mode):
    x, scale = _inputs(3 + len(shape), shape, dtype, scale_dtype=jnp.float32)
    cotangent = harness.random_normal(99, shape, dtype)
    offset = 1.0 if casting_mode == "gemma" else 0.0

    def op(x, scale):
        return liger_jax.rms_norm(x, scale, offset=offset, casting_mode=casting_mode, implementation=implementation)

    def reference(x, scale):
        return liger_jax.rms_norm_reference(x, scale, offset=offset, casting_mode=casting_mode, rounding_dtype=dtype)

    _, (dx, dscale) = harness.vjp_under_jit(op, (x, scale), cotangent)
    _, pullback = jax.vjp(reference, *harness.as_float64(x, scale))
    dx_ref, dscale_ref = pullback(jnp.asarray(cotangent, jnp.float64))
    chex.assert_type([dx, dscale], [dtype, jnp.float32])
    harness.assert_close(dx, dx_ref, dtype)
    harness.assert_close(dscale, dscale_ref, dtype)


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
def test_check_grads_fp32(implementation):
    x, scale = _inputs(5, (9, 48), jnp.float32)
    check_grads(
        lambda x, scale: liger_jax.rms_norm(x, scale, implementation=implementation),
        (x, scale),
        order=1,
        modes=["rev"],
    )


def test_backward_is_bitwise_deterministic():
    x, scale = _inputs(6, (67, 80), jnp.float32)
    grad = jax.jit(jax.grad(lambda x, s: liger_jax.rms_norm(x, s).sum(), argnums=(0, 1)))
    first, second = grad(x, scale), grad(x, scale)
    chex.assert_trees_all_equal(first, second)


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
def test_vmap_folds_batch_into_rows(implementation):
    x, scale = _inputs(7, (4, 5, 72), jnp.float32)
    batched = jax.vmap(lambda x: liger_jax.rms_norm(x, scale, implementation=implementation))(x)
    harness.assert_close(batched, liger_jax.rms_norm_reference(*harness.as_float64(x, scale)), jnp.float32)


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
def test_per_example_gradients_under_vmap(implementation):
    x, _ = _inputs(8, (3, 6, 40), jnp.float32)
    scales = harness.random_normal(9, (3, 40), jnp.float32)

    def loss(op):
        return lambda scale, x: jnp.sum(op(x, scale) ** 2)

    def op(x, scale):
        return liger_jax.rms_norm(x, scale, implementation=implementation)

    per_example = jax.jit(jax.vmap(jax.grad(loss(op), argnums=(0, 1))))(scales, x)
    expected = jax.vmap(jax.grad(loss(liger_jax.rms_norm_reference), argnums=(0, 1)))(*harness.as_float64(scales, x))
    for got, want in zip(per_example, expected, strict=True):
        harness.assert_close(got, want, jnp.float32)


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
def test_checkpoint_gives_the_same_gradients(implementation):
    x, scale = _inputs(10, (11, 56), jnp.float32)

    def loss(x, scale):
        return jnp.sum(jnp.sin(liger_jax.rms_norm(x, scale, implementation=implementation)))

    plain = jax.jit(jax.grad(loss, argnums=(0, 1)))(x, scale)
    remat = jax.jit(jax.grad(jax.checkpoint(loss), argnums=(0, 1)))(x, scale)
    chex.assert_trees_all_close(plain, remat, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("tiling", harness.NORM_BACKWARD_TILINGS)
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("casting_mode", CASTING_MODES)
def test_forced_tilings_match_float64_reference(tiling, dtype, casting_mode):
    shape = harness.FORCED_TILING_SHAPE
    x, scale = _inputs(30 + CASTING_MODES.index(casting_mode), shape, dtype)
    offset = 1.0 if casting_mode == "gemma" else 0.0
    settings = {"offset": offset, "casting_mode": casting_mode}

    def op(x, scale):
        return liger_jax.rms_norm(x, scale, implementation=harness.KERNEL_IMPLEMENTATION, **settings)

    def reference(x, scale):
        return liger_jax.rms_norm_reference(x, scale, rounding_dtype=dtype, **settings)

    with _tiling.overridden(harness.NORM_BACKWARD_TILINGS[tiling]):
        harness.assert_vjp_matches_reference(op, reference, (x, scale), harness.random_normal(39, shape, dtype), dtype)


def test_rows_longer_than_one_tile_use_column_blocks():
    # Two rows of 65537 (one past the old single-tile cap) take the rule's column blocks, forward and backward.
    x, scale = _inputs(40, (2, 65537), jnp.float32)
    op = functools.partial(liger_jax.rms_norm, implementation=harness.KERNEL_IMPLEMENTATION)
    cotangent = harness.random_normal(41, x.shape, jnp.float32)
    harness.assert_vjp_matches_reference(op, liger_jax.rms_norm_reference, (x, scale), cotangent, jnp.float32)


@pytest.mark.parametrize("reduces_rows", [False, True])
@pytest.mark.parametrize("n_cols", [1, 96, 1000, 4096, 8192, 12000, 16384, 20000, 32768, 65536, 65537, 131072])
def test_row_tiling_keeps_a_row_in_one_tile_up_to_the_limit_then_walks_column_blocks(n_cols, reduces_rows):
    tiling = _tiling.row_tiling(n_cols, reduces_rows=reduces_rows)
    limit = _tiling.MAX_BACKWARD_TILE_COLS if reduces_rows else _tiling.MAX_FORWARD_TILE_COLS
    assert tiling.block_d & (tiling.block_d - 1) == 0, "tl.arange needs a power of two"
    if n_cols <= limit:
        assert n_cols <= tiling.block_d < 2 * n_cols
    else:
        assert tiling.block_d == (_tiling.COLUMN_BLOCK if reduces_rows else _tiling.MAX_FORWARD_TILE_COLS)
        assert tiling.num_warps == min(_tiling.MAX_WARPS, tiling.block_d // _tiling.COLUMN_ELEMENTS_PER_WARP)
        assert not tiling.prefetch, "column blocks are never prefetched"
    assert 4 <= tiling.num_warps <= _tiling.MAX_WARPS
    one_tile = n_cols <= tiling.block_d
    assert tiling.prefetch == (
        reduces_rows and one_tile and tiling.block_rows * tiling.block_d <= _tiling.MEASURED_TILE_LIMIT
    )


def test_tiling_override_replaces_the_rule_where_set():
    forced = _tiling.TilingOverride(block_d=1024, num_warps=2, prefetch=False)
    assert _tiling.row_tiling(4000, reduces_rows=True, override=forced) == _tiling.RowTiling(
        block_rows=2, block_d=1024, num_warps=2, programs_per_sm=_tiling.PROGRAMS_PER_SM, prefetch=False
    )
    # A block wider than the row gives one tile of the row's length rounded up.
    assert _tiling.row_tiling(100, override=_tiling.TilingOverride(block_d=4096)).block_d == 128
    with pytest.raises(ValueError, match="block_d must be a power of two"):
        _tiling.TilingOverride(block_d=96)


def test_kernel_writes_every_element():
    # Outputs start as NaN under the interpreter; rows and D chosen to leave partial tiles on both axes.
    x, scale = _inputs(11, (37, 77), jnp.float32)
    y, vjp = jax.vjp(lambda x, s: liger_jax.rms_norm(x, s), x, scale)
    dx, dscale = vjp(jnp.ones_like(y))
    for array in (y, dx, dscale):
        assert np.isfinite(np.asarray(array)).all()


def test_empty_input_gives_empty_output():
    x = jnp.zeros((0, 16), jnp.float32)
    assert liger_jax.rms_norm(x, jnp.ones(16, jnp.float32)).shape == (0, 16)


@pytest.mark.parametrize(
    ("x", "scale", "kwargs", "error", "match"),
    [
        ((), (), {}, ValueError, "x must have at least 1 axes"),
        ((2, 8), (7,), {}, ValueError, r"scale must have shape \(8,\)"),
        ((2, 8), (8, 1), {}, ValueError, r"scale must have shape \(8,\)"),
        ((2, 8), (8,), {"casting_mode": "mistral"}, ValueError, "casting_mode"),
        ((2, 8), (8,), {"implementation": "cuda"}, ValueError, "implementation"),
    ],
)
def test_bad_shapes_and_settings_raise_clear_errors(x, scale, kwargs, error, match):
    harness.assert_call_raises(error, match, liger_jax.rms_norm, (x, scale), **kwargs)


@pytest.mark.parametrize(
    ("x_dtype", "scale_dtype", "match"),
    [
        (jnp.int32, jnp.float32, "x must have a float dtype"),
        (jnp.float32, jnp.int8, "scale must have a float dtype"),
        (jnp.float64, jnp.float32, "x must have a float dtype"),
    ],
)
def test_bad_dtypes_raise_type_errors(x_dtype, scale_dtype, match):
    harness.assert_call_raises(TypeError, match, liger_jax.rms_norm, ((2, 8), 8), (x_dtype, scale_dtype))
