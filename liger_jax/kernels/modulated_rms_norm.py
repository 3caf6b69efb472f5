"""Modulated RMSNorm kernels (AdaLN): y = r · (1 + scale) + shift, r = RMSNorm(x) as ``liger_jax.kernels.rms_norm``
computes it (its casting modes and offset; r rounded to x.dtype), the modulation in fp32 and y rounded once.

Two layouts of the modulation, each a constexpr-free entry point for ``liger_jax.ops._rows.row_launcher``:

* per row (PER_ROW): scale and shift are ``[n_rows, n_cols]`` like x; dscale = dy · r is stored per row (dshift is dy
  itself and needs no kernel).
* shared: scale and shift are ``[n_cols]`` rows shared by every row of the launch (one launch per modulation row);
  dscale = Σ dy · r and dshift = Σ dy come as per-program fp32 partial sums.

With dr = dy · (1 + scale), dx and dweight are RMSNorm's gradients for the cotangent dr. A row is one tile (the op
rejects rows longer than ``liger_jax.ops._tiling.MAX_BACKWARD_TILE_COLS``).
"""

import triton
import triton.language as tl

from liger_jax.kernels._rows import row_block, tile
from liger_jax.kernels.rms_norm import _gradients, _load_scale, _normalized, _rstd, _sum_g_normed, _sum_squares


@triton.jit
def _load_modulation(ptr, cols, offsets, mask, n_cols: tl.constexpr, PER_ROW: tl.constexpr):
    """A modulation (scale or shift) in fp32, per element of the tile [BLOCK_ROWS, BLOCK_D] with PER_ROW, else per
    column [1, BLOCK_D]; 0 where masked."""
    if PER_ROW:
        values = tl.load(ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    else:
        values = tl.load(ptr + cols, mask=cols < n_cols, other=0.0).to(tl.float32)[None, :]
    return values


@triton.jit
def modulated_rms_norm_fwd(
    x_ptr,  # [n_rows, n_cols] x.dtype
    weight_ptr,  # [n_cols] weight.dtype
    scale_ptr,  # [n_rows, n_cols] with PER_ROW, else [n_cols]; scale.dtype
    shift_ptr,  # as scale (scale_ptr again without HAS_SHIFT: never read)
    n_rows,
    y_ptr,  # [n_rows, n_cols] x.dtype
    rstd_ptr,  # [n_rows] fp32
    eps: tl.constexpr,
    offset: tl.constexpr,
    CASTING: tl.constexpr,
    PER_ROW: tl.constexpr,
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
    y = r * (1.0 + _load_modulation(scale_ptr, cols, offsets, mask, n_cols, PER_ROW))
    if HAS_SHIFT:
        y += _load_modulation(shift_ptr, cols, offsets, mask, n_cols, PER_ROW)
    tl.store(y_ptr + offsets, y.to(y_ptr.dtype.element_ty), mask=mask)
    tl.store(rstd_ptr + rows, rstd, mask=rows < n_rows)


@triton.jit
def _tile_backward(
    dy_ptr,
    x_ptr,
    weight_ptr,
    scale_ptr,
    rstd_ptr,
    dx_ptr,
    rows,
    n_rows,
    offset: tl.constexpr,
    CASTING: tl.constexpr,
    PER_ROW: tl.constexpr,
    n_cols: tl.constexpr,
    row_stride: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """Stores dx of the tile of ``rows``; returns dy and r of the tile in fp32 [BLOCK_ROWS, BLOCK_D] (0 where
    masked), its dweight [BLOCK_D] fp32, its offsets and mask."""
    cols, offsets, mask = tile(rows, 0, n_rows, n_cols, row_stride, BLOCK_D)
    dy = tl.load(dy_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0)
    rstd = tl.load(rstd_ptr + rows, mask=rows < n_rows, other=0.0)
    weight = _load_scale(weight_ptr, cols, n_cols, offset)
    dr = dy * (1.0 + _load_modulation(scale_ptr, cols, offsets, mask, n_cols, PER_ROW))
    mean_gn = _sum_g_normed(dr, x, rstd, weight) / n_cols
    dx, dweight = _gradients(dr, x, rstd, weight, mean_gn, CASTING)
    tl.store(dx_ptr + offsets, dx.to(dx_ptr.dtype.element_ty), mask=mask)
    r = tl.where(mask, _normalized(x, rstd, weight, CASTING).to(x.dtype).to(tl.float32), 0.0)
    return dy, r, dweight, offsets, mask


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
        dy, r, tile_dweight, offsets, mask = _tile_backward(
            dy_ptr, x_ptr, weight_ptr, scale_ptr, rstd_ptr, dx_ptr, rows, n_rows,
            offset, CASTING, True, n_cols, row_stride, BLOCK_D,
        )  # fmt: skip
        tl.store(dscale_ptr + offsets, (dy * r).to(dscale_ptr.dtype.element_ty), mask=mask)
        dweight += tile_dweight
    cols = tl.arange(0, BLOCK_D)
    tl.store(dweight_partial_ptr + pid * n_cols + cols, dweight, mask=cols < n_cols)


@triton.jit
def modulated_rms_norm_bwd_shared(
    dy_ptr,  # [n_rows, n_cols] x.dtype
    x_ptr,  # [n_rows, n_cols] x.dtype
    weight_ptr,  # [n_cols] weight.dtype
    scale_ptr,  # [n_cols] scale.dtype
    rstd_ptr,  # [n_rows] fp32
    n_rows,
    dx_ptr,  # [n_rows, n_cols] x.dtype
    dweight_partial_ptr,  # [num_programs, n_cols] fp32
    dscale_partial_ptr,  # [num_programs, n_cols] fp32: Σ dy · r
    dshift_partial_ptr,  # [num_programs, n_cols] fp32: Σ dy
    offset: tl.constexpr,
    CASTING: tl.constexpr,
    PREFETCH: tl.constexpr,  # not used: each tile is walked once, without prefetching
    TILES_PER_PROGRAM: tl.constexpr,
    n_cols: tl.constexpr,
    row_stride: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """Program p walks TILES_PER_PROGRAM row tiles: dx per row, its partial sums of dweight, dscale and dshift in
    row p of each partial."""
    pid = tl.program_id(0).to(tl.int64)
    dweight = tl.zeros((BLOCK_D,), dtype=tl.float32)
    dscale = tl.zeros((BLOCK_D,), dtype=tl.float32)
    dshift = tl.zeros((BLOCK_D,), dtype=tl.float32)
    for tile_index in range(TILES_PER_PROGRAM):
        rows = row_block((pid * TILES_PER_PROGRAM + tile_index) * BLOCK_ROWS, BLOCK_ROWS)
        dy, r, tile_dweight, _, _ = _tile_backward(
            dy_ptr, x_ptr, weight_ptr, scale_ptr, rstd_ptr, dx_ptr, rows, n_rows,
            offset, CASTING, False, n_cols, row_stride, BLOCK_D,
        )  # fmt: skip
        dweight += tile_dweight
        dscale += tl.sum(dy * r, axis=0)
        dshift += tl.sum(dy, axis=0)
    cols = tl.arange(0, BLOCK_D)
    partial = pid * n_cols + cols
    tl.store(dweight_partial_ptr + partial, dweight, mask=cols < n_cols)
    tl.store(dscale_partial_ptr + partial, dscale, mask=cols < n_cols)
    tl.store(dshift_partial_ptr + partial, dshift, mask=cols < n_cols)
