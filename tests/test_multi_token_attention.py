"""multi_token_attention against a float64 oracle written from its definition (causal mask, row softmax or
sparsemax, a grouped strided dilated 2D convolution written as a sum over kernel taps, the future zeroed), values and
gradients; identities of the masks; bad inputs; vmap and sharding; the NNX and linen layers."""

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


def _future(rows: int, cols: int) -> np.ndarray:
    return np.arange(cols)[None, :] > np.arange(rows)[:, None]


def _softmax_oracle(x):
    exps = jnp.exp(x - x.max(axis=-1, keepdims=True))
    return exps / exps.sum(axis=-1, keepdims=True)


def _sparsemax_oracle(x):
    # Sort-based: the support is the k largest with 1 + k z_(k) > Σ_{i≤k} z_(i); τ = (Σ_{i≤k} z_(i) - 1) / k.
    z = jnp.sort(x, axis=-1)[..., ::-1]
    k = jnp.arange(1, x.shape[-1] + 1, dtype=x.dtype).reshape((1,) * (x.ndim - 1) + (-1,))
    cumulative = jnp.cumsum(z, axis=-1)
    support = (1 + k * z > cumulative).sum(axis=-1, keepdims=True)
    tau = (jnp.take_along_axis(cumulative, support - 1, axis=-1) - 1) / support
    return jnp.maximum(x - tau, 0.0)


