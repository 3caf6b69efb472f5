"""RoPE: every implementation against the float64 reference, values and gradients; cos/sin tables."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

import liger_jax
from liger_jax.flax_layers import linen as liger_linen
from liger_jax.flax_layers import nnx as liger_nnx
from tests import harness

# (B, S, Hq, Hkv, D, table batch): the smallest head, GQA with per-token tables (packed sequences), Hkv = 1 with
# odd Hq and D / 2 not a power of two, MHA, and more q heads than one head tile holds (32 at D = 128).
SHAPES = [
    (1, 1, 1, 1, 2, None),
    (2, 5, 4, 2, 64, "B"),
    (1, 7, 3, 1, 80, "1"),
    (3, 4, 6, 6, 16, None),
    (1, 2, 40, 8, 128, "B"),
]


def _table_shape(batch, seq, head_dim, table_batch):
    """[S, D] for None, [1, S, D] for "1" and [B, S, D] for "B"."""
    match table_batch:
        case None:
            return (seq, head_dim)
        case "1":
            return (1, seq, head_dim)
        case "B":
            return (batch, seq, head_dim)


def _inputs(seed, shape, dtype, table_dtype=None):
    """q, k and arbitrary (not rotation) tables, so each pair's two table entries differ."""
    batch, seq, q_heads, k_heads, head_dim, table_batch = shape
    table = _table_shape(batch, seq, head_dim, table_batch)
    return (
        harness.random_normal(seed, (batch, seq, q_heads, head_dim), dtype),
        harness.random_normal(seed + 1, (batch, seq, k_heads, head_dim), dtype),
        harness.random_normal(seed + 2, table, table_dtype or dtype),
        harness.random_normal(seed + 3, table, table_dtype or dtype),
    )


def _op(implementation, interleaved):
    return lambda q, k, cos, sin: liger_jax.apply_rotary_pos_emb(
        q, k, cos, sin, interleaved=interleaved, implementation=implementation
    )


