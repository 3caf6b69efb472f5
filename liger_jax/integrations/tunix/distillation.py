"""Tunix's logit distillation (``tunix.distillation.strategies.LogitStrategy``) on liger_jax's kernels: from the
two models' logits, or, when the forward functions return the models' final hidden states and LM heads
(:func:`head_forward_fn`), without either model's ``[B, S, V]`` logits.

Why the fused path needs other forward functions: Tunix's ``DistillationTrainer`` hands the strategy whatever the
user's ``student_forward_fn`` and ``teacher_forward_fn`` return (``teacher_output`` is computed before the training
step and passed into it, ``student_output`` inside it, under the gradient). Forward functions that return logits
have built them before the strategy runs, so a strategy alone can only speed up the math on them. Forward functions
that return the head's inputs (:class:`HeadInputs`) let the strategy compute the heads and the loss chunk by chunk
with :func:`liger_jax.fused_linear_jsd` and :func:`liger_jax.fused_linear_cross_entropy`; the models' own heads
still run inside the forward functions, unread, and XLA removes them under ``jit``.
"""

from __future__ import annotations

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from tunix.distillation.strategies import logit

from liger_jax import runtime
from liger_jax.integrations.tunix.loss import IGNORE_INDEX, _family, _final_hidden_states, lm_head_weight
from liger_jax.ops import _checks
from liger_jax.ops.cross_entropy import cross_entropy
from liger_jax.ops.fused_linear_cross_entropy import fused_linear_cross_entropy
from liger_jax.ops.fused_linear_distillation import fused_linear_distillation
from liger_jax.ops.fused_linear_jsd import fused_linear_jsd
from liger_jax.ops.jsd import jsd


@flax.struct.dataclass
class HeadInputs:
    """What a model's LM head receives, in place of its logits.

    Attributes:
        hidden: ``[B, S, D]`` the final hidden states (in the dtype the head computes in).
        weight: the head's ``[D, V]`` kernel (``weight_layout="hv"``) or tied ``[V, D]`` embedding table (``"vh"``).
        weight_layout: ``"hv"`` or ``"vh"`` (static).
    """

    hidden: jax.Array
    weight: jax.Array
    weight_layout: str = flax.struct.field(pytree_node=False)


def head_forward_fn(
    model: nnx.Module,
    input_tokens: jax.Array,
    input_mask: jax.Array,
    positions: jax.Array,
    attention_mask: jax.Array,
    images: jax.Array | None = None,
) -> HeadInputs:
    """A forward function for Tunix's distillation strategies that returns the head's inputs, not the logits.

    The counterpart of the forward function of Tunix's logit-distillation example (``logits, _ = model(tokens,
    positions, None, attention_mask)``, then ``logits[:, :-1]``: the last position predicts nothing): the same
    arguments, the same positions, and in place of their logits the final hidden states and the LM head, taken as
    :func:`liger_jax.integrations.tunix.peft_loss_fn` takes them (the model's own ``__call__``; Qwen's and Gemma4's
    cast of the head's operands to the model's dtype). Give it as ``student_forward_fn`` and ``teacher_forward_fn``
    of :class:`LogitStrategy`.

    Args:
        model: a Tunix ``Llama3``, ``Qwen2``, ``Qwen3`` or ``Gemma3`` (or a subclass, such as qwix's LoRA wrapper;
            no LoRA on the head), or a Gemma or Gemma4 without a final logit softcap.
        input_tokens: ``[B, S]`` integer tokens.
        input_mask: ``[B, S]`` (unused: the labels carry the mask).
        positions: ``[B, S]`` integer positions.
        attention_mask: ``[B, S, S]`` bool.
        images: optional images for Gemma3's vision encoder.

    Returns:
        :class:`HeadInputs` of the first ``S - 1`` positions.

    Raises:
        TypeError: ``model`` is not a supported Tunix family.
        ValueError: the model caps its final logits (the fused divergence has no softcap), or its head has LoRA
            parameters.
    """
    del input_mask
    family = _family(model)
    if family.softcap(model) is not None:
        raise ValueError(f"{type(model).__name__} caps its final logits; liger_jax's fused distillation has no softcap")
    weight, layout, head_dtype = lm_head_weight(model, family)
    hidden = _final_hidden_states(model, family, input_tokens, positions, attention_mask, images)
    if head_dtype is not None:
        hidden, weight = hidden.astype(head_dtype), weight.astype(head_dtype)
    return HeadInputs(hidden[:, :-1], weight, layout)


