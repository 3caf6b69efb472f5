"""Fused linear JSD: the generalised Jensen-Shannon divergence between a student's and a teacher's LM heads without
their logits (Liger's ``LigerFusedLinearJSD``)."""

import jax
import jax.numpy as jnp

from liger_jax import runtime
from liger_jax.ops._linear_chunks import WeightLayout
from liger_jax.ops.fused_linear_distillation import distillation_loss, fused_linear_distillation_reference


def fused_linear_jsd(
    student_x: jax.Array,
    student_weight: jax.Array,
    teacher_x: jax.Array,
    teacher_weight: jax.Array,
    labels: jax.Array | None = None,
    *,
    beta: float = 0.5,
    ignore_index: int = -100,
    temperature: float = 1.0,
    student_bias: jax.Array | None = None,
    teacher_bias: jax.Array | None = None,
    weight_layout: WeightLayout = "hv",
    accum_dtype=jnp.float32,
    chunk_size: int | None = None,
    implementation: runtime.Implementation | None = None,
) -> jax.Array:
    r"""``jsd(log_softmax(x_s W_s / T), log_softmax(x_t W_t / T), labels)`` without either model's logits.

    The sum over rows of Liger's generalised JSD (:func:`liger_jax.jsd`: ``beta=0`` the forward KL(teacher ‖
    student), ``beta=1`` the reverse KL) of the temperature-scaled distributions, divided by the number of rows
    whose label is not ``ignore_index`` (every row without ``labels``; at least 1, so an all-ignored batch gives 0).
    It is :func:`liger_jax.fused_linear_distillation` with ``divergence="jsd"``, no hard loss and a soft weight of
    1, and is chunked the same way; the teacher gets no gradient.

    Memory and numerics: as :func:`liger_jax.fused_linear_distillation` (fp32 loss and logits gradient,
    accumulators in ``accum_dtype``).

    Args:
        student_x: ``[..., H_s]`` float32, bfloat16 or float16 (float64 too under ``"xla"``).
        student_weight: ``[H_s, V]`` (``weight_layout="hv"``) or ``[V, H_s]`` (``"vh"``; Liger's layout).
        teacher_x: ``[..., H_t]`` with the student's leading axes.
        teacher_weight: ``[H_t, V]`` or ``[V, H_t]``, in the same layout.
        labels: ``[...]`` integers or None; rows labelled ``ignore_index`` do not count.
        beta: ``β`` in ``[0, 1]``.
        ignore_index: the label of rows to skip.
        temperature: finite > 0, divides both models' logits.
        student_bias, teacher_bias: optional ``[V]`` (beyond Liger's signature, for heads with a bias).
        weight_layout: ``"hv"`` or ``"vh"``.
        accum_dtype: dtype of the student's ``dweight``/``dbias`` accumulators (fp32 by default; the weight's own
            dtype for the least memory, as :func:`liger_jax.fused_linear_distillation`).
        chunk_size: rows per chunk, or None for the default.
        implementation: ``"triton"``, ``"interpret"``, ``"xla"`` or None for the default.

    Returns:
        The fp32 scalar loss (float64 for float64 inputs under ``"xla"``).

    Raises:
        TypeError, ValueError: as :func:`liger_jax.fused_linear_distillation`.

    Example:
        >>> loss = liger_jax.fused_linear_jsd(h_student, lm_head_s, h_teacher, lm_head_t, labels, beta=0.1)
    """
    return distillation_loss(
        student_x,
        student_weight,
        teacher_x,
        teacher_weight,
        labels,
        student_bias,
        teacher_bias,
        op="fused_linear_jsd",
        divergence="jsd",
        weights=(1.0, None),
        beta=beta,
        temperature=temperature,
        ignore_index=ignore_index,
        return_soft_hard_loss=False,
        weight_layout=weight_layout,
        accum_dtype=accum_dtype,
        chunk_size=chunk_size,
        implementation=implementation,
    )


def fused_linear_jsd_reference(
    student_x,
    student_weight,
    teacher_x,
    teacher_weight,
    labels=None,
    *,
    beta=0.5,
    ignore_index=-100,
    temperature=1.0,
    student_bias=None,
    teacher_bias=None,
    weight_layout="hv",
    logits_dtype=None,
):
    """:func:`fused_linear_jsd` from its definition, materialising both models' logits (the test oracle); see
    :func:`liger_jax.fused_linear_distillation_reference`."""
    return fused_linear_distillation_reference(
        student_x,
        student_weight,
        teacher_x,
        teacher_weight,
        labels,
        divergence="jsd",
        weight_hard_loss=0.0,
        weight_soft_loss=1.0,
        beta=beta,
        temperature=temperature,
        ignore_index=ignore_index,
        student_bias=student_bias,
        teacher_bias=teacher_bias,
        weight_layout=weight_layout,
        logits_dtype=logits_dtype,
    )
