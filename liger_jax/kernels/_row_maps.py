"""The column-block walk shared by the row maps differentiated from their output (softmax, sparsemax).

A row map's kernel states its math as two functions: an ``update`` that folds a tile into two per-row statistics
[BLOCK_ROWS] (``(a, b) = update(a, b, x, param)`` for the forward's logits, ``update(a, b, dy, y)`` for the
backward's pairs), and an ``output`` that maps a tile and the final statistics to the result
(``output(x, a, b)``, ``output(dy, y, a, b)``). The helpers here pass them as constexprs and do the walking: a row
that fits one tile is loaded once and kept in registers; a longer one is read in column blocks twice, once for the
statistics and once, last block first, for the output. Addressing as in ``liger_jax.kernels._rows``.
"""

import triton
import triton.language as tl

from liger_jax.kernels._rows import reversed_block, tile


@triton.jit
def load_logits(x_ptr, rows, first_col, n_rows, n_cols, row_stride, BLOCK_D: tl.constexpr):
    """Offsets, mask and the fp32 values of a tile of x, -inf in the columns past the row's end (they drop out of
    every max, exponential and support). Rows past n_rows read 0, which keeps their arithmetic finite; they are
    never stored."""
    _, offsets, mask = tile(rows, first_col, n_rows, n_cols, row_stride, BLOCK_D)
    stored = load_stored_logits(x_ptr, rows, first_col, n_rows, n_cols, row_stride, BLOCK_D)
    return offsets, mask, as_logits(stored, first_col, n_cols, BLOCK_D)


@triton.jit
def load_stored_logits(x_ptr, rows, first_col, n_rows, n_cols, row_stride, BLOCK_D: tl.constexpr):
    """:func:`load_logits`' load: the tile's values in x's dtype (0 where masked). A prefetched tile held this way
    takes half the registers of its fp32 values until :func:`as_logits` converts it."""
    _, offsets, mask = tile(rows, first_col, n_rows, n_cols, row_stride, BLOCK_D)
    return tl.load(x_ptr + offsets, mask=mask, other=0.0)


@triton.jit
def as_logits(stored, first_col, n_cols, BLOCK_D: tl.constexpr):
    """The fp32 values of a tile from :func:`load_stored_logits`, as :func:`load_logits` returns them."""
    cols = first_col + tl.arange(0, BLOCK_D)
    return tl.where(cols[None, :] < n_cols, stored.to(tl.float32), float("-inf"))


@triton.jit
def load_pair(dy_ptr, y_ptr, rows, first_col, n_rows, n_cols, row_stride, BLOCK_D: tl.constexpr):
    """Offsets, mask and fp32 dy and y of a tile, 0 where masked."""
    _, offsets, mask = tile(rows, first_col, n_rows, n_cols, row_stride, BLOCK_D)
    dy = tl.load(dy_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    y = tl.load(y_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    return offsets, mask, dy, y


@triton.jit
def fold_logit_blocks(
    x_ptr, rows, a, b, param, n_rows, n_cols, row_stride, BLOCK_D: tl.constexpr, update: tl.constexpr
):
    """``(a, b)`` folded by ``update(a, b, x, param)`` over the column blocks of the rows of x."""
    for block in range((n_cols + BLOCK_D - 1) // BLOCK_D):
        _, _, x = load_logits(x_ptr, rows, block * BLOCK_D, n_rows, n_cols, row_stride, BLOCK_D)
        a, b = update(a, b, x, param)
    return a, b


@triton.jit
def store_logit_blocks(
    x_ptr, out_ptr, rows, a, b, n_rows, n_cols, row_stride, BLOCK_D: tl.constexpr, output: tl.constexpr
):
    """Stores ``output(x, a, b)`` of each column block of the rows of x, last block first."""
    for step in range((n_cols + BLOCK_D - 1) // BLOCK_D):
        first_col = reversed_block(step, n_cols, BLOCK_D)
        offsets, mask, x = load_logits(x_ptr, rows, first_col, n_rows, n_cols, row_stride, BLOCK_D)
        tl.store(out_ptr + offsets, output(x, a, b).to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def map_logit_rows(
    x_ptr,
    out_ptr,
    rows,
    a,
    b,
    n_rows,
    n_cols: tl.constexpr,
    row_stride: tl.constexpr,
    BLOCK_D: tl.constexpr,
    update: tl.constexpr,
    output: tl.constexpr,
):
    """Stores ``output(x, a, b)`` for the rows of x, with ``(a, b)`` (given as the initial statistics) folded by
    ``update`` over each whole row first."""
    if n_cols <= BLOCK_D:
        offsets, mask, x = load_logits(x_ptr, rows, 0, n_rows, n_cols, row_stride, BLOCK_D)
        a, b = update(a, b, x, 0.0)
        tl.store(out_ptr + offsets, output(x, a, b).to(out_ptr.dtype.element_ty), mask=mask)
    else:
        a, b = fold_logit_blocks(x_ptr, rows, a, b, 0.0, n_rows, n_cols, row_stride, BLOCK_D, update)
        store_logit_blocks(x_ptr, out_ptr, rows, a, b, n_rows, n_cols, row_stride, BLOCK_D, output)


@triton.jit
def map_pair_rows(
    dy_ptr,
    y_ptr,
    dx_ptr,
    rows,
    a,
    b,
    n_rows,
    n_cols: tl.constexpr,
    row_stride: tl.constexpr,
    BLOCK_D: tl.constexpr,
    update: tl.constexpr,
    output: tl.constexpr,
):
    """Stores ``output(dy, y, a, b)`` for the rows of (dy, y), with ``(a, b)`` (given as the initial statistics)
    folded by ``update(a, b, dy, y)`` over each whole row first. dx may alias dy: each element is read before it
    is written."""
    if n_cols <= BLOCK_D:
        offsets, mask, dy, y = load_pair(dy_ptr, y_ptr, rows, 0, n_rows, n_cols, row_stride, BLOCK_D)
        a, b = update(a, b, dy, y)
        tl.store(dx_ptr + offsets, output(dy, y, a, b).to(dx_ptr.dtype.element_ty), mask=mask)
    else:
        for block in range((n_cols + BLOCK_D - 1) // BLOCK_D):
            _, _, dy, y = load_pair(dy_ptr, y_ptr, rows, block * BLOCK_D, n_rows, n_cols, row_stride, BLOCK_D)
            a, b = update(a, b, dy, y)
        for step in range((n_cols + BLOCK_D - 1) // BLOCK_D):
            first_col = reversed_block(step, n_cols, BLOCK_D)
            offsets, mask, dy, y = load_pair(dy_ptr, y_ptr, rows, first_col, n_rows, n_cols, row_stride, BLOCK_D)
            tl.store(dx_ptr + offsets, output(dy, y, a, b).to(dx_ptr.dtype.element_ty), mask=mask)
