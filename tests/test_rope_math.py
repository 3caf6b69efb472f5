"""RoPE math: rotations and their gradients against a float64 closed form written pair by pair, with tables whose
two entries of a pair differ (``rope_cos_sin``'s tables repeat each angle, under which swapping a pair's entries or
the transposed map's signs changes nothing), and float64 finite differences. The tests ``tools/mutation.py`` runs
first against the RoPE kernel and backward rule."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

import liger_jax
from tests import harness

# (batch, seq, q heads, k heads, head_dim): grouped-query heads; 3 pairs a head, padded to a block of 4.
BATCH, SEQ, Q_HEADS, K_HEADS, HEAD_DIM = 2, 3, 6, 2, 6


def _pairs(head_dim, interleaved):
    """Indices of each pair's first and second element."""
    half = np.arange(head_dim // 2)
    return (2 * half, 2 * half + 1) if interleaved else (half, half + head_dim // 2)


def closed_form(x, cos, sin, dout, interleaved):
    """``(out, dx, dcos, dsin)`` in float64 numpy, pair by pair: out1 = x1 c1 - x2 s1, out2 = x2 c2 + x1 s2.

    ``x`` ``[B, S, H, D]``; ``cos``, ``sin`` ``[B, S, D]``; ``dout`` like ``x``. The gradients are the transposed
    map, dx1 = c1 d1 + s2 d2 and dx2 = c2 d2 - s1 d1, and Σ_heads of the products with x.
    """
    x, dout = np.asarray(x, np.float64), np.asarray(dout, np.float64)
    cos, sin = (np.asarray(t, np.float64)[:, :, None, :] for t in (cos, sin))
    first, second = _pairs(x.shape[-1], interleaved)
    x1, x2, d1, d2 = x[..., first], x[..., second], dout[..., first], dout[..., second]
    c1, c2, s1, s2 = cos[..., first], cos[..., second], sin[..., first], sin[..., second]
    out, dx, dcos, dsin = (np.zeros_like(x) for _ in range(4))
    out[..., first], out[..., second] = x1 * c1 - x2 * s1, x2 * c2 + x1 * s2
    dx[..., first], dx[..., second] = c1 * d1 + s2 * d2, c2 * d2 - s1 * d1
    dcos[..., first], dcos[..., second] = d1 * x1, d2 * x2
    dsin[..., first], dsin[..., second] = -d1 * x2, d2 * x1
    return out, dx, dcos.sum(axis=2), dsin.sum(axis=2)


def _normal(seed, shape):
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), jnp.float32)


def _operands(table_batch):
    q = _normal(1, (BATCH, SEQ, Q_HEADS, HEAD_DIM))
    k = _normal(2, (BATCH, SEQ, K_HEADS, HEAD_DIM))
    cos, sin = _normal(3, (table_batch, SEQ, HEAD_DIM)), _normal(4, (table_batch, SEQ, HEAD_DIM))
    return q, k, cos, sin


