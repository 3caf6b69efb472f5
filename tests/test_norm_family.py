"""DyT and PolyNorm: every implementation against float64 references written from their definitions, values and
gradients; their Flax modules; sharding over rows."""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.test_util import check_grads

import liger_jax
from liger_jax.flax_layers import linen as liger_linen
from liger_jax.flax_layers import nnx as liger_nnx
from liger_jax.ops import _heavy_rows, _tiling
from tests import harness
from tests.collectives import assert_only_small_all_reduces, compiled_collectives, mesh, nbytes, place

# (rows..., D): a single row, D not a power of two, rows not a multiple of any block, 3-D, rank 1; every dtype, each
# on some shapes.
CASES = [((1, 64), jnp.bfloat16), ((37, 123), jnp.float16), ((3, 7, 96), jnp.float32), ((100,), jnp.bfloat16)]


def _rows(shape) -> int:
    return int(np.prod(shape[:-1]))


def _dyt_from_definition(x, alpha, gamma, beta):
    """γ · tanh(α x) + β in float64, beta optional."""
    row = (1,) * (x.ndim - 1) + x.shape[-1:]
    y = jnp.tanh(alpha.reshape(()) * x) * gamma.reshape(row)
    return y if beta is None else y + beta.reshape(row)


def _poly_norm_from_definition(x, weight, bias, epsilon=1e-6):
    """w0 · n(x³) + w1 · n(x²) + w2 · n(x) + b, n(u) = u / √(mean(u²) + ε), in float64."""

    def n(u):
        return u / jnp.sqrt(jnp.mean(u * u, axis=-1, keepdims=True) + epsilon)

    return weight[0] * n(x**3) + weight[1] * n(x**2) + weight[2] * n(x) + bias.reshape(())


def _dyt_inputs(seed, shape, dtype, alpha_shape=(1,)):
    x = harness.random_normal(seed, shape, dtype, 2.0)
    alpha = jnp.full(alpha_shape, 0.7, jnp.float32)
    gamma = harness.random_normal(seed + 1, shape[-1:], dtype)
    beta = harness.random_normal(seed + 2, shape[-1:], dtype)
    return x, alpha, gamma, beta


def _poly_inputs(seed, shape, dtype, bias_shape=()):
    x = harness.random_normal(seed, shape, dtype)
    weight = jnp.asarray([0.3, -0.5, 0.8], jnp.float32)
    return x, weight, jnp.full(bias_shape, 0.4, jnp.float32)


def test_references_are_the_definitions():
    x, alpha, gamma, beta = harness.as_float64(*_dyt_inputs(1, (5, 24), jnp.float32))
    np.testing.assert_allclose(
        liger_jax.dyt_reference(x, alpha, gamma, beta), _dyt_from_definition(x, alpha, gamma, beta)
    )
    x, weight, bias = harness.as_float64(*_poly_inputs(2, (5, 24), jnp.float32))
    np.testing.assert_allclose(
        liger_jax.poly_norm_reference(x, weight, bias), _poly_norm_from_definition(x, weight, bias), rtol=1e-12
    )


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
@pytest.mark.parametrize(("shape", "dtype"), CASES)
def test_dyt_values_and_gradients_match_float64_definition(implementation, shape, dtype):
    primals = _dyt_inputs(len(shape), shape, dtype)
    cotangent = harness.random_normal(9, shape, dtype)
    op = functools.partial(liger_jax.dyt, implementation=implementation)
    terms = {1: int(np.prod(shape)), 2: _rows(shape), 3: _rows(shape)}
    harness.assert_vjp_matches_reference_over_sums(op, _dyt_from_definition, primals, cotangent, dtype, terms)


def test_dyt_scalar_alpha_and_no_beta():
    implementation = harness.KERNEL_IMPLEMENTATION
    x, alpha, gamma, _ = _dyt_inputs(3, (9, 40), jnp.float32, alpha_shape=())
    cotangent = harness.random_normal(4, x.shape, jnp.float32)

    def op(x, alpha, gamma):
        return liger_jax.dyt(x, alpha, gamma, None, implementation=implementation)

    def definition(x, alpha, gamma):
        return _dyt_from_definition(x, alpha, gamma, None)

    terms = {1: x.size, 2: 9}
    harness.assert_vjp_matches_reference_over_sums(op, definition, (x, alpha, gamma), cotangent, jnp.float32, terms)


