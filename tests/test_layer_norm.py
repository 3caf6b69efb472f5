"""LayerNorm: every implementation against the float64 reference, values and gradients."""

import functools

import chex
import jax
import jax.numpy as jnp
import pytest
from jax.test_util import check_grads

import liger_jax
from liger_jax import runtime
from liger_jax.ops import _tiling
from tests import harness

# (rows..., D): a single row, D not a power of two, rows not a multiple of any block, 3-D, rank 1, wide rows.
SHAPES = [(1, 64), (37, 123), (3, 7, 96), (100,), (6, 1000)]
# Which weights the op gets: both in x's dtype, both in fp32 (mixed precision), scale only, none.
WEIGHTS = ["same_dtype", "float32", "scale_only", "none"]
# Every shape with both weights, and every other choice of weights on one odd shape.
CASES = [(shape, "same_dtype") for shape in SHAPES] + [((37, 123), weights) for weights in WEIGHTS[1:]]


def _inputs(seed, shape, dtype, weights="same_dtype"):
    x = harness.random_normal(seed, shape, dtype)
    weight_dtype = jnp.float32 if weights == "float32" else dtype
    scale = harness.random_normal(seed + 1, shape[-1:], weight_dtype)
    bias = harness.random_normal(seed + 2, shape[-1:], weight_dtype)
    return x, scale if weights != "none" else None, bias if weights in ("same_dtype", "float32") else None


def _with_weights(fn, scale, bias):
    """``fn(x, scale, bias)`` as a function of the arrays among x, scale, bias (the Nones held fixed)."""

    def call(x, *weights):
        it = iter(weights)
        return fn(x, None if scale is None else next(it), None if bias is None else next(it))

    return call, [w for w in (scale, bias) if w is not None]


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
@pytest.mark.parametrize(("shape", "weights"), CASES)
@pytest.mark.parametrize("dtype", harness.DTYPES)
def test_outputs_and_gradients_match_float64_reference(implementation, shape, dtype, weights):
    x, scale, bias = _inputs(len(shape) + 10 * WEIGHTS.index(weights), shape, dtype, weights)
    op, present = _with_weights(
        lambda x, s, b: liger_jax.layer_norm(x, s, b, implementation=implementation), scale, bias
    )
    reference, _ = _with_weights(liger_jax.layer_norm_reference, scale, bias)
    cotangent = harness.random_normal(99, shape, dtype)
    chex.assert_type(jax.jit(op)(x, *present), dtype)
    harness.assert_vjp_matches_reference(op, reference, (x, *present), cotangent, dtype)


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
def test_check_grads_fp32(implementation):
    x, scale, bias = _inputs(5, (9, 48), jnp.float32)
    check_grads(
        lambda x, scale, bias: liger_jax.layer_norm(x, scale, bias, implementation=implementation),
        (x, scale, bias),
        order=1,
        modes=["rev"],
    )


def test_backward_is_bitwise_deterministic():
    x, scale, bias = _inputs(6, (67, 80), jnp.float32)
    harness.assert_bitwise_deterministic(
        jax.grad(lambda x, s, b: jnp.sum(jnp.sin(liger_jax.layer_norm(x, s, b))), argnums=(0, 1, 2)), x, scale, bias
    )


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
def test_vmap_folds_batch_into_rows(implementation):
    x, scale, bias = _inputs(7, (4, 5, 72), jnp.float32)
    batched = jax.vmap(lambda x: liger_jax.layer_norm(x, scale, bias, implementation=implementation))(x)
    expected = liger_jax.layer_norm_reference(*harness.as_float64(x, scale, bias))
    harness.assert_close(batched, expected, jnp.float32)


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
def test_per_example_gradients_under_vmap(implementation):
    x = harness.random_normal(8, (3, 6, 40), jnp.float32)
    scales = harness.random_normal(9, (3, 40), jnp.float32)
    biases = harness.random_normal(10, (3, 40), jnp.float32)

    def loss(op):
        return lambda scale, bias, x: jnp.sum(jnp.sin(op(x, scale, bias)))

    def op(x, scale, bias):
        return liger_jax.layer_norm(x, scale, bias, implementation=implementation)

    per_example = jax.jit(jax.vmap(jax.grad(loss(op), argnums=(0, 1, 2))))(scales, biases, x)
    expected = jax.vmap(jax.grad(loss(liger_jax.layer_norm_reference), argnums=(0, 1, 2)))(
        *harness.as_float64(scales, biases, x)
    )
    harness.assert_close_trees(per_example, expected, jnp.float32)


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
def test_checkpoint_gives_the_same_gradients(implementation):
    x, scale, bias = _inputs(11, (11, 56), jnp.float32)
    harness.assert_checkpoint_gives_the_same_gradients(
        lambda x, s, b: jnp.sum(jnp.sin(liger_jax.layer_norm(x, s, b, implementation=implementation))),
        (x, scale, bias),
    )


