"""Softmax kernels over the last axis: y = exp(x - max(x)) / Σ exp(x - max(x)), and its backward from y,
dx = y · (dy - Σ dy · y).

Rows are cut as in the other row kernels (see ``liger_jax.kernels._rows``). A row that fits one tile is loaded once
and kept in registers. A longer one is walked in column blocks: the forward first keeps a running max and a running
sum of exponentials rescaled to it (online softmax), then writes y block by block; the backward first sums dy · y,
then writes dx. All arithmetic is fp32; each output is rounded once to its dtype.
"""

import triton
import triton.language as tl

from liger_jax.kernels._row_maps import load_logits, load_pair
from liger_jax.kernels._rows import reversed_block, row_block


@triton.jit
def _shift(row_max):
    """The value each row's exponentials are taken relative to: its max, or 0 while the row holds only -inf
    (exp(-inf - 0) = 0, where exp(-inf - -inf) would be NaN)."""
    return tl.where(row_max == float("-inf"), 0.0, row_max)


@triton.jit
def softmax_fwd(
    x_ptr,  # [n_rows, n_cols] x.dtype
    n_rows,
    y_ptr,  # [n_rows, n_cols] x.dtype
    n_cols: tl.constexpr,
    row_stride: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """y = softmax(x) for BLOCK_ROWS rows, in one tile or in column blocks."""
    rows = row_block(tl.program_id(0).to(tl.int64) * BLOCK_ROWS, BLOCK_ROWS)
    if n_cols <= BLOCK_D:
        offsets, mask, x = load_logits(x_ptr, rows, 0, n_rows, n_cols, row_stride, BLOCK_D)
        exps = tl.exp(x - _shift(tl.max(x, axis=1))[:, None])
        y = exps / tl.sum(exps, axis=1)[:, None]
        tl.store(y_ptr + offsets, y.to(y_ptr.dtype.element_ty), mask=mask)
    else:
        row_max = tl.full((BLOCK_ROWS,), float("-inf"), tl.float32)
        row_sum = tl.zeros((BLOCK_ROWS,), tl.float32)
        for block in range((n_cols + BLOCK_D - 1) // BLOCK_D):
            _, _, x = load_logits(x_ptr, rows, block * BLOCK_D, n_rows, n_cols, row_stride, BLOCK_D)
            new_max = tl.maximum(row_max, tl.max(x, axis=1))
            shift = _shift(new_max)
            # The sum so far is rescaled from the old max to the new one.
            row_sum = row_sum * tl.exp(row_max - shift) + tl.sum(tl.exp(x - shift[:, None]), axis=1)
            row_max = new_max
        for step in range((n_cols + BLOCK_D - 1) // BLOCK_D):
            first_col = reversed_block(step, n_cols, BLOCK_D)
            offsets, mask, x = load_logits(x_ptr, rows, first_col, n_rows, n_cols, row_stride, BLOCK_D)
            y = tl.exp(x - _shift(row_max)[:, None]) / row_sum[:, None]
            tl.store(y_ptr + offsets, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def softmax_bwd(
    dy_ptr,  # [n_rows, n_cols] x.dtype
    y_ptr,  # [n_rows, n_cols] x.dtype, the forward's output
    n_rows,
    dx_ptr,  # [n_rows, n_cols] x.dtype; may alias dy (each element is read before it is written)
    n_cols: tl.constexpr,
    row_stride: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """dx = y · (dy - Σ dy · y) for BLOCK_ROWS rows, in one tile or in column blocks."""
    rows = row_block(tl.program_id(0).to(tl.int64) * BLOCK_ROWS, BLOCK_ROWS)
    if n_cols <= BLOCK_D:
        offsets, mask, dy, y = load_pair(dy_ptr, y_ptr, rows, 0, n_rows, n_cols, row_stride, BLOCK_D)
        dx = y * (dy - tl.sum(dy * y, axis=1)[:, None])
        tl.store(dx_ptr + offsets, dx.to(dx_ptr.dtype.element_ty), mask=mask)
    else:
        dot = tl.zeros((BLOCK_ROWS,), tl.float32)
        for block in range((n_cols + BLOCK_D - 1) // BLOCK_D):
            _, _, dy, y = load_pair(dy_ptr, y_ptr, rows, block * BLOCK_D, n_rows, n_cols, row_stride, BLOCK_D)
            dot += tl.sum(dy * y, axis=1)
        for step in range((n_cols + BLOCK_D - 1) // BLOCK_D):
            first_col = reversed_block(step, n_cols, BLOCK_D)
            offsets, mask, dy, y = load_pair(dy_ptr, y_ptr, rows, first_col, n_rows, n_cols, row_stride, BLOCK_D)
            tl.store(dx_ptr + offsets, (y * (dy - dot[:, None])).to(dx_ptr.dtype.element_ty), mask=mask)
