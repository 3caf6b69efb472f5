"""SwiGLU and GeGLU: every implementation against the float64 reference, values and gradients; Flax MLPs."""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn
from flax import nnx
from jax.test_util import check_grads

import liger_jax
from liger_jax.flax_layers import linen as liger_linen
from liger_jax.flax_layers import nnx as liger_nnx
from tests import harness

# A scalar, one element, several programs with a partial last block (the kernel takes 4096 elements a program).
SHAPES = [(), (1,), (37, 123), (3, 7, 96), (5, 2000)]
OPS = {
    "swiglu": (liger_jax.swiglu, liger_jax.swiglu_reference, jax.nn.silu),
    "geglu": (liger_jax.geglu, liger_jax.geglu_reference, functools.partial(jax.nn.gelu, approximate=True)),
}


def _op(name, implementation):
    op = OPS[name][0]
    return lambda gate, up: op(gate, up, implementation=implementation)


def _check_against_reference(name, implementation, gate, up, cotangent, dtype):
    out, grads = harness.vjp_under_jit(_op(name, implementation), (gate, up), cotangent)
    expected, expected_grads = harness.vjp_under_jit(
        OPS[name][1], harness.as_float64(gate, up), harness.as_float64(cotangent)[0]
    )
    chex.assert_type([out, *grads], dtype)
    chex.assert_shape([out, *grads], gate.shape)
    harness.assert_close(out, expected, dtype)
    harness.assert_close_trees(grads, expected_grads, dtype)


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
@pytest.mark.parametrize("name", OPS)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", harness.DTYPES)
def test_values_and_gradients_match_float64_reference(implementation, name, shape, dtype):
    seed = len(shape) + sum(shape)
    gate = harness.random_normal(seed, shape, dtype, scale=2.0)
    up = harness.random_normal(seed + 1, shape, dtype)
    _check_against_reference(name, implementation, gate, up, harness.random_normal(seed + 2, shape, dtype), dtype)


