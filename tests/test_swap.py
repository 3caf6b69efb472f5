"""Module swapping: apply_liger keeps the NNX state (tree and Param objects) and the outputs; liger_intercept routes
linen modules to the kernels with their own params, during init and apply."""

import warnings

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
import pytest
from flax import nnx

import liger_jax
from liger_jax.flax_layers import KINDS, apply_liger, liger_intercept, register_swap
from liger_jax.flax_layers import linen as liger_linen
from liger_jax.flax_layers import nnx as liger_nnx
from tests import harness, model_checks

IMPLEMENTATION = harness.KERNEL_IMPLEMENTATION
FEATURES = 24


pytestmark = pytest.mark.usefixtures("full_precision_matmuls")


class GatedMLP(nnx.Module):
    """A user's own SwiGLU block, swapped through register_swap."""

    def __init__(self, rngs: nnx.Rngs, dtype=None):
        self.gate = nnx.Linear(FEATURES, 40, use_bias=False, dtype=dtype, rngs=rngs)
        self.up = nnx.Linear(FEATURES, 40, use_bias=False, dtype=dtype, rngs=rngs)
        self.down = nnx.Linear(40, FEATURES, use_bias=False, dtype=dtype, rngs=rngs)

    def __call__(self, x):
        return self.down(jax.nn.silu(self.gate(x)) * self.up(x))


class LigerGatedMLP(GatedMLP):
    def __init__(self, mlp: GatedMLP, implementation):
        self.gate, self.up, self.down = mlp.gate, mlp.up, mlp.down
        self.implementation = implementation

    def __call__(self, x):
        return self.down(liger_jax.swiglu(self.gate(x), self.up(x), implementation=self.implementation))


register_swap(GatedMLP, LigerGatedMLP)


class Block(nnx.Module):
    def __init__(self, rngs: nnx.Rngs, shared_norm: nnx.RMSNorm, dtype):
        self.norm = shared_norm
        self.layer_norm = nnx.LayerNorm(FEATURES, dtype=dtype, rngs=rngs)
        self.mlp = GatedMLP(rngs, dtype)

    def __call__(self, x):
        return x + self.mlp(self.layer_norm(self.norm(x)))


class UserModel(nnx.Module):
    """Norms at the top, in an nnx.List, in an nnx.Dict, shared by two blocks, and one the kernels cannot compute;
    ``dtype`` is the compute dtype of every layer (params stay fp32)."""

    def __init__(self, rngs: nnx.Rngs, dtype=None):
        shared = nnx.RMSNorm(FEATURES, dtype=dtype, rngs=rngs)
        self.blocks = nnx.List([Block(rngs, shared, dtype), Block(rngs, shared, dtype)])
        self.extra = nnx.Dict(final=nnx.RMSNorm(FEATURES, epsilon=1e-5, dtype=dtype, rngs=rngs))
        self.two_axis = nnx.LayerNorm(FEATURES, reduction_axes=(-2, -1), dtype=dtype, rngs=rngs)
        self.out = nnx.Linear(FEATURES, 8, dtype=dtype, rngs=rngs)

    def __call__(self, x):
        for block in self.blocks:
            x = block(x)
        return self.out(self.two_axis(self.extra["final"](x)))


def _randomised(model: nnx.Module) -> nnx.Module:
    """Gives every Param random values so that scales and biases are not the trivial ones and zeros."""
    params = nnx.state(model, nnx.Param)
    keys = iter(jax.random.split(jax.random.key(7), len(jax.tree.leaves(params))))
    nnx.update(model, jax.tree.map(lambda p: 0.5 * jax.random.normal(next(keys), p.shape, p.dtype) + 0.5, params))
    return model


def _variables_by_path(model) -> dict:
    return {path: node for path, node in nnx.iter_graph(model) if isinstance(node, nnx.Variable)}


def _swapped(dtype=None, **switches):
    model = _randomised(UserModel(nnx.Rngs(0), dtype))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        counts = apply_liger(model, implementation=IMPLEMENTATION, **switches)
    return model, counts


