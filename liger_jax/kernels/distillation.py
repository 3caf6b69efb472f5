"""Distillation row kernel: a chunk's student and teacher logits in; each row's soft and hard losses and the
gradient of the scaled losses in the student's logits out, without an intermediate [rows, V] buffer.

With the temperature T, z_s = s / T and z_t = t / T, the student's q = softmax(z_s) and the teacher's p = softmax(z_t),
a row's soft loss is Σ_j f(a_j, b_j), the divergence kernels' per-element terms (``liger_jax.kernels.divergence``) of
(a, b) = (log q, log p) for KL (teacher's log-probabilities as the target) and JSD, or (q, p) for TVD. Its hard loss
is the cross-entropy of the raw logits, logsumexp(s) - s_label. With d = ∂f/∂a:

    ∂ soft / ∂ z_s_j = d_j - q_j Σ_i d_i          (a = log q)
                     = q_j (d_j - Σ_i q_i d_i)    (a = q)
    ∂ / ∂ s_j of (soft_scale · soft + hard_scale · hard)
                     = soft_scale · ∂ soft / ∂ z_s_j / T + hard_scale · (softmax(s)_j - [j = label])

Three passes over the two rows of logits: the online softmax statistics (of s as well when T ≠ 1 and the hard loss is
asked), then the soft loss and the sum Σ d (Σ q d), then, WITH_GRAD, the gradient, stored over the student's logits
(each element is read before it is written). All arithmetic is fp32; the gradient is rounded once when stored.
Rows whose label is ``ignore_index`` (HAS_LABELS) are never loaded: losses 0, gradient 0. A label outside [0, V)
gives a NaN hard loss and no hard gradient, as the cross-entropy kernels do.
"""

import triton
import triton.language as tl

from liger_jax.kernels._rows import reversed_block, row_block
from liger_jax.kernels.cross_entropy import _label_in_range, _target_logit
from liger_jax.kernels.divergence import TVD, _terms
from liger_jax.kernels.softmax import _add_exponentials


@triton.jit
def _logit_pair(student_ptr, teacher_ptr, rows, active, block, n_cols: tl.constexpr, BLOCK_V: tl.constexpr):
    """Offsets, columns, the mask of loaded elements and the fp32 student and teacher logits of the tile of columns
    ``block``: -inf past the row's end (out of every softmax), 0 on rows not loaded (their arithmetic stays finite)."""
    cols = block * BLOCK_V + tl.arange(0, BLOCK_V)
    in_row = cols[None, :] < n_cols
    offsets = rows[:, None] * n_cols + cols[None, :]
    loaded = active[:, None] & in_row
    s = tl.load(student_ptr + offsets, mask=loaded, other=0.0).to(tl.float32)
    t = tl.load(teacher_ptr + offsets, mask=loaded, other=0.0).to(tl.float32)
    return offsets, cols, loaded, tl.where(in_row, s, float("-inf")), tl.where(in_row, t, float("-inf"))


@triton.jit
def _soft_terms(
    s, t, lse_student, lse_teacher, loaded, inv_temperature: tl.constexpr, DIVERGENCE: tl.constexpr, beta: tl.constexpr
):
    """Per element of a tile: the soft loss's terms, ∂f/∂a, the student's probabilities q and the terms of the sum
    the softmax's chain rule subtracts (d, or q · d for TVD); 0 outside ``loaded``."""
    log_q = s * inv_temperature - lse_student[:, None]
    log_p = t * inv_temperature - lse_teacher[:, None]
    q = tl.exp(log_q)
    if DIVERGENCE == TVD:
        loss, d = _terms(q, tl.exp(log_p), DIVERGENCE, beta, True, 0.0)
        spread = q * d
    else:
        loss, d = _terms(log_q, log_p, DIVERGENCE, beta, True, 0.0)
        spread = d
    return tl.where(loaded, loss, 0.0), tl.where(loaded, d, 0.0), q, tl.where(loaded, spread, 0.0)


