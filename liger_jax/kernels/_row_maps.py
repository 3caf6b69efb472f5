"""Tile loads shared by the row maps differentiated from their output (softmax, sparsemax): the forward's padded
logits and the backward's (dy, y) pairs. Addressing as in ``liger_jax.kernels._rows``."""

import triton
import triton.language as tl

from liger_jax.kernels._rows import tile


@triton.jit
def load_logits(x_ptr, rows, first_col, n_rows, n_cols, row_stride, BLOCK_D: tl.constexpr):
    """Offsets, mask and the fp32 values of a tile of x, -inf in the columns past the row's end (they drop out of
    every max, exponential and support). Rows past n_rows read 0, which keeps their arithmetic finite; they are
    never stored."""
    cols, offsets, mask = tile(rows, first_col, n_rows, n_cols, row_stride, BLOCK_D)
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    return offsets, mask, tl.where(cols[None, :] < n_cols, x, float("-inf"))


@triton.jit
def load_pair(dy_ptr, y_ptr, rows, first_col, n_rows, n_cols, row_stride, BLOCK_D: tl.constexpr):
    """Offsets, mask and fp32 dy and y of a tile, 0 where masked."""
    _, offsets, mask = tile(rows, first_col, n_rows, n_cols, row_stride, BLOCK_D)
    dy = tl.load(dy_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    y = tl.load(y_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    return offsets, mask, dy, y
