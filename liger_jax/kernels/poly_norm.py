"""PolyNorm kernels: y = w0 · n(x³) + w1 · n(x²) + w2 · n(x) + b over the last axis, n(u) = u · rstd(u),
rstd(u) = 1 / sqrt(mean(u²) + eps).

Everything is fp32; y and dx are rounded once. The forward stores the three rstd of each row (x³, x², x). With
S_p = Σ dy · x^p over a row of D columns, the backward is
dx = Σ_p w_p · (p · x^(p-1) · rstd_p · dy - (p / D) · x^(2p-1) · rstd_p³ · S_p), and each row's share of the
weight gradients, dw_p = rstd_p · S_p and db = Σ dy, which XLA adds over the rows. A row is one tile (the op rejects
rows longer than ``liger_jax.ops._tiling.MAX_BACKWARD_TILE_COLS``).
"""

import triton
import triton.language as tl

from liger_jax.kernels._rows import row_block, row_sums4, tile


@triton.jit
def _rstd(sum_squares, n_cols: tl.constexpr, eps: tl.constexpr):
    """1 / sqrt(mean(u²) + eps) of each row, from its Σ u² [BLOCK_ROWS]."""
    return 1.0 / tl.sqrt(sum_squares / n_cols + eps)


@triton.jit
def poly_norm_fwd(
    x_ptr,  # [n_rows, n_cols] x.dtype
    w0_ptr,  # [] weight.dtype, weight[0]: the x³ term
    w1_ptr,  # [] weight.dtype, weight[1]: the x² term
    w2_ptr,  # [] weight.dtype, weight[2]: the x term
    bias_ptr,  # [] bias.dtype
    n_rows,
    y_ptr,  # [n_rows, n_cols] x.dtype
    rstd3_ptr,  # [n_rows] fp32
    rstd2_ptr,  # [n_rows] fp32
    rstd1_ptr,  # [n_rows] fp32
    eps: tl.constexpr,
    n_cols: tl.constexpr,
    row_stride: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """One program normalises BLOCK_ROWS rows; it stores y and the three fp32 rstd of each row."""
    rows = row_block(tl.program_id(0).to(tl.int64) * BLOCK_ROWS, BLOCK_ROWS)
    cols, offsets, mask = tile(rows, 0, n_rows, n_cols, row_stride, BLOCK_D)
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    x2 = x * x
    x3 = x2 * x
    squares3, squares2, squares1, _ = row_sums4(x3 * x3, x2 * x2, x * x, x)
    rstd3, rstd2, rstd1 = _rstd(squares3, n_cols, eps), _rstd(squares2, n_cols, eps), _rstd(squares1, n_cols, eps)
    w0 = tl.load(w0_ptr).to(tl.float32)
    w1 = tl.load(w1_ptr).to(tl.float32)
    w2 = tl.load(w2_ptr).to(tl.float32)
    bias = tl.load(bias_ptr).to(tl.float32)
    y = (w0 * rstd3)[:, None] * x3 + (w1 * rstd2)[:, None] * x2 + (w2 * rstd1)[:, None] * x + bias
    tl.store(y_ptr + offsets, y.to(y_ptr.dtype.element_ty), mask=mask)
    row_mask = rows < n_rows
    tl.store(rstd3_ptr + rows, rstd3, mask=row_mask)
    tl.store(rstd2_ptr + rows, rstd2, mask=row_mask)
    tl.store(rstd1_ptr + rows, rstd1, mask=row_mask)


@triton.jit
def poly_norm_bwd(
    dy_ptr,  # [n_rows, n_cols] x.dtype
    x_ptr,  # [n_rows, n_cols] x.dtype
    w0_ptr,  # [] weight.dtype
    w1_ptr,  # [] weight.dtype
    w2_ptr,  # [] weight.dtype
    rstd3_ptr,  # [n_rows] fp32
    rstd2_ptr,  # [n_rows] fp32
    rstd1_ptr,  # [n_rows] fp32
    n_rows,
    dx_ptr,  # [n_rows, n_cols] x.dtype
    dw0_rows_ptr,  # [n_rows] fp32: rstd_3 · S_3
    dw1_rows_ptr,  # [n_rows] fp32: rstd_2 · S_2
    dw2_rows_ptr,  # [n_rows] fp32: rstd_1 · S_1
    dbias_rows_ptr,  # [n_rows] fp32: Σ dy
    n_cols: tl.constexpr,
    row_stride: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """One program writes dx of BLOCK_ROWS rows and each row's terms of dw and dbias (see the module docstring)."""
    rows = row_block(tl.program_id(0).to(tl.int64) * BLOCK_ROWS, BLOCK_ROWS)
    row_mask = rows < n_rows
    cols, offsets, mask = tile(rows, 0, n_rows, n_cols, row_stride, BLOCK_D)
    dy = tl.load(dy_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    rstd3 = tl.load(rstd3_ptr + rows, mask=row_mask, other=0.0)
    rstd2 = tl.load(rstd2_ptr + rows, mask=row_mask, other=0.0)
    rstd1 = tl.load(rstd1_ptr + rows, mask=row_mask, other=0.0)
    w0 = tl.load(w0_ptr).to(tl.float32)
    w1 = tl.load(w1_ptr).to(tl.float32)
    w2 = tl.load(w2_ptr).to(tl.float32)
    x2 = x * x
    x3 = x2 * x
    s3, s2, s1, s0 = row_sums4(dy * x3, dy * x2, dy * x, dy)
    # The correction terms' per-row factors: w_p · (p / D) · rstd_p³ · S_p.
    c3 = w0 * (3.0 / n_cols) * rstd3 * rstd3 * rstd3 * s3
    c2 = w1 * (2.0 / n_cols) * rstd2 * rstd2 * rstd2 * s2
    c1 = w2 * (1.0 / n_cols) * rstd1 * rstd1 * rstd1 * s1
    dx = (
        ((3.0 * w0) * rstd3)[:, None] * x2 * dy
        + ((2.0 * w1) * rstd2)[:, None] * x * dy
        + (w2 * rstd1)[:, None] * dy
        - c3[:, None] * x3 * x2
        - c2[:, None] * x3
        - c1[:, None] * x
    )
    tl.store(dx_ptr + offsets, dx.to(dx_ptr.dtype.element_ty), mask=mask)
    tl.store(dw0_rows_ptr + rows, rstd3 * s3, mask=row_mask)
    tl.store(dw1_rows_ptr + rows, rstd2 * s2, mask=row_mask)
    tl.store(dw2_rows_ptr + rows, rstd1 * s1, mask=row_mask)
    tl.store(dbias_rows_ptr + rows, s0, mask=row_mask)
