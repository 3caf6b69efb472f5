"""Cross-entropy kernels: each program takes BLOCK_ROWS rows and streams the vocabulary in BLOCK_V blocks with an
online softmax (BLOCK_ROWS is 1 for LLM vocabularies).

With c = softcap · tanh(z / softcap) (or c = z without softcap), lse = log Σ_j exp(c_j), smoothing α and V classes,
the loss of a row with label y is

    loss = lse - (1 - α) · c_y - (α / V) · Σ_j c_j + z_loss_scale · lse²

and its gradient is dloss/dz_j = (p_j · (1 + 2 · z_loss_scale · lse) - α / V - (1 - α) · [j = y]) · dc_j/dz_j, with
p = softmax(c) and dc/dz = 1 - tanh². All of it is fp32, whatever the logits dtype; the gradient is rounded to the
logits dtype only when it is stored, so the target term is subtracted before any rounding.

With class weights w (HAS_WEIGHT, Liger's ``ce_weight``) and W = Σ_j w_j the cross-entropy part becomes

    loss = (1 - α) · w_y · (lse - c_y) + (α / V) · Σ_j w_j · (lse - c_j) + z_loss_scale · lse²

with gradient s · ((1 - α) · w_y · (p_j - [j = y]) + (α / V) · (W · p_j - w_j)) + s_z · 2 · z_loss_scale · lse · p_j,
where s and s_z scale the cross-entropy and z-loss parts (they differ for a weighted mean). TOKEN_SCALING multiplies
a row's loss, z-loss and gradient by p_y (a constant, not differentiated). RETURN_ARGMAX stores each row's argmax of
c (the first on ties; -1 for ignored rows). All switches are constexprs: off, they compile away.

Rows whose label is ``ignore_index`` get loss 0, z-loss 0 and a zero gradient; their logits are never loaded. A label
outside [0, V) gives a NaN loss and z-loss and a zero gradient; the target logit is loaded under an in-range mask, so
no label can make a kernel read out of bounds.
"""

import triton
import triton.language as tl

from liger_jax.kernels._rows import reversed_block


@triton.jit
def _tanh(u):
    """tanh in fp32 from exp (the interpreter has no libdevice): absolute error ~1e-7, which is what matters for
    softcapped logits. exp overflowing to inf gives exactly ±1."""
    return 1.0 - 2.0 / (tl.exp(2.0 * u) + 1.0)


@triton.jit
def _row_block(first_row, n_rows, labels_ptr, ignore_index: tl.constexpr, BLOCK_ROWS: tl.constexpr):
    """Rows of this program (int64: rows · V passes 2^31), their labels, and which rows exist / are not ignored."""
    rows = first_row + tl.arange(0, BLOCK_ROWS).to(tl.int64)
    row_exists = rows < n_rows
    labels = tl.load(labels_ptr + rows, mask=row_exists, other=ignore_index).to(tl.int64)
    return rows, labels, row_exists, row_exists & (labels != ignore_index)


@triton.jit
def _label_in_range(labels, n_cols):
    """Which rows' labels name a class: 0 ≤ label < n_cols."""
    return (labels >= 0) & (labels < n_cols)


@triton.jit
def _capped_tile(
    logits_ptr, rows, active, n_cols, block, softcap: tl.constexpr, BLOCK_ROWS: tl.constexpr, BLOCK_V: tl.constexpr
):
    """Offsets, columns, column mask and fp32 softcapped logits of one [BLOCK_ROWS, BLOCK_V] tile.

    Only active rows are loaded (inactive ones read as 0, which keeps their statistics finite); columns past
    n_cols hold -inf so they drop out of every max and exp.
    """
    cols = block * BLOCK_V + tl.arange(0, BLOCK_V)
    col_mask = cols[None, :] < n_cols
    offsets = rows[:, None] * n_cols + cols[None, :]
    z = tl.load(logits_ptr + offsets, mask=active[:, None] & col_mask, other=0.0).to(tl.float32)
    if softcap > 0:
        z = softcap * _tanh(z / softcap)
    return offsets, cols, col_mask, tl.where(col_mask, z, float("-inf"))