def _conv_oracle(p, kernel, stride, padding, dilation, groups):
    """out[b, o, y, x] = Σ_{c in o's group, i, j} pad(p)[b, c, y s0 + i d0, x s1 + j d1] · kernel[i, j, c', o]."""
    (s0, s1), (p0, p1), (d0, d1) = stride, padding, dilation
    kh, kw, in_per_group, out_heads = kernel.shape
    p = jnp.pad(p, ((0, 0), (0, 0), (p0, p0), (p1, p1)))
    rows = (p.shape[2] - d0 * (kh - 1) - 1) // s0 + 1
    cols = (p.shape[3] - d1 * (kw - 1) - 1) // s1 + 1
    row_index = np.arange(rows)[None, :] * s0 + np.arange(kh)[:, None] * d0  # [i, y]
    col_index = np.arange(cols)[None, :] * s1 + np.arange(kw)[:, None] * d1  # [j, x]
    patches = p[:, :, row_index[:, :, None, None], col_index[None, None, :, :]]  # [b, c, i, y, j, x]
    patches = patches.reshape(p.shape[0], groups, in_per_group, kh, rows, kw, cols)
    kernel = kernel.reshape(kh, kw, in_per_group, groups, out_heads // groups)
    out = jnp.einsum("bgciyjx,ijcgo->bgoyx", patches, kernel)
    return out.reshape(p.shape[0], out_heads, rows, cols)


def _pair(v):
    return tuple(v) if isinstance(v, tuple) else (v, v)


def _oracle(options, sparse=False):
    """The definition in float64: Liger's -1e9 fill before sparsemax, -inf before softmax."""

    def run(scores, kernel, bias=None):
        length = scores.shape[-1]
        future = _future(length, length)[None, None]
        if sparse:
            probabilities = _sparsemax_oracle(jnp.where(future, -1e9, scores))
        else:
            probabilities = _softmax_oracle(jnp.where(future, -jnp.inf, scores))
        out = _conv_oracle(
            probabilities,
            kernel,
            _pair(options.get("stride", 1)),
            _pair(options.get("padding", 0)),
            _pair(options.get("dilation", 1)),
            options.get("groups", 1),
        )
        if bias is not None:
            out = out + bias[None, :, None, None]
        return jnp.where(_future(out.shape[-2], out.shape[-1])[None, None], 0.0, out)

    return run


def _inputs(seed, batch, heads, length, kernel_shape, out_heads, dtype, with_bias=True):
    scores = harness.random_normal(seed, (batch, heads, length, length), dtype, scale=2.0)
    kernel = harness.random_normal(seed + 1, kernel_shape + (out_heads,), dtype, scale=0.5)
    bias = harness.random_normal(seed + 2, (out_heads,), dtype) if with_bias else None
    return scores, kernel, bias


# (heads, out_heads, L, kernel (kh, kw, in / groups), options): Liger's padded 3x3; one head with an even kernel and
# no padding (the map shrinks); stride 2 with two groups (6 heads out of 4); a non-square kernel with dilation (2, 1).
# Odd L throughout.
CASES = {
    "padded_3x3": (4, 4, 9, (3, 3, 4), {"padding": 1}),
    "one_head": (1, 1, 7, (2, 2, 1), {}),
    "stride_groups": (4, 6, 9, (3, 3, 2), {"stride": 2, "padding": (1, 1), "groups": 2}),
    "rectangular_dilated": (2, 3, 7, (3, 5, 2), {"padding": 2, "dilation": (2, 1)}),
}


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
@pytest.mark.parametrize("case", CASES)
def test_values_and_gradients_match_the_definition(case, implementation):
    heads, out_heads, length, kernel_shape, options = CASES[case]
    primals = _inputs(10, 2, heads, length, kernel_shape, out_heads, jnp.float32)
    cotangent = harness.random_normal(13, jax.eval_shape(_oracle(options), *primals).shape, jnp.float32)

    def op(*args):
        return liger_jax.multi_token_attention(*args, implementation=implementation, **options)

    harness.assert_vjp_matches_reference(op, _oracle(options), primals, cotangent, jnp.float32)


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
def test_bfloat16_without_bias(implementation):
    heads, out_heads, length, kernel_shape, options = CASES["padded_3x3"]
    scores, kernel, _ = _inputs(20, 2, heads, length, kernel_shape, out_heads, jnp.bfloat16, with_bias=False)
    cotangent = harness.random_normal(23, scores.shape, jnp.bfloat16)

    def op(scores, kernel):
        return liger_jax.multi_token_attention(scores, kernel, implementation=implementation, **options)

    harness.assert_vjp_matches_reference(op, _oracle(options), (scores, kernel), cotangent, jnp.bfloat16)


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
def test_sparse_matches_the_definition(implementation):
    primals = _inputs(30, 2, 2, 9, (3, 3, 2), 2, jnp.float32)
    cotangent = harness.random_normal(33, primals[0].shape, jnp.float32)

    def op(*args):
        return liger_jax.multi_token_attention(*args, padding=1, sparse=True, implementation=implementation)

    harness.assert_vjp_matches_reference(op, _oracle({"padding": 1}, sparse=True), primals, cotangent, jnp.float32)


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
def test_future_is_masked_before_and_after_the_convolution(implementation):
    # The output's future is exactly 0 (bias included); future scores change nothing and get no gradient.
    scores, kernel, bias = _inputs(40, 1, 2, 8, (3, 3, 2), 2, jnp.float32)
    future = _future(8, 8)[None, None]

    def op(scores):
        return liger_jax.multi_token_attention(scores, kernel, bias, padding=1, implementation=implementation)

    cotangent = harness.random_normal(43, scores.shape, jnp.float32)
    out, (dscores,) = harness.vjp_under_jit(op, (scores,), cotangent)
    assert (np.asarray(out)[np.broadcast_to(future, out.shape)] == 0).all()
    assert (np.asarray(dscores)[np.broadcast_to(future, dscores.shape)] == 0).all()
    assert np.abs(np.asarray(dscores)).max() > 1e-3
    shifted = jnp.where(future, scores + 100.0, scores)
    # One compiled program for both (a GPU's XLA fuses an eager call differently, to the last ulp).
    np.testing.assert_array_equal(np.asarray(jax.jit(op)(shifted)), np.asarray(jax.jit(op)(scores)))


def test_finite_differences():
    # The XLA path in float64; the interpreter through fp32.
    scores, kernel, bias = _inputs(50, 1, 2, 5, (3, 3, 2), 2, jnp.float64)
    for implementation, dtype, tolerance in (
        ("xla", jnp.float64, None),
        (harness.KERNEL_IMPLEMENTATION, jnp.float32, 3e-3),
    ):
        args = tuple(a.astype(dtype) for a in (scores, kernel, bias))

        def op(scores, kernel, bias, implementation=implementation):
            return liger_jax.multi_token_attention(scores, kernel, bias, padding=1, implementation=implementation)

        check_grads(jax.jit(op), args, order=1, modes=["rev"], atol=tolerance, rtol=tolerance)


def test_vmap_over_an_extra_axis_matches_each_example():
    scores = harness.random_normal(60, (3, 1, 2, 6, 6), jnp.float32)
    kernel = harness.random_normal(61, (3, 3, 2, 2), jnp.float32)

    def op(s):
        return liger_jax.multi_token_attention(s, kernel, padding=1, implementation=harness.KERNEL_IMPLEMENTATION)

    batched = jax.vmap(op)(scores)
    for i in range(3):
        np.testing.assert_allclose(np.asarray(batched[i]), np.asarray(op(scores[i])), rtol=1e-6, atol=1e-6)


def test_batch_sharding_needs_no_gathers():
    mesh_ = mesh((8,), ("x",))
    scores, kernel, bias = _inputs(70, 8, 2, 8, (3, 3, 2), 2, jnp.float32)

    def loss(scores, kernel, bias):
        out = liger_jax.multi_token_attention(
            scores, kernel, bias, padding=1, implementation=harness.KERNEL_IMPLEMENTATION
        )
        return (out**2).sum()

    step = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
    sharded = (place(scores, mesh_, "x"), place(kernel, mesh_), place(bias, mesh_))
    grads = step(*sharded)
    assert grads[0].sharding.spec == P("x")
    assert_only_small_all_reduces(compiled_collectives(step, *sharded), limit_bytes=4 * (kernel.size + bias.size + 1))
    expected = jax.grad(loss, argnums=(0, 1, 2))(scores, kernel, bias)
    harness.assert_close_trees(grads, expected, jnp.float32)


BAD_INPUTS = [
    ({"scores": np.zeros((2, 4, 4), np.float32)}, ValueError, "scores must be"),
    ({"scores": np.zeros((1, 2, 4, 5), np.float32)}, ValueError, "square"),
    ({"scores": np.zeros((1, 2, 4, 4), np.int32)}, TypeError, "scores must have a float dtype"),
    ({"kernel": np.zeros((3, 3, 2), np.float32)}, ValueError, "kernel must be"),
    ({"kernel": np.zeros((3, 3, 3, 2), np.float32)}, ValueError, "kernel's input axis"),
    ({"bias": np.zeros((3,), np.float32)}, ValueError, "bias must have shape"),
    ({"stride": 0}, ValueError, "stride must be at least 1"),
    ({"stride": 1.5}, TypeError, "stride must be an int"),
    ({"padding": -1}, ValueError, "padding must be at least 0"),
    ({"padding": (1, 2, 3)}, ValueError, "padding must be an int or a pair"),
    ({"dilation": (1, 0)}, ValueError, r"dilation\[1\] must be at least 1"),
    ({"groups": 3}, ValueError, "groups=3 must divide"),
    ({"groups": True}, TypeError, "groups must be an int"),
    ({"sparse": 1}, TypeError, "sparse must be a bool"),
    ({"kernel": np.zeros((3, 1, 2, 2), np.float32), "padding": 0}, ValueError, "square map"),
    ({"sparse": True, "scores": np.zeros((1, 2, 4, 4), jnp.bfloat16)}, TypeError, "sparse=True"),
    ({"implementation": "cuda"}, ValueError, "implementation"),
]


@pytest.mark.parametrize("changes,error,match", BAD_INPUTS)
def test_bad_inputs_are_named(changes, error, match):
    arguments = {
        "scores": np.zeros((1, 2, 4, 4), np.float32),
        "kernel": np.zeros((3, 3, 2, 2), np.float32),
        "bias": np.zeros((2,), np.float32),
        "padding": 1,
    } | changes
    args = {k: jnp.asarray(v) if isinstance(v, np.ndarray) else v for k, v in arguments.items()}
    with pytest.raises(error, match=match):
        liger_jax.multi_token_attention(args.pop("scores"), args.pop("kernel"), args.pop("bias"), **args)


@pytest.mark.parametrize("use_bias", [True, False])
def test_nnx_and_linen_layers_hold_the_params_and_call_the_op(use_bias):
    options = {"stride": 1, "padding": (1, 2), "dilation": 1, "groups": 2}
    scores = harness.random_normal(80, (2, 4, 7, 7), jnp.float32)
    layer = liger_nnx.MultiTokenAttention(
        4, 6, (3, 5), **options, use_bias=use_bias, implementation=harness.KERNEL_IMPLEMENTATION, rngs=nnx.Rngs(0)
    )
    assert layer.kernel.shape == (3, 5, 2, 6)
    # Liger's init: uniform in ±1/√fan_in, fan_in = 3 · 5 · 2.
    assert np.abs(np.asarray(layer.kernel[...])).max() <= 30**-0.5 and np.asarray(layer.kernel[...]).std() > 0.05
    bias = layer.bias[...] if use_bias else None
    if use_bias:
        np.testing.assert_array_equal(np.asarray(bias), 0.0)
    expected = liger_jax.multi_token_attention(scores, layer.kernel[...], bias, implementation="xla", **options)
    harness.assert_close(layer(scores), expected, jnp.float32)

    linen_layer = liger_linen.MultiTokenAttention(
        4, 6, (3, 5), **options, use_bias=use_bias, implementation=harness.KERNEL_IMPLEMENTATION
    )
    variables = linen_layer.init(jax.random.key(0), scores)
    params = {"kernel": layer.kernel[...]} | ({"bias": bias} if use_bias else {})
    assert jax.tree.map(jnp.shape, variables["params"]) == jax.tree.map(jnp.shape, params)
    harness.assert_close(linen_layer.apply({"params": params}, scores), expected, jnp.float32)


def test_layers_check_their_options():
    with pytest.raises(ValueError, match="groups=3 must divide"):
        liger_nnx.MultiTokenAttention(4, 6, 3, groups=3, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="kernel_size must be at least 1"):
        liger_nnx.MultiTokenAttention(4, 4, 0, rngs=nnx.Rngs(0))
