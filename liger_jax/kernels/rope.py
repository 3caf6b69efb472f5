"""Rotary position embedding kernel: out = x · cos + rotate(x) · sin over the head axis, q and k together.

q is [n_tokens, N_Q_HEADS, HEAD_DIM] and k is [n_tokens, N_K_HEADS, HEAD_DIM] (tokens are the flattened batch and
sequence axes); cos and sin are [N_PLANES, cos_rows, ROTARY_DIM] and token t uses row ``t % cos_rows`` of a plane,
so one table serves every sequence of a batch (cos_rows = S) or each token has its own row (cos_rows = B · S).
N_K_HEADS = 0 rotates q alone (k's pointers are then never touched).

The first ROTARY_DIM features of each head split into ROTARY_DIM / 2 pairs (x1, x2) that rotate together:
(d, d + ROTARY_DIM / 2) in the rotate-half (NeoX, Llama) layout and (2d, 2d + 1) in the INTERLEAVED (GPT-J) layout;
features from ROTARY_DIM on pass through unchanged (partial rotary: Phi, GPT-NeoX). With (c1, s1) and (c2, s2) the
table entries at the pair's two positions:

    out1 = x1 · c1 - x2 · s1        out2 = x2 · c2 + x1 · s2

Pair p reads its entries from plane 0 when p < SECTION_T, plane 1 when p < SECTION_T + SECTION_H, else plane 2
(Qwen2-VL's multimodal RoPE: temporal, height and width positions); with SECTION_T = ROTARY_DIM / 2 there is one
plane.

TRANSPOSE applies the transposed map (the backward pass): swapping and negating the sin entries, which is the
rotation by -θ when the table repeats each angle at both positions of a pair (as rope_cos_sin builds it).
"""

import triton
import triton.language as tl


@triton.jit
def _plane_offsets(pairs, cos_rows, ROTARY_DIM: tl.constexpr, SECTION_T: tl.constexpr, SECTION_H: tl.constexpr):
    """[1, len(pairs)]: the offset of the table plane each of ``pairs`` reads; 0 with one plane."""
    if SECTION_T < ROTARY_DIM // 2:
        # int64: planes · cos_rows · ROTARY_DIM can pass 2^31.
        plane = (pairs >= SECTION_T).to(tl.int64) + (pairs >= SECTION_T + SECTION_H).to(tl.int64)
        return (plane * cos_rows * ROTARY_DIM)[None, :]
    else:
        return 0