@triton.jit
def _statistics(
    logits_ptr,
    class_weight_ptr,
    rows,
    labels,
    active,
    n_cols,
    label_smoothing: tl.constexpr,
    softcap: tl.constexpr,
    HAS_WEIGHT: tl.constexpr,
    RETURN_ARGMAX: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_V: tl.constexpr,
    NUM_V_BLOCKS: tl.constexpr,
):
    """One pass over the rows: per row (lse, c_label, Σ_j w_j c_j, Σ_j w_j, argmax), fp32, after softcap (w = 1
    without HAS_WEIGHT; the sums only with smoothing, the argmax only with RETURN_ARGMAX)."""
    running_max = tl.full((BLOCK_ROWS,), float("-inf"), tl.float32)
    running_sum = tl.zeros((BLOCK_ROWS,), tl.float32)
    total = tl.zeros((BLOCK_ROWS,), tl.float32)
    weight_total = tl.zeros((BLOCK_ROWS,), tl.float32)
    argmax = tl.zeros((BLOCK_ROWS,), tl.int32)
    for block in range(NUM_V_BLOCKS):
        _, cols, col_mask, c = _capped_tile(logits_ptr, rows, active, n_cols, block, softcap, BLOCK_ROWS, BLOCK_V)
        block_max = tl.max(c, axis=1)
        if RETURN_ARGMAX:  # first column of the block's max; a later block must be strictly larger to win
            first = tl.min(tl.where(c == block_max[:, None], cols[None, :], n_cols), axis=1)
            argmax = tl.where(block_max > running_max, first, argmax)
        new_max = tl.maximum(running_max, block_max)
        # Shift by 0 while a row has only seen -inf (its first block, or logits masked to -inf), not by -inf:
        # exp(-inf - shift) is then 0 rather than NaN.
        shift = tl.where(new_max == float("-inf"), 0.0, new_max)
        running_sum = running_sum * tl.exp(running_max - shift) + tl.sum(tl.exp(c - shift[:, None]), axis=1)
        running_max = new_max
        if label_smoothing > 0:
            if HAS_WEIGHT:
                w = _class_weights(class_weight_ptr, cols, n_cols)
                total += tl.sum(tl.where(col_mask, c, 0.0) * w[None, :], axis=1)
                weight_total += tl.sum(w)
            else:
                total += tl.sum(tl.where(col_mask, c, 0.0), axis=1)
    target = _target_logit(logits_ptr, rows, labels, active, n_cols, softcap)
    return running_max + tl.log(running_sum), target, total, weight_total, argmax


@triton.jit
def _class_weights(class_weight_ptr, cols, n_cols):
    """The fp32 class weights [BLOCK_V] of ``cols``, 0 past the row's end."""
    return tl.load(class_weight_ptr + cols, mask=cols < n_cols, other=0.0).to(tl.float32)


@triton.jit
def _target_logit(logits_ptr, rows, labels, active, n_cols, softcap: tl.constexpr):
    """Each row's softcapped fp32 logit of its label; rows with a label outside [0, n_cols) read nothing."""
    in_range = _label_in_range(labels, n_cols)
    target = tl.load(logits_ptr + rows * n_cols + tl.where(in_range, labels, 0), mask=active & in_range, other=0.0)
    target = target.to(tl.float32)
    if softcap > 0:
        target = softcap * _tanh(target / softcap)
    return target


@triton.jit
def _label_weight(class_weight_ptr, labels, active, n_cols, HAS_WEIGHT: tl.constexpr):
    """w_label per row (1.0 without HAS_WEIGHT); rows inactive or out of range read nothing."""
    weight = tl.zeros(active.shape, tl.float32) + 1.0
    if HAS_WEIGHT:
        in_range = _label_in_range(labels, n_cols)
        index = tl.where(in_range, labels, 0)
        weight = tl.load(class_weight_ptr + index, mask=active & in_range, other=0.0).to(tl.float32)
    return weight


@triton.jit
def _row_losses(
    lse,
    target,
    total,
    weight_total,
    label_weight,
    labels,
    active,
    n_cols,
    label_smoothing: tl.constexpr,
    z_loss_scale: tl.constexpr,
    HAS_WEIGHT: tl.constexpr,
    TOKEN_SCALING: tl.constexpr,
):
    """Per row (loss, z_loss): 0 for ignored rows, NaN for a label outside [0, n_cols)."""
    z_loss = z_loss_scale * lse * lse
    if HAS_WEIGHT:
        loss = (1.0 - label_smoothing) * label_weight * (lse - target) + z_loss
        if label_smoothing > 0:
            loss += (label_smoothing / n_cols) * (weight_total * lse - total)
    else:
        loss = lse - (1.0 - label_smoothing) * target + z_loss
        if label_smoothing > 0:  # skipped without smoothing: 0 · Σc would be NaN for logits masked to -inf
            loss -= (label_smoothing / n_cols) * total
    if TOKEN_SCALING:
        p_target = tl.exp(target - lse)
        loss *= p_target
        z_loss *= p_target
    in_range = _label_in_range(labels, n_cols)
    loss = tl.where(in_range, loss, float("nan"))
    z_loss = tl.where(in_range, z_loss, float("nan"))
    return tl.where(active, loss, 0.0), tl.where(active, z_loss, 0.0)


