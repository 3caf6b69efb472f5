"""Softmax, sparsemax and ReLU², what they share: every implementation against float64 oracles written from the
definitions (values, gradients, and autodiff of the float64 reference), odd shapes and every dtype, axes, vmap,
remat, sharded rows, bad inputs, the Flax layers. Each op's own math is in tests/test_<op>.py."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import liger_jax
from liger_jax.flax_layers import linen as liger_linen
from liger_jax.flax_layers import nnx as liger_nnx
from liger_jax.ops import _tiling
from tests import activation_oracles, harness
from tests.collectives import assert_only_small_all_reduces, compiled_collectives, mesh, place

OPS = {
    "softmax": (liger_jax.softmax, liger_jax.softmax_reference),
    "sparsemax": (liger_jax.sparsemax, liger_jax.sparsemax_reference),
    "relu_squared": (liger_jax.relu_squared, liger_jax.relu_squared_reference),
}
ROW_MAPS = ("softmax", "sparsemax")
# One row of 7; rows not a multiple of the row tile (16 rows of 128 columns, the last tile partial) and D not a
# power of two, in every dtype; rank 3; one long row per program. The elementwise kernel's 4096-element blocks end
# partial in each.
CASES = [
    ((1, 7), jnp.float32),
    *(((37, 123), dtype) for dtype in harness.DTYPES),
    ((3, 5, 96), jnp.bfloat16),
    ((3, 1500), jnp.float32),
]
# Inputs of scale 2 give sparsemax supports of several entries and ReLU² both signs.
INPUT_SCALE = 2.0


def _op(name, implementation, **options):
    return lambda x: OPS[name][0](x, implementation=implementation, **options)


def _expected(name, x, dy, dtype):
    """The oracles' float64 ``(y, dx)`` at inputs already rounded to ``dtype``. Softmax's backward reads the y its
    forward rounded to ``dtype`` (its numerics contract); the others' gradients do not depend on y's value."""
    value, pullback = activation_oracles.ORACLES[name]
    if name == "softmax":
        return value(x), activation_oracles.softmax_pullback(x, dy, rounded_to=dtype)
    return value(x), pullback(x, dy)


def _inputs(seed, shape, dtype):
    """x of scale INPUT_SCALE and a cotangent, in ``dtype``, and their float64 copies."""
    x = harness.random_normal(seed, shape, dtype, scale=INPUT_SCALE)
    dy = harness.random_normal(seed + 1, shape, dtype)
    return x, dy, np.asarray(x, np.float64), np.asarray(dy, np.float64)


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
@pytest.mark.parametrize("name", OPS)
@pytest.mark.parametrize(("shape", "dtype"), CASES)
def test_values_and_gradients_match_float64_oracles(implementation, name, shape, dtype):
    x, dy, x64, dy64 = _inputs(sum(shape) + list(OPS).index(name), shape, dtype)
    y, (dx,) = harness.vjp_under_jit(_op(name, implementation), (x,), dy)
    chex.assert_type([y, dx], dtype)
    chex.assert_shape([y, dx], shape)
    expected_y, expected_dx = _expected(name, x64, dy64, dtype)
    harness.assert_close(y, expected_y, dtype)
    harness.assert_close(dx, expected_dx, dtype)


@pytest.mark.parametrize("name", OPS)
def test_custom_vjp_matches_autodiff_of_the_float64_reference(name):
    x, dy, x64, dy64 = _inputs(5, (37, 123), jnp.float32)
    _, (dx,) = harness.vjp_under_jit(_op(name, harness.KERNEL_IMPLEMENTATION), (x,), dy)
    _, (expected,) = harness.vjp_under_jit(OPS[name][1], (jnp.asarray(x64),), jnp.asarray(dy64))
    harness.assert_close(dx, expected, jnp.float32)


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
@pytest.mark.parametrize("name", ROW_MAPS)
@pytest.mark.parametrize("axis", [0, -2])
def test_any_axis_matches_the_oracle_along_it(implementation, name, axis):
    x = harness.random_normal(10 + axis, (6, 9, 5), jnp.float32, scale=INPUT_SCALE)
    dy = harness.random_normal(20 + axis, x.shape, jnp.float32)
    y, (dx,) = harness.vjp_under_jit(_op(name, implementation, axis=axis), (x,), dy)
    last = [np.moveaxis(np.asarray(a, np.float64), axis, -1) for a in (x, dy)]
    expected_y, expected_dx = (np.moveaxis(a, -1, axis) for a in _expected(name, *last, jnp.float32))
    harness.assert_close(y, expected_y, jnp.float32)
    harness.assert_close(dx, expected_dx, jnp.float32)


@pytest.mark.parametrize("tiling", ["column_blocks", "no_prefetch"])  # column splits: the norms' backward only
@pytest.mark.parametrize("name", ROW_MAPS)
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_forced_tilings_match_float64_oracles(tiling, name, dtype):
    # Column blocks: each 200-column row in 4 blocks of 64, the last partial, every pass and iteration of the
    # kernels walking them.
    shape = harness.FORCED_TILING_SHAPE
    x = harness.random_normal(30, shape, dtype, scale=INPUT_SCALE)
    dy = harness.random_normal(31, shape, dtype)
    with _tiling.overridden(harness.FORCED_TILINGS[tiling]):
        y, (dx,) = harness.vjp_under_jit(_op(name, harness.KERNEL_IMPLEMENTATION), (x,), dy)
    expected_y, expected_dx = _expected(name, np.asarray(x, np.float64), np.asarray(dy, np.float64), dtype)
    harness.assert_close(y, expected_y, dtype)
    harness.assert_close(dx, expected_dx, dtype)


@pytest.mark.parametrize("name", ROW_MAPS)
@pytest.mark.parametrize("n_cols", [192, 193], ids=["whole_blocks", "one_column_past"])
def test_every_column_block_counts_once(name, n_cols):
    # Forced blocks of 64: 192 columns fill three blocks exactly (a second pass that visits one block too many writes
    # before its row), and 193 leave one column alone in a fourth, made the row's largest so that a pass which skips
    # it gets the max, the sums and the support wrong.
    x = np.array(harness.random_normal(34, (5, n_cols), jnp.float32, scale=INPUT_SCALE))
    x[:, -1] = x.max(axis=-1) + 0.5
    dy = harness.random_normal(35, x.shape, jnp.float32)
    with _tiling.overridden(harness.FORCED_TILINGS["column_blocks"]):
        y, (dx,) = harness.vjp_under_jit(_op(name, harness.KERNEL_IMPLEMENTATION), (jnp.asarray(x),), dy)
    expected_y, expected_dx = _expected(name, np.asarray(x, np.float64), np.asarray(dy, np.float64), jnp.float32)
    harness.assert_close(y, expected_y, jnp.float32)
    harness.assert_close(dx, expected_dx, jnp.float32)


@pytest.mark.parametrize("name", ROW_MAPS)
def test_rows_longer_than_one_tile_use_column_blocks(name):
    # One past the longest row the rule keeps in one tile: 9 blocks of 4096, the last holding one column.
    x = harness.random_normal(32, (2, _tiling.MAX_FORWARD_TILE_COLS + 1), jnp.float32, scale=4.0)
    dy = harness.random_normal(33, x.shape, jnp.float32)
    y, (dx,) = harness.vjp_under_jit(_op(name, harness.KERNEL_IMPLEMENTATION), (x,), dy)
    expected_y, expected_dx = _expected(name, np.asarray(x, np.float64), np.asarray(dy, np.float64), jnp.float32)
    harness.assert_close(y, expected_y, jnp.float32)
    harness.assert_close(dx, expected_dx, jnp.float32)


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
@pytest.mark.parametrize("name", OPS)
def test_vmap_values_and_gradients(implementation, name):
    x, weights, x64, weights64 = _inputs(40, (4, 3, 24), jnp.float32)

    def loss(op):
        return lambda x, weights: jnp.sum(op(x) * weights)

    batched = jax.jit(jax.vmap(jax.value_and_grad(loss(_op(name, implementation)))))(x, weights)
    expected = jax.jit(jax.vmap(jax.value_and_grad(loss(OPS[name][1]))))(jnp.asarray(x64), jnp.asarray(weights64))
    harness.assert_close_trees(batched, expected, jnp.float32)


@pytest.mark.parametrize("name", OPS)
def test_checkpoint_gives_the_same_gradients(name):
    x = harness.random_normal(41, (7, 50), jnp.float32, scale=INPUT_SCALE)
    harness.assert_checkpoint_gives_the_same_gradients(
        lambda x: jnp.sum(jnp.sin(3.0 * _op(name, harness.KERNEL_IMPLEMENTATION)(x))), (x,)
    )


@pytest.mark.parametrize("name", OPS)
def test_rows_shard_without_gathering(name):
    # 8 × 8 rows of 32 over the 8 host devices: each launches the kernel on its own rows.
    x = harness.random_normal(42, (8, 8, 32), jnp.float32, scale=INPUT_SCALE)
    dy = harness.random_normal(43, x.shape, jnp.float32)

    @jax.jit
    def program(x, dy):
        y, pullback = jax.vjp(_op(name, harness.KERNEL_IMPLEMENTATION), x)
        return y, pullback(dy)

    mesh_ = mesh((4, 2), ("x", "y"))
    sharded, sharded_dy = (place(a, mesh_, "x", "y") for a in (x, dy))
    y, (dx,) = program(sharded, sharded_dy)
    expected_y, expected_dx = _expected(name, np.asarray(x, np.float64), np.asarray(dy, np.float64), jnp.float32)
    harness.assert_close(y, expected_y, jnp.float32)
    harness.assert_close(dx, expected_dx, jnp.float32)
    assert y.sharding.spec[:2] == dx.sharding.spec[:2] == ("x", "y")
    assert_only_small_all_reduces(compiled_collectives(program, sharded, sharded_dy), 0)


@pytest.mark.parametrize("name", OPS)
def test_empty_input_gives_empty_output(name):
    x = jnp.zeros((0, 16), jnp.float32)
    y, (dx,) = harness.vjp_under_jit(_op(name, harness.KERNEL_IMPLEMENTATION), (x,), x)
    chex.assert_shape([y, dx], (0, 16))


@pytest.mark.parametrize(
    ("shape", "dtype", "options", "error", "match"),
    [
        ((), jnp.float32, {}, ValueError, "x must have at least 1 axes"),
        ((2, 8), jnp.float32, {"axis": 2}, ValueError, r"axis=2 is out of range for an array of rank 2"),
        ((2, 8), jnp.float32, {"axis": -3}, ValueError, r"axis=-3 is out of range"),
        ((2, 8), jnp.float32, {"axis": (0, 1)}, TypeError, "axis must be an int naming one axis"),
        ((2, 8), jnp.float32, {"axis": True}, TypeError, "axis must be an int naming one axis"),
        ((2, 8), jnp.int32, {}, TypeError, "x must have a float dtype"),
        ((2, 8), jnp.float64, {}, TypeError, "x must have a float dtype"),
        ((2, 8), jnp.float32, {"implementation": "cuda"}, ValueError, "implementation must be one of"),
    ],
)
@pytest.mark.parametrize("name", ROW_MAPS)
def test_row_maps_reject_bad_inputs(shape, dtype, options, error, match, name):
    harness.assert_call_raises(error, match, OPS[name][0], (shape,), dtype, **options)


@pytest.mark.parametrize(
    ("dtype", "options", "error", "match"),
    [
        (jnp.int32, {}, TypeError, "x must have a float dtype"),
        (jnp.float64, {}, TypeError, "x must have a float dtype"),
        (jnp.float32, {"implementation": "cuda"}, ValueError, "implementation must be one of"),
    ],
)
def test_relu_squared_rejects_bad_inputs(dtype, options, error, match):
    harness.assert_call_raises(error, match, liger_jax.relu_squared, ((2, 8),), dtype, **options)


# name -> (layer class, options the layer and the function both take)
LAYERS = {
    "softmax": ("Softmax", {"axis": 0}),
    "sparsemax": ("Sparsemax", {"axis": 0}),
    "relu_squared": ("ReLUSquared", {}),
}


@pytest.mark.parametrize("name", OPS)
def test_nnx_and_linen_layers_call_the_op(name):
    class_name, options = LAYERS[name]
    x = harness.random_normal(50, (5, 12), jnp.float32, scale=INPUT_SCALE)
    expected = OPS[name][0](x, implementation=harness.KERNEL_IMPLEMENTATION, **options)
    layer = getattr(liger_nnx, class_name)(implementation=harness.KERNEL_IMPLEMENTATION, **options)
    assert not nnx.state(layer, nnx.Param)
    harness.assert_close(layer(x), expected, jnp.float32)
    linen_layer = getattr(liger_linen, class_name)(implementation=harness.KERNEL_IMPLEMENTATION, **options)
    y, variables = linen_layer.init_with_output(jax.random.key(0), x)
    assert not variables
    harness.assert_close(y, expected, jnp.float32)
    harness.assert_close(linen_layer.apply(variables, x), expected, jnp.float32)


@pytest.mark.parametrize("name", OPS)
def test_benchmark_case_runs_at_its_smoke_size(name):
    from benchmarks.cases import OPS as BENCHMARK_OPS
    from benchmarks.cases import build_case

    params, dtype = BENCHMARK_OPS[name].smoke[0]
    case = build_case(name, params, dtype)
    (x,) = case.make_inputs(jax.random.key(0))
    harness.assert_close(case.providers["liger_jax"](x), case.providers["xla"](x), jnp.dtype(dtype))