def test_apply_liger_keeps_the_state_tree_and_the_param_objects():
    model = _randomised(UserModel(nnx.Rngs(0)))
    tree_before = jax.tree.structure(nnx.state(model))
    values_before = jax.tree.leaves(nnx.state(model))
    variables_before = _variables_by_path(model)
    opt_state = optax.adam(1e-3).init(nnx.state(model, nnx.Param))

    with pytest.warns(UserWarning, match=r"model\.two_axis"):
        counts = apply_liger(model, implementation=IMPLEMENTATION)

    assert counts == {**dict.fromkeys(KINDS, 0), "rms_norm": 2, "layer_norm": 2, "custom": 2}
    assert jax.tree.structure(nnx.state(model)) == tree_before
    chex.assert_trees_all_equal(jax.tree.leaves(nnx.state(model)), values_before)
    variables_after = _variables_by_path(model)
    assert variables_after.keys() == variables_before.keys()
    assert all(variables_after[path] is variables_before[path] for path in variables_before)
    # The optimizer state made before the swap still fits the params after it.
    updates, _ = optax.adam(1e-3).update(nnx.state(model, nnx.Param), opt_state)
    chex.assert_trees_all_equal_structs(updates, nnx.state(model, nnx.Param))


def test_apply_liger_replaces_registered_modules_and_shares_shared_ones():
    model, _ = _swapped()
    first, second = model.blocks
    assert type(first.norm) is liger_nnx.RMSNorm and first.norm is second.norm
    assert type(first.layer_norm) is liger_nnx.LayerNorm
    assert type(first.mlp) is LigerGatedMLP
    assert type(model.extra["final"]) is liger_nnx.RMSNorm and model.extra["final"].epsilon == 1e-5
    assert type(model.two_axis) is nnx.LayerNorm  # statistics over two axes: left to flax
    assert first.norm.implementation == IMPLEMENTATION


def _loss(model, x):
    return jnp.sum(jnp.sin(model(x).astype(jnp.float32)))


_value_and_grad = nnx.jit(nnx.value_and_grad(_loss, argnums=(0, 1)))


def test_swapped_model_matches_the_flax_model_in_float32():
    flax_model = _randomised(UserModel(nnx.Rngs(0)))
    liger_model, _ = _swapped()
    x = harness.random_normal(1, (3, 5, FEATURES), jnp.float32)
    expected, actual = _value_and_grad(flax_model, x), _value_and_grad(liger_model, x)
    harness.assert_close(liger_model(x), flax_model(x), jnp.float32)
    chex.assert_trees_all_equal_structs(actual, expected)
    jax.tree.map(lambda a, e: harness.assert_close(a, e, jnp.float32), actual, expected)


def test_swapped_model_is_as_accurate_as_the_flax_model_in_bfloat16():
    x = harness.random_normal(1, (3, 5, FEATURES), jnp.bfloat16)
    truth = _value_and_grad(_randomised(UserModel(nnx.Rngs(0), jnp.float32)), x.astype(jnp.float32))
    flax_bf16 = _value_and_grad(_randomised(UserModel(nnx.Rngs(0), jnp.bfloat16)), x)
    liger_bf16 = _value_and_grad(_swapped(jnp.bfloat16)[0], x)
    model_checks.assert_as_accurate_as_flax(liger_bf16, flax_bf16, truth)


def test_switches_turn_kinds_off():
    model, counts = _swapped(rms_norm=False, custom=False)
    assert counts == {**dict.fromkeys(KINDS, 0), "layer_norm": 2}
    assert type(model.blocks[0].norm) is nnx.RMSNorm
    assert type(model.blocks[0].mlp) is GatedMLP


def test_apply_liger_twice_swaps_nothing_more():
    model, _ = _swapped()
    with pytest.warns(UserWarning, match=r"left model\.two_axis \(LayerNorm\)"):
        assert apply_liger(model, implementation=IMPLEMENTATION) == dict.fromkeys(KINDS, 0)


class CopyingMLP(nnx.Module):
    def __init__(self, rngs):
        self.proj = nnx.Linear(4, 4, rngs=rngs)


class Holder(nnx.Module):
    def __init__(self, child):
        self.child = child


def test_a_replacement_that_copies_params_is_refused():
    register_swap(CopyingMLP, lambda module, implementation: CopyingMLP(nnx.Rngs(1)))
    with pytest.raises(ValueError, match=r"model\.child.*own nnx\.Variable"):
        apply_liger(Holder(CopyingMLP(nnx.Rngs(0))))


def test_registered_module_in_a_tuple_is_refused():
    model = Holder(nnx.data((nnx.RMSNorm(4, rngs=nnx.Rngs(0)),)))
    with pytest.raises(ValueError, match=r"model\.child\.0.*immutable tuple"):
        apply_liger(model)


