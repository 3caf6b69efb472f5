"""Rotary position embedding kernels: out = x · cos + rotate(x) · sin over the head axis, q and k together.

q is [n_tokens, N_Q_HEADS, HEAD_DIM] and k is [n_tokens, N_K_HEADS, HEAD_DIM] (tokens are the flattened batch and
sequence axes); cos and sin are [N_PLANES, cos_rows, ROTARY_DIM] and token t uses row ``t % cos_rows`` of a plane,
so one table serves every sequence of a batch (cos_rows = S) or each token has its own row (cos_rows = B · S).

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
def _table_entries(
    cos_ptr,
    sin_ptr,
    cos_rows,
    token,
    ROTARY_DIM: tl.constexpr,
    INTERLEAVED: tl.constexpr,
    TRANSPOSE: tl.constexpr,
    SECTION_T: tl.constexpr,
    SECTION_H: tl.constexpr,
    BLOCK_PAIRS: tl.constexpr,
):
    """The pair geometry and the token's fp32 table entries: ``(first, second, pair_mask, c1, c2, s1, s2)``."""
    pairs = tl.arange(0, BLOCK_PAIRS)
    # BLOCK_PAIRS is ROTARY_DIM / 2 rounded up to a power of two; the mask drops the padding.
    pair_mask = pairs < ROTARY_DIM // 2
    if INTERLEAVED:
        first = 2 * pairs
        second = first + 1
    else:
        first = pairs
        second = pairs + ROTARY_DIM // 2
    row = (token % cos_rows) * ROTARY_DIM
    if SECTION_T < ROTARY_DIM // 2:
        # int64: planes · cos_rows · ROTARY_DIM can pass 2^31.
        plane = (pairs >= SECTION_T).to(tl.int64) + (pairs >= SECTION_T + SECTION_H).to(tl.int64)
        row = row + plane * cos_rows * ROTARY_DIM
    cos1 = tl.load(cos_ptr + row + first, mask=pair_mask, other=0.0).to(tl.float32)
    cos2 = tl.load(cos_ptr + row + second, mask=pair_mask, other=0.0).to(tl.float32)
    sin1 = tl.load(sin_ptr + row + first, mask=pair_mask, other=0.0).to(tl.float32)
    sin2 = tl.load(sin_ptr + row + second, mask=pair_mask, other=0.0).to(tl.float32)
    if TRANSPOSE:
        # The transpose of [[c1, -s1], [s2, c2]] is [[c1, s2], [-s1, c2]].
        swapped = sin1
        sin1 = -sin2
        sin2 = -swapped
    return first, second, pair_mask, cos1, cos2, sin1, sin2


