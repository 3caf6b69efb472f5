"""Softmax kernels over the last axis: y = exp(x - max(x)) / Σ exp(x - max(x)), and its backward from y,
dx = y · (dy - Σ dy · y).

Rows are walked as in ``liger_jax.kernels._row_maps``: the forward's statistics are a running max and a running sum
of exponentials rescaled to it (online softmax), the backward's is Σ dy · y. All arithmetic is fp32; each output is
rounded once to its dtype.
"""

import triton
import triton.language as tl

from liger_jax.kernels._row_maps import map_logit_rows, map_pair_rows
from liger_jax.kernels._rows import row_block


@triton.jit
def _shift(row_max):
    """The value each row's exponentials are taken relative to: its max, or 0 while the row holds only -inf
    (exp(-inf - 0) = 0, where exp(-inf - -inf) would be NaN)."""
    return tl.where(row_max == float("-inf"), 0.0, row_max)


@triton.jit
def _add_exponentials(row_max, row_sum, x, _):
    """The running (max, Σ exp(x - max)) after the tile x; the sum so far is rescaled from the old max to the new."""
    new_max = tl.maximum(row_max, tl.max(x, axis=1))
    shift = _shift(new_max)
    return new_max, row_sum * tl.exp(row_max - shift) + tl.sum(tl.exp(x - shift[:, None]), axis=1)


@triton.jit
def _probabilities(x, row_max, row_sum):
    """y = exp(x - max) / Σ exp(x - max) of a tile."""
    return tl.exp(x - _shift(row_max)[:, None]) / row_sum[:, None]


@triton.jit
def _add_dot(dot, unused, dy, y):
    """The running Σ dy · y after a tile (the second statistic is unused)."""
    return dot + tl.sum(dy * y, axis=1), unused


@triton.jit
def _gradient(dy, y, dot, unused):
    """dx = y · (dy - Σ dy · y) of a tile."""
    return y * (dy - dot[:, None])


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
    row_max = tl.full((BLOCK_ROWS,), float("-inf"), tl.float32)
    row_sum = tl.zeros((BLOCK_ROWS,), tl.float32)
    map_logit_rows(
        x_ptr, y_ptr, rows, row_max, row_sum, n_rows, n_cols, row_stride, BLOCK_D, _add_exponentials, _probabilities
    )


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
    zeros = tl.zeros((BLOCK_ROWS,), tl.float32)
    map_pair_rows(dy_ptr, y_ptr, dx_ptr, rows, zeros, zeros, n_rows, n_cols, row_stride, BLOCK_D, _add_dot, _gradient)
