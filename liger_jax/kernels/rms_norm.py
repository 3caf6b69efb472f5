"""RMSNorm kernels: y = x · rstd · (offset + scale), rstd = 1 / sqrt(mean(x²) + eps), over the last axis.

The rows are the flattened leading axes of x; each row has ``n_cols`` elements and rows are ``row_stride``
elements apart. Statistics are always accumulated in fp32. The fused-add kernels normalise s = x + residual
(rounded to x.dtype) and also store s, reading each input once (Liger's FusedAddRMSNorm).
"""

import triton
import triton.language as tl

from liger_jax.kernels._rows import row_tile

# The CASTING constexpr; liger_jax.ops.rms_norm maps the casting_mode names onto these codes.
CASTING_NONE = tl.constexpr(0)
CASTING_LLAMA = tl.constexpr(1)
CASTING_GEMMA = tl.constexpr(2)


@triton.jit
def _normalize(x, scale, n_cols, eps: tl.constexpr, offset: tl.constexpr, CASTING: tl.constexpr):
    """``(y, rstd)`` in fp32 of a tile ``x`` [BLOCK_ROWS, BLOCK_D] as loaded (x.dtype, 0 where masked), with
    ``scale`` [BLOCK_D] in fp32; y still needs its final rounding to x.dtype."""
    x_f32 = x.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x_f32 * x_f32, axis=1) / n_cols + eps)
    if CASTING == CASTING_LLAMA:
        # Llama rounds the normalised x to the input dtype before the scale multiplies it.
        normed = (x_f32 * rstd[:, None]).to(x.dtype).to(tl.float32)
        y = normed * (offset + scale)[None, :]
    elif CASTING == CASTING_GEMMA:
        y = x_f32 * rstd[:, None] * (offset + scale)[None, :]
    else:
        # Every product rounded to the input dtype, as a model without casts computes it. The fp32 product of two
        # bf16/fp16 values is exact, so rounding it equals the native product (the interpreter has no bf16 math).
        rstd_in = rstd.to(x.dtype).to(tl.float32)
        scale_in = (offset + scale).to(x.dtype).to(tl.float32)
        y = (x_f32 * rstd_in[:, None]).to(x.dtype).to(tl.float32) * scale_in[None, :]
    return y, rstd


@triton.jit
def _normalize_bwd(dy, x, rstd, scale, n_cols, CASTING: tl.constexpr):
    """``(dx, dscale)`` in fp32 of one tile: dx [BLOCK_ROWS, BLOCK_D] and this tile's dscale [BLOCK_D].

    dx = rstd · (g - n · mean(g · n)) with n = x · rstd, g = dy · scale, where ``scale`` [BLOCK_D] fp32 already
    includes the offset; ``dy`` is fp32, ``x`` as loaded (x.dtype) and ``rstd`` [BLOCK_ROWS] fp32, all 0 where
    masked. dscale multiplies dy by n as the forward rounded it (that is what y's dependence on scale is); dx
    passes straight through the roundings.
    """
    x_f32 = x.to(tl.float32)
    normed = x_f32 * rstd[:, None]
    g = dy * scale[None, :]
    mean_gn = tl.sum(g * normed, axis=1) / n_cols
    dx = rstd[:, None] * (g - normed * mean_gn[:, None])
    if CASTING == CASTING_LLAMA:
        normed = normed.to(x.dtype).to(tl.float32)
    elif CASTING == CASTING_NONE:
        rstd_in = rstd.to(x.dtype).to(tl.float32)
        normed = (x_f32 * rstd_in[:, None]).to(x.dtype).to(tl.float32)
    return dx, tl.sum(dy * normed, axis=0)


