"""The RoPE family beyond plain RoPE: partial rotary (``rotary_dim``), q without k, Qwen2-VL's M-RoPE and Llama 4's
complex RoPE, each against a float64 oracle written from its model's definition (complex multiplication by
``exp(j·θ)``), gradients, the rotation's transpose, sharding and bad inputs."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

import liger_jax
from liger_jax.flax_layers import linen as liger_linen
from liger_jax.flax_layers import nnx as liger_nnx
from liger_jax.ops import rope as rope_ops
from tests import harness
from tests.collectives import assert_only_small_all_reduces, compiled_collectives, mesh, place

DTYPES = (jnp.float32, jnp.bfloat16)
BASE = 100.0


def _frequencies(rotary_dim):
    """``base^(-2i/R)`` for each of the R/2 pairs, float64."""
    return BASE ** (-np.arange(0, rotary_dim, 2, dtype=np.float64) / rotary_dim)


def _rotated_by(x, angles, interleaved, rotary_dim):
    """x's first ``rotary_dim`` features turned pair by pair as complex numbers by ``angles [..., R/2]`` (which
    broadcast over heads), the rest passed through: the definition, in float64 jax.numpy."""
    x = jnp.asarray(x, jnp.float64)
    rot, rest = x[..., :rotary_dim], x[..., rotary_dim:]
    if interleaved:
        z = (rot[..., 0::2] + 1j * rot[..., 1::2]) * jnp.exp(1j * angles)
        turned = jnp.stack([z.real, z.imag], axis=-1).reshape(rot.shape)
    else:
        half = rotary_dim // 2
        z = (rot[..., :half] + 1j * rot[..., half:]) * jnp.exp(1j * angles)
        turned = jnp.concatenate([z.real, z.imag], axis=-1)
    return jnp.concatenate([turned, rest], axis=-1)


def _qk(seed, batch, seq, q_heads, k_heads, head_dim, dtype):
    return (
        harness.random_normal(seed, (batch, seq, q_heads, head_dim), dtype),
        harness.random_normal(seed + 1, (batch, seq, k_heads, head_dim), dtype),
    )


def _cotangents(seed, *arrays):
    return tuple(harness.random_normal(seed + i, a.shape, a.dtype) for i, a in enumerate(arrays))


def _assert_matches_oracle(op, oracle, primals, cotangents, dtype):
    """op's outputs and gradients (under jit) match the float64 oracle's; gradients keep their primals' dtypes."""
    out, grads = harness.vjp_under_jit(op, primals, cotangents)
    expected, expected_grads = harness.vjp_under_jit(
        oracle, harness.as_float64(*primals), harness.as_float64(*cotangents)
    )
    chex.assert_type([*out, *grads], dtype)
    harness.assert_close_trees(out, expected, dtype)
    harness.assert_close_trees(grads, expected_grads, dtype)


# Partial rotary ----------------------------------------------------------------------------------------------------

