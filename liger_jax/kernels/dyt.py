"""Dynamic Tanh (DyT) kernels: y = gamma · tanh(alpha · x) + beta over rows of x, alpha a scalar, gamma and beta [D].

Everything is fp32; y and dx are rounded once. With t = tanh(alpha · x) and g = dy · gamma · (1 - t²):
dx = alpha · g, dalpha = Σ x · g, dgamma = Σ dy · t, dbeta = Σ dy. dgamma and dbeta come as per-program partial
sums over rows (``liger_jax.ops._rows.ColumnSum``), dalpha as one sum per row that XLA adds.

The rows are the flattened leading axes of x; a row longer than BLOCK_D is walked in column blocks (see
``liger_jax.kernels._rows``): DyT is elementwise, so one pass serves either way.
"""

import triton
import triton.language as tl

from liger_jax.kernels._rows import add_to_partial, row_block, tile


@triton.jit
def _tanh(u):
    """tanh of fp32 ``u`` from exp (the interpreter has no libdevice): absolute error ~1e-7; exp overflowing to inf
    gives exactly ±1."""
    return 1.0 - 2.0 / (tl.exp(2.0 * u) + 1.0)


@triton.jit
def dyt_fwd(
    x_ptr,  # [n_rows, n_cols] x.dtype
    alpha_ptr,  # [] alpha.dtype
    gamma_ptr,  # [n_cols] gamma.dtype
    beta_ptr,  # [n_cols] beta.dtype
    n_rows,
    y_ptr,  # [n_rows, n_cols] x.dtype
    n_cols: tl.constexpr,
    row_stride: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """One program computes y of BLOCK_ROWS rows, one column block at a time."""
    rows = row_block(tl.program_id(0).to(tl.int64) * BLOCK_ROWS, BLOCK_ROWS)
    alpha = tl.load(alpha_ptr).to(tl.float32)
    for block in range((n_cols + BLOCK_D - 1) // BLOCK_D):
        cols, offsets, mask = tile(rows, block * BLOCK_D, n_rows, n_cols, row_stride, BLOCK_D)
        x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        gamma = tl.load(gamma_ptr + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
        beta = tl.load(beta_ptr + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
        y = _tanh(alpha * x) * gamma[None, :] + beta[None, :]
        tl.store(y_ptr + offsets, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _tile_gradients(dy_ptr, x_ptr, gamma_ptr, dx_ptr, alpha, cols, offsets, mask, n_cols: tl.constexpr):
    """Stores dx of one tile; returns its column sums of dy · t and of dy [BLOCK_D] and its row sums of x · g
    [BLOCK_ROWS], all fp32."""
    dy = tl.load(dy_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    gamma = tl.load(gamma_ptr + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
    t = _tanh(alpha * x)
    g = dy * gamma[None, :] * (1.0 - t * t)
    tl.store(dx_ptr + offsets, (alpha * g).to(dx_ptr.dtype.element_ty), mask=mask)
    return tl.sum(dy * t, axis=0), tl.sum(dy, axis=0), tl.sum(x * g, axis=1)


@triton.jit
def dyt_bwd(
    dy_ptr,  # [n_rows, n_cols] x.dtype
    x_ptr,  # [n_rows, n_cols] x.dtype
    alpha_ptr,  # [] alpha.dtype
    gamma_ptr,  # [n_cols] gamma.dtype
    n_rows,
    dx_ptr,  # [n_rows, n_cols] x.dtype
    dgamma_partial_ptr,  # [num_programs, n_cols] fp32
    dbeta_partial_ptr,  # [num_programs, n_cols] fp32
    dalpha_rows_ptr,  # [n_rows] fp32: each row's Σ x · g
    PREFETCH: tl.constexpr,  # not used: the backward walks each tile once, without prefetching
    TILES_PER_PROGRAM: tl.constexpr,
    n_cols: tl.constexpr,
    row_stride: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """Program p walks TILES_PER_PROGRAM row tiles from row p · TILES_PER_PROGRAM · BLOCK_ROWS: dx, each row's
    dalpha term, and the program's fp32 partial sums of dgamma and dbeta (row p of the partials)."""
    pid = tl.program_id(0).to(tl.int64)
    alpha = tl.load(alpha_ptr).to(tl.float32)
    if n_cols <= BLOCK_D:
        dgamma = tl.zeros((BLOCK_D,), dtype=tl.float32)
        dbeta = tl.zeros((BLOCK_D,), dtype=tl.float32)
        for tile_index in range(TILES_PER_PROGRAM):
            rows = row_block((pid * TILES_PER_PROGRAM + tile_index) * BLOCK_ROWS, BLOCK_ROWS)
            cols, offsets, mask = tile(rows, 0, n_rows, n_cols, row_stride, BLOCK_D)
            tile_dgamma, tile_dbeta, dalpha = _tile_gradients(
                dy_ptr, x_ptr, gamma_ptr, dx_ptr, alpha, cols, offsets, mask, n_cols
            )
            dgamma += tile_dgamma
            dbeta += tile_dbeta
            tl.store(dalpha_rows_ptr + rows, dalpha, mask=rows < n_rows)
        cols = tl.arange(0, BLOCK_D)
        tl.store(dgamma_partial_ptr + pid * n_cols + cols, dgamma, mask=cols < n_cols)
        tl.store(dbeta_partial_ptr + pid * n_cols + cols, dbeta, mask=cols < n_cols)
    else:
        for tile_index in range(TILES_PER_PROGRAM):
            rows = row_block((pid * TILES_PER_PROGRAM + tile_index) * BLOCK_ROWS, BLOCK_ROWS)
            dalpha = tl.zeros((BLOCK_ROWS,), dtype=tl.float32)
            # Other threads of this program stored the previous tile's partial sums, which this tile adds to.
            tl.debug_barrier()
            for block in range((n_cols + BLOCK_D - 1) // BLOCK_D):
                cols, offsets, mask = tile(rows, block * BLOCK_D, n_rows, n_cols, row_stride, BLOCK_D)
                tile_dgamma, tile_dbeta, block_dalpha = _tile_gradients(
                    dy_ptr, x_ptr, gamma_ptr, dx_ptr, alpha, cols, offsets, mask, n_cols
                )
                add_to_partial(dgamma_partial_ptr + pid * n_cols, cols, n_cols, tile_dgamma, tile_index > 0)
                add_to_partial(dbeta_partial_ptr + pid * n_cols, cols, n_cols, tile_dbeta, tile_index > 0)
                dalpha += block_dalpha
            tl.store(dalpha_rows_ptr + rows, dalpha, mask=rows < n_rows)