@triton.jit
def _store_normalized(
    x,
    scale_ptr,
    y_ptr,
    rstd_ptr,
    rows,
    offsets,
    mask,
    n_rows,
    n_cols: tl.constexpr,
    eps: tl.constexpr,
    offset: tl.constexpr,
    CASTING: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """Normalises the loaded tile ``x`` (x.dtype, 0 where masked) and stores y and each row's fp32 rstd."""
    cols = tl.arange(0, BLOCK_D)
    scale = tl.load(scale_ptr + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
    y, rstd = _normalize(x, scale, n_cols, eps, offset, CASTING)
    tl.store(y_ptr + offsets, y.to(y_ptr.dtype.element_ty), mask=mask)
    tl.store(rstd_ptr + rows, rstd, mask=rows < n_rows)


@triton.jit
def rms_norm_fwd(
    x_ptr,  # [n_rows, n_cols] x.dtype
    scale_ptr,  # [n_cols] scale.dtype
    n_rows,
    y_ptr,  # [n_rows, n_cols] x.dtype
    rstd_ptr,  # [n_rows] fp32
    eps: tl.constexpr,
    offset: tl.constexpr,
    CASTING: tl.constexpr,
    n_cols: tl.constexpr,
    row_stride: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """One program normalises BLOCK_ROWS rows; it stores y and the fp32 rstd of each row."""
    rows, offsets, mask = row_tile(
        tl.program_id(0).to(tl.int64) * BLOCK_ROWS, n_rows, n_cols, row_stride, BLOCK_ROWS, BLOCK_D
    )
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0)
    _store_normalized(x, scale_ptr, y_ptr, rstd_ptr, rows, offsets, mask, n_rows, n_cols, eps, offset, CASTING, BLOCK_D)


@triton.jit
def rms_norm_bwd(
    dy_ptr,  # [n_rows, n_cols] x.dtype
    x_ptr,  # [n_rows, n_cols] x.dtype
    scale_ptr,  # [n_cols] scale.dtype
    rstd_ptr,  # [n_rows] fp32
    n_rows,
    dx_ptr,  # [n_rows, n_cols] x.dtype
    dscale_partial_ptr,  # [num_programs, n_cols] fp32
    offset: tl.constexpr,
    CASTING: tl.constexpr,
    TILES_PER_PROGRAM: tl.constexpr,
    n_cols: tl.constexpr,
    row_stride: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """dx row by row (see ``_normalize_bwd``) and per-program partial sums of dscale.

    Program p walks TILES_PER_PROGRAM tiles of BLOCK_ROWS rows from row p · TILES_PER_PROGRAM · BLOCK_ROWS and writes
    its fp32 partial sum of dy · n into row p of dscale_partial; XLA adds the partials (deterministic, no atomics).
    """
    pid = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_D)
    col_mask = cols < n_cols
    scale = offset + tl.load(scale_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
    dscale = tl.zeros((BLOCK_D,), dtype=tl.float32)
    first_row = pid * TILES_PER_PROGRAM * BLOCK_ROWS
    rows, offsets, mask = row_tile(first_row, n_rows, n_cols, row_stride, BLOCK_ROWS, BLOCK_D)
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0)
    dy = tl.load(dy_ptr + offsets, mask=mask, other=0.0)
    rstd = tl.load(rstd_ptr + rows, mask=rows < n_rows, other=0.0)
    for tile in range(TILES_PER_PROGRAM):
        # The next tile's loads are issued before this tile's arithmetic, so memory latency hides behind it.
        next_first_row = first_row + (tile + 1) * BLOCK_ROWS
        next_rows, next_offsets, next_mask = row_tile(next_first_row, n_rows, n_cols, row_stride, BLOCK_ROWS, BLOCK_D)
        next_x = tl.load(x_ptr + next_offsets, mask=next_mask, other=0.0)
        next_dy = tl.load(dy_ptr + next_offsets, mask=next_mask, other=0.0)
        next_rstd = tl.load(rstd_ptr + next_rows, mask=next_rows < n_rows, other=0.0)
        dx, tile_dscale = _normalize_bwd(dy.to(tl.float32), x, rstd, scale, n_cols, CASTING)
        tl.store(dx_ptr + offsets, dx.to(dx_ptr.dtype.element_ty), mask=mask)
        dscale += tile_dscale
        rows, offsets, mask, x, dy, rstd = next_rows, next_offsets, next_mask, next_x, next_dy, next_rstd
    tl.store(dscale_partial_ptr + pid * n_cols + cols, dscale, mask=col_mask)


@triton.jit
def fused_add_rms_norm_fwd(
    x_ptr,  # [n_rows, n_cols] x.dtype
    residual_ptr,  # [n_rows, n_cols] x.dtype
    scale_ptr,  # [n_cols] scale.dtype
    n_rows,
    y_ptr,  # [n_rows, n_cols] x.dtype
    sum_ptr,  # [n_rows, n_cols] x.dtype
    rstd_ptr,  # [n_rows] fp32
    eps: tl.constexpr,
    offset: tl.constexpr,
    CASTING: tl.constexpr,
    n_cols: tl.constexpr,
    row_stride: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """s = x + residual, rounded to x.dtype and stored, then y = RMSNorm(s) and its rstd, as ``rms_norm_fwd``."""
    rows, offsets, mask = row_tile(
        tl.program_id(0).to(tl.int64) * BLOCK_ROWS, n_rows, n_cols, row_stride, BLOCK_ROWS, BLOCK_D
    )
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0)
    residual = tl.load(residual_ptr + offsets, mask=mask, other=0.0)
    # The fp32 sum of two bf16/fp16 values rounds to the same x.dtype value as the native sum.
    total = (x.to(tl.float32) + residual.to(tl.float32)).to(x.dtype)
    tl.store(sum_ptr + offsets, total, mask=mask)
    _store_normalized(
        total, scale_ptr, y_ptr, rstd_ptr, rows, offsets, mask, n_rows, n_cols, eps, offset, CASTING, BLOCK_D
    )


@triton.jit
def fused_add_rms_norm_bwd(
    dy_ptr,  # [n_rows, n_cols] x.dtype, cotangent of y
    dsum_ptr,  # [n_rows, n_cols] x.dtype, cotangent of s
    sum_ptr,  # [n_rows, n_cols] x.dtype
    scale_ptr,  # [n_cols] scale.dtype
    rstd_ptr,  # [n_rows] fp32
    n_rows,
    ds_ptr,  # [n_rows, n_cols] x.dtype, the cotangent of x and of residual
    dscale_partial_ptr,  # [num_programs, n_cols] fp32
    offset: tl.constexpr,
    CASTING: tl.constexpr,
    TILES_PER_PROGRAM: tl.constexpr,
    n_cols: tl.constexpr,
    row_stride: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """ds = dsum + RMSNorm's dx at s (x and residual both get ds), and dscale partials as ``rms_norm_bwd``.

    Each element of dsum is read before ds is written at the same offset, so ds may alias dsum.
    """
    pid = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_D)
    col_mask = cols < n_cols
    scale = offset + tl.load(scale_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
    dscale = tl.zeros((BLOCK_D,), dtype=tl.float32)
    for tile in range(TILES_PER_PROGRAM):
        first_row = (pid * TILES_PER_PROGRAM + tile) * BLOCK_ROWS
        rows, offsets, mask = row_tile(first_row, n_rows, n_cols, row_stride, BLOCK_ROWS, BLOCK_D)
        total = tl.load(sum_ptr + offsets, mask=mask, other=0.0)
        dy = tl.load(dy_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        dsum = tl.load(dsum_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        rstd = tl.load(rstd_ptr + rows, mask=rows < n_rows, other=0.0)
        dx, tile_dscale = _normalize_bwd(dy, total, rstd, scale, n_cols, CASTING)
        tl.store(ds_ptr + offsets, (dx + dsum).to(ds_ptr.dtype.element_ty), mask=mask)
        dscale += tile_dscale
    tl.store(dscale_partial_ptr + pid * n_cols + cols, dscale, mask=col_mask)
