"""Divergence kernels: KL, generalised Jensen-Shannon and total variation between two distributions per row.

Each row holds ``n_cols`` values of the input x (what gets the gradient) and of the target y; the divergence of a row
is a sum of per-element terms, so one pass over x and y gives its loss and, where asked, its gradient in x. With
p = exp(y) the target's probabilities and q = exp(x) the input's (where the operands are log-probabilities):

    KL_DIV, log_target=False:  y · (log max(y, eps) - x)    d/dx = -y
    KL_DIV, log_target=True:   p · (y - x)                  d/dx = -p
    JSD, beta = 0:             p · (y - x)                  d/dx = -p             (forward KL(p ‖ q))
    JSD, beta = 1:             q · (x - y)                  d/dx = q · (x - y) + q  (reverse KL(q ‖ p))
    JSD, 0 < beta < 1:         β p (y - log m) + (1 - β) q (x - log m),  m = β p + (1 - β) q
                                                            d/dx = (1 - β) q (x - log m)
    TVD (x, y probabilities):  |x - y| / 2                  d/dx = sign(x - y) / 2  (0 where x = y)

All of it is fp32 whatever the operands' dtypes; the logs are ``_fast_math.fast_log`` (the GPU's approximate
log2). A term whose weight (y, p or q) is exactly 0 is 0 (0 · log 0 = 0), so classes masked to -inf in both
operands give a finite loss. Rows whose label is ``ignore_index`` (when HAS_LABELS) are never loaded: loss 0,
gradient 0. The gradient is ``grad_scale[row] · d(row loss)/dx``, rounded to the gradient's dtype once, when stored;
or, SIGN_CODES, only its sign, as 2-bit codes four a byte (TVD's residual: its gradient is ±½ or 0 times a scale),
which :func:`scaled_signs` turns into the gradient in the backward pass.
"""

import triton
import triton.language as tl

from liger_jax.kernels._fast_math import fast_log
from liger_jax.kernels._rows import row_block

# The DIVERGENCE constexpr; liger_jax.ops._divergence_rows maps the op names onto these codes.
KL_DIV = tl.constexpr(0)
JSD = tl.constexpr(1)
TVD = tl.constexpr(2)
SMALLEST_NORMAL = tl.constexpr(1.1754943508222875e-38)


@triton.jit
def _weighted(weight, value):
    """weight · value, 0 where weight is 0 (0 · log 0 = 0, and no 0 · inf from a -inf log-probability)."""
    return tl.where(weight == 0.0, 0.0, weight * value)


@triton.jit
def _jsd_terms(x, y, beta: tl.constexpr):
    """(loss, d/dx) per element of the generalised JSD with 0 < beta < 1, from fp32 log-probabilities x and y."""
    q = tl.exp(x)
    p = tl.exp(y)
    # m is floored at the smallest normal fp32 so its log stays finite: below it, the terms weigh x - log m by
    # probabilities under 1e-38, which no fp32 row sum can see. (Where x and y are both -inf the difference is NaN,
    # but both terms weigh it by 0 there.)
    log_m = fast_log(tl.maximum(beta * p + (1.0 - beta) * q, SMALLEST_NORMAL))
    student = _weighted((1.0 - beta) * q, x - log_m)
    return _weighted(beta * p, y - log_m) + student, student


@triton.jit
def _terms(x, y, DIVERGENCE: tl.constexpr, beta: tl.constexpr, log_target: tl.constexpr, eps: tl.constexpr):
    """(loss, d loss/dx) per element, fp32, of an input tile x and a target tile y (fp32); see the module doc."""
    if DIVERGENCE == KL_DIV:
        if log_target:
            p = tl.exp(y)
            loss = _weighted(p, y - x)
            grad = -p
        else:
            # fast_log flushes subnormals: an eps below the smallest normal floors there (those terms weigh < 1e-38).
            loss = _weighted(y, fast_log(tl.maximum(tl.maximum(y, eps), SMALLEST_NORMAL)) - x)
            grad = -y
    elif DIVERGENCE == JSD:
        if beta == 0.0:
            p = tl.exp(y)
            loss = _weighted(p, y - x)
            grad = -p
        elif beta == 1.0:
            q = tl.exp(x)
            loss = _weighted(q, x - y)
            grad = loss + q
        else:
            loss, grad = _jsd_terms(x, y, beta)
    else:
        loss = 0.5 * tl.abs(x - y)
        grad = tl.where(x > y, 0.5, tl.where(x < y, -0.5, 0.0))
    return loss, grad