@pytest.mark.parametrize(
    ("shape", "override"),
    [
        (harness.FORCED_TILING_SHAPE, harness.FORCED_TILINGS["column_blocks"]),
        # One column past three whole blocks, several tiles a program.
        ((67, 193), _tiling.TilingOverride(block_d=64, block_rows=4)),
        # Two-row tiles of one block: each of the interpreter's 3 programs walks 3 tiles, the last one partial.
        ((13, 48), _tiling.TilingOverride(block_rows=2)),
    ],
)
def test_dyt_forced_tilings_match_float64_definition(shape, override):
    primals = _dyt_inputs(5, shape, jnp.bfloat16)
    op = functools.partial(liger_jax.dyt, implementation=harness.KERNEL_IMPLEMENTATION)
    terms = {1: int(np.prod(shape)), 2: shape[0], 3: shape[0]}
    with _tiling.overridden(override):
        harness.assert_vjp_matches_reference_over_sums(
            op, _dyt_from_definition, primals, harness.random_normal(6, shape, jnp.bfloat16), jnp.bfloat16, terms
        )


@pytest.mark.parametrize(
    ("op", "n_cols", "block_rows", "num_warps"),
    [
        ("dyt", 256, 1, 2),
        ("dyt", 512, 1, 4),
        ("dyt", 513, 1, 4),
        ("dyt", 1000, 1, 4),
        ("dyt", 1024, 1, 4),
        ("dyt", 8192, 1, 32),
        ("poly_norm", 1024, 1, 2),
        ("poly_norm", 4096, 1, 4),
        ("poly_norm", 16384, 1, 16),
        ("modulated_rms_norm", 8192, 1, 8),
        ("modulated_rms_norm", 16384, 1, 32),
    ],
)
def test_heavy_rows_get_a_tile_each_from_1024_columns_and_dyt_at_every_length(op, n_cols, block_rows, num_warps):
    # Each op's elements a thread (DyT's 4 on rows of at most 512 columns); an override's rows a tile are kept.
    override = _heavy_rows.heavy_row_override(op, n_cols, reduces_rows=True)
    tiling = _tiling.row_tiling(n_cols, reduces_rows=True, override=override)
    assert (tiling.block_rows, tiling.num_warps) == (block_rows, num_warps)
    assert not tiling.prefetch  # only when forced
    with _tiling.overridden(_tiling.TilingOverride(block_rows=2, prefetch=True)):
        forced = _heavy_rows.heavy_row_override(op, n_cols, reduces_rows=True)
        assert (forced.block_rows, forced.prefetch) == (2, True)


@pytest.mark.parametrize("op", ["poly_norm", "modulated_rms_norm"])
def test_one_tile_kernels_refuse_a_narrower_block(op):
    # Neither kernel walks column blocks: a forced block narrower than the row would leave columns unread.
    x = harness.random_normal(0, (3, 48), jnp.float32)
    ones, zeros = jnp.ones((48,), jnp.float32), jnp.zeros((48,), jnp.float32)
    args = (x, ones[:3], zeros[0]) if op == "poly_norm" else (x, ones, zeros)
    fn = functools.partial(getattr(liger_jax, op), implementation=harness.KERNEL_IMPLEMENTATION)
    with _tiling.overridden(_tiling.TilingOverride(block_d=16)), pytest.raises(ValueError, match="one tile"):
        fn(*args)


