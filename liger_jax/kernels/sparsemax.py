"""Sparsemax kernels over the last axis: y = max(x - τ, 0), the Euclidean projection of x onto the probability
simplex, and its backward from the support S = {y > 0}: dx = (dy - mean_S(dy)) on S, 0 off it.

τ solves Σ_j max(x_j - τ, 0) = 1. Liger sorts each row first (in torch) and scans the sorted prefix sums; these
kernels need no sort. They run the fixed-point iteration of Michelot's algorithm (1986), Newton's method on
Σ_j max(x_j - τ, 0) - 1:

    τ ← (Σ_{x_j > τ} x_j - 1) / |{j : x_j > τ}|

from a τ below the solution. Any nonempty set T of entries gives one: (Σ_T x - 1) / |T| ≤ τ*, as Σ_T (x - τ*) ≤
Σ_T max(x - τ*, 0) ≤ 1. The first τ is the larger of the bounds of T = {x > max - 1} and {x > max - 1/2}, both taken
in one pass (on normal rows of 4096-32768 entries this leaves 2.4 passes of the iteration on average, against 4.0
from the first set alone and 5.1 without the settled test below). From any τ below the solution the step lands
between τ and the solution, so τ rises and the support shrinks. Each pass also takes the support's smallest entry
(in the same reduction), and a support is settled when that entry lies above the τ it gives: then Σ_S (x - τ) = 1
with every term positive and every entry off S at most the previous τ, so τ is the solution, and the pass that finds
the final support also proves it final (no pass to see it stay). A program iterates until none of its unsettled
rows' supports shrank (under rounding a settled test may fail at the fixed point: the sizes then stop falling); it
takes at most D passes.

A row that fits one tile stays in registers through the iteration, where a pass costs ALU work on every element and
a reduction across the program's warps, not bytes. A longer one is walked in column blocks (see
``liger_jax.kernels._row_maps``), where a pass is a read of the row from memory. All arithmetic is fp32; y and dx are
rounded once to their dtype.
"""

import triton
import triton.language as tl

from liger_jax.kernels._row_maps import (
    as_logits,
    fold_logit_blocks,
    load_stored_logits,
    map_pair_rows,
    store_logit_blocks,
)
from liger_jax.kernels._rows import row_block, row_sums2, row_sums4, tile


@triton.jit
def _sums_and_min(count0, total0, smallest0, count1, total1, smallest1):
    """The combine of :func:`_support`'s reduction: sizes and sums add, the smallest entries meet."""
    return count0 + count1, total0 + total1, tl.minimum(smallest0, smallest1)


@triton.jit
def _start_sets(x, row_max):
    """Per row of the fp32 tile ``x``, the sizes and sums of {x > max - 1} and {x > max - 1/2} (fp32; a count is
    exact below 2^24), in one reduction: ``(wide count, wide sum, narrow count, narrow sum)``."""
    wide = x > (row_max - 1.0)[:, None]
    narrow = x > (row_max - 0.5)[:, None]
    return row_sums4(wide.to(tl.float32), tl.where(wide, x, 0.0), narrow.to(tl.float32), tl.where(narrow, x, 0.0))


@triton.jit
def _add_start_sets(counts, totals, x, row_max):
    """The running :func:`_start_sets` after the tile x: the two sets' sizes joined ([BLOCK_ROWS, 2]), and sums."""
    wide_count, wide_total, narrow_count, narrow_total = _start_sets(x, row_max)
    wide_counts, narrow_counts = tl.split(counts)
    wide_totals, narrow_totals = tl.split(totals)
    return (
        tl.join(wide_counts + wide_count, narrow_counts + narrow_count),
        tl.join(wide_totals + wide_total, narrow_totals + narrow_total),
    )


@triton.jit
def _start(wide_count, wide_total, narrow_count, narrow_total):
    """The first τ: the larger of the two sets' lower bounds of the solution."""
    return tl.maximum(_threshold(wide_count, wide_total), _threshold(narrow_count, narrow_total))