@triton.jit
def _store_row_losses(
    logits_ptr,
    labels_ptr,
    class_weight_ptr,
    n_rows,
    loss_ptr,
    z_loss_ptr,
    lse_ptr,
    argmax_ptr,
    n_cols: tl.constexpr,
    ignore_index: tl.constexpr,
    label_smoothing: tl.constexpr,
    z_loss_scale: tl.constexpr,
    softcap: tl.constexpr,
    HAS_WEIGHT: tl.constexpr,
    TOKEN_SCALING: tl.constexpr,
    RETURN_ARGMAX: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_V: tl.constexpr,
    NUM_V_BLOCKS: tl.constexpr,
):
    """This program's rows: one pass for their statistics, loss, z-loss, lse (and argmax) stored; returns (rows,
    labels, row_exists, active, lse, target) for a gradient pass."""
    first_row = tl.program_id(0).to(tl.int64) * BLOCK_ROWS
    rows, labels, row_exists, active = _row_block(first_row, n_rows, labels_ptr, ignore_index, BLOCK_ROWS)
    lse, target, total, weight_total, argmax = _statistics(
        logits_ptr,
        class_weight_ptr,
        rows,
        labels,
        active,
        n_cols,
        label_smoothing,
        softcap,
        HAS_WEIGHT,
        RETURN_ARGMAX,
        BLOCK_ROWS,
        BLOCK_V,
        NUM_V_BLOCKS,
    )
    label_weight = _label_weight(class_weight_ptr, labels, active, n_cols, HAS_WEIGHT)
    loss, z_loss = _row_losses(
        lse,
        target,
        total,
        weight_total,
        label_weight,
        labels,
        active,
        n_cols,
        label_smoothing,
        z_loss_scale,
        HAS_WEIGHT,
        TOKEN_SCALING,
    )
    tl.store(loss_ptr + rows, loss, mask=row_exists)
    tl.store(z_loss_ptr + rows, z_loss, mask=row_exists)
    tl.store(lse_ptr + rows, lse, mask=row_exists)
    if RETURN_ARGMAX:
        tl.store(argmax_ptr + rows, tl.where(active, argmax, -1), mask=row_exists)
    return rows, labels, row_exists, active, lse, target