@triton.jit
def _load_pairs(
    ptr,
    starts,
    row_mask,
    cos_rows,
    ROTARY_DIM: tl.constexpr,
    INTERLEAVED: tl.constexpr,
    SECTION_T: tl.constexpr,
    SECTION_H: tl.constexpr,
    BLOCK_PAIRS: tl.constexpr,
):
    """(x1, x2): both members of each pair of the rows at ``starts`` [N, 1], fp32 [N, BLOCK_PAIRS], 0 where masked
    (``row_mask`` [N, 1]; BLOCK_PAIRS is ROTARY_DIM / 2 rounded up to a power of two)."""
    if INTERLEAVED:
        # One contiguous load of each row, its pairs split in registers: loads of every other element would be
        # 2-byte scalar accesses, several times the memory instructions of the vector loads.
        features = tl.arange(0, 2 * BLOCK_PAIRS)
        offsets = starts + features[None, :] + _plane_offsets(features // 2, cos_rows, ROTARY_DIM, SECTION_T, SECTION_H)
        x = tl.load(ptr + offsets, mask=row_mask & (features[None, :] < ROTARY_DIM), other=0.0).to(tl.float32)
        x1, x2 = tl.split(tl.reshape(x, (x.shape[0], BLOCK_PAIRS, 2)))
    else:
        pairs = tl.arange(0, BLOCK_PAIRS)
        offsets = starts + pairs[None, :] + _plane_offsets(pairs, cos_rows, ROTARY_DIM, SECTION_T, SECTION_H)
        mask = row_mask & (pairs[None, :] < ROTARY_DIM // 2)
        x1 = tl.load(ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        x2 = tl.load(ptr + offsets + ROTARY_DIM // 2, mask=mask, other=0.0).to(tl.float32)
    return x1, x2


@triton.jit
def _store_pairs(
    ptr, starts, row_mask, out1, out2, ROTARY_DIM: tl.constexpr, INTERLEAVED: tl.constexpr, BLOCK_PAIRS: tl.constexpr
):
    """Stores ``out1``, ``out2`` [N, BLOCK_PAIRS] fp32 at the pair positions of the rows at ``starts`` [N, 1], as
    :func:`_load_pairs` reads them (interleaved pairs joined in registers, each row one contiguous store)."""
    if INTERLEAVED:
        features = tl.arange(0, 2 * BLOCK_PAIRS)
        out = tl.reshape(tl.join(out1, out2), (out1.shape[0], 2 * BLOCK_PAIRS))
        mask = row_mask & (features[None, :] < ROTARY_DIM)
        tl.store(ptr + starts + features[None, :], out.to(ptr.dtype.element_ty), mask=mask)
    else:
        pairs = tl.arange(0, BLOCK_PAIRS)
        offsets = starts + pairs[None, :]
        mask = row_mask & (pairs[None, :] < ROTARY_DIM // 2)
        tl.store(ptr + offsets, out1.to(ptr.dtype.element_ty), mask=mask)
        tl.store(ptr + offsets + ROTARY_DIM // 2, out2.to(ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rotate_heads(
    x_ptr,
    out_ptr,
    token,
    cos1,
    cos2,
    sin1,
    sin2,
    N_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    ROTARY_DIM: tl.constexpr,
    INTERLEAVED: tl.constexpr,
    BLOCK_PAIRS: tl.constexpr,
    BLOCK_HEADS: tl.constexpr,
    BLOCK_PASS: tl.constexpr,
):
    """Rotates the N_HEADS heads of one token, BLOCK_HEADS heads per step, with the token's table entries
    ([1, BLOCK_PAIRS] fp32), and copies each head's features past ROTARY_DIM."""
    for head_tile in range((N_HEADS + BLOCK_HEADS - 1) // BLOCK_HEADS):
        heads = head_tile * BLOCK_HEADS + tl.arange(0, BLOCK_HEADS)
        # int64: tokens · heads · HEAD_DIM can pass 2^31.
        head_starts = ((token * N_HEADS + heads.to(tl.int64)) * HEAD_DIM)[:, None]
        head_mask = heads[:, None] < N_HEADS
        # Heads have no table planes: one "section" holds every pair.
        x1, x2 = _load_pairs(x_ptr, head_starts, head_mask, 0, ROTARY_DIM, INTERLEAVED, ROTARY_DIM // 2, 0, BLOCK_PAIRS)
        out1 = x1 * cos1 - x2 * sin1
        out2 = x2 * cos2 + x1 * sin2
        _store_pairs(out_ptr, head_starts, head_mask, out1, out2, ROTARY_DIM, INTERLEAVED, BLOCK_PAIRS)
        if ROTARY_DIM < HEAD_DIM:
            # BLOCK_PASS is HEAD_DIM - ROTARY_DIM rounded up to a power of two; the mask drops the padding.
            passing = ROTARY_DIM + tl.arange(0, BLOCK_PASS)
            pass_mask = head_mask & (passing[None, :] < HEAD_DIM)
            pass_offsets = head_starts + passing[None, :]
            tl.store(out_ptr + pass_offsets, tl.load(x_ptr + pass_offsets, mask=pass_mask), mask=pass_mask)


@triton.jit
def rope(
    q_ptr,  # [n_tokens, N_Q_HEADS, HEAD_DIM] q.dtype
    k_ptr,  # [n_tokens, N_K_HEADS, HEAD_DIM] k.dtype; any placeholder when N_K_HEADS = 0
    cos_ptr,  # [N_PLANES, cos_rows, ROTARY_DIM] cos.dtype
    sin_ptr,  # [N_PLANES, cos_rows, ROTARY_DIM] sin.dtype
    cos_rows,
    q_out_ptr,  # [n_tokens, N_Q_HEADS, HEAD_DIM] q.dtype
    k_out_ptr,  # [n_tokens, N_K_HEADS, HEAD_DIM] k.dtype; any placeholder when N_K_HEADS = 0
    N_Q_HEADS: tl.constexpr,
    N_K_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    ROTARY_DIM: tl.constexpr,
    INTERLEAVED: tl.constexpr,
    TRANSPOSE: tl.constexpr,
    SECTION_T: tl.constexpr,
    SECTION_H: tl.constexpr,
    BLOCK_PAIRS: tl.constexpr,
    BLOCK_PASS: tl.constexpr,
    BLOCK_Q_HEADS: tl.constexpr,
    BLOCK_K_HEADS: tl.constexpr,
):
    """One program per token: loads the token's cos/sin entries once (fp32) and rotates all its q and k heads."""
    token = tl.program_id(0).to(tl.int64)
    table_start = tl.full((1, 1), 0, tl.int64) + (token % cos_rows) * ROTARY_DIM
    table_mask = tl.full((1, 1), 1, tl.int1)
    cos1, cos2 = _load_pairs(
        cos_ptr, table_start, table_mask, cos_rows, ROTARY_DIM, INTERLEAVED, SECTION_T, SECTION_H, BLOCK_PAIRS
    )
    sin1, sin2 = _load_pairs(
        sin_ptr, table_start, table_mask, cos_rows, ROTARY_DIM, INTERLEAVED, SECTION_T, SECTION_H, BLOCK_PAIRS
    )
    if TRANSPOSE:
        # The transpose of [[c1, -s1], [s2, c2]] is [[c1, s2], [-s1, c2]].
        sin1, sin2 = -sin2, -sin1
    _rotate_heads(
        q_ptr,
        q_out_ptr,
        token,
        cos1,
        cos2,
        sin1,
        sin2,
        N_Q_HEADS,
        HEAD_DIM,
        ROTARY_DIM,
        INTERLEAVED,
        BLOCK_PAIRS,
        BLOCK_Q_HEADS,
        BLOCK_PASS,
    )
    _rotate_heads(
        k_ptr,
        k_out_ptr,
        token,
        cos1,
        cos2,
        sin1,
        sin2,
        N_K_HEADS,
        HEAD_DIM,
        ROTARY_DIM,
        INTERLEAVED,
        BLOCK_PAIRS,
        BLOCK_K_HEADS,
        BLOCK_PASS,
    )
