"""fused_neighborhood_attention against a float64 oracle written from its definition (each query's window listed
position by position, a softmax over it, the values it weights), values and gradients; a window covering the whole
sequence is jax.nn.dot_product_attention; bad inputs; vmap and sharding; the NNX and linen layers."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P
from jax.test_util import check_grads

import liger_jax
from liger_jax.flax_layers import linen as liger_linen
from liger_jax.flax_layers import nnx as liger_nnx
from tests import harness
from tests.collectives import assert_only_small_all_reduces, compiled_collectives, mesh, place

pytestmark = pytest.mark.usefixtures("full_precision_matmuls")  # XLA's fp32 convs and dots at fp32, not TF32


def _window(length: int, kernel_size: int, dilation: int) -> np.ndarray:
    """[length, length] bool: key i + m · dilation for m in -(k // 2) .. k // 2, inside the sequence."""
    keep = np.zeros((length, length), bool)
    for i in range(length):
        for m in range(-(kernel_size // 2), kernel_size // 2 + 1):
            if 0 <= i + m * dilation < length:
                keep[i, i + m * dilation] = True
    return keep


def _oracle(kernel_size, dilation, scale=None):
    def run(q, k, v):
        s = (1.0 / math.sqrt(q.shape[-1])) if scale is None else scale
        scores = s * jnp.einsum("bqhd,bkhd->bhqk", q, k)
        scores = jnp.where(_window(q.shape[1], kernel_size, dilation)[None, None], scores, -jnp.inf)
        exps = jnp.exp(scores - scores.max(axis=-1, keepdims=True))
        return jnp.einsum("bhqk,bkhd->bqhd", exps / exps.sum(axis=-1, keepdims=True), v)

    return run


def _qkv(seed, shape, dtype):
    return tuple(harness.random_normal(seed + i, shape, dtype) for i in range(3))


# (shape [B, S, H, D], kernel_size, dilation, scale): Liger's window of 7 on odd S and D, a given scale; dilation 2
# with three heads and the default scale; a window wider than the sequence; kernel_size 1 (each query sees only
# itself: out = v); a sequence of three 64-position blocks (the last partial) whose dilated band crosses block edges.
CASES = {
    "window_7": ((2, 13, 1, 5), 7, 1, 0.7),
    "dilated": ((1, 11, 3, 8), 3, 2, None),
    "wider_than_seq": ((1, 4, 2, 3), 9, 1, None),
    "self_only": ((2, 5, 1, 4), 1, 1, None),
    "several_blocks": ((1, 150, 2, 4), 9, 2, None),
}


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
@pytest.mark.parametrize("case", CASES)
def test_values_and_gradients_match_the_definition(case, implementation):
    shape, kernel_size, dilation, scale = CASES[case]
    primals = _qkv(10, shape, jnp.float32)
    cotangent = harness.random_normal(13, shape, jnp.float32)

    def op(q, k, v):
        return liger_jax.fused_neighborhood_attention(
            q, k, v, kernel_size=kernel_size, dilation=dilation, scale=scale, implementation=implementation
        )

    harness.assert_vjp_matches_reference(op, _oracle(kernel_size, dilation, scale), primals, cotangent, jnp.float32)
    if case == "self_only":
        np.testing.assert_array_equal(np.asarray(op(*primals)), np.asarray(primals[2]))


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
def test_bfloat16(implementation):
    primals = _qkv(20, (2, 10, 2, 8), jnp.bfloat16)
    cotangent = harness.random_normal(23, primals[0].shape, jnp.bfloat16)

    def op(q, k, v):
        return liger_jax.fused_neighborhood_attention(q, k, v, kernel_size=5, implementation=implementation)

    harness.assert_vjp_matches_reference(op, _oracle(5, 1), primals, cotangent, jnp.bfloat16)


def test_a_window_over_the_whole_sequence_is_full_attention():
    # An independent check of the layout and scale: kernel_size ≥ 2 S - 1 leaves no key out.
    q, k, v = _qkv(30, (2, 6, 3, 4), jnp.float32)
    out = liger_jax.fused_neighborhood_attention(q, k, v, kernel_size=11, implementation=harness.KERNEL_IMPLEMENTATION)
    harness.assert_close(out, jax.nn.dot_product_attention(q, k, v), jnp.float32)


def test_outside_the_window_changes_nothing():
    q, k, v = _qkv(40, (1, 9, 1, 4), jnp.float32)
    outside = ~_window(9, 3, 2)

    def op(k, v):
        return liger_jax.fused_neighborhood_attention(
            q, k, v, kernel_size=3, dilation=2, implementation=harness.KERNEL_IMPLEMENTATION
        )

    # Query 0's window is keys {0, 2}: moving any other key or value leaves its output exactly as it was.
    moved = np.asarray(outside[0])[None, :, None, None]
    out = op(k, v)
    out_moved = op(jnp.where(moved, k + 5.0, k), jnp.where(moved, v - 3.0, v))
    np.testing.assert_array_equal(np.asarray(out_moved)[:, 0], np.asarray(out)[:, 0])
    assert np.abs(np.asarray(out_moved - out)).max() > 0.1


def test_finite_differences():
    q, k, v = _qkv(50, (1, 7, 2, 3), jnp.float64)
    for implementation, dtype, tolerance in (
        ("xla", jnp.float64, None),
        (harness.KERNEL_IMPLEMENTATION, jnp.float32, 3e-3),
    ):

        def op(q, k, v, implementation=implementation):
            return liger_jax.fused_neighborhood_attention(
                q, k, v, kernel_size=3, dilation=2, implementation=implementation
            )

        args = tuple(a.astype(dtype) for a in (q, k, v))
        check_grads(jax.jit(op), args, order=1, modes=["rev"], atol=tolerance, rtol=tolerance)


def test_vmap_over_an_extra_axis_matches_each_example():
    q, k, v = _qkv(60, (3, 1, 6, 2, 4), jnp.float32)

    def op(q, k, v):
        return liger_jax.fused_neighborhood_attention(
            q, k, v, kernel_size=3, implementation=harness.KERNEL_IMPLEMENTATION
        )

    batched = jax.vmap(op)(q, k, v)
    for i in range(3):
        np.testing.assert_allclose(np.asarray(batched[i]), np.asarray(op(q[i], k[i], v[i])), rtol=1e-6, atol=1e-6)


def test_batch_and_head_sharding_needs_no_collectives():
    mesh_ = mesh((4, 2), ("x", "y"))
    q, k, v = _qkv(70, (4, 8, 2, 4), jnp.float32)

    def loss(q, k, v):
        out = liger_jax.fused_neighborhood_attention(
            q, k, v, kernel_size=3, implementation=harness.KERNEL_IMPLEMENTATION
        )
        return (out**2).sum()

    step = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
    sharded = tuple(place(a, mesh_, "x", None, "y") for a in (q, k, v))
    grads = step(*sharded)
    assert all(g.sharding.spec == P("x", None, "y") for g in grads)
    assert_only_small_all_reduces(compiled_collectives(step, *sharded), limit_bytes=0)
    harness.assert_close_trees(grads, jax.grad(loss, argnums=(0, 1, 2))(q, k, v), jnp.float32)


def test_inside_shard_map_each_device_attends_over_its_examples():
    mesh_ = mesh((8,), ("x",))
    q, k, v = _qkv(75, (8, 6, 1, 4), jnp.float32)

    def loss(q, k, v):
        out = liger_jax.fused_neighborhood_attention(
            q, k, v, kernel_size=3, implementation=harness.KERNEL_IMPLEMENTATION
        )
        return (out**2).sum()

    per_device = jax.shard_map(
        jax.grad(loss, argnums=(0, 1, 2)), mesh=mesh_, in_specs=(P("x"),) * 3, out_specs=(P("x"),) * 3
    )
    grads = jax.jit(per_device)(*(place(a, mesh_, "x") for a in (q, k, v)))
    harness.assert_close_trees(grads, jax.grad(loss, argnums=(0, 1, 2))(q, k, v), jnp.float32)


BAD_INPUTS = [
    ({"query": np.zeros((2, 4, 3), np.float32)}, ValueError, "query must be"),
    ({"key": np.zeros((1, 5, 2, 4), np.float32)}, ValueError, "key must have shape"),
    ({"value": np.zeros((1, 4, 2, 4), np.float16)}, TypeError, "value must have dtype float32"),
    (
        {n: np.zeros((1, 4, 2, 4), np.int32) for n in ("query", "key", "value")},
        TypeError,
        "query must have a float dtype",
    ),
    ({"kernel_size": 4}, ValueError, "kernel_size must be odd"),
    ({"kernel_size": 0}, ValueError, "kernel_size must be at least 1"),
    ({"kernel_size": 3.0}, TypeError, "kernel_size must be an int"),
    ({"dilation": 0}, ValueError, "dilation must be at least 1"),
    ({"scale": -1.0}, ValueError, "scale must be a positive"),
    ({"scale": "0.5"}, TypeError, "scale must be a float"),
    ({"implementation": "cuda"}, ValueError, "implementation"),
]


@pytest.mark.parametrize("changes,error,match", BAD_INPUTS)
def test_bad_inputs_are_named(changes, error, match):
    arguments = {n: np.zeros((1, 4, 2, 4), np.float32) for n in ("query", "key", "value")} | changes
    args = {k: jnp.asarray(v) if isinstance(v, np.ndarray) else v for k, v in arguments.items()}
    with pytest.raises(error, match=match):
        liger_jax.fused_neighborhood_attention(args.pop("query"), args.pop("key"), args.pop("value"), **args)


def _composed(params, x, num_heads, kernel_size, dilation):
    """The layer written out: four affine maps around the op (xla)."""

    def dense(name, h):
        return h @ params[name]["kernel"] + params[name]["bias"][None, None]

    q, k, v = (dense(n, x).reshape(*x.shape[:-1], num_heads, -1) for n in ("q_proj", "k_proj", "v_proj"))
    out = liger_jax.fused_neighborhood_attention(
        q, k, v, kernel_size=kernel_size, dilation=dilation, implementation="xla"
    )
    return dense("out_proj", out.reshape(x.shape))


def test_nnx_and_linen_layers_hold_the_projections_and_call_the_op():
    x = harness.random_normal(80, (2, 9, 12), jnp.float32)
    layer = liger_nnx.FusedNeighborhoodAttention(
        12, 3, 5, 2, implementation=harness.KERNEL_IMPLEMENTATION, rngs=nnx.Rngs(0)
    )
    params = {
        name: {"kernel": getattr(layer, name).kernel[...], "bias": getattr(layer, name).bias[...]}
        for name in ("q_proj", "k_proj", "v_proj", "out_proj")
    }
    expected = _composed(params, x, 3, 5, 2)
    harness.assert_close(layer(x), expected, jnp.float32)

    linen_layer = liger_linen.FusedNeighborhoodAttention(12, 3, 5, 2, implementation=harness.KERNEL_IMPLEMENTATION)
    variables = linen_layer.init(jax.random.key(0), x)
    assert jax.tree.map(jnp.shape, variables["params"]) == jax.tree.map(jnp.shape, params)
    harness.assert_close(linen_layer.apply({"params": params}, x), expected, jnp.float32)


def test_layer_dropout_applies_only_when_asked():
    x = harness.random_normal(90, (1, 6, 8), jnp.float32)
    layer = liger_nnx.FusedNeighborhoodAttention(8, 2, 3, dropout=0.5, implementation="xla", rngs=nnx.Rngs(0))
    quiet = layer(x, deterministic=True)
    np.testing.assert_array_equal(np.asarray(layer(x, deterministic=True)), np.asarray(quiet))
    assert np.abs(np.asarray(layer(x) - quiet)).max() > 1e-3
    linen_layer = liger_linen.FusedNeighborhoodAttention(8, 2, 3, dropout=0.5, implementation="xla")
    variables = linen_layer.init(jax.random.key(0), x)
    dropped = linen_layer.apply(variables, x, deterministic=False, rngs={"dropout": jax.random.key(1)})
    assert np.abs(np.asarray(dropped - linen_layer.apply(variables, x))).max() > 1e-3


def test_layers_check_their_options():
    with pytest.raises(ValueError, match="hidden_size \\(10\\) must be divisible by num_heads \\(3\\)"):
        liger_nnx.FusedNeighborhoodAttention(10, 3, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="kernel_size must be odd"):
        liger_nnx.FusedNeighborhoodAttention(12, 3, 4, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="dilation must be at least 1"):
        liger_linen.FusedNeighborhoodAttention(12, 3, 3, 0).init(jax.random.key(0), jnp.zeros((1, 4, 12)))
