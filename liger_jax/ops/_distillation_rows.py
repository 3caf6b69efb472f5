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

from liger_jax import runtime
from liger_jax.ops import _cross_entropy_rows, _tiling, vocab_parallel
from liger_jax.ops._cross_entropy_rows import LossSettings
from liger_jax.ops._divergence_rows import Divergence
from liger_jax.ops.jsd import jsd_rows, jsd_terms
from liger_jax.ops.kl_div import kl_div_rows, kl_div_terms
from liger_jax.ops.tvd import tvd_rows, tvd_terms

DIVERGENCES = ("jsd", "kl", "tvd", "cosine")
# Liger's cosine distillation: F.normalize's floor on a row's norm.
COSINE_NORM_EPS = 1e-12
# fp32 [chunk, V] buffers the jax.numpy row math holds besides the two models' logits: the two models'
# log-probabilities, then the gradient.
_FP32_BUFFERS_PER_LOGIT = 3
# The kernel's vocabulary block and warps on GPUs, as measured on the H200 (with libdevice's accurate log, before
# ``kernels._fast_math``; one row per program on a [2048, 128256] bf16 chunk, JSD with the hard loss: 4096 columns
# at 8 warps 1.71 ms, at 16 warps 2.04 ms; 2048 at 8 warps 1.82 ms; 1024 at 4 warps 1.84 ms; KL 1.2 ms at 4096 or
# 2048 columns and 8 warps, 1.5 ms at 16), and in the interpreter (small, so test vocabularies span blocks). Rows
# share a program only when shorter than a block: two 2048-column rows per program at 8 warps took 2.9 ms a chunk.
MAX_BLOCK_V = 4096
MAX_WARPS = 8
INTERPRETER_MAX_BLOCK_V = 128


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

    def logit_bytes(self, logits_dtype, vocab_sharded: bool) -> int:
        """Bytes a chunk holds per logit: both models' logits, and the fp32 buffers of the jax.numpy row math
        unless the kernel runs (the gradient then overwrites the student's logits)."""
        both_logits = 2 * jnp.dtype(logits_dtype).itemsize
        return both_logits if self._uses_kernel(vocab_sharded) else both_logits + 4 * _FP32_BUFFERS_PER_LOGIT

    def _uses_kernel(self, vocab_sharded: bool) -> bool:
        return self.implementation != "xla" and not vocab_sharded and self.divergence != "cosine"

    def __call__(self, student_logits, teacher_logits, labels, *scales, vocab_axes=()):
        if self._uses_kernel(bool(vocab_axes)):
            return self._kernel(student_logits, teacher_logits, labels, scales)
        soft_scale, hard_scale = scales if scales else (None, None)
        soft, dsoft = self._soft(student_logits, teacher_logits, labels, soft_scale, tuple(vocab_axes))
        hard, dhard = jnp.zeros_like(soft), None
        if self.hard_loss:
            hard, dhard = self._hard(student_logits, labels, hard_scale, tuple(vocab_axes))
        if not scales:
            return (soft, hard), None
        dlogits = dsoft if dhard is None else dsoft + dhard.astype(dsoft.dtype)
        return (soft, hard), dlogits.astype(student_logits.dtype)

    def _kernel(self, student_logits, teacher_logits, labels, scales):
        """The distillation kernel on whole rows: ``((soft, hard), dstudent or None)``."""
        from liger_jax.kernels import distillation, divergence

        n_rows, n_cols = student_logits.shape
        limit = INTERPRETER_MAX_BLOCK_V if self.implementation == "interpret" else MAX_BLOCK_V
        block_v = min(limit, _tiling.next_power_of_2(n_cols))
        block_rows = _tiling.rows_per_tile(block_v)
        with_grad = bool(scales)
        # Without the gradient, the scales and dstudent are one-element placeholders the kernel never touches.
        placeholder = jnp.zeros((1,), jnp.float32)
        soft_scale, hard_scale = (s.astype(jnp.float32) for s in scales) if with_grad else (placeholder,) * 2
        row_values = jax.ShapeDtypeStruct((n_rows,), jnp.float32)
        gradient = jax.ShapeDtypeStruct((n_rows, n_cols) if with_grad else (1,), student_logits.dtype)
        codes = {"kl": divergence.KL_DIV, "jsd": divergence.JSD, "tvd": divergence.TVD}
        soft, hard, dstudent = runtime.launch(
            distillation.distillation_rows,
            student_logits,
            teacher_logits,
            labels,
            soft_scale,
            hard_scale,
            n_rows,
            out_shape=(row_values, row_values, gradient),
            grid=(_tiling.cdiv(n_rows, block_rows),),
            implementation=self.implementation,
            num_warps=max(4, min(MAX_WARPS, block_rows * block_v // 256)),
            input_output_aliases={0: 2} if with_grad else None,
            n_cols=n_cols,
            ignore_index=self.ignore_index,
            inv_temperature=1.0 / self.temperature,
            DIVERGENCE=codes[self.divergence].value,
            beta=self.beta,
            HAS_LABELS=self.has_labels,
            HARD_LOSS=self.hard_loss,
            RAW_SOFTMAX=self.hard_loss and self.temperature != 1.0,
            WITH_GRAD=with_grad,
            BLOCK_ROWS=block_rows,
            BLOCK_V=block_v,
        )
        return (soft, hard), dstudent if with_grad else None

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
