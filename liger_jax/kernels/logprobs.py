"""Log-probability and entropy kernels: per row, the log-probability of one token and the entropy of the softmax.

With a row's logits l and temperature T, z = l / T (fp32, after loading), lse = log Σ_j exp(z_j), p = softmax(z)
and the row's token t,

    logprob = z_t - lse,    entropy = -Σ_j p_j log p_j = lse - Σ_j p_j z_j,

and for per-row cotangents g (of logprob) and h (of entropy) the logits' gradient is

    d/dl_j = (g · ([j = t] - p_j) - h · p_j · (z_j - lse + entropy)) / T.

All of it is fp32, whatever the logits dtype. Each program streams its rows' vocabulary in blocks with an online
softmax (the cross-entropy kernels' tiles); the entropy is accumulated as Σ_j e_j (z_j - m) around the running max m,
so it never subtracts two large numbers. A token outside [0, V) gives a NaN log-prob and no log-prob gradient; its
row's entropy is still defined.
"""

import triton
import triton.language as tl

from liger_jax.kernels.cross_entropy import _capped_tile, _label_in_range


@triton.jit
def _rows_and_tokens(tokens_ptr, n_rows, BLOCK_ROWS: tl.constexpr):
    """This program's rows (int64: rows · V passes 2^31), whether they exist, and their tokens."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS).to(tl.int64)
    row_exists = rows < n_rows
    tokens = tl.load(tokens_ptr + rows, mask=row_exists, other=0).to(tl.int64)
    return rows, row_exists, tokens


@triton.jit
def logprobs_and_entropy(
    logits_ptr,  # [n_rows, n_cols] logits.dtype
    tokens_ptr,  # [n_rows] int32 or int64
    n_rows,
    logprob_ptr,  # [n_rows] fp32
    entropy_ptr,  # [n_rows] fp32
    lse_ptr,  # [n_rows] fp32: for logprobs_and_entropy_grad
    n_cols: tl.constexpr,  # V; a constexpr so rows start provably 16-byte aligned (kernels._rows)
    inv_temperature: tl.constexpr,  # 1 / T
    BLOCK_ROWS: tl.constexpr,
    BLOCK_V: tl.constexpr,
    NUM_V_BLOCKS: tl.constexpr,
):
    """Per row: log-probability of its token, entropy and lse, in one read of the logits."""
    rows, row_exists, tokens = _rows_and_tokens(tokens_ptr, n_rows, BLOCK_ROWS)
    running_max = tl.full((BLOCK_ROWS,), float("-inf"), tl.float32)
    running_sum = tl.zeros((BLOCK_ROWS,), tl.float32)  # Σ e_j, e_j = exp(z_j - running_max)
    running_dot = tl.zeros((BLOCK_ROWS,), tl.float32)  # Σ e_j (z_j - running_max)
    for block in range(NUM_V_BLOCKS):
        _, _, col_mask, z = _capped_tile(logits_ptr, rows, row_exists, n_cols, block, 0.0, BLOCK_ROWS, BLOCK_V)
        z = z * inv_temperature
        new_max = tl.maximum(running_max, tl.max(z, axis=1))
        # Shift by 0 while a row has only seen -inf: exp(-inf - shift) is then 0 rather than NaN.
        shift = tl.where(new_max == float("-inf"), 0.0, new_max)
        # Moving the reference point from running_max to shift adds (running_max - shift) to every earlier term;
        # while nothing was summed (running_sum 0) that difference may be -inf and must not enter.
        moved = tl.where(running_sum > 0, running_max - shift, 0.0)
        rescale = tl.exp(running_max - shift)
        e = tl.exp(z - shift[:, None])
        centred = tl.where(col_mask, z - shift[:, None], 0.0)  # masked columns: e = 0, and 0 · -inf would be NaN
        running_dot = rescale * (running_dot + moved * running_sum) + tl.sum(e * centred, axis=1)
        running_sum = running_sum * rescale + tl.sum(e, axis=1)
        running_max = new_max
    lse = running_max + tl.log(running_sum)
    entropy = tl.log(running_sum) - running_dot / running_sum
    in_range = _label_in_range(tokens, n_cols)
    target = tl.load(logits_ptr + rows * n_cols + tl.where(in_range, tokens, 0), mask=row_exists & in_range, other=0)
    logprob = tl.where(in_range, target.to(tl.float32) * inv_temperature - lse, float("nan"))
    tl.store(logprob_ptr + rows, logprob, mask=row_exists)
    tl.store(entropy_ptr + rows, entropy, mask=row_exists)
    tl.store(lse_ptr + rows, lse, mask=row_exists)


@triton.jit
def logprobs_and_entropy_grad(
    logits_ptr,  # [n_rows, n_cols] logits.dtype; may alias dlogits_ptr
    tokens_ptr,  # [n_rows] int32 or int64
    lse_ptr,  # [n_rows] fp32, from logprobs_and_entropy
    entropy_ptr,  # [n_rows] fp32, from logprobs_and_entropy
    logprob_cotangent_ptr,  # [n_rows] fp32
    entropy_cotangent_ptr,  # [n_rows] fp32
    n_rows,
    dlogits_ptr,  # [n_rows, n_cols] logits.dtype
    n_cols: tl.constexpr,  # V; a constexpr so rows start provably 16-byte aligned (kernels._rows)
    inv_temperature: tl.constexpr,  # 1 / T
    BLOCK_ROWS: tl.constexpr,
    BLOCK_V: tl.constexpr,
    NUM_V_BLOCKS: tl.constexpr,
):
    """g · dlogprob/dl + h · dentropy/dl per row: one read of the logits, one write of the gradient (each element
    stored after its logit was read, so it may overwrite the logits)."""
    rows, row_exists, tokens = _rows_and_tokens(tokens_ptr, n_rows, BLOCK_ROWS)
    lse = tl.load(lse_ptr + rows, mask=row_exists, other=0.0)
    entropy = tl.load(entropy_ptr + rows, mask=row_exists, other=0.0)
    in_range = _label_in_range(tokens, n_cols)
    g = tl.where(in_range, tl.load(logprob_cotangent_ptr + rows, mask=row_exists, other=0.0), 0.0)
    h = tl.load(entropy_cotangent_ptr + rows, mask=row_exists, other=0.0)
    for block in range(NUM_V_BLOCKS):
        offsets, cols, col_mask, z = _capped_tile(logits_ptr, rows, row_exists, n_cols, block, 0.0, BLOCK_ROWS, BLOCK_V)
        z = z * inv_temperature
        log_p = tl.where(col_mask, z - lse[:, None], 0.0)  # masked columns: p = 0 below, and keep log_p finite
        p = tl.exp(z - lse[:, None])
        grad = -p * (g[:, None] + h[:, None] * (log_p + entropy[:, None]))
        # The token's +g joins -g · p_t in fp32: rounding p_t first loses it in bf16 (Liger #1329).
        grad += tl.where(cols[None, :] == tokens[:, None], g[:, None], 0.0)
        grad = grad * inv_temperature
        tl.store(dlogits_ptr + offsets, grad.to(dlogits_ptr.dtype.element_ty), mask=row_exists[:, None] & col_mask)