@triton.jit
def _store_grads(
    logits_ptr,
    class_weight_ptr,
    dlogits_ptr,
    grad_scale_ptr,
    z_grad_scale_ptr,
    rows,
    labels,
    row_exists,
    active,
    lse,
    target,
    n_cols: tl.constexpr,
    label_smoothing: tl.constexpr,
    z_loss_scale: tl.constexpr,
    softcap: tl.constexpr,
    HAS_WEIGHT: tl.constexpr,
    TOKEN_SCALING: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_V: tl.constexpr,
    NUM_V_BLOCKS: tl.constexpr,
    AFTER_STATISTICS: tl.constexpr,
):
    """grad_scale · dloss/dlogits of this program's rows, from their lse (and target logit, for TOKEN_SCALING): one
    read of the logits, one write. With HAS_WEIGHT the z-loss part is scaled by z_grad_scale instead.

    AFTER_STATISTICS (the program just read the rows for their lse): walk back from the last block, the likeliest
    still in L2 (H200, FLCE's 8192 × 128256 bf16 chunks: 1.96 → 1.79 ms). Alone (the backward from a saved lse)
    the forward walk is faster (the same logits: 1.09 ms, 1.23 walked back).

    Each gradient element is stored after its logit was read, so the gradient may overwrite the logits in place.
    Ignored rows get a zero gradient; so does a label outside [0, n_cols), whose loss is NaN.
    """
    in_range = _label_in_range(labels, n_cols)
    scale = tl.load(grad_scale_ptr + rows, mask=row_exists, other=0.0)
    scale = tl.where(active & in_range, scale, 0.0)
    if HAS_WEIGHT:
        z_scale = tl.load(z_grad_scale_ptr + rows, mask=row_exists, other=0.0)
        z_scale = tl.where(active & in_range, z_scale, 0.0)
        label_weight = _label_weight(class_weight_ptr, labels, active, n_cols, HAS_WEIGHT)
        weight_total = tl.zeros((BLOCK_ROWS,), tl.float32)
        if label_smoothing > 0:
            for block in range(NUM_V_BLOCKS):
                cols = block * BLOCK_V + tl.arange(0, BLOCK_V)
                weight_total += tl.sum(_class_weights(class_weight_ptr, cols, n_cols))
    if TOKEN_SCALING:
        p_target = tl.exp(target - lse)
        scale *= p_target
        if HAS_WEIGHT:
            z_scale *= p_target
    softmax_scale = 1.0 + 2.0 * z_loss_scale * lse
    for step in range(NUM_V_BLOCKS):
        block = step
        if AFTER_STATISTICS:
            block = reversed_block(step, n_cols, BLOCK_V) // BLOCK_V
        offsets, cols, col_mask, c = _capped_tile(logits_ptr, rows, active, n_cols, block, softcap, BLOCK_ROWS, BLOCK_V)
        p = tl.exp(c - lse[:, None])
        is_target = cols[None, :] == labels[:, None]
        if HAS_WEIGHT:
            # The target's -1 joins p_y in fp32 before any rounding, as below.
            grad = (1.0 - label_smoothing) * label_weight[:, None] * (p - tl.where(is_target, 1.0, 0.0))
            if label_smoothing > 0:
                w = _class_weights(class_weight_ptr, cols, n_cols)
                grad += (label_smoothing / n_cols) * (weight_total[:, None] * p - w[None, :])
            grad = grad * scale[:, None] + (2.0 * z_loss_scale * lse * z_scale)[:, None] * p
        else:
            grad = p * softmax_scale[:, None] - label_smoothing / n_cols
            # The target's -(1 - α) joins p_y in fp32: rounding p_y first loses it entirely in bf16 (Liger #1329).
            grad -= tl.where(is_target, 1.0 - label_smoothing, 0.0)
        if softcap > 0:
            tanh = tl.where(col_mask, c / softcap, 0.0)
            grad *= 1.0 - tanh * tanh
        if not HAS_WEIGHT:
            grad = grad * scale[:, None]
        tl.store(dlogits_ptr + offsets, grad.to(dlogits_ptr.dtype.element_ty), mask=row_exists[:, None] & col_mask)


@triton.jit
def cross_entropy_loss(
    logits_ptr,  # [n_rows, n_cols] logits.dtype
    labels_ptr,  # [n_rows] int32 or int64
    class_weight_ptr,  # [n_cols] fp32 class weights (read only with HAS_WEIGHT)
    n_rows,
    loss_ptr,  # [n_rows] fp32
    z_loss_ptr,  # [n_rows] fp32
    lse_ptr,  # [n_rows] fp32: log Σ_j exp(c_j), for cross_entropy_grad
    argmax_ptr,  # [n_rows] int32 (written only with RETURN_ARGMAX)
    n_cols: tl.constexpr,  # V; a constexpr so rows start provably 16-byte aligned (kernels._rows)
    ignore_index: tl.constexpr,
    label_smoothing: tl.constexpr,
    z_loss_scale: tl.constexpr,
    softcap: tl.constexpr,  # 0.0 means no softcap
    HAS_WEIGHT: tl.constexpr,
    TOKEN_SCALING: tl.constexpr,
    RETURN_ARGMAX: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_V: tl.constexpr,
    NUM_V_BLOCKS: tl.constexpr,
):
    """Per-row loss, z-loss, lse (and argmax): one read of the logits."""
    _store_row_losses(
        logits_ptr,
        labels_ptr,
        class_weight_ptr,
        n_rows,
        loss_ptr,
        z_loss_ptr,
        lse_ptr,
        argmax_ptr,
        n_cols,
        ignore_index,
        label_smoothing,
        z_loss_scale,
        softcap,
        HAS_WEIGHT,
        TOKEN_SCALING,
        RETURN_ARGMAX,
        BLOCK_ROWS,
        BLOCK_V,
        NUM_V_BLOCKS,
    )