def _assert_close(actual, expected):
    np.testing.assert_allclose(np.asarray(actual, np.float64), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
@pytest.mark.parametrize("interleaved", [False, True], ids=["rotate_half", "interleaved"])
@pytest.mark.parametrize("table_batch", [1, BATCH], ids=["shared_table", "table_per_sequence"])
def test_rotations_and_gradients_match_the_closed_form(implementation, interleaved, table_batch):
    q, k, cos, sin = _operands(table_batch)
    dq_out, dk_out = _normal(5, q.shape), _normal(6, k.shape)
    (q_out, k_out), (dq, dk) = harness.vjp_under_jit(
        lambda q, k: liger_jax.apply_rotary_pos_emb(
            q, k, cos, sin, interleaved=interleaved, implementation=implementation
        ),
        (q, k),
        (dq_out, dk_out),
    )
    tables = [np.broadcast_to(np.asarray(t), (BATCH, SEQ, HEAD_DIM)) for t in (cos, sin)]
    expected_q = closed_form(q, *tables, dq_out, interleaved)
    expected_k = closed_form(k, *tables, dk_out, interleaved)
    for actual, expected in [(q_out, expected_q[0]), (k_out, expected_k[0]), (dq, expected_q[1]), (dk, expected_k[1])]:
        _assert_close(actual, expected)


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
@pytest.mark.parametrize("interleaved", [False, True], ids=["rotate_half", "interleaved"])
def test_table_gradients_match_the_closed_form(implementation, interleaved):
    q, k, cos, sin = _operands(BATCH)
    dq_out, dk_out = _normal(7, q.shape), _normal(8, k.shape)
    _, (dq, dk, dcos, dsin) = harness.vjp_under_jit(
        lambda q, k, cos, sin: liger_jax.apply_rotary_pos_emb(
            q, k, cos, sin, interleaved=interleaved, implementation=implementation
        ),
        (q, k, cos, sin),
        (dq_out, dk_out),
    )
    expected_q = closed_form(q, cos, sin, dq_out, interleaved)
    expected_k = closed_form(k, cos, sin, dk_out, interleaved)
    _assert_close(dq, expected_q[1])
    _assert_close(dk, expected_k[1])
    _assert_close(dcos, expected_q[2] + expected_k[2])
    _assert_close(dsin, expected_q[3] + expected_k[3])


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
@pytest.mark.parametrize("interleaved", [False, True], ids=["rotate_half", "interleaved"])
def test_finite_differences_in_float64(implementation, interleaved):
    # Through the fp32 kernel, float64 finite differences need tolerances that fp32 rounding allows.
    q, k, cos, sin = _operands(1)
    dtype = jnp.float64 if implementation == "xla" else jnp.float32

    def rope(q, k):
        q_out, k_out = liger_jax.apply_rotary_pos_emb(
            q.astype(dtype), k.astype(dtype), cos, sin, interleaved=interleaved, implementation=implementation
        )
        return q_out.astype(jnp.float64), k_out.astype(jnp.float64)

    tolerance = {"atol": 1e-7, "rtol": 1e-7, "eps": 1e-4} if implementation == "xla" else {"atol": 2e-3, "rtol": 2e-3}
    check_grads(jax.jit(rope), harness.as_float64(q, k), order=1, modes=["rev"], **tolerance)


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
@pytest.mark.parametrize("interleaved", [False, True], ids=["rotate_half", "interleaved"])
def test_partial_rotary_matches_the_closed_form_and_passes_the_rest_through(implementation, interleaved):
    # Two of the three pairs rotate (a block of 2 pairs), two features pass through (a block of 2): the tables are
    # rotary_dim wide, arbitrary, per sequence.
    rotary_dim = 4
    q, k, _, _ = _operands(BATCH)
    cos, sin = _normal(9, (BATCH, SEQ, rotary_dim)), _normal(10, (BATCH, SEQ, rotary_dim))
    dq_out, dk_out = _normal(11, q.shape), _normal(12, k.shape)
    (q_out, k_out), (dq, dk, dcos, dsin) = harness.vjp_under_jit(
        lambda q, k, cos, sin: liger_jax.apply_rotary_pos_emb(
            q, k, cos, sin, interleaved=interleaved, rotary_dim=rotary_dim, implementation=implementation
        ),
        (q, k, cos, sin),
        (dq_out, dk_out),
    )
    table_grads = np.zeros((2, BATCH, SEQ, rotary_dim))
    for x, dout, out, dx in [(q, dq_out, q_out, dq), (k, dk_out, k_out, dk)]:
        x, dout = np.asarray(x, np.float64), np.asarray(dout, np.float64)
        rotated, dx_rotated, dcos_x, dsin_x = closed_form(
            x[..., :rotary_dim], cos, sin, dout[..., :rotary_dim], interleaved
        )
        _assert_close(out, np.concatenate([rotated, x[..., rotary_dim:]], axis=-1))
        _assert_close(dx, np.concatenate([dx_rotated, dout[..., rotary_dim:]], axis=-1))
        table_grads += (dcos_x, dsin_x)
    _assert_close(dcos, table_grads[0])
    _assert_close(dsin, table_grads[1])