def _reference(interleaved):
    return lambda q, k, cos, sin: liger_jax.apply_rotary_pos_emb_reference(q, k, cos, sin, interleaved=interleaved)


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", harness.DTYPES)
@pytest.mark.parametrize("interleaved", [False, True])
def test_values_and_gradients_match_float64_reference(implementation, shape, dtype, interleaved):
    q, k, cos, sin = _inputs(len(shape) + shape[4], shape, dtype)
    cotangents = (harness.random_normal(50, q.shape, dtype), harness.random_normal(51, k.shape, dtype))
    op = _op(implementation, interleaved)
    (q_rot, k_rot), (dq, dk) = harness.vjp_under_jit(lambda q, k: op(q, k, cos, sin), (q, k), cotangents)
    q64, k64, cos64, sin64 = harness.as_float64(q, k, cos, sin)
    expected, expected_grads = harness.vjp_under_jit(
        lambda q, k: _reference(interleaved)(q, k, cos64, sin64), (q64, k64), harness.as_float64(*cotangents)
    )
    chex.assert_type([q_rot, k_rot, dq, dk], dtype)
    chex.assert_shape([q_rot, dq], q.shape)
    chex.assert_shape([k_rot, dk], k.shape)
    harness.assert_close_trees((q_rot, k_rot), expected, dtype)
    harness.assert_close_trees((dq, dk), expected_grads, dtype)


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
@pytest.mark.parametrize("table_batch", [None, "1", "B"])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_table_gradients_match_float64_reference(implementation, table_batch, dtype):
    q, k, cos, sin = _inputs(20, (2, 3, 4, 2, 24, table_batch), dtype)
    cotangents = (harness.random_normal(52, q.shape, dtype), harness.random_normal(53, k.shape, dtype))
    _, grads = harness.vjp_under_jit(_op(implementation, False), (q, k, cos, sin), cotangents)
    _, expected = harness.vjp_under_jit(
        _reference(False), harness.as_float64(q, k, cos, sin), harness.as_float64(*cotangents)
    )
    chex.assert_type(grads, dtype)
    harness.assert_close_trees(grads, expected, dtype)


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
def test_gradient_of_cos_alone(implementation):
    q, k, cos, sin = _inputs(21, (1, 3, 2, 1, 8, None), jnp.float32)

    def loss(op):
        return lambda cos: sum(jnp.sum(out**2) for out in op(q, k, cos, sin))

    got = jax.jit(jax.grad(loss(_op(implementation, True))))(cos)
    expected = jax.jit(jax.grad(loss(_reference(True))))(harness.as_float64(cos)[0])
    harness.assert_close(got, expected, jnp.float32)


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
def test_check_grads_fp32(implementation):
    q, k, cos, sin = _inputs(22, (2, 3, 4, 2, 12, "B"), jnp.float32)
    check_grads(_op(implementation, False), (q, k, cos, sin), order=1, modes=["rev"])


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
@pytest.mark.parametrize("in_axes", [(0, 0, None, None), (0, None, None, None), (0, 0, 0, 0)])
def test_vmap(implementation, in_axes):
    q, k, cos, sin = _inputs(23, (2, 3, 4, 2, 16, "B"), jnp.float32)
    batched = [
        harness.random_normal(24 + i, (3, *a.shape), a.dtype) if axis == 0 else a
        for i, (a, axis) in enumerate(zip((q, k, cos, sin), in_axes, strict=True))
    ]
    got = jax.jit(jax.vmap(_op(implementation, False), in_axes=in_axes))(*batched)
    expected = jax.jit(jax.vmap(_reference(False), in_axes=in_axes))(*harness.as_float64(*batched))
    harness.assert_close_trees(got, expected, jnp.float32)


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
def test_checkpoint_gives_the_same_gradients(implementation):
    q, k, cos, sin = _inputs(25, (1, 4, 4, 2, 16, None), jnp.float32)

    def loss(q, k):
        q_rot, k_rot = _op(implementation, False)(q, k, cos, sin)
        return jnp.sum(jnp.sin(q_rot)) + jnp.sum(k_rot**2)

    plain = jax.jit(jax.grad(loss, argnums=(0, 1)))(q, k)
    remat = jax.jit(jax.grad(jax.checkpoint(loss), argnums=(0, 1)))(q, k)
    chex.assert_trees_all_close(plain, remat, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("interleaved", [False, True])
def test_reference_rotates_pairs_as_complex_numbers(interleaved):
    # The two layouts pair up dimensions differently; either way pair i turns by the angle position · base^(-2i/D).
    batch, seq, heads, head_dim = 2, 5, 3, 8
    positions = jnp.asarray([[0, 1, 2, 3, 4], [7, 3, 0, 9, 1]])
    x = harness.random_normal(26, (batch, seq, heads, head_dim), jnp.float64)
    cos, sin = liger_jax.rope_cos_sin(positions, head_dim, interleaved=interleaved, dtype=jnp.float64)
    rotated, _ = liger_jax.apply_rotary_pos_emb_reference(x, x, cos, sin, interleaved=interleaved)
    frequencies = 10000.0 ** (-jnp.arange(0, head_dim, 2) / head_dim)
    angles = positions[..., None, None] * frequencies[None, None, None, :]
    if interleaved:
        z = (x[..., 0::2] + 1j * x[..., 1::2]) * jnp.exp(1j * angles)
        expected = jnp.stack([z.real, z.imag], axis=-1).reshape(x.shape)
    else:
        z = (x[..., : head_dim // 2] + 1j * x[..., head_dim // 2 :]) * jnp.exp(1j * angles)
        expected = jnp.concatenate([z.real, z.imag], axis=-1)
    harness.assert_close(rotated, expected, jnp.float32)


@pytest.mark.parametrize("positions_shape", [(6,), (2, 6)])
def test_rope_cos_sin_matches_hf_llama(positions_shape):
    # HF transformers' LlamaRotaryEmbedding in fp32: inv_freq = 1 / base^(arange(0, D, 2) / D), emb = [θ, θ].
    head_dim, base = 10, 500000.0
    positions = np.arange(int(np.prod(positions_shape))).reshape(positions_shape) * 997
    inv_freq = 1.0 / (base ** (np.arange(0, head_dim, 2).astype(np.float32) / head_dim))
    angles = positions.astype(np.float32)[..., None] * inv_freq
    emb = np.concatenate([angles, angles], axis=-1)
    cos, sin = liger_jax.rope_cos_sin(jnp.asarray(positions), head_dim, base=base, dtype=jnp.bfloat16)
    chex.assert_shape([cos, sin], (*positions_shape, head_dim))
    chex.assert_type([cos, sin], jnp.bfloat16)
    harness.assert_close(cos, np.cos(emb), jnp.bfloat16)
    harness.assert_close(sin, np.sin(emb), jnp.bfloat16)


def test_empty_sequence_gives_empty_output():
    q, k, cos, sin = _inputs(28, (2, 0, 4, 2, 8, None), jnp.float32)
    out, grads = harness.vjp_under_jit(_op(harness.KERNEL_IMPLEMENTATION, False), (q, k, cos, sin), (q, k))
    chex.assert_shape([out[0], grads[0]], q.shape)
    chex.assert_shape([out[1], grads[1]], k.shape)


@pytest.mark.parametrize(
    ("q", "k", "cos", "sin", "error", "match"),
    [
        ((2, 4, 8), (2, 4, 1, 8), (4, 8), (4, 8), ValueError, r"q must have shape \(batch, seq, heads"),
        ((2, 4, 2, 8), (2, 4, 8), (4, 8), (4, 8), ValueError, r"k must have shape \(batch, seq, heads"),
        ((1, 2, 2, 7), (1, 2, 1, 7), (2, 7), (2, 7), ValueError, "head_dim .* must be even"),
        ((1, 2, 2, 8), (2, 2, 1, 8), (2, 8), (2, 8), ValueError, r"k must have shape \(1, 2, 1, 8\)"),
        ((1, 2, 2, 8), (1, 2, 1, 6), (2, 8), (2, 8), ValueError, r"k must have shape \(1, 2, 1, 8\)"),
        ((1, 2, 4, 8), (1, 2, 3, 8), (2, 8), (2, 8), ValueError, r"k's heads \(3\) must divide q's heads \(4\)"),
        ((2, 2, 4, 8), (2, 2, 2, 8), (3, 8), (3, 8), ValueError, "cos must have shape"),
        ((2, 2, 4, 8), (2, 2, 2, 8), (3, 2, 8), (3, 2, 8), ValueError, "cos must have shape"),
        ((2, 2, 4, 8), (2, 2, 2, 8), (2, 8), (2, 2, 8), ValueError, r"sin must have shape \(2, 8\)"),
    ],
)
def test_bad_shapes_raise_clear_errors(q, k, cos, sin, error, match):
    arrays = (jnp.ones(s, jnp.float32) for s in (q, k, cos, sin))
    with pytest.raises(error, match=match):
        liger_jax.apply_rotary_pos_emb(*arrays, implementation=harness.KERNEL_IMPLEMENTATION)


@pytest.mark.parametrize("bad", ["q", "k", "cos", "sin"])
def test_bad_dtypes_raise_type_errors(bad):
    shapes = {"q": (1, 2, 2, 8), "k": (1, 2, 1, 8), "cos": (2, 8), "sin": (2, 8)}
    arrays = {name: jnp.ones(shape, jnp.int32 if name == bad else jnp.float32) for name, shape in shapes.items()}
    with pytest.raises(TypeError, match=f"{bad} must have a float dtype"):
        liger_jax.apply_rotary_pos_emb(**arrays, implementation=harness.KERNEL_IMPLEMENTATION)


@pytest.mark.parametrize(
    ("positions", "head_dim", "error", "match"),
    [
        (jnp.arange(4.0), 8, TypeError, "positions must be an integer array"),
        (jnp.zeros((1, 2, 3), jnp.int32), 8, ValueError, r"positions must have shape \(S,\) or \(B, S\)"),
        (jnp.arange(4), 7, ValueError, "head_dim must be a positive even int"),
    ],
)
def test_rope_cos_sin_bad_arguments(positions, head_dim, error, match):
    with pytest.raises(error, match=match):
        liger_jax.rope_cos_sin(positions, head_dim)


@pytest.mark.parametrize("flavour", ["nnx", "linen"])
@pytest.mark.parametrize("positions", [None, np.asarray([[5, 6, 7], [0, 1, 9]])])
def test_rotary_embedding_modules(flavour, positions):
    q, k, _, _ = _inputs(27, (2, 3, 4, 2, 16, None), jnp.bfloat16)
    options = {"base": 500.0, "interleaved": True, "implementation": harness.KERNEL_IMPLEMENTATION}
    if flavour == "nnx":
        got = liger_nnx.RotaryEmbedding(16, **options)(q, k, positions)
    else:
        got = liger_linen.RotaryEmbedding(16, **options).apply({}, q, k, positions)
    table_positions = jnp.arange(3) if positions is None else jnp.asarray(positions)
    cos, sin = liger_jax.rope_cos_sin(table_positions, 16, base=500.0, interleaved=True, dtype=jnp.float64)
    expected = liger_jax.apply_rotary_pos_emb_reference(*harness.as_float64(q, k), cos, sin, interleaved=True)
    chex.assert_type(got, jnp.bfloat16)
    harness.assert_close_trees(got, expected, jnp.bfloat16)