@triton.jit
def _support(x, tau):
    """Per row of the fp32 tile ``x``, of its support {x > τ}: the size, the sum and the smallest entry (+inf when
    empty), in one reduction."""
    support = x > tau[:, None]
    statistics = (support.to(tl.float32), tl.where(support, x, 0.0), tl.where(support, x, float("inf")))
    return tl.reduce(statistics, 1, _sums_and_min)


@triton.jit
def _add_support(count, total_and_smallest, x, tau):
    """The running :func:`_support` after the tile x; its sum and smallest entry joined ([BLOCK_ROWS, 2])."""
    block_count, block_total, block_smallest = _support(x, tau)
    total, smallest = tl.split(total_and_smallest)
    return count + block_count, tl.join(total + block_total, tl.minimum(smallest, block_smallest))


@triton.jit
def _add_max(row_max, unused, x, _):
    """The running row max after the tile x (the second statistic is unused)."""
    return tl.maximum(row_max, tl.max(x, axis=1)), unused


@triton.jit
def _threshold(count, total):
    """The next τ from the current support's size and sum."""
    return (total - 1.0) / count


@triton.jit
def _any_shrank(count, previous_count, unsettled):
    """Whether some row whose support may not be final (``unsettled``) lost entries in this step: the program
    iterates again. (In exact arithmetic a support that did not shrink was settled a step before; under rounding
    a settled test still ends with the sizes falling strictly while a program iterates, so within D steps.)"""
    return tl.sum((unsettled & (count < previous_count)).to(tl.int32)) > 0


@triton.jit
def _projection(x, tau, unused):
    """y = max(x - τ, 0) of a tile."""
    return tl.maximum(x - tau[:, None], 0.0)


@triton.jit
def _tile_support(x, x_ptr, rows, n_rows, n_cols, row_stride, tau, BLOCK_D: tl.constexpr):
    """:func:`_support` of the fp32 tile ``x`` of whole rows, in registers (the row pointers unused)."""
    return _support(x, tau)


@triton.jit
def _column_block_support(x, x_ptr, rows, n_rows, n_cols, row_stride, tau, BLOCK_D: tl.constexpr):
    """:func:`_support` of ``rows`` of x in memory, walked in column blocks (the tile ``x`` unused)."""
    zeros = tl.zeros_like(tau)
    empty = tl.join(zeros, zeros + float("inf"))
    count, total_and_smallest = fold_logit_blocks(
        x_ptr, rows, zeros, empty, tau, n_rows, n_cols, row_stride, BLOCK_D, _add_support
    )
    total, smallest = tl.split(total_and_smallest)
    return count, total, smallest


@triton.jit
def _solution(first_tau, x, x_ptr, rows, n_rows, n_cols, row_stride, BLOCK_D: tl.constexpr, support: tl.constexpr):
    """τ of each row by the support iteration from ``first_tau`` (below the solution), each pass's support taken
    by ``support`` (:func:`_tile_support` or :func:`_column_block_support`); each pass proves or not that its
    support settled."""
    count, total, smallest = support(x, x_ptr, rows, n_rows, n_cols, row_stride, first_tau, BLOCK_D)
    tau = _threshold(count, total)
    shrinking = _any_shrank(count, count + 1.0, smallest <= tau)
    while shrinking:
        new_count, total, smallest = support(x, x_ptr, rows, n_rows, n_cols, row_stride, tau, BLOCK_D)
        tau = _threshold(new_count, total)
        shrinking = _any_shrank(new_count, count, smallest <= tau)
        count = new_count
    return tau


@triton.jit
def _one_tile_projection(x):
    """y = max(x - τ, 0) of the fp32 tile ``x`` of whole rows, τ found by the support iteration in registers."""
    wide_count, wide_total, narrow_count, narrow_total = _start_sets(x, tl.max(x, axis=1))
    first_tau = _start(wide_count, wide_total, narrow_count, narrow_total)
    tau = _solution(first_tau, x, x, 0, 0, 0, 0, 1, _tile_support)
    return _projection(x, tau, 0.0)