def test_bad_arguments():
    with pytest.raises(ValueError, match="cannot replace the model itself"):
        apply_liger(nnx.RMSNorm(4, rngs=nnx.Rngs(0)))
    with pytest.raises(TypeError, match="flax.nnx.Module"):
        apply_liger({"norm": nnx.RMSNorm(4, rngs=nnx.Rngs(0))})
    with pytest.raises(ValueError, match="implementation must be one of"):
        apply_liger(Holder(nnx.RMSNorm(4, rngs=nnx.Rngs(0))), implementation="cuda")
    with pytest.raises(ValueError, match="kind must be one of"):
        register_swap(CopyingMLP, lambda module, implementation: module, kind="mlp")
    with pytest.raises(TypeError, match="flax.nnx.Module or flax.linen.Module"):
        register_swap(dict, lambda module, implementation: module)


class LinenGated(nn.Module):
    @nn.compact
    def __call__(self, x):
        gate, up = nn.Dense(32, name="gate")(x), nn.Dense(32, name="up")(x)
        return nn.Dense(FEATURES, use_bias=False, name="down")(jax.nn.silu(gate) * up)


class LinenLigerGated(nn.Module):
    implementation: str | None = None

    @nn.compact
    def __call__(self, x):
        gate, up = nn.Dense(32, name="gate")(x), nn.Dense(32, name="up")(x)
        gated = liger_jax.swiglu(gate, up, implementation=self.implementation)
        return nn.Dense(FEATURES, use_bias=False, name="down")(gated)


register_swap(LinenGated, lambda module, implementation: LinenLigerGated(implementation=implementation, parent=None))


class LinenModel(nn.Module):
    @nn.compact
    def __call__(self, x):
        norm = nn.RMSNorm(epsilon=1e-5)
        x = norm(nn.Dense(FEATURES)(x))
        x = x + LinenGated()(nn.LayerNorm()(x))
        x = norm(x)  # the same module (and param) a second time
        return nn.LayerNorm(reduction_axes=(-2, -1))(x)  # not swappable: flax runs it


def _linen_params(x):
    params = LinenModel().init(jax.random.key(0), x)
    keys = iter(jax.random.split(jax.random.key(3), len(jax.tree.leaves(params))))
    return jax.tree.map(lambda p: 0.5 * jax.random.normal(next(keys), p.shape, p.dtype) + 0.5, params)


def test_liger_intercept_init_gives_flax_params():
    x = harness.random_normal(2, (2, 7, 12), jnp.float32)
    expected = LinenModel().init(jax.random.key(0), x)
    with liger_intercept(implementation=IMPLEMENTATION) as counts:
        actual = LinenModel().init(jax.random.key(0), x)
    chex.assert_trees_all_equal_structs(actual, expected)
    chex.assert_trees_all_close(actual, expected)
    assert counts == {**dict.fromkeys(KINDS, 0), "rms_norm": 2, "layer_norm": 1, "custom": 1}


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_liger_intercept_apply_matches_flax(dtype):
    x = harness.random_normal(2, (2, 7, 12), dtype)
    params = _linen_params(x)

    def loss(params, x):
        return jnp.sum(jnp.sin(LinenModel().apply(params, x).astype(jnp.float32)))

    expected_loss, (expected_grads, expected_dx) = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))(params, x)
    with liger_intercept(implementation=IMPLEMENTATION) as counts:  # jit traces inside the context
        actual_loss, (actual_grads, actual_dx) = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))(params, x)
    assert counts["rms_norm"] == 2 and counts["layer_norm"] == 1 and counts["custom"] == 1
    harness.assert_close(actual_loss, expected_loss, dtype)
    harness.assert_close(actual_dx, expected_dx, dtype)
    jax.tree.map(lambda a, e: harness.assert_close(a, e, dtype), actual_grads, expected_grads)


def test_liger_intercept_switches_and_scope():
    x = harness.random_normal(2, (2, 7, 12), jnp.float32)
    params = _linen_params(x)
    with liger_intercept(rms_norm=False, layer_norm=False, custom=False) as counts:
        LinenModel().apply(params, x)
    assert counts == dict.fromkeys(KINDS, 0)
    seen = []

    def spy(next_fun, args, kwargs, context):
        seen.append(type(context.module))
        return next_fun(*args, **kwargs)

    with nn.intercept_methods(spy):
        LinenModel().apply(params, x)  # outside liger_intercept: flax's own modules only
    assert liger_linen.RMSNorm not in seen and nn.RMSNorm in seen
    with pytest.raises(ValueError, match="implementation must be one of"), liger_intercept(implementation="gpu"):
        pass
