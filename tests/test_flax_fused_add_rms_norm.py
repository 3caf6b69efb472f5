"""The Flax FusedAddRMSNorm modules (and liger RMSNorm's ``fused_add``): ``(y, s)`` with ``s = x + residual`` and
``y`` flax's RMSNorm of it, values and gradients; one kernel where flax's promotion keeps x's dtype."""

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from liger_jax.flax_layers import linen as liger_linen
from liger_jax.flax_layers import nnx as liger_nnx
from tests import harness

# (x dtype, param dtype, dtype): flax's promotion keeps x's dtype in the first three (one kernel), widens it in the
# last two (the add, then the norm).
DTYPE_CASES = [
    (jnp.float32, jnp.float32, None),
    (jnp.bfloat16, jnp.bfloat16, None),
    (jnp.bfloat16, jnp.float32, jnp.bfloat16),
    (jnp.bfloat16, jnp.float32, None),
    (jnp.float16, jnp.float32, jnp.float32),
]


def _one_kernel(x_dtype, param_dtype, dtype):
    return jnp.promote_types(x_dtype, dtype or param_dtype) == x_dtype


def _operands(seed, shape, dtype):
    return harness.random_normal(seed, shape, dtype), harness.random_normal(seed + 1, shape, dtype)


def _top_level_adds(function, *args):
    return sum(equation.primitive.name == "add" for equation in jax.make_jaxpr(function)(*args).eqns)


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
@pytest.mark.parametrize(("x_dtype", "param_dtype", "dtype"), DTYPE_CASES)
def test_nnx_matches_flax_add_then_norm(implementation, x_dtype, param_dtype, dtype):
    ours = liger_nnx.FusedAddRMSNorm(
        72, param_dtype=param_dtype, dtype=dtype, implementation=implementation, rngs=nnx.Rngs(0)
    )
    theirs = nnx.RMSNorm(72, param_dtype=param_dtype, dtype=dtype, rngs=nnx.Rngs(0))
    ours.scale[...] = theirs.scale[...] = harness.random_normal(3, (72,), param_dtype)
    chex.assert_trees_all_equal_structs(nnx.state(ours, nnx.Param), nnx.state(theirs, nnx.Param))
    x, residual = _operands(1, (2, 5, 72), x_dtype)
    cotangents = (harness.random_normal(4, (2, 5, 72), theirs(x).dtype), harness.random_normal(5, x.shape, x_dtype))

    def pullback(norm):
        def loss(module, x, residual):
            y, total = norm(module, x, residual)
            return jnp.sum(y.astype(jnp.float32) * cotangents[0]) + jnp.sum(total.astype(jnp.float32) * cotangents[1])

        return nnx.value_and_grad(loss, argnums=(0, 1, 2))

    def flax_add_then_norm(module, x, residual):
        return module(x + residual), x + residual

    (y, total), (expected_y, expected_total) = ours(x, residual), flax_add_then_norm(theirs, x, residual)
    chex.assert_type([y, total], [expected_y.dtype, x_dtype])
    harness.assert_close(y, expected_y, expected_y.dtype)
    harness.assert_close(total, expected_total, x_dtype)
    (_, (ours_params, dx, dresidual)) = pullback(lambda m, x, r: m(x, r))(ours, x, residual)
    (_, (theirs_params, expected_dx, expected_dresidual)) = pullback(flax_add_then_norm)(theirs, x, residual)
    precision = harness.least_precise(x_dtype, param_dtype, dtype)
    harness.assert_close(dx, expected_dx, precision)
    harness.assert_close(dresidual, expected_dresidual, precision)
    harness.assert_close(ours_params.scale[...], theirs_params.scale[...], precision)


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
@pytest.mark.parametrize(("x_dtype", "param_dtype", "dtype"), DTYPE_CASES)
def test_linen_matches_flax_add_then_norm(implementation, x_dtype, param_dtype, dtype):
    options = {"param_dtype": param_dtype, "dtype": dtype, "epsilon": 1e-5}
    ours = liger_linen.FusedAddRMSNorm(implementation=implementation, **options)
    theirs = nn.RMSNorm(**options)
    x, residual = _operands(6, (3, 4, 56), x_dtype)
    params = {"params": {"scale": harness.random_normal(8, (56,), param_dtype)}}
    chex.assert_trees_all_equal_structs(ours.init(jax.random.key(0), x, residual), params)

    def flax_add_then_norm(params, x, residual):
        return theirs.apply(params, x + residual), x + residual

    # Both jitted: XLA may keep the bf16 sum's excess precision where it feeds the norm, in either.
    y, total = jax.jit(ours.apply)(params, x, residual)
    expected_y, expected_total = jax.jit(flax_add_then_norm)(params, x, residual)
    chex.assert_type([y, total], [expected_y.dtype, x_dtype])
    harness.assert_close(y, expected_y, expected_y.dtype)
    harness.assert_close(total, expected_total, x_dtype)

    cotangents = (harness.random_normal(13, x.shape, expected_y.dtype), harness.random_normal(14, x.shape, x_dtype))

    def loss(apply):
        def value(params, x, residual):
            y, total = apply(params, x, residual)
            return sum(jnp.sum(out.astype(jnp.float32) * c) for out, c in zip((y, total), cotangents, strict=True))

        return jax.grad(value, argnums=(0, 1, 2))

    precision = harness.least_precise(x_dtype, param_dtype, dtype)
    harness.assert_close_trees(
        jax.jit(loss(ours.apply))(params, x, residual),
        jax.jit(loss(flax_add_then_norm))(params, x, residual),
        precision,
    )


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
@pytest.mark.parametrize(("x_dtype", "param_dtype", "dtype"), DTYPE_CASES)
def test_without_residual_both_frameworks_match_flax_norm_passing_x_on(implementation, x_dtype, param_dtype, dtype):
    # residual None: (flax's norm of x, x itself), and x's gradient sums both outputs' cotangents.
    options = {"param_dtype": param_dtype, "dtype": dtype}
    nnx_norm = liger_nnx.FusedAddRMSNorm(40, implementation=implementation, rngs=nnx.Rngs(0), **options)
    linen_norm = liger_linen.FusedAddRMSNorm(implementation=implementation, **options)
    theirs = nn.RMSNorm(**options)
    x = harness.random_normal(15, (3, 5, 40), x_dtype)
    params = {"params": {"scale": harness.random_normal(16, (40,), param_dtype)}}
    graphdef, state = nnx.split(nnx_norm)
    out_dtype = theirs.apply(params, x).dtype
    cotangents = (harness.random_normal(17, x.shape, out_dtype), harness.random_normal(18, x.shape, x_dtype))

    def value_and_grads(apply):
        def value(params, x):
            y, total = apply(params, x)
            return sum(jnp.sum(out.astype(jnp.float32) * c) for out, c in zip((y, total), cotangents, strict=True))

        return jax.jit(lambda params, x: (apply(params, x), jax.grad(value, argnums=(0, 1))(params, x)))(params, x)

    def with_nnx_scale(params, x):
        scale_only = jax.tree.map(lambda _: params["params"]["scale"], state)
        return nnx.merge(graphdef, scale_only)(x, None)

    expected = value_and_grads(lambda params, x: (theirs.apply(params, x), x))
    precision = harness.least_precise(x_dtype, param_dtype, dtype)
    for apply in (lambda params, x: linen_norm.apply(params, x, None), with_nnx_scale):
        (y, total), grads = value_and_grads(apply)
        chex.assert_trees_all_equal(total, x)
        harness.assert_close(y, expected[0][0], out_dtype)
        harness.assert_close_trees(grads, expected[1], precision)