# LayerNorm's own: the backward's row sums from a kernel of their own, for column blocks read by one program a row
# and split among three (then each split reads only its own columns).
TILINGS = harness.NORM_BACKWARD_TILINGS | {
    "separate_row_sums": _tiling.TilingOverride(block_d=64, separate_row_sums=True),
    "separate_row_sums_split": _tiling.TilingOverride(block_d=32, column_splits=3, separate_row_sums=True),
}


@pytest.mark.parametrize("tiling", TILINGS)
@pytest.mark.parametrize(("dtype", "weights"), [(jnp.float32, "same_dtype"), (jnp.bfloat16, "float32")])
def test_forced_tilings_match_float64_reference(tiling, dtype, weights):
    shape = harness.FORCED_TILING_SHAPE
    x, scale, bias = _inputs(30, shape, dtype, weights)
    # A mean far from 0 against a unit spread: the column blocks' merged variance must not cancel.
    x = (x.astype(jnp.float32) + 8.0).astype(dtype)

    def op(x, scale, bias):
        return liger_jax.layer_norm(x, scale, bias, implementation=harness.KERNEL_IMPLEMENTATION)

    cotangent = harness.random_normal(39, shape, dtype)
    with _tiling.overridden(TILINGS[tiling]):
        harness.assert_vjp_matches_reference(op, liger_jax.layer_norm_reference, (x, scale, bias), cotangent, dtype)


def test_a_batched_input_sums_its_rows_apart_where_the_backward_walks_column_blocks(monkeypatch):
    # The choice follows the row length, the last axis, whatever the leading axes: [2, 3, 200] in blocks of 64.
    launched = []

    def record(kernel, *args, out_shape, **settings):
        launched.append(kernel.fn.__name__)
        return tuple(jnp.zeros(shape.shape, shape.dtype) for shape in out_shape)

    monkeypatch.setattr(runtime, "launch", record)
    x, scale, bias = _inputs(13, (2, 3, 200), jnp.float32)
    with _tiling.overridden(_tiling.TilingOverride(block_d=64, separate_row_sums=True)):
        y, pullback = jax.vjp(
            functools.partial(liger_jax.layer_norm, implementation=harness.KERNEL_IMPLEMENTATION), x, scale, bias
        )
        pullback(y)
    assert launched == ["layer_norm_fwd", "layer_norm_bwd_row_sums", "layer_norm_bwd"]


@pytest.mark.parametrize(
    ("n_cols", "override", "expected"),
    [
        (65536, None, True),  # four splits
        (32768, None, False),  # two splits share their sums
        (32768, _tiling.TilingOverride(separate_row_sums=True), True),
        (65536, _tiling.TilingOverride(separate_row_sums=True), True),
        (65536, _tiling.TilingOverride(separate_row_sums=False), False),
        (4096, _tiling.TilingOverride(separate_row_sums=True), False),  # one tile: its sums are in registers
        (200, _tiling.TilingOverride(block_d=64, separate_row_sums=True), True),
    ],
)
def test_the_backward_sums_rows_apart_only_where_it_walks_column_blocks(n_cols, override, expected):
    assert _tiling.separate_row_sums(n_cols, override) is expected


def test_kernel_writes_every_element():
    # Rows and D chosen to leave partial tiles on both axes.
    x, scale, bias = _inputs(12, (37, 77), jnp.float32)
    y, vjp = jax.vjp(liger_jax.layer_norm, x, scale, bias)
    harness.assert_all_finite(y, vjp(jnp.ones_like(y)))


def test_empty_input_gives_empty_output():
    x = jnp.zeros((0, 16), jnp.float32)
    assert liger_jax.layer_norm(x, jnp.ones(16, jnp.float32), None).shape == (0, 16)


@pytest.mark.parametrize(
    ("x", "scale", "bias", "kwargs", "match"),
    [
        ((), (), (), {}, "x must have at least 1 axes"),
        ((2, 8), (7,), (8,), {}, r"scale must have shape \(8,\)"),
        ((2, 8), (8,), (8, 1), {}, r"bias must have shape \(8,\)"),
        ((2, 8), None, (9,), {}, r"bias must have shape \(8,\)"),
        ((2, 8), (8,), (8,), {"implementation": "cuda"}, "implementation"),
    ],
)
def test_bad_shapes_and_settings_raise_value_errors(x, scale, bias, kwargs, match):
    harness.assert_call_raises(ValueError, match, liger_jax.layer_norm, (x, scale, bias), **kwargs)


@pytest.mark.parametrize(
    ("x_dtype", "scale_dtype", "bias_dtype", "match"),
    [
        (jnp.int32, jnp.float32, jnp.float32, "x must have a float dtype"),
        (jnp.float32, jnp.int8, jnp.float32, "scale must have a float dtype"),
        (jnp.float32, jnp.float32, jnp.int32, "bias must have a float dtype"),
        (jnp.float64, jnp.float32, jnp.float32, "x must have a float dtype"),
    ],
)
def test_bad_dtypes_raise_type_errors(x_dtype, scale_dtype, bias_dtype, match):
    dtypes = (x_dtype, scale_dtype, bias_dtype)
    harness.assert_call_raises(TypeError, match, liger_jax.layer_norm, ((2, 8), 8, 8), dtypes)