def test_dyt_gradient_identities():
    # dbeta sums dy over the rows; dalpha is Σ x · dx / α (dx = α · g, dalpha = Σ x · g).
    x, alpha, gamma, beta = _dyt_inputs(7, (13, 48), jnp.float32)
    dy = harness.random_normal(8, x.shape, jnp.float32)
    op = functools.partial(liger_jax.dyt, implementation=harness.KERNEL_IMPLEMENTATION)
    _, (dx, dalpha, _, dbeta) = harness.vjp_under_jit(op, (x, alpha, gamma, beta), dy)
    np.testing.assert_allclose(dbeta, dy.sum(axis=0), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(dalpha[0], jnp.sum(x * dx) / alpha[0], rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
@pytest.mark.parametrize(("shape", "dtype"), CASES)
def test_poly_norm_values_and_gradients_match_float64_definition(implementation, shape, dtype):
    primals = _poly_inputs(len(shape), shape, dtype)
    cotangent = harness.random_normal(10, shape, dtype)
    op = functools.partial(liger_jax.poly_norm, implementation=implementation)
    terms = {1: int(np.prod(shape)), 2: int(np.prod(shape))}
    harness.assert_vjp_matches_reference_over_sums(op, _poly_norm_from_definition, primals, cotangent, dtype, terms)


def test_poly_norm_bias_of_shape_one_and_epsilon():
    implementation = harness.KERNEL_IMPLEMENTATION
    primals = _poly_inputs(11, (6, 30), jnp.float32, bias_shape=(1,))
    op = functools.partial(liger_jax.poly_norm, epsilon=0.5, implementation=implementation)
    definition = functools.partial(_poly_norm_from_definition, epsilon=0.5)
    cotangent = harness.random_normal(12, (6, 30), jnp.float32)
    harness.assert_vjp_matches_reference_over_sums(op, definition, primals, cotangent, jnp.float32, {1: 180, 2: 180})


def test_poly_norm_gradient_identities():
    # dbias sums dy; dw_p sums dy · n(x^p), the term w_p multiplies.
    x, weight, bias = _poly_inputs(13, (17, 40), jnp.float32)
    dy = harness.random_normal(14, x.shape, jnp.float32)
    op = functools.partial(liger_jax.poly_norm, implementation=harness.KERNEL_IMPLEMENTATION)
    _, (_, dweight, dbias) = harness.vjp_under_jit(op, (x, weight, bias), dy)
    np.testing.assert_allclose(dbias, dy.sum(), rtol=1e-5, atol=1e-4)
    x64, dy64 = harness.as_float64(x, dy)
    terms = [_poly_norm_from_definition(x64, jnp.eye(3)[p], jnp.zeros(())) for p in range(3)]
    np.testing.assert_allclose(dweight, [jnp.sum(dy64 * t) for t in terms], rtol=1e-5, atol=1e-4)


def test_check_grads_fp32_kernels_and_float64_references():
    kernel = harness.KERNEL_IMPLEMENTATION
    dyt_primals = _dyt_inputs(15, (2, 8), jnp.float32)
    check_grads(functools.partial(liger_jax.dyt, implementation=kernel), dyt_primals, order=1, modes=["rev"])
    check_grads(liger_jax.dyt_reference, harness.as_float64(*dyt_primals), order=1, modes=["rev"])
    poly_primals = _poly_inputs(16, (2, 8), jnp.float32)
    check_grads(functools.partial(liger_jax.poly_norm, implementation=kernel), poly_primals, order=1, modes=["rev"])
    check_grads(liger_jax.poly_norm_reference, harness.as_float64(*poly_primals), order=1, modes=["rev"])


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
def test_vmap_folds_into_rows_and_maps_batched_weights(implementation):
    x, alpha, gamma, beta = _dyt_inputs(17, (2, 5, 24), jnp.float32)
    folded = jax.jit(jax.vmap(lambda x: liger_jax.dyt(x, alpha, gamma, beta, implementation=implementation)))(x)
    harness.assert_close(folded, _dyt_from_definition(*harness.as_float64(x, alpha, gamma, beta)), jnp.float32)
    _, weight, bias = _poly_inputs(18, (2, 5, 24), jnp.float32)
    weights = jnp.stack([weight, 2 * weight])

    def loss(op):
        return lambda weight, x: jnp.sum(op(x, weight, bias) ** 2)

    op = functools.partial(liger_jax.poly_norm, implementation=implementation)
    per_example = jax.jit(jax.vmap(jax.grad(loss(op), argnums=(0, 1))))(weights, x)
    want = jax.vmap(jax.grad(loss(_poly_norm_from_definition), argnums=(0, 1)))(*harness.as_float64(weights, x))
    harness.assert_close_trees(per_example, want, jnp.float32)


@pytest.mark.parametrize("op_name", ["dyt", "poly_norm"])
def test_sharded_rows_stay_sharded_and_match_one_device(op_name):
    mesh_ = mesh((4,), ("data",))
    if op_name == "dyt":
        x, *weights = _dyt_inputs(19, (8, 6, 32), jnp.float32)
    else:
        x, *weights = _poly_inputs(20, (8, 6, 32), jnp.float32)
    dy = harness.random_normal(21, x.shape, jnp.float32)
    op = functools.partial(getattr(liger_jax, op_name), implementation=harness.KERNEL_IMPLEMENTATION)

    @jax.jit
    def program(x, weights, dy):
        y, pullback = jax.vjp(op, x, *weights)
        return y, pullback(dy)

    expected = program(x, weights, dy)
    sharded = (place(x, mesh_, "data"), [place(w, mesh_) for w in weights], place(dy, mesh_, "data"))
    y, grads = program(*sharded)
    chex.assert_trees_all_close((y, grads), expected, atol=1e-5, rtol=1e-5)
    assert y.sharding.spec[0] == "data" and grads[0].sharding.spec[0] == "data"
    assert_only_small_all_reduces(compiled_collectives(program, *sharded), 2 * nbytes(*weights) + 64)


def test_checkpoint_gives_the_same_gradients():
    x, alpha, gamma, beta = _dyt_inputs(22, (5, 16), jnp.float32)
    kernel = harness.KERNEL_IMPLEMENTATION

    def loss(x, alpha, gamma, beta):
        y = liger_jax.dyt(x, alpha, gamma, beta, implementation=kernel)
        return jnp.sum(
            jnp.sin(liger_jax.poly_norm(y, jnp.ones(3, jnp.float32), jnp.zeros((), jnp.float32), implementation=kernel))
        )

    harness.assert_checkpoint_gives_the_same_gradients(loss, (x, alpha, gamma, beta))


def test_modules_hold_liger_params_and_match_the_op():
    param_dtype = jnp.bfloat16
    x = harness.random_normal(23, (2, 3, 24), jnp.bfloat16)
    kernel = harness.KERNEL_IMPLEMENTATION
    nnx_dyt = liger_nnx.DyT(24, init_alpha=0.3, param_dtype=param_dtype, implementation=kernel)
    linen_dyt = liger_linen.DyT(init_alpha=0.3, param_dtype=param_dtype, implementation=kernel)
    linen_params = linen_dyt.init(jax.random.key(0), x)
    chex.assert_trees_all_equal(nnx.to_pure_dict(nnx.state(nnx_dyt, nnx.Param)), linen_params["params"])
    assert {k: v.shape for k, v in linen_params["params"].items()} == {"alpha": (1,), "gamma": (24,), "beta": (24,)}
    expected = liger_jax.dyt_reference(x, jnp.full((1,), 0.3), jnp.ones(24), jnp.zeros(24))
    harness.assert_close(nnx_dyt(x), expected, jnp.bfloat16)
    harness.assert_close(linen_dyt.apply(linen_params, x), expected, jnp.bfloat16)
    assert liger_nnx.DyT(24, beta=False).beta is None

    nnx_poly = liger_nnx.PolyNorm(epsilon=1e-5, param_dtype=param_dtype, implementation=kernel)
    linen_poly = liger_linen.PolyNorm(epsilon=1e-5, param_dtype=param_dtype, implementation=kernel)
    linen_params = linen_poly.init(jax.random.key(0), x)
    chex.assert_trees_all_equal(nnx.to_pure_dict(nnx.state(nnx_poly, nnx.Param)), linen_params["params"])
    expected = liger_jax.poly_norm_reference(x, jnp.full((3,), 1 / 3), jnp.ones(()), epsilon=1e-5)
    harness.assert_close(nnx_poly(x), expected, jnp.bfloat16)
    harness.assert_close(linen_poly.apply(linen_params, x), expected, jnp.bfloat16)


def test_empty_inputs_give_empty_outputs():
    x = jnp.zeros((0, 16), jnp.float32)
    ones = functools.partial(jnp.ones, dtype=jnp.float32)
    assert liger_jax.dyt(x, ones(()), ones(16), None).shape == (0, 16)
    assert liger_jax.poly_norm(x, ones(3), ones(())).shape == (0, 16)


@pytest.mark.parametrize(
    ("shapes", "match"),
    [
        (((), (), (8,), (8,)), "x must have at least 1 axes"),
        (((2, 8), (2,), (8,), (8,)), "alpha must be a scalar"),
        (((2, 8), (), (7,), (8,)), r"gamma must have shape \(8,\)"),
        (((2, 8), (), (8,), (8, 1)), r"beta must have shape \(8,\)"),
    ],
)
def test_dyt_bad_shapes_raise_clear_errors(shapes, match):
    harness.assert_call_raises(ValueError, match, liger_jax.dyt, shapes)


@pytest.mark.parametrize(
    ("shapes", "kwargs", "match"),
    [
        (((), (3,), ()), {}, "x must have at least 1 axes"),
        (((2, 8), (2,), ()), {}, r"weight must have shape \(3,\)"),
        (((2, 8), (3,), (2,)), {}, "bias must be a scalar"),
        (((2, 16385), (3,), ()), {}, "implementation='xla'"),
        (((2, 8), (3,), ()), {"implementation": "cuda"}, "implementation"),
    ],
)
def test_poly_norm_bad_shapes_raise_clear_errors(shapes, kwargs, match):
    harness.assert_call_raises(ValueError, match, liger_jax.poly_norm, shapes, **kwargs)


@pytest.mark.parametrize(
    ("op", "shapes", "dtypes", "match"),
    [
        (liger_jax.dyt, ((2, 8), (), (8,), (8,)), (jnp.int32,) + (jnp.float32,) * 3, "x must have a float dtype"),
        (liger_jax.dyt, ((2, 8), (), (8,), (8,)), (jnp.float32, jnp.int32, jnp.float32, jnp.float32), "alpha"),
        (liger_jax.dyt, ((2, 8), (), (8,), (8,)), (jnp.float32,) * 3 + (jnp.int8,), "beta must have a float dtype"),
        (liger_jax.poly_norm, ((2, 8), (3,), ()), (jnp.float64, jnp.float32, jnp.float32), "x must have a float"),
        (liger_jax.poly_norm, ((2, 8), (3,), ()), (jnp.float32, jnp.int32, jnp.float32), "weight must have a float"),
        (liger_jax.poly_norm, ((2, 8), (3,), ()), (jnp.float32, jnp.float32, jnp.int32), "bias must have a float"),
    ],
)
def test_bad_dtypes_raise_type_errors(op, shapes, dtypes, match):
    harness.assert_call_raises(TypeError, match, op, shapes, dtypes)


# Modulated RMSNorm: (x shape, scale shape) for a modulation per token, per example ([B, D] and [B, 1, D]), shared by
# every token ([D]), and a single row.
MODULATIONS = [
    ((2, 5, 24), (2, 5, 24)),
    ((2, 5, 24), (2, 24)),
    ((3, 4, 40), (3, 1, 40)),
    ((7, 33), (33,)),
    ((24,), (24,)),
]
MODULATION_IDS = ["per_token", "per_example", "per_example_keepdims", "shared", "rank1"]


def _modulated_from_definition(x, weight, scale, shift, epsilon=1e-6, offset=0.0):
    """RMSNorm(x) · (1 + scale) + shift in float64, the modulation broadcast from x's leading axes."""
    row = (1,) * (x.ndim - 1) + x.shape[-1:]
    normed = x / jnp.sqrt(jnp.mean(x * x, axis=-1, keepdims=True) + epsilon) * (offset + weight).reshape(row)
    leading = scale.shape[:-1]
    while leading and leading[-1] == 1:
        leading = leading[:-1]
    shape = leading + (1,) * (x.ndim - 1 - len(leading)) + x.shape[-1:]
    return normed * (1 + scale.reshape(shape)) + shift.reshape(shape)


def _modulated_inputs(seed, x_shape, scale_shape, dtype):
    x = harness.random_normal(seed, x_shape, dtype)
    weight = harness.random_normal(seed + 1, x_shape[-1:], dtype)
    scale = harness.random_normal(seed + 2, scale_shape, dtype, 0.5)
    shift = harness.random_normal(seed + 3, scale_shape, dtype)
    return x, weight, scale, shift


def test_modulated_reference_is_the_definition():
    for x_shape, scale_shape in MODULATIONS[1:4]:
        primals = harness.as_float64(*_modulated_inputs(24, x_shape, scale_shape, jnp.float32))
        reference = functools.partial(liger_jax.modulated_rms_norm_reference, offset=1.0, casting_mode="gemma")
        definition = functools.partial(_modulated_from_definition, offset=1.0)
        np.testing.assert_allclose(jax.jit(reference)(*primals), jax.jit(definition)(*primals), rtol=1e-12, atol=1e-12)


# Each layout in one dtype and casting mode; together they take every one.
MODULATED_CASES = [
    pytest.param(*layout, dtype, casting_mode, id=f"{name}-{jnp.dtype(dtype).name}-{casting_mode}")
    for layout, name, dtype, casting_mode in zip(
        MODULATIONS,
        MODULATION_IDS,
        (jnp.float32, jnp.bfloat16, jnp.float32, jnp.bfloat16, jnp.float16),
        ("gemma", "llama", "llama", "gemma", "none"),
        strict=True,
    )
]


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
@pytest.mark.parametrize(("x_shape", "scale_shape", "dtype", "casting_mode"), MODULATED_CASES)
def test_modulated_values_and_gradients_match_float64_reference(
    implementation, x_shape, scale_shape, dtype, casting_mode
):
    primals = _modulated_inputs(25, x_shape, scale_shape, dtype)
    cotangent = harness.random_normal(26, x_shape, dtype)
    settings = {"offset": 0.5, "casting_mode": casting_mode}
    op = functools.partial(liger_jax.modulated_rms_norm, implementation=implementation, **settings)
    reference = functools.partial(liger_jax.modulated_rms_norm_reference, rounding_dtype=dtype, **settings)
    rows = _rows(x_shape)
    modulated_rows = rows // _rows(scale_shape) if len(scale_shape) > 1 else rows
    terms = {1: rows, 2: modulated_rows, 3: modulated_rows}
    harness.assert_vjp_matches_reference_over_sums(op, reference, primals, cotangent, dtype, terms)


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
def test_modulated_without_weight_or_shift(implementation):
    x, _, scale, _ = _modulated_inputs(27, (3, 6, 32), (3, 32), jnp.float16)
    cotangent = harness.random_normal(28, x.shape, jnp.float16)
    # Without a weight the offset is ignored, as Liger does.
    settings = {"offset": 1.0, "casting_mode": "none"}

    def op(x, scale):
        return liger_jax.modulated_rms_norm(x, None, scale, implementation=implementation, **settings)

    def reference(x, scale):
        return liger_jax.modulated_rms_norm_reference(x, None, scale, rounding_dtype=jnp.float16, **settings)

    harness.assert_vjp_matches_reference_over_sums(op, reference, (x, scale), cotangent, jnp.float16, {1: 6})
    definition = jax.jit(lambda x, scale: _modulated_from_definition(x, jnp.ones(32), scale, jnp.zeros(scale.shape)))
    harness.assert_close(jax.jit(op)(x, scale), definition(*harness.as_float64(x, scale)), jnp.float16)


def test_modulated_gradient_identities():
    # Per token, dshift is dy and dscale is dy · RMSNorm(x); per example they sum those over the example's tokens.
    x, weight, scale, shift = _modulated_inputs(29, (2, 9, 32), (2, 9, 32), jnp.float32)
    dy = harness.random_normal(30, x.shape, jnp.float32)
    kernel = harness.KERNEL_IMPLEMENTATION
    op = functools.partial(liger_jax.modulated_rms_norm, implementation=kernel)
    _, (_, _, dscale, dshift) = harness.vjp_under_jit(op, (x, weight, scale, shift), dy)
    normed = liger_jax.rms_norm(x, weight, casting_mode="llama", implementation=kernel)
    np.testing.assert_array_equal(dshift, dy)
    np.testing.assert_allclose(dscale, dy * normed, rtol=1e-6, atol=1e-6)
    per_example = (x, weight, scale[:, 0], shift[:, 0])
    _, (_, _, dscale, dshift) = harness.vjp_under_jit(op, per_example, dy)
    np.testing.assert_allclose(dshift, dy.sum(axis=1), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(dscale, jnp.sum(dy * normed, axis=1), rtol=1e-5, atol=1e-5)


def test_modulated_rows_shard_per_token():
    mesh_ = mesh((4,), ("data",))
    x, weight, scale, shift = _modulated_inputs(31, (8, 6, 32), (8, 6, 32), jnp.float32)
    dy = harness.random_normal(32, x.shape, jnp.float32)
    op = functools.partial(liger_jax.modulated_rms_norm, implementation=harness.KERNEL_IMPLEMENTATION)

    @jax.jit
    def program(x, weight, scale, shift, dy):
        y, pullback = jax.vjp(op, x, weight, scale, shift)
        return y, pullback(dy)

    expected = program(x, weight, scale, shift, dy)
    rows = [place(a, mesh_, "data") for a in (x, scale, shift, dy)]
    sharded = (rows[0], place(weight, mesh_), rows[1], rows[2], rows[3])
    y, grads = program(*sharded)
    chex.assert_trees_all_close((y, grads), expected, atol=1e-5, rtol=1e-5)
    assert y.sharding.spec[0] == "data" and grads[2].sharding.spec[0] == "data"
    assert_only_small_all_reduces(compiled_collectives(program, *sharded), nbytes(weight) + 64)


@pytest.mark.parametrize("prefetch", [False, True])
@pytest.mark.parametrize(
    ("x_shape", "scale_shape"), [((2, 7, 24), (2, 24)), ((9, 24), (24,)), ((2, 7, 24), (2, 7, 24))]
)
def test_modulation_groups_split_over_programs_and_tiles(x_shape, scale_shape, prefetch):
    # Two-row tiles: per example, each program walks its group's 4 tiles, the last one partial; shared, the group's
    # 5 tiles go to 3 programs; per token, the 7 tiles of all rows go to 3 programs. Every partial of dscale and
    # dshift must land in its own group's sum, with the next tile loaded ahead (prefetch) or not.
    primals = _modulated_inputs(35, x_shape, scale_shape, jnp.float32)
    cotangent = harness.random_normal(36, x_shape, jnp.float32)
    op = functools.partial(liger_jax.modulated_rms_norm, implementation=harness.KERNEL_IMPLEMENTATION)
    with _tiling.overridden(_tiling.TilingOverride(block_rows=2, prefetch=prefetch)):
        got = harness.vjp_under_jit(op, primals, cotangent)
    reference = liger_jax.modulated_rms_norm_reference
    expected = harness.vjp_under_jit(reference, harness.as_float64(*primals), *harness.as_float64(cotangent))
    chex.assert_trees_all_close(got, jax.tree.map(lambda a: a.astype(jnp.float32), expected), atol=1e-5, rtol=1e-5)


def test_modulation_groups_vmap_fold_into_groups_and_map_gradients():
    # vmap folds the mapped axis into the groups of the forward launch; the backward (partial sums) maps over it.
    x, weight, scale, shift = _modulated_inputs(39, (3, 2, 5, 24), (3, 2, 24), jnp.float32)
    op = functools.partial(liger_jax.modulated_rms_norm, implementation=harness.KERNEL_IMPLEMENTATION)

    def loss(op):
        return lambda x, scale, shift: jnp.sum(op(x, weight, scale, shift) ** 2)

    got = jax.jit(jax.vmap(jax.value_and_grad(loss(op), argnums=(0, 1, 2))))(x, scale, shift)
    reference = loss(liger_jax.modulated_rms_norm_reference)
    want = jax.vmap(jax.value_and_grad(reference, argnums=(0, 1, 2)))(*harness.as_float64(x, scale, shift))
    harness.assert_close_trees(got, want, jnp.float32)


@pytest.mark.parametrize("spec", [("data",), (None, "data")], ids=["examples", "tokens"])
def test_modulation_groups_shard_over_examples_and_tokens(spec):
    mesh_ = mesh((4,), ("data",))
    x, weight, scale, shift = _modulated_inputs(37, (8, 8, 32), (8, 32), jnp.float32)
    dy = harness.random_normal(38, x.shape, jnp.float32)
    op = functools.partial(liger_jax.modulated_rms_norm, implementation=harness.KERNEL_IMPLEMENTATION)

    @jax.jit
    def program(x, weight, scale, shift, dy):
        y, pullback = jax.vjp(op, x, weight, scale, shift)
        return y, pullback(dy)

    expected = program(x, weight, scale, shift, dy)
    modulation = spec[:1] if spec[0] else ()
    sharded = (
        place(x, mesh_, *spec),
        place(weight, mesh_),
        place(scale, mesh_, *modulation),
        place(shift, mesh_, *modulation),
        place(dy, mesh_, *spec),
    )
    y, grads = program(*sharded)
    chex.assert_trees_all_close((y, grads), expected, atol=1e-5, rtol=1e-5)
    assert y.sharding.spec == jax.sharding.PartitionSpec(*spec)
    # Only partial sums cross devices: dweight, and per token dscale and dshift.
    assert_only_small_all_reduces(compiled_collectives(program, *sharded), nbytes(weight, scale, shift) + 64)


def test_modulated_modules_hold_liger_params():
    x, _, scale, shift = _modulated_inputs(33, (2, 3, 16), (2, 16), jnp.bfloat16)
    kernel = harness.KERNEL_IMPLEMENTATION
    settings = {"epsilon": 1e-5, "offset": 1.0, "casting_mode": "gemma", "init_fn": "zeros", "implementation": kernel}
    nnx_norm = liger_nnx.ModulatedRMSNorm(16, **settings)
    linen_norm = liger_linen.ModulatedRMSNorm(**settings)
    params = linen_norm.init(jax.random.key(0), x, scale, shift)
    chex.assert_trees_all_equal(nnx.to_pure_dict(nnx.state(nnx_norm, nnx.Param)), params["params"])
    expected = liger_jax.modulated_rms_norm_reference(
        x, jnp.zeros(16), scale, shift, epsilon=1e-5, offset=1.0, casting_mode="gemma"
    )
    harness.assert_close(nnx_norm(x, scale, shift), expected, jnp.bfloat16)
    harness.assert_close(linen_norm.apply(params, x, scale, shift), expected, jnp.bfloat16)
    assert liger_nnx.ModulatedRMSNorm(16, elementwise_affine=False).weight is None
    with pytest.raises(ValueError, match="init_fn"):
        liger_nnx.ModulatedRMSNorm(16, init_fn="normal")


@pytest.mark.parametrize(
    ("shapes", "kwargs", "error", "match"),
    [
        (((2, 5, 8), (8,), (5, 8), None), {}, ValueError, "scale must broadcast over x's leading axes"),
        (((2, 5, 8), (8,), (2, 5, 4), None), {}, ValueError, r"scale must have shape \(2, 5, 8\)"),
        (((2, 5, 8), (8,), (2, 8), (8,)), {}, ValueError, r"shift must have shape \(2, 8\)"),
        (((2, 5, 8), (7,), (2, 8), None), {}, ValueError, r"weight must have shape \(8,\)"),
        (((2, 8), (8,), (2, 8), None), {"casting_mode": "mistral"}, ValueError, "casting_mode"),
        (((2, 16385), None, (16385,), None), {}, ValueError, "implementation='xla'"),
        (((2, 8), (8,), (2, 8), None), {}, TypeError, "scale must have a float dtype"),
    ],
)
def test_modulated_bad_inputs_raise_clear_errors(shapes, kwargs, error, match):
    dtypes = (jnp.float32, jnp.float32, jnp.int32 if error is TypeError else jnp.float32, jnp.float32)
    harness.assert_call_raises(error, match, liger_jax.modulated_rms_norm, shapes, dtypes, **kwargs)
