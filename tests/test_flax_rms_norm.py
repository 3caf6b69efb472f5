"""The Flax RMSNorm drop-ins: same param tree and same outputs and gradients as flax's own modules."""

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

DTYPE_CASES = harness.FLAX_DTYPE_CASES


def _nnx_pair(features, implementation, **options):
    ours = liger_nnx.RMSNorm(features, implementation=implementation, rngs=nnx.Rngs(0), **options)
    theirs = nnx.RMSNorm(features, rngs=nnx.Rngs(0), **options)
    if ours.scale is not None:
        scale = harness.random_normal(3, (features,), ours.scale.dtype)
        ours.scale[...], theirs.scale[...] = scale, scale
    return ours, theirs


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
@pytest.mark.parametrize(("x_dtype", "param_dtype", "dtype"), DTYPE_CASES)
@pytest.mark.parametrize("use_scale", [True, False])
def test_nnx_matches_flax(implementation, x_dtype, param_dtype, dtype, use_scale):
    ours, theirs = _nnx_pair(72, implementation, param_dtype=param_dtype, dtype=dtype, use_scale=use_scale)
    chex.assert_trees_all_equal_structs(nnx.state(ours, nnx.Param), nnx.state(theirs, nnx.Param))
    x = harness.random_normal(1, (2, 5, 72), x_dtype)
    expected = theirs(x)
    actual = jax.jit(lambda x: ours(x))(x)
    chex.assert_type(actual, expected.dtype)
    harness.assert_close(actual, expected, expected.dtype)


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
@pytest.mark.parametrize(("x_dtype", "param_dtype", "dtype"), DTYPE_CASES)
def test_nnx_gradients_match_flax(implementation, x_dtype, param_dtype, dtype):
    ours, theirs = _nnx_pair(40, implementation, param_dtype=param_dtype, dtype=dtype)
    x = harness.random_normal(2, (9, 40), x_dtype)
    cotangent = harness.random_normal(4, (9, 40), theirs(x).dtype)

    def pullback(module):
        def loss(module, x):
            return jnp.sum(module(x).astype(jnp.float32) * cotangent.astype(jnp.float32))

        return nnx.grad(loss, argnums=(0, 1))(module, x)

    (ours_params, ours_dx), (theirs_params, theirs_dx) = pullback(ours), pullback(theirs)
    precision = harness.least_precise(x_dtype, param_dtype, dtype)
    harness.assert_close(ours_dx, theirs_dx, precision)
    harness.assert_close(ours_params.scale[...], theirs_params.scale[...], precision)


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
@pytest.mark.parametrize(("x_dtype", "param_dtype", "dtype"), DTYPE_CASES)
@pytest.mark.parametrize("use_scale", [True, False])
def test_linen_matches_flax(implementation, x_dtype, param_dtype, dtype, use_scale):
    options = {"param_dtype": param_dtype, "dtype": dtype, "use_scale": use_scale, "epsilon": 1e-5}
    ours = liger_linen.RMSNorm(implementation=implementation, **options)
    theirs = nn.RMSNorm(**options)
    x = harness.random_normal(5, (3, 4, 56), x_dtype)
    params = theirs.init(jax.random.key(0), x)
    if use_scale:
        params = {"params": {"scale": harness.random_normal(6, (56,), param_dtype)}}
    chex.assert_trees_all_equal_structs(ours.init(jax.random.key(0), x), params)
    expected = theirs.apply(params, x)
    actual = jax.jit(ours.apply)(params, x)
    chex.assert_type(actual, expected.dtype)
    harness.assert_close(actual, expected, expected.dtype)
    expected_grads = jax.grad(lambda p: jnp.sum(theirs.apply(p, x).astype(jnp.float32) ** 2))(params)
    actual_grads = jax.grad(lambda p: jnp.sum(ours.apply(p, x).astype(jnp.float32) ** 2))(params)
    harness.assert_close_trees(actual_grads, expected_grads, harness.least_precise(x_dtype, param_dtype, dtype))


def test_gemma_offset_and_llama_casting_reach_the_kernel():
    module = liger_nnx.RMSNorm(16, offset=1.0, casting_mode="llama", dtype=jnp.bfloat16, rngs=nnx.Rngs(0))
    x = harness.random_normal(7, (4, 16), jnp.bfloat16)
    expected = liger_jax.rms_norm(x, module.scale[...].astype(jnp.bfloat16), offset=1.0, casting_mode="llama")
    chex.assert_trees_all_equal(module(x), expected)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"reduction_axes": 1}, "reduction_axes"),
        ({"feature_axes": (0, 2)}, "feature_axes"),
        ({"axis_name": "batch"}, "axis_name"),
    ],
)
def test_unsupported_options_raise(options, message):
    x = harness.random_normal(8, (2, 3, 8), jnp.float32)
    with pytest.raises(ValueError, match=message):
        liger_nnx.RMSNorm(8, rngs=nnx.Rngs(0), **options)(x)
    with pytest.raises(ValueError, match=message):
        liger_linen.RMSNorm(**options).init(jax.random.key(0), x)


def test_mask_and_float_reductions_raise():
    x = harness.random_normal(9, (2, 8), jnp.float32)
    with pytest.raises(ValueError, match="mask"):
        liger_nnx.RMSNorm(8, rngs=nnx.Rngs(0))(x, mask=jnp.ones_like(x, bool))
    with pytest.raises(ValueError, match="force_float32_reductions"):
        liger_linen.RMSNorm(force_float32_reductions=False).init(jax.random.key(0), x)
    with pytest.raises(ValueError, match="offset"):
        liger_nnx.RMSNorm(8, offset=1.0, use_scale=False, rngs=nnx.Rngs(0))
