"""Fused linear distillation: a student's and a teacher's LM heads and the loss between them, chunked over rows so
neither model's ``N × V`` logits exist (Liger's ``LigerFusedLinearDistillationBase`` and its JSD, KL, TVD and
cosine losses)."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from liger_jax import runtime
from liger_jax.ops import _checks, _dispatch, _linear_chunks
from liger_jax.ops._cross_entropy_checks import check_labels
from liger_jax.ops._cross_entropy_rows import count_targets
from liger_jax.ops._distillation_rows import DIVERGENCES, DistillationRows
from liger_jax.ops._linear_chunks import ChunkPlan, WeightLayout, check_linear_operands, logits_reference
from liger_jax.ops.fused_linear_logprobs import check_temperature


def fused_linear_distillation(
    student_x: jax.Array,
    student_weight: jax.Array,
    teacher_x: jax.Array,
    teacher_weight: jax.Array,
    labels: jax.Array,
    *,
    divergence: str = "jsd",
    weight_hard_loss: float = 0.5,
    weight_soft_loss: float = 0.5,
    beta: float = 0.5,
    temperature: float = 1.0,
    ignore_index: int = -100,
    student_bias: jax.Array | None = None,
    teacher_bias: jax.Array | None = None,
    return_soft_hard_loss: bool = False,
    weight_layout: WeightLayout = "hv",
    accum_dtype=jnp.float32,
    chunk_size: int | None = None,
    implementation: runtime.Implementation | None = None,
) -> jax.Array | tuple[jax.Array, jax.Array, jax.Array]:
    r"""Knowledge distillation through both LM heads without their logits (Liger's chunked distillation losses).

    With the student's logits :math:`s = x_s W_s + b_s`, the teacher's :math:`t = x_t W_t + b_t`, the rows
    :math:`R` whose label is not ``ignore_index`` and :math:`n = \max(|R|, 1)`:

    .. math::
        \mathrm{hard} = \frac{1}{n} \sum_{r \in R} \mathrm{CE}(s_r, y_r), \qquad
        \mathrm{soft} = \frac{1}{n} \sum_{r \in R} D(s_r / T, t_r / T),

        \mathrm{loss} = w_\mathrm{hard} \cdot \mathrm{hard} + w_\mathrm{soft} \cdot \mathrm{soft}

    where the cross-entropy takes the raw logits and the divergence :math:`D` the temperature-scaled ones:

    * ``"jsd"``: Liger's generalised JSD of the student's and teacher's log-softmaxes at ``beta`` (``beta=0`` the
      forward KL(teacher ‖ student), ``beta=1`` the reverse KL; see :func:`liger_jax.jsd`).
    * ``"kl"``: the forward KL(teacher ‖ student) :math:`\sum_j p_{t,j} (\log p_{t,j} - \log p_{s,j})`.
    * ``"tvd"``: :math:`\tfrac12 \sum_j |p_{s,j} - p_{t,j}|` (see :func:`liger_jax.tvd`).
    * ``"cosine"``: ``beta · (1 - cos(s / T, t / T))`` (Liger's cosine-similarity loss; ``beta`` is its weight).

    No :math:`T^2` factor, as in Liger. Only the student gets gradients; the teacher is frozen. The rows are walked
    in chunks (the chunk rule of :func:`liger_jax.fused_linear_cross_entropy`, sized for the several ``[chunk, V]``
    buffers a chunk holds here): each chunk's two logits are computed, their loss and its gradient in the student's
    logits taken at once, and the gradient turned into ``dx`` and ``dweight``/``dbias`` right away, so the backward
    pass only scales them by the cotangent. An all-ignored batch gives 0 and zero gradients.

    Memory: besides its inputs and outputs, a step holds one chunk's ``[chunk, V]`` buffers, ``dx`` and the
    ``dweight`` accumulator (``H × V`` in ``accum_dtype``). With a kernel implementation and the JSD, KL or TVD loss
    the chunk's buffers are both models' logits in their dtype (one kernel reads them and writes the gradient over
    the student's: 4 bytes per logit for bf16 heads); the ``"xla"`` implementation, the cosine loss and a sharded
    vocabulary add fp32 buffers (the two models' log-probabilities, then the gradient: 16 bytes per logit for bf16
    heads, 20 for fp32 ones). By default a chunk's buffers take at most the bound of
    :func:`liger_jax.fused_linear_cross_entropy` (the larger of x's and the accumulator's bytes, at least 64 MiB).
    With ``accum_dtype`` the weight's own dtype the accumulator can be the gradient's buffer itself, and a
    ``chunk_size`` then bounds the temporaries to about ``chunk_size · V`` times those bytes.

    Numerics: logits in ``result_type`` of each model's x and weight; the losses and the gradient of the logits in
    fp32 (rounded once to the logits' dtype; on the GPU the JSD's log of m is the hardware's approximate log2,
    ~1e-7 absolute beyond the fp32 rounding); ``dweight``/``dbias`` summed over the chunks in ``accum_dtype`` (fp32
    by default; bf16 accumulation drifts, Liger #512) and rounded to their parameter's dtype.

    Args:
        student_x: ``[..., H_s]`` float32, bfloat16 or float16 (float64 too under ``"xla"``).
        student_weight: ``[H_s, V]`` (``weight_layout="hv"``) or ``[V, H_s]`` (``"vh"``).
        teacher_x: ``[..., H_t]`` with the student's leading axes.
        teacher_weight: ``[H_t, V]`` or ``[V, H_t]``, the student's vocabulary, in the same layout.
        labels: ``[...]`` integers in ``[0, V)`` or ``ignore_index``.
        divergence: ``"jsd"``, ``"kl"``, ``"tvd"`` or ``"cosine"``.
        weight_hard_loss, weight_soft_loss: the weights of the two losses.
        beta: the JSD's β in ``[0, 1]``, or the cosine loss's weight; unused by ``"kl"`` and ``"tvd"``.
        temperature: finite > 0, divides both models' logits in the soft loss.
        ignore_index: the label of rows that count in neither loss.
        student_bias, teacher_bias: optional ``[V]``.
        return_soft_hard_loss: also return the soft and hard losses (for logging: no gradient flows through them).
        weight_layout: ``"hv"`` or ``"vh"``, for both heads.
        accum_dtype: dtype of the student's ``dweight``/``dbias`` accumulators. With the weight's own dtype the
            accumulator can be the gradient buffer itself (least memory: no ``H × V`` fp32 temporary).
        chunk_size: rows per chunk (overrides the bound above), or None for the default above.
        implementation: ``"triton"``, ``"interpret"``, ``"xla"`` or None for the default (see
            :mod:`liger_jax.runtime`).

    Returns:
        The fp32 scalar loss (float64 for float64 inputs under ``"xla"``); with ``return_soft_hard_loss`` the tuple
        ``(loss, soft_loss, hard_loss)``.

    Raises:
        TypeError: an operand or accum_dtype is not floating point, labels are not integers, or ignore_index is not
            an int.
        ValueError: shapes do not fit together (the heads' vocabularies must be equal), an unknown divergence or
            weight_layout, beta outside [0, 1], temperature not a finite number > 0, a loss weight not finite,
            chunk_size not a positive int, or a concrete label out of range.

    Example:
        >>> loss = liger_jax.fused_linear_distillation(h_student, w_student, h_teacher, w_teacher, labels,
        ...                                            divergence="kl", temperature=2.0)
    """
    _checks.check_choice("divergence", divergence, DIVERGENCES)
    for name, weight in (("weight_hard_loss", weight_hard_loss), ("weight_soft_loss", weight_soft_loss)):
        if not math.isfinite(weight):
            raise ValueError(f"{name} must be a finite number, got {weight!r}")
    hard_loss = weight_hard_loss != 0 or return_soft_hard_loss  # as Liger: no cross-entropy when it is discarded
    return distillation_loss(
        student_x,
        student_weight,
        teacher_x,
        teacher_weight,
        labels,
        student_bias,
        teacher_bias,
        op="fused_linear_distillation",
        divergence=divergence,
        weights=(float(weight_soft_loss), float(weight_hard_loss) if hard_loss else None),
        beta=beta,
        temperature=temperature,
        ignore_index=ignore_index,
        return_soft_hard_loss=return_soft_hard_loss,
        weight_layout=weight_layout,
        accum_dtype=accum_dtype,
        chunk_size=chunk_size,
        implementation=implementation,
    )


def fused_linear_distillation_reference(
    student_x,
    student_weight,
    teacher_x,
    teacher_weight,
    labels,
    *,
    divergence="jsd",
    weight_hard_loss=0.5,
    weight_soft_loss=0.5,
    beta=0.5,
    temperature=1.0,
    ignore_index=-100,
    student_bias=None,
    teacher_bias=None,
    return_soft_hard_loss=False,
    weight_layout="hv",
    logits_dtype=None,
):
    """The specification (and test oracle) of :func:`fused_linear_distillation`: materialises both models' logits
    (rounded to ``logits_dtype`` where the chunks round them, when given) and takes the losses from their
    definitions in ``promote(dtype, float32)``; the teacher under ``stop_gradient``. Labels may be None (every row
    counts, no hard loss: :func:`liger_jax.fused_linear_jsd`'s form)."""
    student = logits_reference(student_x, student_weight, student_bias, weight_layout, logits_dtype)
    teacher = logits_reference(teacher_x, teacher_weight, teacher_bias, weight_layout, logits_dtype)
    teacher = jax.lax.stop_gradient(teacher)
    compute = jnp.promote_types(student.dtype, jnp.float32)
    student, teacher = student.astype(compute), teacher.astype(compute)
    counted = jnp.ones(student.shape[:-1], bool) if labels is None else labels != ignore_index
    n = jnp.maximum(jnp.sum(counted), 1).astype(compute)
    scaled_student, scaled_teacher = student / temperature, teacher / temperature
    log_q = jax.nn.log_softmax(scaled_student, axis=-1)  # the student's
    log_p = jax.nn.log_softmax(scaled_teacher, axis=-1)  # the teacher's
    q, p = jnp.exp(log_q), jnp.exp(log_p)

    def kl(weights, log_weights, log_other):  # Σ_j w_j (log w_j - log o_j), with 0 · log 0 = 0
        return jnp.sum(jnp.where(weights > 0, weights * (log_weights - log_other), 0.0), axis=-1)

    match divergence:
        case "jsd" if beta == 0.0:
            rows = kl(p, log_p, log_q)
        case "jsd" if beta == 1.0:
            rows = kl(q, log_q, log_p)
        case "jsd":
            log_m = jnp.log(beta * p + (1.0 - beta) * q)
            rows = beta * kl(p, log_p, log_m) + (1.0 - beta) * kl(q, log_q, log_m)
        case "kl":
            rows = kl(p, log_p, log_q)
        case "tvd":
            rows = 0.5 * jnp.sum(jnp.abs(q - p), axis=-1)
        case _:
            norms = jnp.linalg.norm(scaled_student, axis=-1) * jnp.linalg.norm(scaled_teacher, axis=-1)
            rows = beta * (1.0 - jnp.sum(scaled_student * scaled_teacher, axis=-1) / norms)
    soft = jnp.sum(jnp.where(counted, rows, 0.0)) / n
    hard = jnp.zeros((), compute)
    if labels is not None:
        log_softmax = jax.nn.log_softmax(student, axis=-1)
        picked = jnp.take_along_axis(log_softmax, jnp.where(counted, labels, 0)[..., None], axis=-1)[..., 0]
        hard = -jnp.sum(jnp.where(counted, picked, 0.0)) / n
    loss = weight_hard_loss * hard + weight_soft_loss * soft
    return (loss, soft, hard) if return_soft_hard_loss else loss


def distillation_loss(
    student_x,
    student_weight,
    teacher_x,
    teacher_weight,
    labels,
    student_bias,
    teacher_bias,
    *,
    op: str,
    divergence: str,
    weights: tuple[float, float | None],
    beta: float,
    temperature: float,
    ignore_index: int,
    return_soft_hard_loss: bool,
    weight_layout: str,
    accum_dtype,
    chunk_size: int | None,
    implementation,
):
    """Checks, then the chunked loss: what :func:`fused_linear_distillation` and :func:`liger_jax.fused_linear_jsd`
    share. ``weights`` is ``(soft weight, hard weight or None for no cross-entropy)``; ``labels`` may be None
    (every row counts, no cross-entropy); ``op`` names the caller for the size rule."""
    rows_shape = jax.ShapeDtypeStruct(student_x.shape[:-1], jnp.int32)
    implementation = _dispatch.resolve(
        implementation, op, _dispatch.logits_elements(rows_shape, student_weight, weight_layout)
    )
    n_classes = check_linear_operands(
        student_x,
        student_weight,
        student_bias,
        weight_layout,
        implementation,
        ("student_x", "student_weight", "student_bias"),
    )
    teacher_classes = check_linear_operands(
        teacher_x,
        teacher_weight,
        teacher_bias,
        weight_layout,
        implementation,
        ("teacher_x", "teacher_weight", "teacher_bias"),
    )
    if teacher_classes != n_classes:
        raise ValueError(
            f"teacher_weight must have the student's vocabulary of {n_classes} classes, got {teacher_classes}"
        )
    _checks.check_shape("teacher_x", teacher_x, student_x.shape[:-1] + teacher_x.shape[-1:], "the rows of student_x")
    _checks.check_int("ignore_index", ignore_index)
    if labels is not None:
        check_labels(labels, student_x.shape[:-1], "the leading axes of student_x", n_classes, ignore_index)
    if not 0.0 <= beta <= 1.0:
        raise ValueError(f"beta must be in [0, 1], got {beta!r}")
    check_temperature(temperature)
    _linear_chunks.check_accum_dtype(accum_dtype)
    _linear_chunks.check_chunk_size(chunk_size)
    soft_weight, hard_weight = weights
    rows = DistillationRows(
        divergence=divergence,
        beta=float(beta),
        temperature=float(temperature),
        ignore_index=int(ignore_index),
        has_labels=labels is not None,
        hard_loss=hard_weight is not None,
        implementation=implementation,
    )
    if labels is None:
        labels = jnp.zeros(student_x.shape[:-1], jnp.int32)  # read only as "not ignored"
    if labels.size == 0:
        zero = jnp.zeros((), jnp.promote_types(jnp.result_type(student_x, student_weight), jnp.float32))
        return (zero, zero, zero) if return_soft_hard_loss else zero
    logits_dtype = jnp.result_type(student_x.dtype, student_weight.dtype)
    plan = ChunkPlan.for_operands(
        student_x,
        student_weight,
        student_bias,
        weight_layout,
        chunk_size,
        accum_dtype,
        rows.logit_bytes(logits_dtype, vocab_sharded=False),
        rows.logit_bytes(logits_dtype, vocab_sharded=True),
    )
    teacher = jax.lax.stop_gradient((teacher_x, teacher_weight, teacher_bias))
    loss, soft, hard = _distillation(
        student_x, student_weight, student_bias, teacher, labels, plan, rows, (soft_weight, hard_weight or 0.0)
    )
    # soft and hard are for logging; the gradient flows through loss, which contains them.
    return (loss, jax.lax.stop_gradient(soft), jax.lax.stop_gradient(hard)) if return_soft_hard_loss else loss


def _counted(labels, rows: DistillationRows):
    """``n = max(non-ignored rows, 1)`` (every row without labels), float32."""
    if not rows.has_labels:
        return jnp.float32(labels.size)
    return jnp.maximum(count_targets(labels, rows.ignore_index), 1.0)


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6, 7))
def _distillation(x, weight, bias, teacher, labels, plan: ChunkPlan, rows: DistillationRows, weights):
    """``(loss, soft, hard)`` scalars; without differentiation only the losses."""
    soft, hard = _linear_chunks.run_chunks(x, weight, bias, (labels,), plan, rows, 2, False, teacher).values
    return _losses(soft, hard, labels, rows, weights)


def _losses(soft, hard, labels, rows, weights):
    n = _counted(labels, rows).astype(soft.dtype)
    soft, hard = jnp.sum(soft) / n, jnp.sum(hard) / n
    return weights[0] * soft + weights[1] * hard, soft, hard


def _distillation_fwd(x, weight, bias, teacher, labels, plan, rows, weights):
    n = _counted(labels, rows)
    soft_scale, hard_scale = (jnp.broadcast_to(w / n, labels.shape) for w in weights)
    results = _linear_chunks.run_chunks(x, weight, bias, (labels, soft_scale, hard_scale), plan, rows, 2, True, teacher)
    return _losses(*results.values, labels, rows, weights), (results.dx, results.dweight, results.dbias, labels)


def _distillation_bwd(plan, rows, weights, residuals, cotangents):
    del rows, weights
    loss_cotangent = cotangents[0]  # soft and hard leave through stop_gradient
    dx, dweight, dbias, labels = residuals
    dx = (dx * loss_cotangent).astype(plan.x_dtype)
    dweight, dbias = plan.parameter_grads(dweight * loss_cotangent, None if dbias is None else dbias * loss_cotangent)
    return dx, dweight, dbias, None, np.zeros(labels.shape, jax.dtypes.float0)


_distillation.defvjp(_distillation_fwd, _distillation_bwd)