def token_labels_fn(input_tokens: jax.Array, input_mask: jax.Array, **unused: Any) -> jax.Array:
    """Next-token labels as integers: ``input_tokens[:, 1:]``, ``-100`` where ``input_mask[:, 1:]`` is off.

    The integer form of the one-hot labels of Tunix's example (``one_hot(input_tokens[:, 1:]) · input_mask[:, 1:]``)
    for :class:`LogitStrategy`'s ``labels_fn``: the same loss without a ``[B, S, V]`` array of labels.

    Args:
        input_tokens: ``[B, S]`` integer tokens.
        input_mask: ``[B, S]`` bool or 0/1.
        unused: the other model inputs (positions, attention mask), as Tunix passes them.

    Returns:
        ``[B, S - 1]`` int32.
    """
    del unused
    return jnp.where(input_mask[:, 1:].astype(bool), input_tokens[:, 1:], IGNORE_INDEX).astype(jnp.int32)


class LogitStrategy(logit.LogitStrategy):
    r"""Tunix's ``LogitStrategy`` with its loss on liger_jax's kernels: a drop-in for ``DistillationTrainer``.

    Tunix 0.1.7's loss, with :math:`T` the temperature, :math:`\alpha` the weight of the distillation, :math:`N` the
    number of positions (padding included) and :math:`p`, :math:`q` the teacher's and student's softmaxes at
    :math:`T`:

    .. math::
        \mathrm{loss} = \alpha T^2 \frac{1}{N} \sum_{r} \mathrm{KL}(p_r \,\|\, q_r)
            + (1 - \alpha) \frac{1}{N} \sum_{r\ \mathrm{labelled}} \mathrm{CE}(s_r, y_r)

    and its metrics ``distill/soft_loss`` (the first mean times :math:`T^2`), ``distill/hard_loss``,
    ``distill/kl_div`` (the first mean) and ``distill/teacher_loss`` (the teacher's cross-entropy, alike). Tunix
    masks nothing: a padded position (a label row of zeros) still counts in :math:`N` and in the KL; with
    ``kl_on_padding=False`` the KL skips padded positions too (:math:`N` stays). ``distill_top_k`` (logits only)
    takes the KL over the teacher's top k classes, renormalised, as Tunix does.

    What runs depends on what the forward functions return:

    * logits ``[B, S, V]`` (Tunix's own forward functions): the KL by :func:`liger_jax.jsd` (``beta=0``, the forward
      KL) on the fp32 log-softmaxes at :math:`T`, the cross-entropies by :func:`liger_jax.cross_entropy`.
    * :class:`HeadInputs` (:func:`head_forward_fn` for both models): no ``[B, S, V]`` logits. The KL by
      :func:`liger_jax.fused_linear_jsd` over all positions and the cross-entropy by
      :func:`liger_jax.fused_linear_cross_entropy` (two chunked passes over the student's head: Tunix's KL counts
      positions its cross-entropy skips); with ``kl_on_padding=False`` one pass of
      :func:`liger_jax.fused_linear_distillation` gives both. The teacher's cross-entropy (a metric) is one more
      forward pass over its head. The two heads may differ in layout (tied or not) and hidden size.

    Labels (what ``labels_fn`` returns): ``[B, S]`` integers, ``-100`` for positions without a label
    (:func:`token_labels_fn`, no ``[B, S, V]`` labels), or Tunix's ``[B, S, V]`` one-hot rows, zero rows for
    positions without a label (soft labels are not what this computes: concrete ones are checked).

    Numerics: softmaxes, losses and the logits' gradients in fp32, as Tunix (which casts both logits to fp32); in
    fp32 the two agree to rounding.

    Args:
        student_forward_fn, teacher_forward_fn: ``(model, **inputs)`` returning logits or :class:`HeadInputs` (both
            the same kind).
        labels_fn: ``(**inputs)`` returning the labels above.
        temperature: > 0.
        alpha: in ``[0, 1]``.
        distill_top_k: ``0`` (the full vocabulary) or the number of the teacher's classes the KL takes.
        kl_on_padding: whether unlabelled positions count in the KL (Tunix's loss: True).
        implementation: the kernels' implementation (see :mod:`liger_jax.runtime`), None for the default.

    Raises:
        ValueError: temperature or alpha out of range (Tunix's checks), distill_top_k negative.
        TypeError: distill_top_k or kl_on_padding of the wrong type.
    """

    def __init__(
        self,
        student_forward_fn,
        teacher_forward_fn,
        labels_fn,
        temperature: float = 2.0,
        alpha: float = 0.5,
        distill_top_k: int = 0,
        *,
        kl_on_padding: bool = True,
        implementation: runtime.Implementation | None = None,
    ):
        super().__init__(student_forward_fn, teacher_forward_fn, labels_fn, temperature, alpha, distill_top_k)
        _checks.check_int("distill_top_k", distill_top_k, minimum=0)
        if not isinstance(kl_on_padding, bool):
            raise TypeError(f"kl_on_padding must be a bool, got {kl_on_padding!r}")
        self.kl_on_padding = kl_on_padding
        self.implementation = implementation

    def compute_loss(
        self, student_output: jax.Array | HeadInputs, teacher_output: jax.Array | HeadInputs, labels: jax.Array
    ) -> tuple[jax.Array, dict[str, jax.Array]]:
        """``(loss, metrics)`` as Tunix's ``LogitStrategy.compute_loss`` (see the class)."""
        tokens = _token_labels(labels)
        if isinstance(student_output, HeadInputs) != isinstance(teacher_output, HeadInputs):
            raise TypeError(
                "student_output and teacher_output must both be logits or both HeadInputs (head_forward_fn), got "
                f"{type(student_output).__name__} and {type(teacher_output).__name__}"
            )
        terms = _head_terms if isinstance(student_output, HeadInputs) else _logit_terms
        loss, kl, hard, teacher_loss = terms(self, student_output, jax.lax.stop_gradient(teacher_output), tokens)
        metrics = {
            "distill/soft_loss": kl * self.temperature**2,
            "distill/hard_loss": hard,
            "distill/kl_div": kl,
            "distill/teacher_loss": teacher_loss,
        }
        return loss, metrics

    def compute_eval_loss(
        self, student_output: jax.Array | HeadInputs, labels: jax.Array
    ) -> tuple[jax.Array, dict[str, jax.Array]]:
        """``(cross-entropy, {})`` as Tunix's ``LogitStrategy.compute_eval_loss``: the student's mean over all
        positions."""
        return _mean_cross_entropy(student_output, _token_labels(labels), self.implementation), {}