@triton.jit
def _store_column_block_projection(
    x_ptr, y_ptr, rows, n_rows, n_cols, row_stride, BLOCK_ROWS: tl.constexpr, BLOCK_D: tl.constexpr
):
    """Stores y = max(x - τ, 0) of ``rows``, each walked in column blocks: a pass for the max, one for the first τ,
    one per support iteration, one for y."""
    zeros = tl.zeros((BLOCK_ROWS,), tl.float32)
    row_max = tl.full((BLOCK_ROWS,), float("-inf"), tl.float32)
    row_max, _ = fold_logit_blocks(x_ptr, rows, row_max, zeros, 0.0, n_rows, n_cols, row_stride, BLOCK_D, _add_max)
    pairs = tl.join(zeros, zeros)
    counts, totals = fold_logit_blocks(
        x_ptr, rows, pairs, pairs, row_max, n_rows, n_cols, row_stride, BLOCK_D, _add_start_sets
    )
    wide_count, narrow_count = tl.split(counts)
    wide_total, narrow_total = tl.split(totals)
    first_tau = _start(wide_count, wide_total, narrow_count, narrow_total)
    tau = _solution(first_tau, 0.0, x_ptr, rows, n_rows, n_cols, row_stride, BLOCK_D, _column_block_support)
    store_logit_blocks(x_ptr, y_ptr, rows, tau, zeros, n_rows, n_cols, row_stride, BLOCK_D, _projection)


@triton.jit
def sparsemax_fwd(
    x_ptr,  # [n_rows, n_cols] x.dtype
    n_rows,
    y_ptr,  # [n_rows, n_cols] x.dtype
    PREFETCH: tl.constexpr,
    TILES_PER_PROGRAM: tl.constexpr,
    n_cols: tl.constexpr,
    row_stride: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """y = max(x - τ, 0), τ found by the support iteration, for rows that fit one tile: program p walks
    TILES_PER_PROGRAM tiles of BLOCK_ROWS rows, and with PREFETCH loads the next tile before iterating on this one
    (where one program fills a multiprocessor, that load is the only one in flight during the iteration's
    arithmetic); for longer rows, one row tile a program, walked in column blocks."""
    first_tile = tl.program_id(0).to(tl.int64) * TILES_PER_PROGRAM
    if n_cols <= BLOCK_D:
        rows = row_block(first_tile * BLOCK_ROWS, BLOCK_ROWS)
        if PREFETCH:
            stored = load_stored_logits(x_ptr, rows, 0, n_rows, n_cols, row_stride, BLOCK_D)
        for tile_index in range(TILES_PER_PROGRAM):
            if not PREFETCH:
                stored = load_stored_logits(x_ptr, rows, 0, n_rows, n_cols, row_stride, BLOCK_D)
            next_rows = row_block((first_tile + tile_index + 1) * BLOCK_ROWS, BLOCK_ROWS)
            if PREFETCH:
                next_stored = load_stored_logits(x_ptr, next_rows, 0, n_rows, n_cols, row_stride, BLOCK_D)
            y = _one_tile_projection(as_logits(stored, 0, n_cols, BLOCK_D))
            # The addresses again rather than held through the iteration: registers are what a prefetch costs.
            _, offsets, mask = tile(rows, 0, n_rows, n_cols, row_stride, BLOCK_D)
            tl.store(y_ptr + offsets, y.to(y_ptr.dtype.element_ty), mask=mask)
            rows = next_rows
            if PREFETCH:
                stored = next_stored
    else:
        tl.static_assert(TILES_PER_PROGRAM == 1, "column blocks are not prefetched: one row tile a program")
        rows = row_block(first_tile * BLOCK_ROWS, BLOCK_ROWS)
        _store_column_block_projection(x_ptr, y_ptr, rows, n_rows, n_cols, row_stride, BLOCK_ROWS, BLOCK_D)


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
