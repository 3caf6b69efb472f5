"""LayerNorm kernels: y = (x - mean) · rstd · scale + bias, rstd = 1 / sqrt(var + eps), over the last axis.

The rows are the flattened leading axes of x; each row has ``n_cols`` elements and rows are ``row_stride``
elements apart. A row lives in one tile, so mean and variance are two exact passes over registers (no
E[x²] - E[x]² cancellation); everything is computed in fp32 and y is rounded once, to y's dtype.
"""

import triton
import triton.language as tl

from liger_jax.kernels._rows import row_tile


@triton.jit
def layer_norm_fwd(
    x_ptr,  # [n_rows, n_cols] x.dtype
    scale_ptr,  # [n_cols] scale.dtype
    bias_ptr,  # [n_cols] bias.dtype
    n_rows,
    y_ptr,  # [n_rows, n_cols] x.dtype
    mean_ptr,  # [n_rows] fp32
    rstd_ptr,  # [n_rows] fp32
    eps: tl.constexpr,
    n_cols: tl.constexpr,
    row_stride: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """One program normalises BLOCK_ROWS rows; it stores y and the fp32 mean and rstd of each row."""
    rows, offsets, mask = row_tile(
        tl.program_id(0).to(tl.int64) * BLOCK_ROWS, n_rows, n_cols, row_stride, BLOCK_ROWS, BLOCK_D
    )
    cols = tl.arange(0, BLOCK_D)
    col_mask = cols < n_cols
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    scale = tl.load(scale_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
    bias = tl.load(bias_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
    mean = tl.sum(x, axis=1) / n_cols
    # Masked columns would contribute (0 - mean)² to the variance: zero them.
    centred = tl.where(mask, x - mean[:, None], 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(centred * centred, axis=1) / n_cols + eps)
    y = centred * rstd[:, None] * scale[None, :] + bias[None, :]
    tl.store(y_ptr + offsets, y.to(y_ptr.dtype.element_ty), mask=mask)
    tl.store(mean_ptr + rows, mean, mask=rows < n_rows)
    tl.store(rstd_ptr + rows, rstd, mask=rows < n_rows)


@triton.jit
def layer_norm_bwd(
    dy_ptr,  # [n_rows, n_cols] x.dtype
    x_ptr,  # [n_rows, n_cols] x.dtype
    scale_ptr,  # [n_cols] scale.dtype
    mean_ptr,  # [n_rows] fp32
    rstd_ptr,  # [n_rows] fp32
    n_rows,
    dx_ptr,  # [n_rows, n_cols] x.dtype
    dscale_partial_ptr,  # [num_programs, n_cols] fp32
    dbias_partial_ptr,  # [num_programs, n_cols] fp32
    TILES_PER_PROGRAM: tl.constexpr,
    n_cols: tl.constexpr,
    row_stride: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """dx = rstd · (g - mean(g) - n · mean(g · n)) with n = (x - mean) · rstd, g = dy · scale, row by row.

    Program p walks TILES_PER_PROGRAM tiles of BLOCK_ROWS rows from row p · TILES_PER_PROGRAM · BLOCK_ROWS and writes
    its fp32 partial sums of dy · n (dscale) and dy (dbias) into row p of the partials; XLA adds the partials
    (deterministic, no atomics).
    """
    pid = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_D)
    col_mask = cols < n_cols
    scale = tl.load(scale_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
    dscale = tl.zeros((BLOCK_D,), dtype=tl.float32)
    dbias = tl.zeros((BLOCK_D,), dtype=tl.float32)
    for tile in range(TILES_PER_PROGRAM):
        first_row = (pid * TILES_PER_PROGRAM + tile) * BLOCK_ROWS
        rows, offsets, mask = row_tile(first_row, n_rows, n_cols, row_stride, BLOCK_ROWS, BLOCK_D)
        row_mask = rows < n_rows
        x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        mean = tl.load(mean_ptr + rows, mask=row_mask, other=0.0)
        rstd = tl.load(rstd_ptr + rows, mask=row_mask, other=0.0)
        # Masked columns hold x = 0, so x - mean would not vanish there: zero n explicitly.
        normed = tl.where(mask, (x - mean[:, None]) * rstd[:, None], 0.0)
        g = dy * scale[None, :]
        mean_g = tl.sum(g, axis=1) / n_cols
        mean_gn = tl.sum(g * normed, axis=1) / n_cols
        dx = rstd[:, None] * (g - mean_g[:, None] - normed * mean_gn[:, None])
        tl.store(dx_ptr + offsets, dx.to(dx_ptr.dtype.element_ty), mask=mask)
        dscale += tl.sum(dy * normed, axis=0)
        dbias += tl.sum(dy, axis=0)
    tl.store(dscale_partial_ptr + pid * n_cols + cols, dscale, mask=col_mask)
    tl.store(dbias_partial_ptr + pid * n_cols + cols, dbias, mask=col_mask)
