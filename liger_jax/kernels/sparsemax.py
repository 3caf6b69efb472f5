"""Sparsemax kernels over the last axis: y = max(x - τ, 0), the Euclidean projection of x onto the probability
simplex, and its backward from the support S = {y > 0}: dx = (dy - mean_S(dy)) on S, 0 off it.

τ solves Σ_j max(x_j - τ, 0) = 1. Liger sorts each row first (in torch) and scans the sorted prefix sums; these
kernels need no sort. They run the fixed-point iteration of Michelot's algorithm (1986)

    τ ← (Σ_{x_j > τ} x_j - 1) / |{j : x_j > τ}|

from τ = max(x) - 1, which lies below the solution (the largest output is at most 1). From any τ below the
solution the step lands between τ and the solution, so τ rises and the support shrinks; once an iteration keeps the
support, τ is the exact solution for it. It takes at most D steps and, on LLM-like rows, a handful: the iteration
starts on the few entries within 1 of the max. A program iterates until none of its rows' supports shrank; a row
that already converged recomputes the same τ.

A row that fits one tile stays in registers through the iteration. A longer one is walked in column blocks (see
``liger_jax.kernels._row_maps``), one pass per iteration for the support's count and sum. All arithmetic is fp32; y
and dx are rounded once to their dtype.
"""

import triton
import triton.language as tl

from liger_jax.kernels._row_maps import fold_logit_blocks, load_logits, map_pair_rows, store_logit_blocks
from liger_jax.kernels._rows import row_block, row_sums2


@triton.jit
def _support(x, tau):
    """Per row of the fp32 tile ``x``: |{x > τ}| and Σ_{x > τ} x, both fp32 (a count is exact below 2^24), summed
    in one reduction."""
    support = x > tau[:, None]
    return row_sums2(support.to(tl.float32), tl.where(support, x, 0.0))


@triton.jit
def _add_support(count, total, x, tau):
    """The running :func:`_support` after the tile x."""
    block_count, block_total = _support(x, tau)
    return count + block_count, total + block_total


@triton.jit
def _add_max(row_max, unused, x, _):
    """The running row max after the tile x (the second statistic is unused)."""
    return tl.maximum(row_max, tl.max(x, axis=1)), unused


@triton.jit
def _threshold(count, total):
    """The next τ from the current support's size and sum."""
    return (total - 1.0) / count


@triton.jit
def _any_shrank(new_count, count):
    """Whether some row's support lost entries: the program iterates again. (The loop carries this flag rather than
    the previous counts, which Triton 3.6's layout pass cannot compile in a ``while``.)"""
    return tl.sum((new_count < count).to(tl.int32)) > 0


@triton.jit
def _projection(x, tau, unused):
    """y = max(x - τ, 0) of a tile."""
    return tl.maximum(x - tau[:, None], 0.0)


@triton.jit
def sparsemax_fwd(
    x_ptr,  # [n_rows, n_cols] x.dtype
    n_rows,
    y_ptr,  # [n_rows, n_cols] x.dtype
    n_cols: tl.constexpr,
    row_stride: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """y = max(x - τ, 0) for BLOCK_ROWS rows, τ found by the support iteration, in one tile or in column blocks."""
    rows = row_block(tl.program_id(0).to(tl.int64) * BLOCK_ROWS, BLOCK_ROWS)
    zeros = tl.zeros((BLOCK_ROWS,), tl.float32)
    if n_cols <= BLOCK_D:
        offsets, mask, x = load_logits(x_ptr, rows, 0, n_rows, n_cols, row_stride, BLOCK_D)
        tau = tl.max(x, axis=1) - 1.0
        count, total = _support(x, tau)
        shrinking = True
        while shrinking:
            tau = _threshold(count, total)
            new_count, total = _support(x, tau)
            shrinking = _any_shrank(new_count, count)
            count = new_count
        tl.store(y_ptr + offsets, _projection(x, tau, zeros).to(y_ptr.dtype.element_ty), mask=mask)
    else:
        row_max = tl.full((BLOCK_ROWS,), float("-inf"), tl.float32)
        row_max, _ = fold_logit_blocks(x_ptr, rows, row_max, zeros, 0.0, n_rows, n_cols, row_stride, BLOCK_D, _add_max)
        tau = row_max - 1.0
        count, total = fold_logit_blocks(
            x_ptr, rows, zeros, zeros, tau, n_rows, n_cols, row_stride, BLOCK_D, _add_support
        )
        shrinking = True
        while shrinking:
            tau = _threshold(count, total)
            new_count, total = fold_logit_blocks(
                x_ptr, rows, zeros, zeros, tau, n_rows, n_cols, row_stride, BLOCK_D, _add_support
            )
            shrinking = _any_shrank(new_count, count)
            count = new_count
        store_logit_blocks(x_ptr, y_ptr, rows, tau, zeros, n_rows, n_cols, row_stride, BLOCK_D, _projection)


@triton.jit
def _add_support_sums(count, total, dy, y):
    """The running |S| and Σ_S dy, fp32, after a tile, with S = {y > 0} (masked elements read y = 0)."""
    support = y > 0.0
    block_count, block_total = row_sums2(support.to(tl.float32), tl.where(support, dy, 0.0))
    return count + block_count, total + block_total


@triton.jit
def _gradient(dy, y, count, total):
    """dx of a tile: dy - mean_S(dy) on the support, 0 off it."""
    # Rows past n_rows have an empty support; every real row's output sums to 1, so its support is not empty.
    mean = total / tl.maximum(count, 1.0)
    return tl.where(y > 0.0, dy - mean[:, None], 0.0)


@triton.jit
def sparsemax_bwd(
    dy_ptr,  # [n_rows, n_cols] x.dtype
    y_ptr,  # [n_rows, n_cols] x.dtype, the forward's output
    n_rows,
    dx_ptr,  # [n_rows, n_cols] x.dtype; may alias dy (each element is read before it is written)
    n_cols: tl.constexpr,
    row_stride: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """dx = dy - mean_S(dy) on S = {y > 0}, 0 off it, for BLOCK_ROWS rows, in one tile or in column blocks."""
    rows = row_block(tl.program_id(0).to(tl.int64) * BLOCK_ROWS, BLOCK_ROWS)
    zeros = tl.zeros((BLOCK_ROWS,), tl.float32)
    map_pair_rows(
        dy_ptr, y_ptr, dx_ptr, rows, zeros, zeros, n_rows, n_cols, row_stride, BLOCK_D, _add_support_sums, _gradient
    )