@triton.jit
def distillation_rows(
    student_ptr,  # [n_rows, n_cols] logits dtype; the gradient is written over it (WITH_GRAD)
    teacher_ptr,  # [n_rows, n_cols] any float dtype
    labels_ptr,  # [n_rows] int, read when HAS_LABELS
    soft_scale_ptr,  # [n_rows] fp32, read WITH_GRAD
    hard_scale_ptr,  # [n_rows] fp32, read WITH_GRAD and HARD_LOSS
    n_rows,
    soft_ptr,  # [n_rows] fp32
    hard_ptr,  # [n_rows] fp32, 0 without HARD_LOSS
    dstudent_ptr,  # [n_rows, n_cols] logits dtype, written WITH_GRAD (may alias student_ptr)
    n_cols: tl.constexpr,
    ignore_index: tl.constexpr,
    inv_temperature: tl.constexpr,
    DIVERGENCE: tl.constexpr,
    beta: tl.constexpr,
    HAS_LABELS: tl.constexpr,
    HARD_LOSS: tl.constexpr,
    RAW_SOFTMAX: tl.constexpr,
    WITH_GRAD: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    """Soft and hard losses of BLOCK_ROWS rows and, WITH_GRAD, the gradient of soft_scale · soft + hard_scale ·
    hard in the student's logits (see the module docstring). RAW_SOFTMAX (the hard loss at T ≠ 1) keeps the raw
    logits' softmax statistics apart from the tempered ones."""
    rows = row_block(tl.program_id(0).to(tl.int64) * BLOCK_ROWS, BLOCK_ROWS)
    row_exists = rows < n_rows
    labels = tl.zeros((BLOCK_ROWS,), tl.int64)
    active = row_exists
    if HAS_LABELS:
        labels = tl.load(labels_ptr + rows, mask=row_exists, other=ignore_index).to(tl.int64)
        active = row_exists & (labels != ignore_index)
    max_student = tl.full((BLOCK_ROWS,), float("-inf"), tl.float32)
    max_teacher = tl.full((BLOCK_ROWS,), float("-inf"), tl.float32)
    max_raw = tl.full((BLOCK_ROWS,), float("-inf"), tl.float32)
    sum_student = tl.zeros((BLOCK_ROWS,), tl.float32)
    sum_teacher = tl.zeros((BLOCK_ROWS,), tl.float32)
    sum_raw = tl.zeros((BLOCK_ROWS,), tl.float32)
    for block in range((n_cols + BLOCK_V - 1) // BLOCK_V):
        _, _, _, s, t = _logit_pair(student_ptr, teacher_ptr, rows, active, block, n_cols, BLOCK_V)
        max_student, sum_student = _add_exponentials(max_student, sum_student, s * inv_temperature, 0.0)
        max_teacher, sum_teacher = _add_exponentials(max_teacher, sum_teacher, t * inv_temperature, 0.0)
        if RAW_SOFTMAX:
            max_raw, sum_raw = _add_exponentials(max_raw, sum_raw, s, 0.0)
    lse_student = max_student + tl.log(sum_student)
    lse_teacher = max_teacher + tl.log(sum_teacher)
    lse_raw = lse_student
    if RAW_SOFTMAX:
        lse_raw = max_raw + tl.log(sum_raw)
    hard = tl.zeros((BLOCK_ROWS,), tl.float32)
    in_range = _label_in_range(labels, n_cols)
    if HARD_LOSS:
        target = _target_logit(student_ptr, rows, labels, active, n_cols, 0.0)
        hard = tl.where(active, tl.where(in_range, lse_raw - target, float("nan")), 0.0)
    soft = tl.zeros((BLOCK_ROWS,), tl.float32)
    spread = tl.zeros((BLOCK_ROWS,), tl.float32)
    # The passes alternate direction: each starts on the blocks the one before read last.
    for step in range((n_cols + BLOCK_V - 1) // BLOCK_V):
        block = reversed_block(step, n_cols, BLOCK_V) // BLOCK_V
        _, _, loaded, s, t = _logit_pair(student_ptr, teacher_ptr, rows, active, block, n_cols, BLOCK_V)
        loss, _, _, chained = _soft_terms(s, t, lse_student, lse_teacher, loaded, inv_temperature, DIVERGENCE, beta)
        soft += tl.sum(loss, axis=1)
        spread += tl.sum(chained, axis=1)
    tl.store(soft_ptr + rows, soft, mask=row_exists)
    tl.store(hard_ptr + rows, hard, mask=row_exists)
    if WITH_GRAD:
        soft_scale = tl.load(soft_scale_ptr + rows, mask=row_exists, other=0.0) * inv_temperature
        hard_scale = tl.zeros((BLOCK_ROWS,), tl.float32)
        if HARD_LOSS:
            hard_scale = tl.load(hard_scale_ptr + rows, mask=row_exists, other=0.0)
            hard_scale = tl.where(in_range, hard_scale, 0.0)
        for block in range((n_cols + BLOCK_V - 1) // BLOCK_V):
            offsets, cols, loaded, s, t = _logit_pair(student_ptr, teacher_ptr, rows, active, block, n_cols, BLOCK_V)
            _, d, q, _ = _soft_terms(s, t, lse_student, lse_teacher, loaded, inv_temperature, DIVERGENCE, beta)
            if DIVERGENCE == TVD:
                dz = q * (d - spread[:, None])
            else:
                dz = d - q * spread[:, None]
            grad = soft_scale[:, None] * dz
            if HARD_LOSS:
                raw_q = q
                if RAW_SOFTMAX:
                    raw_q = tl.exp(s - lse_raw[:, None])
                onehot = tl.where(cols[None, :] == labels[:, None], 1.0, 0.0)
                grad += hard_scale[:, None] * (raw_q - onehot)
            grad = tl.where(loaded, grad, 0.0)
            stored = row_exists[:, None] & (cols[None, :] < n_cols)
            tl.store(dstudent_ptr + offsets, grad.to(dstudent_ptr.dtype.element_ty), mask=stored)