@triton.jit
def _rotate_heads(
    x_ptr,
    out_ptr,
    token,
    cos1,
    cos2,
    sin1,
    sin2,
    first,
    second,
    pair_mask,
    N_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    ROTARY_DIM: tl.constexpr,
    BLOCK_HEADS: tl.constexpr,
    BLOCK_PASS: tl.constexpr,
):
    """Rotates the N_HEADS heads of one token, BLOCK_HEADS heads per step, with the token's table entries, and
    copies each head's features past ROTARY_DIM."""
    for head_tile in range((N_HEADS + BLOCK_HEADS - 1) // BLOCK_HEADS):
        heads = head_tile * BLOCK_HEADS + tl.arange(0, BLOCK_HEADS)
        # int64: tokens · heads · HEAD_DIM can pass 2^31.
        head_start = (token * N_HEADS + heads.to(tl.int64)) * HEAD_DIM
        head_mask = heads[:, None] < N_HEADS
        mask = head_mask & pair_mask[None, :]
        first_offsets = head_start[:, None] + first[None, :]
        second_offsets = head_start[:, None] + second[None, :]
        x1 = tl.load(x_ptr + first_offsets, mask=mask, other=0.0).to(tl.float32)
        x2 = tl.load(x_ptr + second_offsets, mask=mask, other=0.0).to(tl.float32)
        out1 = x1 * cos1[None, :] - x2 * sin1[None, :]
        out2 = x2 * cos2[None, :] + x1 * sin2[None, :]
        tl.store(out_ptr + first_offsets, out1.to(out_ptr.dtype.element_ty), mask=mask)
        tl.store(out_ptr + second_offsets, out2.to(out_ptr.dtype.element_ty), mask=mask)
        if ROTARY_DIM < HEAD_DIM:
            # BLOCK_PASS is HEAD_DIM - ROTARY_DIM rounded up to a power of two; the mask drops the padding.
            passing = ROTARY_DIM + tl.arange(0, BLOCK_PASS)
            pass_mask = head_mask & (passing[None, :] < HEAD_DIM)
            pass_offsets = head_start[:, None] + passing[None, :]
            tl.store(out_ptr + pass_offsets, tl.load(x_ptr + pass_offsets, mask=pass_mask), mask=pass_mask)


@triton.jit
def rope(
    q_ptr,  # [n_tokens, N_Q_HEADS, HEAD_DIM] q.dtype
    k_ptr,  # [n_tokens, N_K_HEADS, HEAD_DIM] k.dtype
    cos_ptr,  # [N_PLANES, cos_rows, ROTARY_DIM] cos.dtype
    sin_ptr,  # [N_PLANES, cos_rows, ROTARY_DIM] sin.dtype
    cos_rows,
    q_out_ptr,  # [n_tokens, N_Q_HEADS, HEAD_DIM] q.dtype
    k_out_ptr,  # [n_tokens, N_K_HEADS, HEAD_DIM] k.dtype
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
    first, second, pair_mask, cos1, cos2, sin1, sin2 = _table_entries(
        cos_ptr, sin_ptr, cos_rows, token, ROTARY_DIM, INTERLEAVED, TRANSPOSE, SECTION_T, SECTION_H, BLOCK_PAIRS
    )
    _rotate_heads(
        q_ptr,
        q_out_ptr,
        token,
        cos1,
        cos2,
        sin1,
        sin2,
        first,
        second,
        pair_mask,
        N_Q_HEADS,
        HEAD_DIM,
        ROTARY_DIM,
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
        first,
        second,
        pair_mask,
        N_K_HEADS,
        HEAD_DIM,
        ROTARY_DIM,
        BLOCK_K_HEADS,
        BLOCK_PASS,
    )


@triton.jit
def rope_one(
    x_ptr,  # [n_tokens, N_HEADS, HEAD_DIM] x.dtype
    cos_ptr,  # [N_PLANES, cos_rows, ROTARY_DIM] cos.dtype
    sin_ptr,  # [N_PLANES, cos_rows, ROTARY_DIM] sin.dtype
    cos_rows,
    out_ptr,  # [n_tokens, N_HEADS, HEAD_DIM] x.dtype
    N_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    ROTARY_DIM: tl.constexpr,
    INTERLEAVED: tl.constexpr,
    TRANSPOSE: tl.constexpr,
    SECTION_T: tl.constexpr,
    SECTION_H: tl.constexpr,
    BLOCK_PAIRS: tl.constexpr,
    BLOCK_PASS: tl.constexpr,
    BLOCK_HEADS: tl.constexpr,
):
    """:func:`rope` for a single tensor (queries without keys): one program per token."""
    token = tl.program_id(0).to(tl.int64)
    first, second, pair_mask, cos1, cos2, sin1, sin2 = _table_entries(
        cos_ptr, sin_ptr, cos_rows, token, ROTARY_DIM, INTERLEAVED, TRANSPOSE, SECTION_T, SECTION_H, BLOCK_PAIRS
    )
    _rotate_heads(
        x_ptr,
        out_ptr,
        token,
        cos1,
        cos2,
        sin1,
        sin2,
        first,
        second,
        pair_mask,
        N_HEADS,
        HEAD_DIM,
        ROTARY_DIM,
        BLOCK_HEADS,
        BLOCK_PASS,
    )
