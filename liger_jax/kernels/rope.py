"""Rotary position embedding kernels: out = x · cos + rotate(x) · sin over the head axis, q and k together.

q is [n_tokens, N_Q_HEADS, HEAD_DIM] and k is [n_tokens, N_K_HEADS, HEAD_DIM] (tokens are the flattened batch and
sequence axes); cos and sin are [cos_rows, HEAD_DIM] and token t uses row ``t % cos_rows``, so one table serves
every sequence of a batch (cos_rows = S) or each token has its own row (cos_rows = B · S).

Each head splits into HEAD_DIM / 2 pairs (x1, x2) that rotate together: (d, d + HEAD_DIM / 2) in the rotate-half
(NeoX, Llama) layout and (2d, 2d + 1) in the INTERLEAVED (GPT-J) layout. With (c1, s1) and (c2, s2) the table
entries at the pair's two positions:

    out1 = x1 · c1 - x2 · s1        out2 = x2 · c2 + x1 · s2

TRANSPOSE applies the transposed map (the backward pass): swapping and negating the sin entries, which is the
rotation by -θ when the table repeats each angle at both positions of a pair (as rope_cos_sin builds it).
"""

import triton
import triton.language as tl


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
    BLOCK_HEADS: tl.constexpr,
):
    """Rotates the N_HEADS heads of one token, BLOCK_HEADS heads per step, with the token's table entries."""
    for head_tile in range((N_HEADS + BLOCK_HEADS - 1) // BLOCK_HEADS):
        heads = head_tile * BLOCK_HEADS + tl.arange(0, BLOCK_HEADS)
        # int64: tokens · heads · HEAD_DIM can pass 2^31.
        head_start = (token * N_HEADS + heads.to(tl.int64)) * HEAD_DIM
        mask = (heads[:, None] < N_HEADS) & pair_mask[None, :]
        first_offsets = head_start[:, None] + first[None, :]
        second_offsets = head_start[:, None] + second[None, :]
        x1 = tl.load(x_ptr + first_offsets, mask=mask, other=0.0).to(tl.float32)
        x2 = tl.load(x_ptr + second_offsets, mask=mask, other=0.0).to(tl.float32)
        out1 = x1 * cos1[None, :] - x2 * sin1[None, :]
        out2 = x2 * cos2[None, :] + x1 * sin2[None, :]
        tl.store(out_ptr + first_offsets, out1.to(out_ptr.dtype.element_ty), mask=mask)
        tl.store(out_ptr + second_offsets, out2.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def rope(
    q_ptr,  # [n_tokens, N_Q_HEADS, HEAD_DIM] q.dtype
    k_ptr,  # [n_tokens, N_K_HEADS, HEAD_DIM] k.dtype
    cos_ptr,  # [cos_rows, HEAD_DIM] cos.dtype
    sin_ptr,  # [cos_rows, HEAD_DIM] sin.dtype
    cos_rows,
    q_out_ptr,  # [n_tokens, N_Q_HEADS, HEAD_DIM] q.dtype
    k_out_ptr,  # [n_tokens, N_K_HEADS, HEAD_DIM] k.dtype
    N_Q_HEADS: tl.constexpr,
    N_K_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    INTERLEAVED: tl.constexpr,
    TRANSPOSE: tl.constexpr,
    BLOCK_PAIRS: tl.constexpr,
    BLOCK_Q_HEADS: tl.constexpr,
    BLOCK_K_HEADS: tl.constexpr,
):
    """One program per token: loads the token's cos/sin row once (fp32) and rotates all its q and k heads."""
    token = tl.program_id(0).to(tl.int64)
    pairs = tl.arange(0, BLOCK_PAIRS)
    # BLOCK_PAIRS is HEAD_DIM / 2 rounded up to a power of two; the mask drops the padding.
    pair_mask = pairs < HEAD_DIM // 2
    if INTERLEAVED:
        first = 2 * pairs
        second = first + 1
    else:
        first = pairs
        second = pairs + HEAD_DIM // 2
    table_row = cos_ptr + (token % cos_rows) * HEAD_DIM
    cos1 = tl.load(table_row + first, mask=pair_mask, other=0.0).to(tl.float32)
    cos2 = tl.load(table_row + second, mask=pair_mask, other=0.0).to(tl.float32)
    table_row = sin_ptr + (token % cos_rows) * HEAD_DIM
    sin1 = tl.load(table_row + first, mask=pair_mask, other=0.0).to(tl.float32)
    sin2 = tl.load(table_row + second, mask=pair_mask, other=0.0).to(tl.float32)
    if TRANSPOSE:
        # The transpose of [[c1, -s1], [s2, c2]] is [[c1, s2], [-s1, c2]].
        swapped = sin1
        sin1 = -sin2
        sin2 = -swapped
    _rotate_heads(
        q_ptr, q_out_ptr, token, cos1, cos2, sin1, sin2, first, second, pair_mask, N_Q_HEADS, HEAD_DIM, BLOCK_Q_HEADS
    )
    _rotate_heads(
        k_ptr, k_out_ptr, token, cos1, cos2, sin1, sin2, first, second, pair_mask, N_K_HEADS, HEAD_DIM, BLOCK_K_HEADS
    )
