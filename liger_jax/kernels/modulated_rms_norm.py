"""Modulated RMSNorm kernels (AdaLN): y = r · (1 + scale) + shift, r = RMSNorm(x) as ``liger_jax.kernels.rms_norm``
computes it (its casting modes and offset; r rounded to x.dtype), the modulation in fp32 and y rounded once.

The modulation (scale and shift) is ``[n_rows / ROWS_PER_MODULATION, n_cols]``: row m modulates rows
``[m · ROWS_PER_MODULATION, (m + 1) · ROWS_PER_MODULATION)`` of x. Two backward layouts:

* per row (ROWS_PER_MODULATION = 1, launched by ``liger_jax.ops._rows.row_launcher``): dscale = dy · r is stored per
  row (dshift is dy itself and needs no kernel).
* grouped (a modulation row per group of rows: per example, or one for all rows): dscale = Σ dy · r and dshift = Σ dy
  over the group come as per-program fp32 partial sums, PROGRAMS_PER_GROUP programs per group, each walking row
  tiles of its own group only, so XLA sums each group's partials apart.

With dr = dy · (1 + scale), dx and dweight are RMSNorm's gradients for the cotangent dr. A row is one tile (the op
rejects rows longer than ``liger_jax.ops._tiling.MAX_BACKWARD_TILE_COLS``).
"""

import triton
import triton.language as tl

from liger_jax.kernels._rows import row_block, tile
from liger_jax.kernels.rms_norm import (
    _gradients,
    _load_backward_tile,
    _load_scale,
    _normalized,
    _rstd,
    _sum_g_normed,
    _sum_squares,
)