@pytest.mark.parametrize(("x_dtype", "param_dtype", "dtype"), DTYPE_CASES)
def test_one_kernel_where_flax_keeps_x_dtype_else_the_add_and_the_norm(x_dtype, param_dtype, dtype):
    implementation = harness.KERNEL_IMPLEMENTATION
    nnx_norm = liger_nnx.FusedAddRMSNorm(
        16, param_dtype=param_dtype, dtype=dtype, implementation=implementation, rngs=nnx.Rngs(0)
    )
    linen_norm = liger_linen.FusedAddRMSNorm(param_dtype=param_dtype, dtype=dtype, implementation=implementation)
    x, residual = _operands(12, (4, 16), x_dtype)
    params = linen_norm.init(jax.random.key(0), x, residual)
    adds = 0 if _one_kernel(x_dtype, param_dtype, dtype) else 1
    assert _top_level_adds(lambda x, r: nnx_norm(x, r), x, residual) == adds
    assert _top_level_adds(lambda x, r: linen_norm.apply(params, x, r), x, residual) == adds


def test_gemma_offset_reaches_the_fused_kernel():
    ours = liger_nnx.FusedAddRMSNorm(
        24, offset=1.0, casting_mode="gemma", implementation=harness.KERNEL_IMPLEMENTATION, rngs=nnx.Rngs(0)
    )
    ours.scale[...] = harness.random_normal(9, (24,), jnp.float32)
    theirs = liger_nnx.RMSNorm(24, offset=1.0, casting_mode="gemma", implementation="xla", rngs=nnx.Rngs(0))
    theirs.scale = ours.scale
    x, residual = _operands(10, (7, 24), jnp.float32)
    y, total = ours(x, residual)
    harness.assert_close(y, theirs(x + residual), jnp.float32)


def test_residual_of_another_dtype_or_shape_raises():
    norm = liger_nnx.FusedAddRMSNorm(8, implementation=harness.KERNEL_IMPLEMENTATION, rngs=nnx.Rngs(0))
    x = harness.random_normal(11, (3, 8), jnp.float32)
    with pytest.raises(TypeError, match="residual"):
        norm(x, x.astype(jnp.bfloat16))
    with pytest.raises(ValueError, match="residual"):
        norm(x, x[:2])
