"""Per-row math of the fused linear distillation losses, on one chunk's student and teacher logits.

The soft loss of a row compares the student's and the teacher's distributions at a temperature T
(``z = logits / T`` in fp32): a divergence of their log-softmaxes (``jsd``, forward ``kl``) or softmaxes (``tvd``),
computed by the divergence ops' per-row functions (:func:`liger_jax.ops.jsd.jsd_rows`, ``kl_div_rows``,
``tvd_rows``), or ``beta · (1 - cos(z_student, z_teacher))`` (``cosine``). Their gradient in the student's
log-probabilities (probabilities) is chained through the softmax here, and through the temperature. The hard loss
is the cross-entropy of the student's raw logits on the labels (the cross-entropy kernels' per-row math). With the
vocabulary sharded, the softmax statistics, the divergences' row sums and the cosine's dot products are summed
across the vocabulary axes, and the divergences' per-element terms come from the same ops' ``*_terms``.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp

from liger_jax.ops import _cross_entropy_rows, vocab_parallel
from liger_jax.ops._cross_entropy_rows import LossSettings
from liger_jax.ops._divergence_rows import Divergence
from liger_jax.ops.jsd import jsd_rows, jsd_terms
from liger_jax.ops.kl_div import kl_div_rows, kl_div_terms
from liger_jax.ops.tvd import tvd_rows, tvd_terms

DIVERGENCES = ("jsd", "kl", "tvd", "cosine")
# Liger's cosine distillation: F.normalize's floor on a row's norm.
COSINE_NORM_EPS = 1e-12


@dataclasses.dataclass(frozen=True)
class DistillationRows:
    """The chunk loop's row math (``_linear_chunks.RowMath``) of a distillation loss.

    Called as ``rows(student_logits [C, V], teacher_logits [C, V], labels [C], [soft_scale [C], hard_scale [C]],
    vocab_axes=...)``: per-row values ``(soft, hard)`` (unnormalised; 0 on ignored rows, ``hard`` 0 without
    ``hard_loss``), and with the scales the gradient of ``Σ_rows soft_scale · soft + hard_scale · hard`` in the
    student's logits (logits dtype).
    """

    divergence: str
    beta: float
    temperature: float
    ignore_index: int
    has_labels: bool
    hard_loss: bool
    implementation: str

    def __call__(self, student_logits, teacher_logits, labels, *scales, vocab_axes=()):
        soft_scale, hard_scale = scales if scales else (None, None)
        soft, dsoft = self._soft(student_logits, teacher_logits, labels, soft_scale, tuple(vocab_axes))
        hard, dhard = jnp.zeros_like(soft), None
        if self.hard_loss:
            hard, dhard = self._hard(student_logits, labels, hard_scale, tuple(vocab_axes))
        if not scales:
            return (soft, hard), None
        dlogits = dsoft if dhard is None else dsoft + dhard.astype(dsoft.dtype)
        return (soft, hard), dlogits.astype(student_logits.dtype)

    def _ignored(self, labels):
        return labels == self.ignore_index if self.has_labels else jnp.zeros(labels.shape, bool)

    def _soft(self, student_logits, teacher_logits, labels, scale, axes):
        """Per-row soft losses and (with ``scale``) their scaled gradient in the student's logits, fp32."""
        compute = jnp.promote_types(student_logits.dtype, jnp.float32)
        inv_temperature = 1.0 / self.temperature
        student = student_logits.astype(compute) * inv_temperature
        teacher = teacher_logits.astype(compute) * inv_temperature
        ignored = self._ignored(labels)
        if scale is not None:
            scale = jnp.where(ignored, 0.0, scale).astype(compute)
        if self.divergence == "cosine":
            loss, dstudent = _cosine_rows(student, teacher, scale, self.beta, axes)
        else:
            student_logp, teacher_logp = _log_softmax(student, axes), _log_softmax(teacher, axes)
            if self.divergence == "tvd":  # a divergence of probabilities
                operands = (jnp.exp(student_logp), jnp.exp(teacher_logp))
            else:
                operands = (student_logp, teacher_logp)
            if axes:
                loss, doperand = self._sharded_divergence(*operands, scale, axes)
            else:
                loss, doperand = self._divergence_rows(*operands, labels, scale)
            dstudent = None
            if scale is not None:  # through the softmax: d/dz of Σ_j g_j f(z)_j
                if self.divergence == "tvd":
                    probabilities = operands[0]
                    spread = jax.lax.psum(jnp.sum(probabilities * doperand, axis=-1), axes)
                    dstudent = probabilities * (doperand - spread[..., None])
                else:
                    spread = jax.lax.psum(jnp.sum(doperand, axis=-1), axes)
                    dstudent = doperand - jnp.exp(student_logp) * spread[..., None]
        loss = jnp.where(ignored, 0.0, loss)
        return loss, None if dstudent is None else dstudent * inv_temperature

    def _divergence_rows(self, student, teacher, labels, scale):
        """The divergence ops' per-row functions on whole rows: ``(loss, d/d student)`` (zeros without scale)."""
        grad_scale = jnp.zeros(labels.shape, student.dtype) if scale is None else scale
        options = {"implementation": self.implementation}
        labels = labels if self.has_labels else None
        match self.divergence:
            case "jsd":
                return jsd_rows(
                    student, teacher, labels, grad_scale, beta=self.beta, ignore_index=self.ignore_index, **options
                )
            case "kl":  # forward KL(teacher ‖ student), the teacher's log-probabilities as the target
                return kl_div_rows(student, teacher, grad_scale, log_target=True, **options)
            case "tvd":
                return tvd_rows(student, teacher, labels, grad_scale, ignore_index=self.ignore_index, **options)
        raise ValueError(f"divergence must be one of {DIVERGENCES}, got {self.divergence!r}")

    def _sharded_divergence(self, student, teacher, scale, axes):
        """``(loss, d/d student)`` of this device's vocabulary slice: the ops' per-element terms, summed across
        ``axes``."""
        terms_of = {"jsd": jsd_terms, "kl": kl_div_terms, "tvd": tvd_terms}[self.divergence]
        settings = Divergence(self.divergence, terms_of, "xla", beta=self.beta, log_target=True)
        terms, pullback = jax.vjp(lambda student: terms_of(student, teacher, settings), student)
        loss = jax.lax.psum(jnp.sum(terms, axis=-1), axes)
        if scale is None:
            return loss, None
        (dstudent,) = pullback(jnp.broadcast_to(scale[..., None], terms.shape).astype(terms.dtype))
        return loss, dstudent

    def _hard(self, student_logits, labels, scale, axes):
        """Per-row cross-entropy of the raw logits and (with ``scale``) its scaled gradient (logits dtype)."""
        settings = _hard_settings(self.ignore_index, self.implementation)
        if scale is None:
            losses = vocab_parallel.row_losses(settings, axes) if axes else _cross_entropy_rows.row_losses(settings)
            return losses(student_logits, labels)[0], None
        if axes:
            losses_and_grads = vocab_parallel.row_losses_and_grads(settings, axes)
        else:
            losses_and_grads = _cross_entropy_rows.row_losses_and_grads(settings)
        dlogits, loss, _ = losses_and_grads(student_logits, labels, scale.astype(jnp.float32))
        return loss, dlogits