@triton.jit
def _program_rows(labels_ptr, n_rows, ignore_index: tl.constexpr, HAS_LABELS: tl.constexpr, BLOCK_ROWS: tl.constexpr):
    """This program's rows (int64), which of them exist, and which of those are not ignored."""
    rows = row_block(tl.program_id(0).to(tl.int64) * BLOCK_ROWS, BLOCK_ROWS)
    row_exists = rows < n_rows
    active = row_exists
    if HAS_LABELS:
        labels = tl.load(labels_ptr + rows, mask=row_exists, other=ignore_index)
        active = row_exists & (labels != ignore_index)
    return rows, row_exists, active


@triton.jit
def _block_terms(
    input_ptr,
    target_ptr,
    rows,
    row_exists,
    active,
    block,
    n_cols: tl.constexpr,
    DIVERGENCE: tl.constexpr,
    beta: tl.constexpr,
    log_target: tl.constexpr,
    eps: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    """Offsets, store mask, loss and gradient terms of the [BLOCK_ROWS, BLOCK_V] tile of columns ``block``.

    Only active rows are read; the terms are 0 outside them and past ``n_cols`` (what an ignored row stores).
    """
    cols = block * BLOCK_V + tl.arange(0, BLOCK_V)
    in_row = cols[None, :] < n_cols
    offsets = rows[:, None] * n_cols + cols[None, :]
    loaded = active[:, None] & in_row
    x = tl.load(input_ptr + offsets, mask=loaded, other=0.0).to(tl.float32)
    y = tl.load(target_ptr + offsets, mask=loaded, other=0.0).to(tl.float32)
    loss, grad = _terms(x, y, DIVERGENCE, beta, log_target, eps)
    return offsets, row_exists[:, None] & in_row, tl.where(loaded, loss, 0.0), tl.where(loaded, grad, 0.0)


@triton.jit
def _store_sign_codes(
    codes_ptr, rows, row_exists, block, grad, n_cols: tl.constexpr, BLOCK_ROWS: tl.constexpr, BLOCK_V: tl.constexpr
):
    """Stores sign(grad) + 1 (0, 1 or 2) of the tile of columns ``block`` four a byte: column 4k + j of a row in bits
    2j..2j+1 of byte k of its ceil(n_cols / 4) bytes. BLOCK_V is a multiple of 4."""
    code = (grad > 0.0).to(tl.int32) - (grad < 0.0).to(tl.int32) + 1
    shifts = 2 * tl.arange(0, 4)
    packed = tl.sum(tl.reshape(code, (BLOCK_ROWS, BLOCK_V // 4, 4)) << shifts[None, None, :], axis=2)
    n_bytes: tl.constexpr = (n_cols + 3) // 4
    byte_cols = block * (BLOCK_V // 4) + tl.arange(0, BLOCK_V // 4)
    stored = row_exists[:, None] & (byte_cols[None, :] < n_bytes)
    tl.store(codes_ptr + rows[:, None] * n_bytes + byte_cols[None, :], packed.to(tl.uint8), mask=stored)


@triton.jit
def divergence(
    input_ptr,  # [n_rows, n_cols] any float dtype
    target_ptr,  # [n_rows, n_cols] any float dtype
    labels_ptr,  # [n_rows] int, read only when HAS_LABELS
    grad_scale_ptr,  # [n_rows] fp32, read only WITH_GRAD
    n_rows,
    loss_ptr,  # [n_rows] fp32, or [n_rows, n_cols] fp32 when ELEMENTWISE
    dinput_ptr,  # WITH_GRAD: [n_rows, n_cols] the gradient's dtype; SIGN_CODES: [n_rows, ceil(n_cols / 4)] uint8
    n_cols: tl.constexpr,
    ignore_index: tl.constexpr,
    DIVERGENCE: tl.constexpr,
    beta: tl.constexpr,
    log_target: tl.constexpr,
    eps: tl.constexpr,
    HAS_LABELS: tl.constexpr,
    ELEMENTWISE: tl.constexpr,
    WITH_GRAD: tl.constexpr,
    SIGN_CODES: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_V: tl.constexpr,
    NUM_V_BLOCKS: tl.constexpr,
):
    """Each row's loss (or, ELEMENTWISE, each element's term) and, WITH_GRAD, grad_scale · d(row loss)/dx or,
    SIGN_CODES, the codes of its sign (grad_scale unread): one read of input and target."""
    rows, row_exists, active = _program_rows(labels_ptr, n_rows, ignore_index, HAS_LABELS, BLOCK_ROWS)
    if WITH_GRAD:
        scale = tl.load(grad_scale_ptr + rows, mask=row_exists, other=0.0)
    total = tl.zeros((BLOCK_ROWS,), tl.float32)
    for block in range(NUM_V_BLOCKS):
        offsets, stored, loss, grad = _block_terms(
            input_ptr, target_ptr, rows, row_exists, active, block, n_cols, DIVERGENCE, beta, log_target, eps, BLOCK_V
        )
        if ELEMENTWISE:
            tl.store(loss_ptr + offsets, loss, mask=stored)
        else:
            total += tl.sum(loss, axis=1)
        if SIGN_CODES:
            _store_sign_codes(dinput_ptr, rows, row_exists, block, grad, n_cols, BLOCK_ROWS, BLOCK_V)
        elif WITH_GRAD:
            grad = grad * scale[:, None]
            tl.store(dinput_ptr + offsets, grad.to(dinput_ptr.dtype.element_ty), mask=stored)
    if not ELEMENTWISE:
        tl.store(loss_ptr + rows, total, mask=row_exists)


@triton.jit
def scaled_signs(
    codes_ptr,  # [n_rows, ceil(n_cols / 4)] uint8: the divergence kernel's SIGN_CODES
    scale_ptr,  # [n_rows] fp32
    cotangent_ptr,  # [n_rows, n_cols] any float dtype, read only when PER_ELEMENT
    out_ptr,  # [n_rows, n_cols] any float dtype
    n_cols: tl.constexpr,
    BLOCK_V: tl.constexpr,
    PER_ELEMENT: tl.constexpr,
):
    """scale[row] · sign (· cotangent[row, col] when PER_ELEMENT, the product in fp32 rounded once) for the BLOCK_V
    columns ``program_id(1)`` of row ``program_id(0)``, each sign its code - 1 (the inverse of
    :func:`_store_sign_codes`): a read of the codes (and of the cotangent), a write of the result."""
    row = tl.program_id(0).to(tl.int64)
    n_bytes: tl.constexpr = (n_cols + 3) // 4
    byte_cols = tl.program_id(1) * (BLOCK_V // 4) + tl.arange(0, BLOCK_V // 4)
    codes = tl.load(codes_ptr + row * n_bytes + byte_cols, mask=byte_cols < n_bytes, other=0).to(tl.int32)
    shifts = 2 * tl.arange(0, 4)
    signs = tl.reshape(((codes[:, None] >> shifts[None, :]) & 3) - 1, (BLOCK_V,))
    cols = tl.program_id(1) * BLOCK_V + tl.arange(0, BLOCK_V)
    in_row = cols < n_cols
    scaled = signs.to(tl.float32) * tl.load(scale_ptr + row)
    if PER_ELEMENT:
        scaled *= tl.load(cotangent_ptr + row * n_cols + cols, mask=in_row).to(tl.float32)
    tl.store(out_ptr + row * n_cols + cols, scaled.to(out_ptr.dtype.element_ty), mask=in_row)
