"""Tile addressing shared by the row-wise kernels: a tile is BLOCK_ROWS rows × BLOCK_D columns of a [n_rows, n_cols]
array whose rows are ``row_stride`` elements apart.

``n_cols`` and ``row_stride`` are constexprs in every row kernel: jax-triton passes int scalars without Triton's
divisibility-by-16 specialisation, and a runtime row stride or column bound leaves Triton unable to prove that a
row starts 16-byte aligned, so every bf16 load and store becomes a 2-byte access (about half of HBM bandwidth).
``n_rows`` may stay a runtime scalar: the row mask is constant along a row and does not split the vectors."""

import triton
import triton.language as tl


@triton.jit
def row_tile(first_row, n_rows, n_cols, row_stride, BLOCK_ROWS: tl.constexpr, BLOCK_D: tl.constexpr):
    """Row indices [BLOCK_ROWS], offsets [BLOCK_ROWS, BLOCK_D] (int64: rows · D can pass 2^31) and the mask of
    in-bounds elements of the tile starting at ``first_row``."""
    rows = first_row + tl.arange(0, BLOCK_ROWS).to(tl.int64)
    cols = tl.arange(0, BLOCK_D)
    offsets = rows[:, None] * row_stride + cols[None, :]
    mask = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
    return rows, offsets, mask