@triton.jit
def _load_modulation(ptr, rows, cols, mask, n_cols: tl.constexpr, ROWS_PER_MODULATION: tl.constexpr):
    """The modulation (scale or shift) of each element of the tile of ``rows`` [BLOCK_ROWS, BLOCK_D] in fp32, 0 where
    masked."""
    offsets = (rows // ROWS_PER_MODULATION)[:, None] * n_cols + cols[None, :]
    return tl.load(ptr + offsets, mask=mask, other=0.0).to(tl.float32)


@triton.jit
def modulated_rms_norm_fwd(
    x_ptr,  # [n_rows, n_cols] x.dtype
    weight_ptr,  # [n_cols] weight.dtype
    scale_ptr,  # [n_rows / ROWS_PER_MODULATION, n_cols] scale.dtype
    shift_ptr,  # as scale (scale_ptr again without HAS_SHIFT: never read)
    n_rows,
    y_ptr,  # [n_rows, n_cols] x.dtype
    rstd_ptr,  # [n_rows] fp32
    eps: tl.constexpr,
    offset: tl.constexpr,
    CASTING: tl.constexpr,
    ROWS_PER_MODULATION: tl.constexpr,
    HAS_SHIFT: tl.constexpr,
    n_cols: tl.constexpr,
    row_stride: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """One program normalises and modulates BLOCK_ROWS rows; it stores y and each row's fp32 rstd."""
    rows = row_block(tl.program_id(0).to(tl.int64) * BLOCK_ROWS, BLOCK_ROWS)
    cols, offsets, mask = tile(rows, 0, n_rows, n_cols, row_stride, BLOCK_D)
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0)
    rstd = _rstd(_sum_squares(x), n_cols, eps)
    # r as rms_norm returns it: rounded to x.dtype.
    r = _normalized(x, rstd, _load_scale(weight_ptr, cols, n_cols, offset), CASTING).to(x.dtype).to(tl.float32)
    y = r * (1.0 + _load_modulation(scale_ptr, rows, cols, mask, n_cols, ROWS_PER_MODULATION))
    if HAS_SHIFT:
        y += _load_modulation(shift_ptr, rows, cols, mask, n_cols, ROWS_PER_MODULATION)
    tl.store(y_ptr + offsets, y.to(y_ptr.dtype.element_ty), mask=mask)
    tl.store(rstd_ptr + rows, rstd, mask=rows < n_rows)


@triton.jit
def _tile_backward(
    dy,
    x,
    rstd,
    rows,
    cols,
    offsets,
    mask,
    weight_ptr,
    scale_ptr,
    dx_ptr,
    offset: tl.constexpr,
    CASTING: tl.constexpr,
    ROWS_PER_MODULATION: tl.constexpr,
    n_cols: tl.constexpr,
):
    """Stores dx of the tile of ``rows`` from its dy and x as loaded (0 where masked) and its rows' rstd; returns dy
    and r of the tile in fp32 [BLOCK_ROWS, BLOCK_D] (0 where masked) and its dweight [BLOCK_D] fp32."""
    dy = dy.to(tl.float32)
    weight = _load_scale(weight_ptr, cols, n_cols, offset)
    dr = dy * (1.0 + _load_modulation(scale_ptr, rows, cols, mask, n_cols, ROWS_PER_MODULATION))
    mean_gn = _sum_g_normed(dr, x, rstd, weight) / n_cols
    dx, dweight = _gradients(dr, x, rstd, weight, mean_gn, CASTING)
    tl.store(dx_ptr + offsets, dx.to(dx_ptr.dtype.element_ty), mask=mask)
    r = tl.where(mask, _normalized(x, rstd, weight, CASTING).to(x.dtype).to(tl.float32), 0.0)
    return dy, r, dweight


@triton.jit
def modulated_rms_norm_bwd_per_row(
    dy_ptr,  # [n_rows, n_cols] x.dtype
    x_ptr,  # [n_rows, n_cols] x.dtype
    weight_ptr,  # [n_cols] weight.dtype
    scale_ptr,  # [n_rows, n_cols] scale.dtype
    rstd_ptr,  # [n_rows] fp32
    n_rows,
    dx_ptr,  # [n_rows, n_cols] x.dtype
    dweight_partial_ptr,  # [num_programs, n_cols] fp32
    dscale_ptr,  # [n_rows, n_cols] scale.dtype: dy · r
    offset: tl.constexpr,
    CASTING: tl.constexpr,
    PREFETCH: tl.constexpr,  # not used: each tile is walked once, without prefetching
    TILES_PER_PROGRAM: tl.constexpr,
    n_cols: tl.constexpr,
    row_stride: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """Program p walks TILES_PER_PROGRAM row tiles: dx and dscale per row, its partial sum of dweight in row p."""
    pid = tl.program_id(0).to(tl.int64)
    dweight = tl.zeros((BLOCK_D,), dtype=tl.float32)
    for tile_index in range(TILES_PER_PROGRAM):
        rows = row_block((pid * TILES_PER_PROGRAM + tile_index) * BLOCK_ROWS, BLOCK_ROWS)
        cols, offsets, mask = tile(rows, 0, n_rows, n_cols, row_stride, BLOCK_D)
        dy, x, rstd = _load_backward_tile(dy_ptr, x_ptr, rstd_ptr, rows, offsets, mask, n_rows)
        dy_f32, r, tile_dweight = _tile_backward(
            dy, x, rstd, rows, cols, offsets, mask, weight_ptr, scale_ptr, dx_ptr, offset, CASTING, 1, n_cols
        )
        tl.store(dscale_ptr + offsets, (dy_f32 * r).to(dscale_ptr.dtype.element_ty), mask=mask)
        dweight += tile_dweight
    cols = tl.arange(0, BLOCK_D)
    tl.store(dweight_partial_ptr + pid * n_cols + cols, dweight, mask=cols < n_cols)


@triton.jit
def _group_rows(group, group_tile, n_rows, ROWS_PER_GROUP: tl.constexpr, BLOCK_ROWS: tl.constexpr):
    """The rows of tile ``group_tile`` of ``group`` (int64); rows past the group's end point at n_rows, where a
    tile is masked."""
    local = row_block(group_tile * BLOCK_ROWS, BLOCK_ROWS)
    return tl.where(local < ROWS_PER_GROUP, group * ROWS_PER_GROUP + local, n_rows)


@triton.jit
def modulated_rms_norm_bwd_grouped(
    dy_ptr,  # [n_rows, n_cols] x.dtype
    x_ptr,  # [n_rows, n_cols] x.dtype
    weight_ptr,  # [n_cols] weight.dtype
    scale_ptr,  # [n_rows / ROWS_PER_GROUP, n_cols] scale.dtype
    rstd_ptr,  # [n_rows] fp32
    n_rows,
    dx_ptr,  # [n_rows, n_cols] x.dtype
    dweight_partial_ptr,  # [num_programs, n_cols] fp32
    dscale_partial_ptr,  # [num_programs, n_cols] fp32: Σ dy · r
    dshift_partial_ptr,  # [num_programs, n_cols] fp32: Σ dy
    offset: tl.constexpr,
    CASTING: tl.constexpr,
    ROWS_PER_GROUP: tl.constexpr,
    PROGRAMS_PER_GROUP: tl.constexpr,
    PREFETCH: tl.constexpr,
    TILES_PER_PROGRAM: tl.constexpr,
    n_cols: tl.constexpr,
    row_stride: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """Program p (the q-th of group g = p // PROGRAMS_PER_GROUP) walks TILES_PER_PROGRAM row tiles of its group: dx
    per row, its partial sums of dweight, dscale and dshift in row p of each partial. With PREFETCH the next tile's
    loads are issued before this tile's arithmetic (a second tile's registers), so memory latency hides behind it."""
    pid = tl.program_id(0).to(tl.int64)
    group, first_tile = pid // PROGRAMS_PER_GROUP, (pid % PROGRAMS_PER_GROUP) * TILES_PER_PROGRAM
    dweight = tl.zeros((BLOCK_D,), dtype=tl.float32)
    dscale = tl.zeros((BLOCK_D,), dtype=tl.float32)
    dshift = tl.zeros((BLOCK_D,), dtype=tl.float32)
    rows = _group_rows(group, first_tile, n_rows, ROWS_PER_GROUP, BLOCK_ROWS)
    cols, offsets, mask = tile(rows, 0, n_rows, n_cols, row_stride, BLOCK_D)
    if PREFETCH:
        dy, x, rstd = _load_backward_tile(dy_ptr, x_ptr, rstd_ptr, rows, offsets, mask, n_rows)
    for tile_index in range(TILES_PER_PROGRAM):
        if not PREFETCH:
            dy, x, rstd = _load_backward_tile(dy_ptr, x_ptr, rstd_ptr, rows, offsets, mask, n_rows)
        next_rows = _group_rows(group, first_tile + tile_index + 1, n_rows, ROWS_PER_GROUP, BLOCK_ROWS)
        _, next_offsets, next_mask = tile(next_rows, 0, n_rows, n_cols, row_stride, BLOCK_D)
        if PREFETCH:
            next_dy, next_x, next_rstd = _load_backward_tile(
                dy_ptr, x_ptr, rstd_ptr, next_rows, next_offsets, next_mask, n_rows
            )
        dy_f32, r, tile_dweight = _tile_backward(
            dy, x, rstd, rows, cols, offsets, mask, weight_ptr, scale_ptr, dx_ptr,
            offset, CASTING, ROWS_PER_GROUP, n_cols,
        )  # fmt: skip
        dweight += tile_dweight
        dscale += tl.sum(dy_f32 * r, axis=0)
        dshift += tl.sum(dy_f32, axis=0)
        rows, offsets, mask = next_rows, next_offsets, next_mask
        if PREFETCH:
            dy, x, rstd = next_dy, next_x, next_rstd
    partial = pid * n_cols + cols
    tl.store(dweight_partial_ptr + partial, dweight, mask=cols < n_cols)
    tl.store(dscale_partial_ptr + partial, dscale, mask=cols < n_cols)
    tl.store(dshift_partial_ptr + partial, dshift, mask=cols < n_cols)