@triton.jit
def cross_entropy_loss_and_grad(
    logits_ptr,  # [n_rows, n_cols] logits.dtype; may alias dlogits_ptr
    labels_ptr,  # [n_rows] int32 or int64
    class_weight_ptr,  # [n_cols] fp32 class weights (read only with HAS_WEIGHT)
    grad_scale_ptr,  # [n_rows] fp32: multiplies each row's gradient (1/n for "mean", a cotangent, ...)
    z_grad_scale_ptr,  # [n_rows] fp32: the same for the z-loss part (read only with HAS_WEIGHT)
    n_rows,
    dlogits_ptr,  # [n_rows, n_cols] logits.dtype
    loss_ptr,  # [n_rows] fp32
    z_loss_ptr,  # [n_rows] fp32
    lse_ptr,  # [n_rows] fp32
    argmax_ptr,  # [n_rows] int32 (written only with RETURN_ARGMAX)
    n_cols: tl.constexpr,  # V; a constexpr so rows start provably 16-byte aligned (kernels._rows)
    ignore_index: tl.constexpr,
    label_smoothing: tl.constexpr,
    z_loss_scale: tl.constexpr,
    softcap: tl.constexpr,  # 0.0 means no softcap
    HAS_WEIGHT: tl.constexpr,
    TOKEN_SCALING: tl.constexpr,
    RETURN_ARGMAX: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_V: tl.constexpr,
    NUM_V_BLOCKS: tl.constexpr,
):
    """Per-row loss, z-loss, lse (argmax) and grad_scale · dloss/dlogits: two reads of the logits, one write of the
    gradient (which may overwrite the logits)."""
    rows, labels, row_exists, active, lse, target = _store_row_losses(
        logits_ptr,
        labels_ptr,
        class_weight_ptr,
        n_rows,
        loss_ptr,
        z_loss_ptr,
        lse_ptr,
        argmax_ptr,
        n_cols,
        ignore_index,
        label_smoothing,
        z_loss_scale,
        softcap,
        HAS_WEIGHT,
        TOKEN_SCALING,
        RETURN_ARGMAX,
        BLOCK_ROWS,
        BLOCK_V,
        NUM_V_BLOCKS,
    )
    _store_grads(
        logits_ptr,
        class_weight_ptr,
        dlogits_ptr,
        grad_scale_ptr,
        z_grad_scale_ptr,
        rows,
        labels,
        row_exists,
        active,
        lse,
        target,
        n_cols,
        label_smoothing,
        z_loss_scale,
        softcap,
        HAS_WEIGHT,
        TOKEN_SCALING,
        BLOCK_ROWS,
        BLOCK_V,
        NUM_V_BLOCKS,
        True,
    )


@triton.jit
def cross_entropy_grad(
    logits_ptr,  # [n_rows, n_cols] logits.dtype; may alias dlogits_ptr
    labels_ptr,  # [n_rows] int32 or int64
    class_weight_ptr,  # [n_cols] fp32 class weights (read only with HAS_WEIGHT)
    lse_ptr,  # [n_rows] fp32, from cross_entropy_loss
    grad_scale_ptr,  # [n_rows] fp32: multiplies each row's gradient (the cotangent times 1/n for "mean", ...)
    z_grad_scale_ptr,  # [n_rows] fp32: the same for the z-loss part (read only with HAS_WEIGHT)
    n_rows,
    dlogits_ptr,  # [n_rows, n_cols] logits.dtype
    n_cols: tl.constexpr,  # V; a constexpr so rows start provably 16-byte aligned (kernels._rows)
    ignore_index: tl.constexpr,
    label_smoothing: tl.constexpr,
    z_loss_scale: tl.constexpr,
    softcap: tl.constexpr,  # 0.0 means no softcap
    HAS_WEIGHT: tl.constexpr,
    TOKEN_SCALING: tl.constexpr,
    RETURN_ARGMAX: tl.constexpr,  # unused here; shared with the forward kernels' constexprs
    BLOCK_ROWS: tl.constexpr,
    BLOCK_V: tl.constexpr,
    NUM_V_BLOCKS: tl.constexpr,
):
    """grad_scale · dloss/dlogits from the forward's lse (the backward pass): one read of the logits, one write of
    the gradient (which may overwrite the logits)."""
    first_row = tl.program_id(0).to(tl.int64) * BLOCK_ROWS
    rows, labels, row_exists, active = _row_block(first_row, n_rows, labels_ptr, ignore_index, BLOCK_ROWS)
    lse = tl.load(lse_ptr + rows, mask=row_exists, other=0.0)
    target = lse
    if TOKEN_SCALING:
        target = _target_logit(logits_ptr, rows, labels, active, n_cols, softcap)
    _store_grads(
        logits_ptr,
        class_weight_ptr,
        dlogits_ptr,
        grad_scale_ptr,
        z_grad_scale_ptr,
        rows,
        labels,
        row_exists,
        active,
        lse,
        target,
        n_cols,
        label_smoothing,
        z_loss_scale,
        softcap,
        HAS_WEIGHT,
        TOKEN_SCALING,
        BLOCK_ROWS,
        BLOCK_V,
        NUM_V_BLOCKS,
        False,
    )
