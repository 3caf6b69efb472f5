"""Tile addressing shared by the row-wise kernels: a tile is BLOCK_ROWS rows × BLOCK_D columns of a [n_rows, n_cols]
array whose rows are ``row_stride`` elements apart.

A row fits one tile when ``n_cols <= BLOCK_D``. Otherwise a kernel walks it in ``(n_cols + BLOCK_D - 1) // BLOCK_D``
column blocks, the last one partial, in two passes: one for the row statistics, then one that uses them. (The
kernels write that count inside ``range(...)`` rather than naming it: Triton's interpreter turns every assigned
value into a tensor, and ``range`` of a tensor fails there.)

``n_cols`` and ``row_stride`` are constexprs in every row kernel: jax-triton passes int scalars without Triton's
divisibility-by-16 specialisation, and a runtime row stride or column bound leaves Triton unable to prove that a
row starts 16-byte aligned, so every bf16 load and store becomes a 2-byte access (about half of HBM bandwidth).
``n_rows`` may stay a runtime scalar: the row mask is constant along a row and does not split the vectors. A
column block starts at a multiple of the constexpr BLOCK_D, which keeps the alignment provable.
"""

import triton
import triton.language as tl


@triton.jit
def row_block(first_row, BLOCK_ROWS: tl.constexpr):
    """The BLOCK_ROWS row indices from ``first_row``, int64 (rows · D can pass 2^31)."""
    return first_row + tl.arange(0, BLOCK_ROWS).to(tl.int64)


@triton.jit
def tile(rows, first_col, n_rows, n_cols, row_stride, BLOCK_D: tl.constexpr):
    """Column indices [BLOCK_D], offsets [BLOCK_ROWS, BLOCK_D] and the mask of in-bounds elements of the tile of
    ``rows`` [BLOCK_ROWS] from column ``first_col``."""
    cols = first_col + tl.arange(0, BLOCK_D)
    offsets = rows[:, None] * row_stride + cols[None, :]
    mask = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
    return cols, offsets, mask


@triton.jit
def reversed_block(step, n_cols: tl.constexpr, BLOCK_D: tl.constexpr):
    """The first column of the block that a row's second pass visits at ``step``: the last block first, so the
    blocks the first pass read most recently, the likeliest to be still in L2, are read again soonest."""
    return ((n_cols + BLOCK_D - 1) // BLOCK_D - 1 - step) * BLOCK_D


@triton.jit
def add_to_partial(partial_row_ptr, cols, n_cols, values, accumulate):
    """Stores ``values`` [BLOCK_D] fp32 into a program's row of partial sums at ``cols``, added to what is there
    when ``accumulate`` (a program's first row tile starts its sums; an unwritten partial is garbage)."""
    previous = tl.load(partial_row_ptr + cols, mask=(cols < n_cols) & accumulate, other=0.0)
    tl.store(partial_row_ptr + cols, previous + values, mask=cols < n_cols)