def _token_labels(labels: jax.Array) -> jax.Array:
    """Integer labels ``[...]``, ``-100`` for positions without one, from integer or one-hot ``[..., V]`` labels."""
    if jnp.issubdtype(labels.dtype, jnp.integer):
        return labels
    if not jnp.issubdtype(labels.dtype, jnp.floating):
        raise TypeError(f"labels must be integers or one-hot floats, got {labels.dtype}")
    values = _checks.concrete_values(labels)
    if values is not None and not (np.isin(values, (0.0, 1.0)).all() and (values.sum(-1) <= 1).all()):
        raise ValueError("labels must be one-hot rows (zero rows for unlabelled positions), got other values")
    labelled = jnp.sum(labels, axis=-1) > 0
    return jnp.where(labelled, jnp.argmax(labels, axis=-1), IGNORE_INDEX).astype(jnp.int32)


def _kl_labels(strategy: LogitStrategy, tokens: jax.Array) -> tuple[jax.Array | None, jax.Array]:
    """``(labels for the KL, share)``: all positions count (no labels, a share of 1), or the labelled ones, whose
    mean (what the divergences take) times their share of all positions is Tunix's mean over all positions."""
    if strategy.kl_on_padding:
        return None, jnp.float32(1.0)
    return tokens, jnp.sum(tokens != IGNORE_INDEX) / tokens.size


