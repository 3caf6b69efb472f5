"""Neighborhood attention kernels over ``[B, S, H, D]`` queries, keys and values: only the band of keys within
``R = (kernel_size // 2) · dilation`` of a query is ever loaded, so work and memory grow with S · R, not S².

Forward (one program per BLOCK_M queries of one (batch, head)): scores ``s = scale · q kᵀ`` tile by tile over the
band's key blocks, an online softmax (running max and sum of exponentials, rescaled as the max grows), ``P v``
accumulated in fp32; it writes the output and each query's fp32 log-sum-exp ``lse`` for the backward pass.
Backward (flash-attention's, recomputing P = exp(s - lse)): ``dS = P ∘ (dO vᵀ - Δ)`` with ``Δ = Σ dO ∘ O`` per
query, then ``dq = scale · dS k`` per query block, and ``dk = scale · dSᵀ q``, ``dv = Pᵀ dO`` per key block (the
band is symmetric, so a key block's queries are the same band). No atomics: each program owns its output rows.

Every matmul operand is in the inputs' dtype with fp32 accumulation (``input_precision="ieee"``: fp32 stays fp32,
not TF32); P is rounded to v's dtype for ``P v``, as flash attention does. Sizes are constexprs (see
``liger_jax.kernels._rows`` on why).
"""

import triton
import triton.language as tl


@triton.jit
def _tile(ptr, rows, cols, base, S: tl.constexpr, H: tl.constexpr, D: tl.constexpr):
    """The [rows, cols] tile of one (batch, head) of a [B, S, H, D] array from ``base`` (its element (b, 0, h, 0)),
    0 outside the sequence and the head dim."""
    mask = (rows[:, None] >= 0) & (rows[:, None] < S) & (cols[None, :] < D)
    return tl.load(ptr + base + rows[:, None].to(tl.int64) * (H * D) + cols[None, :], mask=mask, other=0.0)


@triton.jit
def _dot(a, b, UPCAST: tl.constexpr):
    """fp32 ``a @ b``. With UPCAST the operands go to fp32 first: exact for bf16 and fp16 (so is each product), and
    what Triton's interpreter needs, whose tl.dot of bf16 tiles returns garbage (triton 3.6)."""
    if UPCAST:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    return tl.dot(a, b, input_precision="ieee")


@triton.jit
def _scores(
    q, k, queries, keys, scale, S: tl.constexpr, RADIUS: tl.constexpr, DILATION: tl.constexpr, UPCAST: tl.constexpr
):
    """fp32 ``scale · q kᵀ`` [BLOCK_Q, BLOCK_K], -inf outside the band (|key - query| > RADIUS, off the dilation
    grid) and outside the sequence."""
    offset = keys[None, :] - queries[:, None]
    inside = (keys[None, :] >= 0) & (keys[None, :] < S) & (queries[:, None] < S)
    inside = inside & (offset <= RADIUS) & (offset >= -RADIUS) & (offset % DILATION == 0)
    scores = _dot(q, tl.trans(k), UPCAST) * scale
    return tl.where(inside, scores, float("-inf"))