@functools.cache
def _hard_settings(ignore_index: int, implementation: str) -> LossSettings:
    return LossSettings(ignore_index, 0.0, 0.0, None, "sum", implementation)


def _log_softmax(z, axes):
    """Row log-softmax of ``z`` ``[..., V/n]`` whose vocabulary is sharded on ``axes`` (none: whole rows)."""
    row_max = jax.lax.pmax(jnp.max(z, axis=-1), axes)
    total = jax.lax.psum(jnp.sum(jnp.exp(z - row_max[..., None]), axis=-1), axes)
    return z - (row_max + jnp.log(total))[..., None]


def _cosine_rows(student, teacher, scale, beta, axes):
    """``beta · (1 - cos(student, teacher))`` per row (norms floored at COSINE_NORM_EPS, as F.normalize) and,
    with ``scale``, ``scale · d/d student``."""
    dot = jax.lax.psum(jnp.sum(student * teacher, axis=-1), axes)
    student_norm = jnp.maximum(jnp.sqrt(jax.lax.psum(jnp.sum(student * student, axis=-1), axes)), COSINE_NORM_EPS)
    teacher_norm = jnp.maximum(jnp.sqrt(jax.lax.psum(jnp.sum(teacher * teacher, axis=-1), axes)), COSINE_NORM_EPS)
    cosine = dot / (student_norm * teacher_norm)
    loss = beta * (1.0 - cosine)
    if scale is None:
        return loss, None
    # d cos / d s = t / (|s| |t|) - cos · s / |s|²
    dcos = teacher / (student_norm * teacher_norm)[..., None] - (cosine / student_norm**2)[..., None] * student
    return loss, -(beta * scale)[..., None] * dcos
