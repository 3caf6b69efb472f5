"""The Flax LayerNorm drop-ins: same param tree and same outputs and gradients as flax's own modules."""

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest
from flax import nnx

import liger_jax
from liger_jax.flax_layers import linen as liger_linen
from liger_jax.flax_layers import nnx as liger_nnx
from tests import harness

# (use_scale, use_bias) without the default (True, True).
PARTIAL_WEIGHTS = [(False, True), (True, False), (False, False)]


def _nnx_pair(features, implementation, **options):
    ours = liger_nnx.LayerNorm(features, implementation=implementation, rngs=nnx.Rngs(0), **options)
    theirs = nnx.LayerNorm(features, rngs=nnx.Rngs(0), **options)
    for seed, name in enumerate(("scale", "bias")):
        param = getattr(ours, name)
        if param is not None:
            value = harness.random_normal(seed + 3, (features,), param.dtype)
            getattr(ours, name)[...], getattr(theirs, name)[...] = value, value
    chex.assert_trees_all_equal_structs(nnx.state(ours, nnx.Param), nnx.state(theirs, nnx.Param))
    return ours, theirs


def _assert_nnx_matches(ours, theirs, x, precision):
    expected = theirs(x)
    actual = jax.jit(lambda x: ours(x))(x)
    chex.assert_type(actual, expected.dtype)
    harness.assert_close(actual, expected, expected.dtype)
    cotangent = harness.random_normal(4, x.shape, expected.dtype)

    def pullback(module):
        def loss(module, x):
            return jnp.sum(module(x).astype(jnp.float32) * cotangent.astype(jnp.float32))

        return nnx.grad(loss, argnums=(0, 1))(module, x)

    harness.assert_close_trees(pullback(ours), pullback(theirs), precision)


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
@pytest.mark.parametrize(("x_dtype", "param_dtype", "dtype"), harness.FLAX_DTYPE_CASES)
def test_nnx_matches_flax(implementation, x_dtype, param_dtype, dtype):
    ours, theirs = _nnx_pair(72, implementation, param_dtype=param_dtype, dtype=dtype)
    x = harness.random_normal(1, (2, 5, 72), x_dtype)
    _assert_nnx_matches(ours, theirs, x, harness.least_precise(x_dtype, param_dtype, dtype))


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
@pytest.mark.parametrize(("use_scale", "use_bias"), PARTIAL_WEIGHTS)
def test_nnx_without_scale_or_bias_matches_flax(implementation, use_scale, use_bias):
    ours, theirs = _nnx_pair(40, implementation, use_scale=use_scale, use_bias=use_bias, epsilon=1e-5)
    _assert_nnx_matches(ours, theirs, harness.random_normal(2, (9, 40), jnp.float32), jnp.float32)


def _assert_linen_matches(implementation, x, **options):
    ours = liger_linen.LayerNorm(implementation=implementation, **options)
    theirs = nn.LayerNorm(**options)
    params = theirs.init(jax.random.key(0), x)
    params = jax.tree.map(lambda p: harness.random_normal(6, p.shape, p.dtype), params)
    chex.assert_trees_all_equal_structs(ours.init(jax.random.key(0), x), params)
    expected = theirs.apply(params, x)
    actual = jax.jit(ours.apply)(params, x)
    chex.assert_type(actual, expected.dtype)
    harness.assert_close(actual, expected, expected.dtype)
    expected_grads = jax.grad(lambda p, x: jnp.sum(jnp.sin(theirs.apply(p, x).astype(jnp.float32))), (0, 1))
    actual_grads = jax.grad(lambda p, x: jnp.sum(jnp.sin(ours.apply(p, x).astype(jnp.float32))), (0, 1))
    precision = harness.least_precise(x.dtype, options.get("param_dtype"), options.get("dtype"))
    harness.assert_close_trees(actual_grads(params, x), expected_grads(params, x), precision)


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
@pytest.mark.parametrize(("x_dtype", "param_dtype", "dtype"), harness.FLAX_DTYPE_CASES)
def test_linen_matches_flax(implementation, x_dtype, param_dtype, dtype):
    x = harness.random_normal(5, (3, 4, 56), x_dtype)
    _assert_linen_matches(implementation, x, param_dtype=param_dtype, dtype=dtype)


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
@pytest.mark.parametrize(("use_scale", "use_bias"), PARTIAL_WEIGHTS)
def test_linen_without_scale_or_bias_matches_flax(implementation, use_scale, use_bias):
    x = harness.random_normal(7, (9, 40), jnp.float32)
    _assert_linen_matches(implementation, x, use_scale=use_scale, use_bias=use_bias, epsilon=1e-5)


def test_module_calls_the_kernel_with_its_params():
    module = liger_nnx.LayerNorm(16, epsilon=1e-5, rngs=nnx.Rngs(0))
    x = harness.random_normal(8, (4, 16), jnp.float32)
    chex.assert_trees_all_equal(module(x), liger_jax.layer_norm(x, module.scale[...], module.bias[...]))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"reduction_axes": 1}, "reduction_axes"),
        ({"feature_axes": (0, 2)}, "feature_axes"),
        ({"axis_name": "batch"}, "axis_name"),
        ({"axis_index_groups": [[0]]}, "axis_index_groups"),
    ],
)
def test_unsupported_options_raise(options, message):
    x = harness.random_normal(9, (2, 3, 8), jnp.float32)
    with pytest.raises(ValueError, match=message):
        liger_nnx.LayerNorm(8, rngs=nnx.Rngs(0), **options)(x)
    with pytest.raises(ValueError, match=message):
        liger_linen.LayerNorm(**options).init(jax.random.key(0), x)


def test_mask_and_low_precision_reductions_raise():
    x = harness.random_normal(10, (2, 8), jnp.float32)
    mask = jnp.ones_like(x, bool)
    with pytest.raises(ValueError, match="mask"):
        liger_nnx.LayerNorm(8, rngs=nnx.Rngs(0))(x, mask=mask)
    with pytest.raises(ValueError, match="mask"):
        liger_linen.LayerNorm().init(jax.random.key(0), x, mask=mask)
    with pytest.raises(ValueError, match="force_float32_reductions"):
        liger_linen.LayerNorm(force_float32_reductions=False).init(jax.random.key(0), x)