@triton.jit
def neighborhood_attention_fwd(
    q_ptr,  # [B, S, H, D] q.dtype
    k_ptr,  # [B, S, H, D] q.dtype
    v_ptr,  # [B, S, H, D] q.dtype
    o_ptr,  # [B, S, H, D] q.dtype
    lse_ptr,  # [B, S, H] fp32
    scale: tl.constexpr,
    S: tl.constexpr,
    H: tl.constexpr,
    D: tl.constexpr,
    RADIUS: tl.constexpr,
    DILATION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BAND_BLOCKS: tl.constexpr,
    UPCAST: tl.constexpr,
):
    """O = softmax_band(scale · q kᵀ) v and lse for BLOCK_M queries of one (batch, head).

    Grid ``(cdiv(S, BLOCK_M), B · H)``. BAND_BLOCKS key blocks from the band's clipped start cover the band of
    every query of the block (the launcher counts them); UPCAST as :func:`_dot`.
    """
    batch_head = tl.program_id(1)
    base = (batch_head // H).to(tl.int64) * S * H * D + (batch_head % H) * D
    queries = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_D)
    q = _tile(q_ptr, queries, cols, base, S, H, D)
    row_max = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    row_sum = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)
    first_key = tl.maximum(tl.program_id(0) * BLOCK_M - RADIUS, 0)  # the band of this block's queries
    for step in range(BAND_BLOCKS):
        keys = first_key + step * BLOCK_N + tl.arange(0, BLOCK_N)
        k = _tile(k_ptr, keys, cols, base, S, H, D)
        v = _tile(v_ptr, keys, cols, base, S, H, D)
        scores = _scores(q, k, queries, keys, scale, S, RADIUS, DILATION, UPCAST)
        new_max = tl.maximum(row_max, tl.max(scores, axis=1))
        # A row with no key of its band in this block yet keeps max -inf: shift by 0 there (exp(-inf - 0) = 0).
        shift = tl.where(new_max == float("-inf"), 0.0, new_max)
        probabilities = tl.exp(scores - shift[:, None])
        rescale = tl.exp(row_max - shift)
        row_sum = row_sum * rescale + tl.sum(probabilities, axis=1)
        acc = acc * rescale[:, None] + _dot(probabilities.to(v.dtype), v, UPCAST)
        row_max = new_max
    rows = queries[:, None].to(tl.int64) * (H * D) + cols[None, :]
    mask = (queries[:, None] < S) & (cols[None, :] < D)
    # Each query's band holds the query itself, so row_sum ≥ 1 on every stored row; rows past S sum to 0.
    row_sum = tl.where(queries < S, row_sum, 1.0)
    tl.store(o_ptr + base + rows, (acc / row_sum[:, None]).to(o_ptr.dtype.element_ty), mask=mask)
    lse_offsets = (batch_head // H).to(tl.int64) * S * H + queries * H + batch_head % H
    tl.store(lse_ptr + lse_offsets, row_max + tl.log(row_sum), mask=queries < S)


@triton.jit
def _row_stats(ptr, rows, batch_head, S: tl.constexpr, H: tl.constexpr):
    """A [B, S, H] fp32 statistic (lse or Δ) at ``rows`` of one (batch, head); 0 outside the sequence."""
    offsets = (batch_head // H).to(tl.int64) * S * H + rows * H + batch_head % H
    return tl.load(ptr + offsets, mask=(rows >= 0) & (rows < S), other=0.0)


@triton.jit
def neighborhood_attention_bwd_dq(
    q_ptr,  # [B, S, H, D] q.dtype
    k_ptr,  # [B, S, H, D] q.dtype
    v_ptr,  # [B, S, H, D] q.dtype
    do_ptr,  # [B, S, H, D] q.dtype, the output's cotangent
    lse_ptr,  # [B, S, H] fp32, from the forward
    delta_ptr,  # [B, S, H] fp32, Σ_d dO · O
    dq_ptr,  # [B, S, H, D] q.dtype
    scale: tl.constexpr,
    S: tl.constexpr,
    H: tl.constexpr,
    D: tl.constexpr,
    RADIUS: tl.constexpr,
    DILATION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BAND_BLOCKS: tl.constexpr,
    UPCAST: tl.constexpr,
):
    """dq = scale · Σ_band P ∘ (dO vᵀ - Δ) k for BLOCK_M queries of one (batch, head)."""
    batch_head = tl.program_id(1)
    base = (batch_head // H).to(tl.int64) * S * H * D + (batch_head % H) * D
    queries = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_D)
    q = _tile(q_ptr, queries, cols, base, S, H, D)
    do = _tile(do_ptr, queries, cols, base, S, H, D)
    lse = _row_stats(lse_ptr, queries, batch_head, S, H)
    delta = _row_stats(delta_ptr, queries, batch_head, S, H)
    acc = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)
    first_key = tl.maximum(tl.program_id(0) * BLOCK_M - RADIUS, 0)  # the band of this block's queries
    for step in range(BAND_BLOCKS):
        keys = first_key + step * BLOCK_N + tl.arange(0, BLOCK_N)
        k = _tile(k_ptr, keys, cols, base, S, H, D)
        v = _tile(v_ptr, keys, cols, base, S, H, D)
        probabilities = tl.exp(_scores(q, k, queries, keys, scale, S, RADIUS, DILATION, UPCAST) - lse[:, None])
        dp = _dot(do, tl.trans(v), UPCAST)
        ds = probabilities * (dp - delta[:, None])
        acc += _dot(ds.to(k.dtype), k, UPCAST)
    rows = queries[:, None].to(tl.int64) * (H * D) + cols[None, :]
    mask = (queries[:, None] < S) & (cols[None, :] < D)
    tl.store(dq_ptr + base + rows, (acc * scale).to(dq_ptr.dtype.element_ty), mask=mask)


@triton.jit
def neighborhood_attention_bwd_dkdv(
    q_ptr,  # [B, S, H, D] q.dtype
    k_ptr,  # [B, S, H, D] q.dtype
    v_ptr,  # [B, S, H, D] q.dtype
    do_ptr,  # [B, S, H, D] q.dtype, the output's cotangent
    lse_ptr,  # [B, S, H] fp32, from the forward
    delta_ptr,  # [B, S, H] fp32, Σ_d dO · O
    dk_ptr,  # [B, S, H, D] q.dtype
    dv_ptr,  # [B, S, H, D] q.dtype
    scale: tl.constexpr,
    S: tl.constexpr,
    H: tl.constexpr,
    D: tl.constexpr,
    RADIUS: tl.constexpr,
    DILATION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BAND_BLOCKS: tl.constexpr,
    UPCAST: tl.constexpr,
):
    """dk = scale · Σ_band dSᵀ q and dv = Σ_band Pᵀ dO for BLOCK_N keys of one (batch, head)."""
    batch_head = tl.program_id(1)
    base = (batch_head // H).to(tl.int64) * S * H * D + (batch_head % H) * D
    keys = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    cols = tl.arange(0, BLOCK_D)
    k = _tile(k_ptr, keys, cols, base, S, H, D)
    v = _tile(v_ptr, keys, cols, base, S, H, D)
    dk = tl.zeros((BLOCK_N, BLOCK_D), tl.float32)
    dv = tl.zeros((BLOCK_N, BLOCK_D), tl.float32)
    first_query = tl.maximum(tl.program_id(0) * BLOCK_N - RADIUS, 0)  # the band of this block's keys
    for step in range(BAND_BLOCKS):
        queries = first_query + step * BLOCK_M + tl.arange(0, BLOCK_M)
        q = _tile(q_ptr, queries, cols, base, S, H, D)
        do = _tile(do_ptr, queries, cols, base, S, H, D)
        lse = _row_stats(lse_ptr, queries, batch_head, S, H)
        delta = _row_stats(delta_ptr, queries, batch_head, S, H)
        probabilities = tl.exp(_scores(q, k, queries, keys, scale, S, RADIUS, DILATION, UPCAST) - lse[:, None])
        dv += _dot(tl.trans(probabilities.to(do.dtype)), do, UPCAST)
        ds = probabilities * (_dot(do, tl.trans(v), UPCAST) - delta[:, None])
        dk += _dot(tl.trans(ds.to(q.dtype)), q, UPCAST)
    rows = keys[:, None].to(tl.int64) * (H * D) + cols[None, :]
    mask = (keys[:, None] < S) & (cols[None, :] < D)
    tl.store(dk_ptr + base + rows, (dk * scale).to(dk_ptr.dtype.element_ty), mask=mask)
    tl.store(dv_ptr + base + rows, dv.to(dv_ptr.dtype.element_ty), mask=mask)