def _weighted(strategy: LogitStrategy, kl: jax.Array, hard: jax.Array) -> jax.Array:
    """``alpha · T² · kl + (1 - alpha) · hard``."""
    return strategy.alpha * strategy.temperature**2 * kl + (1.0 - strategy.alpha) * hard


def _logit_terms(strategy: LogitStrategy, student: jax.Array, teacher: jax.Array, tokens: jax.Array):
    """``(loss, kl, hard, teacher's cross-entropy)`` from the logits ``[..., V]``."""
    student, teacher = student.astype(jnp.float32), teacher.astype(jnp.float32)
    student_kept, teacher_kept = student, teacher
    if strategy.distill_top_k > 0:
        teacher_kept, kept = jax.lax.top_k(teacher, strategy.distill_top_k)
        student_kept = jnp.take_along_axis(student, kept, axis=-1)
    kl_labels, share = _kl_labels(strategy, tokens)
    log_student = jax.nn.log_softmax(student_kept / strategy.temperature, axis=-1)
    log_teacher = jax.nn.log_softmax(teacher_kept / strategy.temperature, axis=-1)
    kl = jsd(log_student, log_teacher, kl_labels, beta=0.0, implementation=strategy.implementation) * share
    hard = _mean_cross_entropy(student, tokens, strategy.implementation)
    teacher_loss = _mean_cross_entropy(teacher, tokens, strategy.implementation)
    return _weighted(strategy, kl, hard), kl, hard, teacher_loss


def _head_terms(strategy: LogitStrategy, student: HeadInputs, teacher: HeadInputs, tokens: jax.Array):
    """``(loss, kl, hard, teacher's cross-entropy)`` from the heads' inputs, without the logits."""
    if strategy.distill_top_k > 0:
        raise ValueError("distill_top_k needs the teacher's logits; with HeadInputs use distill_top_k=0")
    teacher_weight = teacher.weight
    if teacher.weight_layout != student.weight_layout:  # the fused ops take one layout for both heads
        teacher_weight = teacher_weight.T
    operands = (student.hidden, student.weight, teacher.hidden, teacher_weight)
    options = dict(temperature=strategy.temperature, weight_layout=student.weight_layout)
    implementation = strategy.implementation
    teacher_loss = _mean_cross_entropy(teacher, tokens, implementation)
    if strategy.kl_on_padding:
        kl = fused_linear_jsd(*operands, beta=0.0, implementation=implementation, **options)
        hard = _mean_cross_entropy(student, tokens, implementation)
        return _weighted(strategy, kl, hard), kl, hard, teacher_loss
    _, share = _kl_labels(strategy, tokens)
    # One pass: both losses over the labelled positions, weighted as _weighted weighs them (only the total carries a
    # gradient), then scaled to Tunix's mean over all positions.
    loss, kl, hard = fused_linear_distillation(
        *operands,
        tokens,
        divergence="kl",
        weight_soft_loss=strategy.alpha * strategy.temperature**2,
        weight_hard_loss=1.0 - strategy.alpha,
        ignore_index=IGNORE_INDEX,
        return_soft_hard_loss=True,
        implementation=implementation,
        **options,
    )
    return loss * share, kl * share, hard * share, teacher_loss


def _mean_cross_entropy(
    output: jax.Array | HeadInputs, tokens: jax.Array, implementation: runtime.Implementation | None
) -> jax.Array:
    """The cross-entropy summed over the labelled positions, divided by all positions (Tunix's mean)."""
    if isinstance(output, HeadInputs):
        total = fused_linear_cross_entropy(
            output.hidden,
            output.weight,
            tokens,
            ignore_index=IGNORE_INDEX,
            reduction="sum",
            weight_layout=output.weight_layout,
            implementation=implementation,
        )
    else:
        logits = output.astype(jnp.float32)  # as Tunix
        total = cross_entropy(logits, tokens, ignore_index=IGNORE_INDEX, reduction="sum", implementation=implementation)
    return total / tokens.size
