"""TiledMLP: the wrapped MLP's outputs and gradients, tile by tile, with a fraction of its temporaries."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from liger_jax.flax_layers import linen as liger_linen
from liger_jax.flax_layers import nnx as liger_nnx
from liger_jax.flax_layers.tiled_mlp import tiled_over_sequence
from tests import harness
from tests.collectives import assert_only_small_all_reduces, compiled_collectives, mesh, nbytes, place


class GeluMLP(nnx.Module):
    """A user's own MLP with flax's layers: a bias, a gelu and a different output width."""

    def __init__(self, hidden, intermediate, out, *, rngs, dtype=jnp.float32):
        self.up = nnx.Linear(hidden, intermediate, param_dtype=dtype, rngs=rngs)
        self.down = nnx.Linear(intermediate, out, param_dtype=dtype, rngs=rngs)

    def __call__(self, x):
        return self.down(jax.nn.gelu(self.up(x)))


def _loss(module, x, cotangent):
    return jnp.sum(module(x) * cotangent)


def _value_and_grads(module, x, cotangent):
    """The output and the gradients of ``sum(module(x) · cotangent)`` for the params and x, under jit."""

    @nnx.jit
    def run(module, x):
        grads = nnx.grad(_loss, argnums=(0, 1))(module, x, cotangent)
        return module(x), nnx.state(grads[0], nnx.Param), grads[1]

    return run(module, x)


# (x shape, num_shards): a whole number of tiles over batch × seq, a shorter last tile, Liger's default
# ceil(S / H), more shards than tokens, and [S, H] (MoE experts' layout).
CASES = [((2, 12, 6), 4), ((2, 11, 6), 3), ((1, 20, 6), None), ((1, 3, 6), 8), ((9, 6), 2)]


@pytest.mark.parametrize(("shape", "num_shards"), CASES)
def test_nnx_tiled_mlp_matches_the_mlp_in_float64(shape, num_shards):
    mlp = liger_nnx.SwiGLUMLP(6, 24, param_dtype=jnp.float64, implementation="xla", rngs=nnx.Rngs(0))
    x = harness.random_normal(1, shape, jnp.float64)
    cotangent = harness.random_normal(2, shape, jnp.float64)
    tiled = liger_nnx.TiledMLP(mlp, num_shards=num_shards)
    got = _value_and_grads(tiled, x, cotangent)
    expected = _value_and_grads(mlp, x, cotangent)
    assert jax.tree.structure(nnx.state(tiled, nnx.Param)["mlp"]) == jax.tree.structure(expected[1])
    got = (got[0], got[1]["mlp"], got[2])
    jax.tree.map(lambda a, e: np.testing.assert_allclose(a, e, rtol=1e-12, atol=1e-12), got, expected)


@pytest.mark.usefixtures("full_precision_matmuls")
def test_nnx_tiled_mlp_wraps_any_mlp_and_the_kernels():
    # A user's flax MLP with another output width, and our SwiGLU kernel through the interpreter, in fp32.
    for mlp, out in [
        (GeluMLP(8, 20, 5, rngs=nnx.Rngs(1)), 5),
        (liger_nnx.SwiGLUMLP(8, 20, implementation=harness.KERNEL_IMPLEMENTATION, rngs=nnx.Rngs(2)), 8),
    ]:
        x = harness.random_normal(3, (2, 7, 8), jnp.float32)
        cotangent = harness.random_normal(4, (2, 7, out), jnp.float32)
        got = _value_and_grads(liger_nnx.TiledMLP(mlp, num_shards=3), x, cotangent)
        expected = _value_and_grads(mlp, x, cotangent)
        got = (got[0], got[1]["mlp"], got[2])
        jax.tree.map(lambda a, e: np.testing.assert_allclose(a, e, rtol=1e-5, atol=1e-5), got, expected)


def test_linen_tiled_mlp_matches_the_mlp():
    mlp = liger_linen.GEGLUMLP(24, param_dtype=jnp.float64, implementation="xla")
    tiled = liger_linen.TiledMLP(mlp, num_shards=3)
    x = harness.random_normal(5, (2, 10, 6), jnp.float64)
    cotangent = harness.random_normal(6, (2, 10, 6), jnp.float64)
    variables = tiled.init(jax.random.key(0), x)
    params = variables["params"]["mlp"]
    assert jax.tree.structure(params) == jax.tree.structure(mlp.init(jax.random.key(0), x)["params"])

    def loss(apply, variables):
        return jnp.sum(apply(variables, x) * cotangent)

    got = jax.jit(jax.value_and_grad(lambda v: loss(tiled.apply, v)))(variables)
    expected = jax.jit(jax.value_and_grad(lambda p: loss(mlp.apply, {"params": p})))(params)
    np.testing.assert_allclose(got[0], expected[0], rtol=1e-12)
    jax.tree.map(
        lambda a, e: np.testing.assert_allclose(a, e, rtol=1e-12, atol=1e-12), got[1]["params"]["mlp"], expected[1]
    )


def test_tiling_shrinks_the_temporaries_of_the_backward_pass():
    # Intermediate 64x the hidden width: the [tokens, intermediate] activations dominate. Untiled, the backward
    # pass holds several of them; tiled, the few of one tile, so the temporaries shrink with the tile.
    mlp = liger_nnx.SwiGLUMLP(16, 1024, implementation="xla", rngs=nnx.Rngs(0))
    x = jax.ShapeDtypeStruct((2, 256, 16), jnp.float32)

    def temp_bytes(module):
        graphdef, params = nnx.split(module)

        def loss(params, x):
            return jnp.sum(nnx.merge(graphdef, params)(x) ** 2)

        compiled = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(params, x).compile()
        return compiled.memory_analysis().temp_size_in_bytes

    intermediate = 2 * 256 * 1024 * 4  # one [tokens, intermediate] fp32 activation
    plain = temp_bytes(mlp)
    eight, sixteen = (temp_bytes(liger_nnx.TiledMLP(mlp, num_shards=n)) for n in (8, 16))
    assert plain > 2 * intermediate
    assert 4 * eight < plain and sixteen < 0.6 * eight, (plain, eight, sixteen)


@pytest.mark.parametrize(("shape", "num_shards", "match"), [((6,), 2, "x must have shape"), ((4, 6), 0, "num_shards")])
def test_bad_arguments(shape, num_shards, match):
    with pytest.raises(ValueError, match=match):
        tiled_over_sequence(lambda tile: tile, jnp.ones(shape), num_shards=num_shards)


def test_a_batch_sharded_input_stays_sharded():
    # Tiles cut the sequence, not the batch: data parallelism needs no gather, only the weights' gradient sums.
    mlp = liger_nnx.SwiGLUMLP(8, 16, implementation="xla", rngs=nnx.Rngs(3))
    graphdef, params = nnx.split(liger_nnx.TiledMLP(mlp, num_shards=3))
    x = harness.random_normal(7, (8, 10, 8), jnp.float32)

    @jax.jit
    def grads(params, x):
        return jax.grad(lambda params, x: jnp.sum(nnx.merge(graphdef, params)(x) ** 2), argnums=(0, 1))(params, x)

    mesh_ = mesh((8,), ("x",))
    sharded = place(x, mesh_, "x")
    got, expected = grads(params, sharded), grads(params, x)
    jax.tree.map(lambda a, e: np.testing.assert_allclose(a, e, rtol=1e-5, atol=1e-5), got, expected)
    assert got[1].sharding.is_equivalent_to(sharded.sharding, 3)
    assert_only_small_all_reduces(compiled_collectives(grads, params, sharded), nbytes(*jax.tree.leaves(params)))