# (B, S, Hq, Hkv, D, rotary_dim): Phi-like (a quarter of the head rotates), an odd number of pairs and pass-through
# features not a power of two, rotary_dim = D.
PARTIAL_SHAPES = [(2, 3, 4, 2, 32, 8), (1, 5, 3, 1, 22, 6), (2, 2, 2, 2, 12, 12)]


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
@pytest.mark.parametrize("shape", PARTIAL_SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("interleaved", [False, True])
def test_partial_rotary_matches_the_definition(implementation, shape, dtype, interleaved):
    batch, seq, q_heads, k_heads, head_dim, rotary_dim = shape
    q, k = _qk(1, batch, seq, q_heads, k_heads, head_dim, dtype)
    positions = jnp.asarray(np.random.default_rng(2).integers(0, 50, (batch, seq)))
    cos, sin = liger_jax.rope_cos_sin(positions, head_dim, base=BASE, interleaved=interleaved, rotary_dim=rotary_dim)
    angles = np.asarray(positions)[:, :, None, None] * _frequencies(rotary_dim)

    def op(q, k):
        return liger_jax.apply_rotary_pos_emb(
            q, k, cos, sin, interleaved=interleaved, rotary_dim=rotary_dim, implementation=implementation
        )

    def oracle(q, k):
        return tuple(_rotated_by(x, angles, interleaved, rotary_dim) for x in (q, k))

    _assert_matches_oracle(op, oracle, (q, k), _cotangents(3, q, k), dtype)


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
def test_partial_rotary_table_gradients(implementation):
    # Arbitrary tables (the two entries of a pair differ), so a swapped entry or sign in the kernel shows.
    q, k = _qk(4, 2, 3, 4, 2, 14, jnp.float32)
    cos, sin = harness.random_normal(6, (2, 3, 10), jnp.float32), harness.random_normal(7, (2, 3, 10), jnp.float32)
    harness.assert_vjp_matches_reference(
        lambda *a: liger_jax.apply_rotary_pos_emb(*a, rotary_dim=10, implementation=implementation),
        lambda *a: liger_jax.apply_rotary_pos_emb_reference(*a),
        (q, k, cos, sin),
        _cotangents(8, q, k),
        jnp.float32,
    )


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
@pytest.mark.parametrize("interleaved", [False, True])
def test_gradient_is_the_transposed_rotation(implementation, interleaved):
    # R is orthogonal: pulling R x back gives x (pass-through features included), and pulling any g back is the
    # rotation by -θ, that is the tables (cos, -sin).
    q, k = _qk(9, 1, 4, 3, 1, 18, jnp.float32)
    cos, sin = liger_jax.rope_cos_sin(jnp.arange(4) * 7, 18, interleaved=interleaved, rotary_dim=10)
    g = _cotangents(11, q, k)

    def op(cos, sin):
        return lambda q, k: liger_jax.apply_rotary_pos_emb(
            q, k, cos, sin, interleaved=interleaved, rotary_dim=10, implementation=implementation
        )

    @jax.jit
    def run(q, k, g):
        rotated, pullback = jax.vjp(op(cos, sin), q, k)
        return pullback(rotated), pullback(g), op(cos, -sin)(*g)

    unrotated, pulled_back, rotated_back = run(q, k, g)
    harness.assert_close_trees(unrotated, (q, k), jnp.float32)
    harness.assert_close_trees(pulled_back, rotated_back, jnp.float32)


def test_check_grads_in_float64():
    q, k = _qk(12, 1, 3, 2, 1, 10, jnp.float64)
    cos, sin = harness.random_normal(14, (3, 6), jnp.float64), harness.random_normal(15, (3, 6), jnp.float64)

    def op(q, k, cos, sin):
        return liger_jax.apply_rotary_pos_emb(q, k, cos, sin, rotary_dim=6, implementation="xla")

    check_grads(jax.jit(op), (q, k, cos, sin), order=1, modes=["rev"])


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
def test_queries_alone_rotate_as_with_keys(implementation):
    q, k = _qk(16, 2, 3, 4, 2, 16, jnp.float32)
    cos, sin = liger_jax.rope_cos_sin(jnp.arange(3), 16, rotary_dim=12)

    def alone(q):
        q_rot, k_rot = liger_jax.apply_rotary_pos_emb(q, None, cos, sin, rotary_dim=12, implementation=implementation)
        assert k_rot is None
        return q_rot

    (q_rot,), (dq,) = harness.vjp_under_jit(lambda q: (alone(q),), (q,), _cotangents(18, q))
    (q_ref, _), (dq_ref, _) = harness.vjp_under_jit(
        lambda q, k: liger_jax.apply_rotary_pos_emb_reference(q, k, cos, sin), (q, k), (*_cotangents(18, q), k)
    )
    harness.assert_close_trees((q_rot, dq), (q_ref, dq_ref), jnp.float32)


def test_rope_cos_sin_partial_tables_are_hf_partial_rotary():
    # HF GPT-NeoX / Phi: dim = head_dim * partial_rotary_factor; inv_freq = 1 / base^(arange(0, dim, 2) / dim).
    positions = np.asarray([0, 3, 11])
    cos, sin = liger_jax.rope_cos_sin(jnp.asarray(positions), 32, base=BASE, rotary_dim=8, dtype=jnp.float64)
    angles = positions[:, None] * _frequencies(8)
    harness.assert_close(cos, np.cos(np.concatenate([angles, angles], -1)), jnp.float32)
    harness.assert_close(sin, np.sin(np.concatenate([angles, angles], -1)), jnp.float32)


@pytest.mark.parametrize(
    ("rotary_dim", "table_width", "match"),
    [
        (5, 5, "rotary_dim must be a positive even int at most head_dim = 8, got 5"),
        (10, 10, "rotary_dim must be a positive even int at most head_dim = 8, got 10"),
        (0, 8, "rotary_dim must be a positive even int"),
        (4, 8, r"cos must have shape .*R = rotary_dim"),
        (None, 4, r"cos must have shape .*R = rotary_dim"),
    ],
)
def test_bad_rotary_dim_raises(rotary_dim, table_width, match):
    harness.assert_call_raises(
        ValueError,
        match,
        lambda q, k, cos, sin, **kw: liger_jax.apply_rotary_pos_emb(q, k, cos, sin, rotary_dim=rotary_dim, **kw),
        [(1, 2, 2, 8), (1, 2, 1, 8), (2, table_width), (2, table_width)],
    )


def test_rope_cos_sin_bad_rotary_dim():
    with pytest.raises(ValueError, match="rotary_dim must be a positive even int at most head_dim = 8"):
        liger_jax.rope_cos_sin(jnp.arange(3), 8, rotary_dim=12)


# Qwen2-VL M-RoPE ---------------------------------------------------------------------------------------------------


def _mrope_oracle(positions, mrope_section, head_dim, interleaved=False):
    """The definition: pair i turns by ``position[plane(i)] · base^(-2i/D)``, plane(i) the section i falls in.

    ``positions [3, B, S]``; returns ``x -> x rotated`` (rotate-half or interleaved pairs) in float64."""
    plane = np.searchsorted(np.cumsum(mrope_section), np.arange(head_dim // 2), side="right")
    angles = np.moveaxis(np.asarray(positions, np.float64)[plane], 0, -1)  # [B, S, D/2]: pair i's position
    angles = angles[:, :, None, :] * _frequencies(head_dim)
    return lambda x: _rotated_by(x, angles, interleaved, head_dim)


def _hf_multimodal_tables(table, mrope_section):
    """HF transformers' apply_multimodal_rotary_pos_emb: split the tables by mrope_section * 2, chunk i from plane
    i % 3 (a second formulation of the section choice, for arbitrary tables)."""
    bounds = np.cumsum(list(mrope_section) * 2)[:-1]
    return jnp.concatenate([chunk[i % 3] for i, chunk in enumerate(jnp.split(table, bounds, axis=-1))], axis=-1)


def _mrope_tables(positions, head_dim, table_batch):
    """rope_cos_sin of each plane's position ids: ``[3, B, S, D]`` ("B"), ``[3, 1, S, D]`` ("1"), ``[3, S, D]``."""
    planes, batch, seq = positions.shape
    if table_batch != "B":
        positions = positions[:, :1]
    flat = jnp.asarray(positions).reshape(-1, seq)
    cos, sin = liger_jax.rope_cos_sin(flat, head_dim, base=BASE)
    shape = {"B": (planes, batch, seq, head_dim), "1": (planes, 1, seq, head_dim), None: (planes, seq, head_dim)}
    return cos.reshape(shape[table_batch]), sin.reshape(shape[table_batch])


# (B, S, Hq, Hkv, D, mrope_section, table batch): Qwen2-VL's split at a small D, an empty section and an odd number
# of pairs, one head with shared tables, a temporal section of most pairs.
MROPE_CASES = [
    (2, 3, 4, 2, 16, (2, 3, 3), "B"),
    (1, 5, 3, 1, 14, (0, 4, 3), "1"),
    (2, 4, 2, 1, 10, (1, 1, 3), None),
    (1, 3, 2, 1, 16, (6, 1, 1), None),
]


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
@pytest.mark.parametrize("case", MROPE_CASES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_mrope_matches_the_definition(implementation, case, dtype):
    batch, seq, q_heads, k_heads, head_dim, mrope_section, table_batch = case
    q, k = _qk(20, batch, seq, q_heads, k_heads, head_dim, dtype)
    positions = np.random.default_rng(22).integers(0, 40, (3, batch, seq))
    if table_batch != "B":
        positions[:, 1:] = positions[:, :1]
    cos, sin = _mrope_tables(positions, head_dim, table_batch)
    oracle_rotation = _mrope_oracle(positions, mrope_section, head_dim)

    def op(q, k):
        return liger_jax.qwen2vl_mrope(q, k, cos, sin, mrope_section, implementation=implementation)

    def oracle(q, k):
        return oracle_rotation(q), oracle_rotation(k)

    _assert_matches_oracle(op, oracle, (q, k), _cotangents(23, q, k), dtype)


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
def test_interleaved_pairs_read_their_sections_planes(implementation):
    # The kernel finds a pair's table plane in either pair layout; no public op pairs M-RoPE's planes with the
    # interleaved layout, so the shared rotation is called directly, against the definition.
    head_dim, mrope_section = 12, (2, 1, 3)
    q, k = _qk(40, 1, 3, 2, 1, head_dim, jnp.float32)
    positions = np.random.default_rng(42).integers(0, 40, (3, 1, 3))
    cos, sin = liger_jax.rope_cos_sin(jnp.asarray(positions).reshape(3, 3), head_dim, base=BASE, interleaved=True)
    oracle_rotation = _mrope_oracle(positions, mrope_section, head_dim, interleaved=True)

    def op(q, k):
        return rope_ops.rotate(
            (q, k), cos, sin, interleaved=True, sections=mrope_section, implementation=implementation
        )

    def oracle(q, k):
        return oracle_rotation(q), oracle_rotation(k)

    _assert_matches_oracle(op, oracle, (q, k), _cotangents(43, q, k), jnp.float32)


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
def test_mrope_table_gradients_match_hf(implementation):
    # Arbitrary tables: each pair's entries differ and the planes differ, so reading a wrong plane or entry shows.
    mrope_section = (1, 2, 2)
    q, k = _qk(25, 2, 3, 2, 1, 10, jnp.float32)
    cos, sin = (harness.random_normal(27 + i, (3, 2, 3, 10), jnp.float32) for i in range(2))

    def oracle(q, k, cos, sin):
        cos, sin = (_hf_multimodal_tables(t, mrope_section) for t in (cos, sin))
        return liger_jax.apply_rotary_pos_emb_reference(q, k, cos, sin)

    harness.assert_vjp_matches_reference(
        lambda *a: liger_jax.qwen2vl_mrope(*a, mrope_section, implementation=implementation),
        oracle,
        (q, k, cos, sin),
        _cotangents(29, q, k),
        jnp.float32,
    )


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
def test_mrope_queries_alone_and_vmap(implementation):
    q, k = _qk(31, 3, 2, 4, 2, 8, jnp.float32)
    cos, sin = _mrope_tables(np.random.default_rng(33).integers(0, 9, (3, 3, 2)), 8, None)

    def op(q):
        return liger_jax.qwen2vl_mrope(q, None, cos, sin, (1, 1, 2), implementation=implementation)[0]

    got = jax.jit(jax.vmap(op))(q[:, None])
    expected, _ = liger_jax.qwen2vl_mrope_reference(*harness.as_float64(q, k), cos, sin, (1, 1, 2))
    harness.assert_close(got[:, 0], expected, jnp.float32)


def test_mrope_check_grads_in_float64():
    q, k = _qk(34, 1, 2, 2, 1, 8, jnp.float64)
    cos, sin = (harness.random_normal(36 + i, (3, 1, 2, 8), jnp.float64) for i in range(2))
    check_grads(
        jax.jit(lambda *a: liger_jax.qwen2vl_mrope(*a, (2, 1, 1), implementation="xla")),
        (q, k, cos, sin),
        order=1,
        modes=["rev"],
    )


@pytest.mark.parametrize(
    ("mrope_section", "table", "error", "match"),
    [
        ((2, 2, 2), (3, 1, 2, 8), ValueError, r"mrope_section must be 3 non-negative ints summing to .* = 4"),
        ((2, 2), (3, 1, 2, 8), ValueError, "mrope_section must be 3 non-negative ints"),
        ((3, -1, 2), (3, 1, 2, 8), ValueError, "mrope_section must be 3 non-negative ints"),
        ((2, 1, 1), (1, 2, 8), ValueError, r"cos must have shape \(3, S\|1 S\|B S, R\)"),
        ((2, 1, 1), (2, 1, 2, 8), ValueError, r"cos must have shape \(3, S\|1 S\|B S, R\)"),
    ],
)
def test_mrope_bad_arguments(mrope_section, table, error, match):
    harness.assert_call_raises(
        error,
        match,
        lambda q, k, cos, sin, **kw: liger_jax.qwen2vl_mrope(q, k, cos, sin, mrope_section, **kw),
        [(1, 2, 2, 8), (1, 2, 1, 8), table, table],
    )


# Llama 4 -----------------------------------------------------------------------------------------------------------


def _llama4_oracle(freqs_cis):
    """HF Llama 4's apply_rotary_emb: view adjacent features as complex, multiply by ``freqs_cis[:, :, None, :]``."""

    def rotate(x):
        z = x[..., 0::2] + 1j * x[..., 1::2]
        product = z * jnp.expand_dims(freqs_cis, -2)
        return jnp.stack([product.real, product.imag], axis=-1).reshape(x.shape)

    return rotate


def _complex(seed, shape):
    return jnp.asarray(
        harness.random_normal(seed, shape, jnp.float32) + 1j * harness.random_normal(seed + 1, shape, jnp.float32)
    )


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("freqs_shape", ["S", "B"])
def test_llama4_rope_matches_hf(implementation, dtype, freqs_shape):
    # General complex frequencies (not unit modulus): the kernel multiplies by any complex number, and its
    # backward by the conjugate.
    batch, seq, head_dim = 2, 5, 12
    q, k = _qk(40, batch, seq, 4, 2, head_dim, dtype)
    freqs_cis = _complex(42, (seq, head_dim // 2) if freqs_shape == "S" else (batch, seq, head_dim // 2))
    oracle_rotation = _llama4_oracle(
        jnp.asarray(freqs_cis, jnp.complex128) if freqs_shape == "B" else jnp.asarray(freqs_cis, jnp.complex128)[None]
    )

    def op(q, k):
        return liger_jax.llama4_rope(q, k, freqs_cis, implementation=implementation)

    def oracle(q, k):
        return oracle_rotation(q), oracle_rotation(k)

    _assert_matches_oracle(op, oracle, (q, k), _cotangents(44, q, k), dtype)


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
def test_llama4_gradient_is_the_conjugate_rotation(implementation):
    seq, head_dim = 4, 8
    q, k = _qk(46, 1, seq, 2, 1, head_dim, jnp.float32)
    angles = np.arange(seq)[:, None] * _frequencies(head_dim)
    freqs_cis = jnp.asarray(np.exp(1j * angles), jnp.complex64)

    def op(freqs):
        return lambda q, k: liger_jax.llama4_rope(q, k, freqs, implementation=implementation)

    @jax.jit
    def run(q, k, g):
        rotated, pullback = jax.vjp(op(freqs_cis), q, k)
        return pullback(rotated), pullback(g), op(jnp.conj(freqs_cis))(*g)

    unrotated, pulled_back, rotated_back = run(q, k, _cotangents(48, q, k))
    harness.assert_close_trees(unrotated, (q, k), jnp.float32)
    harness.assert_close_trees(pulled_back, rotated_back, jnp.float32)


def test_llama4_check_grads_in_float64():
    q, k = _qk(50, 1, 3, 2, 1, 6, jnp.float64)
    freqs_cis = jnp.exp(1j * jnp.asarray(harness.random_normal(52, (3, 3), jnp.float64)))
    check_grads(
        jax.jit(lambda q, k: liger_jax.llama4_rope(q, k, freqs_cis, implementation="xla")),
        (q, k),
        order=1,
        modes=["rev"],
    )


@pytest.mark.parametrize(
    ("freqs", "error", "match"),
    [
        (jnp.ones((2, 4), jnp.float32), TypeError, r"freqs_cis must have a complex dtype \(complex64\)"),
        (jnp.ones((2, 4), jnp.complex128), TypeError, r"freqs_cis must have a complex dtype \(complex64\)"),
        (jnp.ones((2, 8), jnp.complex64), ValueError, r"freqs_cis must have shape \(S, D/2\)"),
        (jnp.ones((3, 2, 4), jnp.complex64), ValueError, r"freqs_cis must have shape \(S, D/2\)"),
    ],
)
def test_llama4_bad_frequencies(freqs, error, match):
    harness.assert_call_raises(
        error, match, lambda q, k, **kw: liger_jax.llama4_rope(q, k, freqs, **kw), [(1, 2, 2, 8), (1, 2, 1, 8)]
    )


# Sharding ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("op", ["partial", "mrope"])
def test_family_partitions_on_batch_and_heads(op):
    """Batch and heads sharded (data and tensor parallelism), per-sequence tables sharded with the batch: the same
    results as on one device, shardings kept, nothing gathered."""
    q, k = _qk(60, 4, 2, 4, 2, 12, jnp.float32)
    if op == "partial":
        cos, sin = liger_jax.rope_cos_sin(jnp.arange(8).reshape(4, 2), 12, rotary_dim=6)
        table_spec = ("x",)

        def run(q, k, cos, sin):
            return liger_jax.apply_rotary_pos_emb(
                q, k, cos, sin, rotary_dim=6, implementation=harness.KERNEL_IMPLEMENTATION
            )
    else:
        cos, sin = _mrope_tables(np.random.default_rng(62).integers(0, 9, (3, 4, 2)), 12, "B")
        table_spec = (None, "x")

        def run(q, k, cos, sin):
            return liger_jax.qwen2vl_mrope(q, k, cos, sin, (2, 2, 2), implementation=harness.KERNEL_IMPLEMENTATION)

    @jax.jit
    def program(q, k, cos, sin, g):
        out, pullback = jax.vjp(lambda q, k: run(q, k, cos, sin), q, k)
        return out, pullback(g)

    g = _cotangents(63, q, k)
    expected = program(q, k, cos, sin, g)
    mesh_ = mesh((4, 2), ("x", "y"))
    sharded = [place(a, mesh_, "x", None, "y") for a in (q, k)]
    tables = [place(t, mesh_, *table_spec) for t in (cos, sin)]
    g_sharded = tuple(place(a, mesh_, "x", None, "y") for a in g)
    got = program(*sharded, *tables, g_sharded)
    chex.assert_trees_all_close(got, expected, atol=1e-6, rtol=1e-6)
    for result, array in zip(jax.tree.leaves(got), sharded + sharded, strict=True):
        assert result.sharding.is_equivalent_to(array.sharding, array.ndim)
    assert_only_small_all_reduces(compiled_collectives(program, *sharded, *tables, g_sharded), 0)


# Modules -----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("flavour", ["nnx", "linen"])
def test_modules(flavour):
    # Partial rotary RotaryEmbedding and Qwen2-VL's MultimodalRotaryEmbedding against the definitions.
    q, k = _qk(70, 2, 3, 4, 2, 16, jnp.bfloat16)
    positions = np.asarray([[5, 6, 7], [0, 1, 9]])
    position_ids = np.random.default_rng(72).integers(0, 20, (3, 2, 3))
    options = {"base": BASE, "implementation": harness.KERNEL_IMPLEMENTATION}
    if flavour == "nnx":
        partial = liger_nnx.RotaryEmbedding(16, rotary_dim=6, **options)(q, k, positions)
        multimodal = liger_nnx.MultimodalRotaryEmbedding(16, (2, 3, 3), **options)(q, k, position_ids)
    else:
        partial = liger_linen.RotaryEmbedding(16, rotary_dim=6, **options).apply({}, q, k, positions)
        multimodal = liger_linen.MultimodalRotaryEmbedding(16, (2, 3, 3), **options).apply({}, q, k, position_ids)
    angles = positions[:, :, None, None] * _frequencies(6)
    mrope = _mrope_oracle(position_ids, (2, 3, 3), 16)
    chex.assert_type([*partial, *multimodal], jnp.bfloat16)
    harness.assert_close_trees(partial, tuple(_rotated_by(x, angles, False, 6) for x in (q, k)), jnp.bfloat16)
    harness.assert_close_trees(multimodal, (mrope(q), mrope(k)), jnp.bfloat16)


@pytest.mark.parametrize(
    ("position_ids", "error", "match"),
    [
        (jnp.zeros((3, 2, 4)), TypeError, "position_ids must be an integer array"),
        (jnp.zeros((2, 4), jnp.int32), ValueError, r"position_ids must have shape \(3, B, S\)"),
    ],
)
def test_mrope_cos_sin_bad_positions(position_ids, error, match):
    with pytest.raises(error, match=match):
        liger_jax.mrope_cos_sin(position_ids, 8)