# The interpreter's exp overflows to inf (σ → 0, as on the GPU) and numpy warns.
@pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")
@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
@pytest.mark.parametrize("name", OPS)
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_saturated_activations(implementation, name, dtype):
    gate = jnp.asarray([-1e4, -100.0, -30.0, -8.0, -1e-3, 0.0, 1e-3, 8.0, 30.0, 100.0, 1e4], dtype)
    up = jnp.linspace(-2.0, 2.0, gate.size).astype(dtype)
    _check_against_reference(name, implementation, gate, up, jnp.ones_like(gate), dtype)


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
@pytest.mark.parametrize("name", OPS)
def test_check_grads_fp32(implementation, name):
    gate, up = harness.random_normal(1, (6, 40), jnp.float32), harness.random_normal(2, (6, 40), jnp.float32)
    check_grads(_op(name, implementation), (gate, up), order=1, modes=["rev"])


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
@pytest.mark.parametrize("in_axes", [(0, 0), (0, None), (None, 1)])
def test_vmap_values_and_gradients(implementation, in_axes):
    shapes = {0: (4, 9, 30), 1: (9, 4, 30), None: (9, 30)}
    gate = harness.random_normal(3, shapes[in_axes[0]], jnp.float32)
    up = harness.random_normal(4, shapes[in_axes[1]], jnp.float32)

    def loss(op):
        return lambda gate, up: jnp.sum(jnp.sin(op(gate, up)))

    batched = jax.vmap(jax.value_and_grad(loss(_op("swiglu", implementation)), argnums=(0, 1)), in_axes=in_axes)
    expected = jax.vmap(jax.value_and_grad(loss(liger_jax.swiglu_reference), argnums=(0, 1)), in_axes=in_axes)
    harness.assert_close_trees(
        jax.jit(batched)(gate, up), jax.jit(expected)(*harness.as_float64(gate, up)), jnp.float32
    )


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
def test_checkpoint_gives_the_same_gradients(implementation):
    gate, up = harness.random_normal(5, (7, 50), jnp.float32), harness.random_normal(6, (7, 50), jnp.float32)

    def loss(gate, up):
        return jnp.sum(jnp.sin(liger_jax.geglu(gate, up, implementation=implementation)))

    plain = jax.jit(jax.grad(loss, argnums=(0, 1)))(gate, up)
    remat = jax.jit(jax.grad(jax.checkpoint(loss), argnums=(0, 1)))(gate, up)
    chex.assert_trees_all_close(plain, remat, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("name", OPS)
def test_empty_input_gives_empty_output(name):
    gate = jnp.zeros((0, 16), jnp.float32)
    out, grads = harness.vjp_under_jit(_op(name, harness.KERNEL_IMPLEMENTATION), (gate, gate), gate)
    chex.assert_shape([out, *grads], (0, 16))


@pytest.mark.parametrize(
    ("gate", "up", "error", "match"),
    [
        (jnp.ones((2, 8), jnp.float32), jnp.ones((2, 7), jnp.float32), ValueError, r"up must have shape \(2, 8\)"),
        (jnp.ones((2, 8), jnp.float32), jnp.ones((8,), jnp.float32), ValueError, r"up must have shape \(2, 8\)"),
        (jnp.ones((2, 8), jnp.float32), jnp.ones((2, 8), jnp.bfloat16), TypeError, "up must have dtype float32"),
        (jnp.ones((2, 8), jnp.int32), jnp.ones((2, 8), jnp.int32), TypeError, "gate must have a float dtype"),
        (jnp.ones((2, 8), jnp.float64), jnp.ones((2, 8), jnp.float64), TypeError, "gate must have a float dtype"),
    ],
)
@pytest.mark.parametrize("name", OPS)
def test_bad_inputs_raise_clear_errors(gate, up, error, match, name):
    with pytest.raises(error, match=match):
        _op(name, harness.KERNEL_IMPLEMENTATION)(gate, up)


# Full-precision matmuls: a GPU's default TF32 would turn the MLPs' last-bit differences into 1e-3 ones.
HIGHEST = jax.lax.Precision.HIGHEST


class _PlainNNXMLP(nnx.Module):
    """The same MLP in plain flax.nnx, the oracle of the liger MLPs."""

    def __init__(self, hidden, intermediate, activation, *, rngs):
        linear = functools.partial(nnx.Linear, use_bias=False, precision=HIGHEST, rngs=rngs)
        self.gate_proj = linear(hidden, intermediate)
        self.up_proj = linear(hidden, intermediate)
        self.down_proj = linear(intermediate, hidden)
        self.activation = activation

    def __call__(self, x):
        return self.down_proj(self.activation(self.gate_proj(x)) * self.up_proj(x))


class _PlainLinenMLP(nn.Module):
    intermediate: int
    activation: callable

    @nn.compact
    def __call__(self, x):
        dense = functools.partial(nn.Dense, use_bias=False, precision=HIGHEST)
        gate = dense(self.intermediate, name="gate_proj")(x)
        up = dense(self.intermediate, name="up_proj")(x)
        return dense(x.shape[-1], name="down_proj")(self.activation(gate) * up)


MLPS = {"swiglu": ("SwiGLUMLP", jax.nn.silu), "geglu": ("GEGLUMLP", OPS["geglu"][2])}


@pytest.mark.parametrize("name", OPS)
def test_nnx_mlp_equals_plain_flax(name):
    class_name, activation = MLPS[name]
    model = getattr(liger_nnx, class_name)(
        24, 40, precision=HIGHEST, implementation=harness.KERNEL_IMPLEMENTATION, rngs=nnx.Rngs(0)
    )
    plain = _PlainNNXMLP(24, 40, activation, rngs=nnx.Rngs(1))
    params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    chex.assert_trees_all_equal_shapes(params, nnx.to_pure_dict(nnx.state(plain, nnx.Param)))
    nnx.update(plain, nnx.state(model, nnx.Param))
    x = harness.random_normal(7, (2, 5, 24), jnp.float32)

    def loss(model, x):
        return jnp.sum(jnp.sin(model(x)))

    def value_and_grads(model):
        value, (dmodel, dx) = nnx.jit(nnx.value_and_grad(loss, argnums=(0, 1)))(model, x)
        return value, nnx.to_pure_dict(dmodel), dx

    harness.assert_close_trees(value_and_grads(model), value_and_grads(plain), jnp.float32)


@pytest.mark.parametrize("name", OPS)
def test_linen_mlp_equals_plain_flax(name):
    class_name, activation = MLPS[name]
    model = getattr(liger_linen, class_name)(40, precision=HIGHEST, implementation=harness.KERNEL_IMPLEMENTATION)
    plain = _PlainLinenMLP(40, activation)
    x = harness.random_normal(8, (2, 5, 24), jnp.float32)
    params = model.init(jax.random.key(0), x)
    chex.assert_trees_all_equal_shapes(params, plain.init(jax.random.key(0), x))

    def loss(module):
        return lambda params, x: jnp.sum(jnp.sin(module.apply(params, x)))

    got = jax.jit(jax.value_and_grad(loss(model), argnums=(0, 1)))(params, x)
    expected = jax.jit(jax.value_and_grad(loss(plain), argnums=(0, 1)))(params, x)
    harness.assert_close_trees(got, expected, jnp.float32)


def test_mlp_options_reach_the_projections():
    model = liger_nnx.SwiGLUMLP(8, 16, use_bias=True, dtype=jnp.bfloat16, param_dtype=jnp.float16, rngs=nnx.Rngs(0))
    chex.assert_type(model.gate_proj.bias[...], jnp.float16)
    chex.assert_type(model(jnp.ones((3, 8), jnp.float32)), jnp.bfloat16)
    linen = liger_linen.GEGLUMLP(16, use_bias=True, dtype=jnp.bfloat16, param_dtype=jnp.float16)
    y, params = linen.init_with_output(jax.random.key(0), jnp.ones((3, 8), jnp.float32))
    chex.assert_type([y, params["params"]["down_proj"]["bias"]], [jnp.bfloat16, jnp.float16])
    np.testing.assert_equal(params["params"]["down_proj"]["bias"].shape, (8,))
