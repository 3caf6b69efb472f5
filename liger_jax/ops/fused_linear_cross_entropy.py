"""Fused linear cross-entropy: the LM head's matmul and its loss, chunked over rows so N×V logits never exist."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from liger_jax import runtime
from liger_jax.ops import _dispatch, _linear_chunks, vocab_parallel
from liger_jax.ops._cross_entropy_checks import check_class_weight, check_flags, check_labels, loss_settings
from liger_jax.ops._cross_entropy_rows import (
    LossSettings,
    reduce_losses,
    reduction_grad_scales,
    row_losses,
    row_losses_and_grads,
)
from liger_jax.ops._linear_chunks import (
    WEIGHT_LAYOUTS,
    ChunkPlan,
    WeightLayout,
    check_accum_dtype,
    check_chunk_size,
    check_linear_operands,
    chunk_logits_bound,
    default_chunk_rows,
    logits_reference,
)
from liger_jax.ops.cross_entropy import (
    Reduction,
    cross_entropy_reference,
    finished_outputs,
    reduced_reference_results,
)

__all__ = [
    "WEIGHT_LAYOUTS",
    "WeightLayout",
    "chunk_logits_bound",
    "default_chunk_rows",
    "fused_linear_cross_entropy",
    "fused_linear_cross_entropy_reference",
]


def fused_linear_cross_entropy(
    x: jax.Array,
    weight: jax.Array,
    labels: jax.Array,
    *,
    bias: jax.Array | None = None,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    z_loss_scale: float = 0.0,
    softcap: float | None = None,
    reduction: Reduction = "mean",
    return_z_loss: bool = False,
    ce_weight: jax.Array | None = None,
    use_token_scaling: bool = False,
    return_token_accuracy: bool = False,
    return_predicted_tokens: bool = False,
    weight_layout: WeightLayout = "hv",
    accum_dtype=jnp.float32,
    chunk_size: int | None = None,
    implementation: runtime.Implementation | None = None,
) -> jax.Array | tuple[jax.Array, ...]:
    r"""``cross_entropy(x @ weight + bias, labels)`` without materialising the logits (Liger's FusedLinearCrossEntropy).

    The rows of ``x`` are processed in chunks of ``chunk_size`` under a ``lax.fori_loop`` (compile time does not
    grow with N). For each chunk XLA computes the logits (a ``[chunk, V]`` matmul in the dtype of ``x`` and
    ``weight``, as a Dense layer would), the cross-entropy kernel turns them into per-row losses and, in place,
    their gradient, and XLA immediately consumes that gradient: ``dx`` for the chunk's rows, and ``dweight`` and
    ``dbias`` accumulated in ``accum_dtype``. The backward pass only scales these by the cotangent.

    With ``reduction="none"`` the cotangent differs per row and ``dweight = Σ_rows g_row · x_rowᵀ dlogits_row``
    cannot be rescaled after the sum, so the forward pass computes only the losses and the backward pass recomputes
    the chunk logits with each row's gradient scaled by its cotangent: exact, at the price of a fourth matmul.

    Memory: besides its inputs and outputs, a step holds one chunk's logits (``chunk × V``, overwritten by their
    gradient), the ``dweight`` accumulator (``H × V`` in ``accum_dtype``), ``dx`` (``N × H``) and ``dbias`` — never
    ``N × V``. By default one chunk's logits, and their gradient, each take at most

        ``bound = max(bytes of x, H · V · itemsize(accum_dtype), 64 MiB)``

    (:func:`chunk_logits_bound`; with a sharded input, of each device's rows and vocabulary slice): memory the step
    holds anyway in ``x`` and the accumulator. The chunk is the most rows within that bound, up to 2048 (where
    the per-chunk passes over the weight and the accumulator hide under the matmul flops; larger chunks gain no
    speed), in multiples of 128 rows. The compiled temporaries are then a few times the bound whatever N and V
    are, and below a quarter of the full fp32 logits (``N · V · 4`` bytes) whenever those are at least 64 times
    the bound. A Llama-3-8B head (H=4096, V=128256, bf16) gets 2048 rows (501 MiB of chunk logits); an fp32 head
    of H=256 over V=32768 classes gets 512 rows (the 64 MiB floor). The ``"xla"`` implementation runs the same
    chunked loop with a pure-JAX loss, so CPU and TPU users get the same bound.

    Numerics: loss math as :func:`liger_jax.cross_entropy` (fp32 softmax whatever the dtype); logits and their
    gradient in ``result_type(x, weight)``; ``dweight``/``dbias`` summed over chunks in ``accum_dtype`` (fp32 by
    default; bf16 accumulation drifts, Liger #512) and rounded once to their parameter's dtype. The matmuls follow
    jax's matmul precision like any ``jnp.dot``: fp32 inputs run as TF32 on NVIDIA GPUs unless
    ``jax.default_matmul_precision("highest")`` is set.

    Args:
        x: ``[..., H]`` float32, bfloat16 or float16 (float64 too under ``"xla"``); each leading index is a row.
        weight: ``[H, V]`` for ``weight_layout="hv"`` (a Dense/Linear kernel) or ``[V, H]`` for ``"vh"`` (a tied
            embedding table); neither layout makes a transposed copy.
        labels: ``[...]`` (``x.shape[:-1]``) integers in ``[0, V)`` or ``ignore_index``.
        bias: optional ``[V]`` added to the logits.
        ignore_index, label_smoothing, z_loss_scale, softcap, reduction, return_z_loss, ce_weight,
            use_token_scaling, return_token_accuracy, return_predicted_tokens: as :func:`liger_jax.cross_entropy`
            (the argmax is computed in the loss pass of each chunk, exact for V < 2^24).
        weight_layout: ``"hv"`` or ``"vh"``, as above.
        accum_dtype: dtype of the ``dweight``/``dbias`` accumulators. With the weight's own dtype the accumulator
            can be the gradient buffer itself (least memory: no ``H × V`` fp32 temporary).
        chunk_size: rows per chunk (overrides the bound above), or None for the default above.
        implementation: ``"triton"``, ``"interpret"``, ``"xla"`` or None for the default (see
            :mod:`liger_jax.runtime`).

    Returns:
        As :func:`liger_jax.cross_entropy`: the fp32 loss, a scalar or ``[...]`` for ``"none"``, and with any
        ``return_*`` flag the tuple of it and the requested ``z_loss``, ``token_accuracy``, ``predicted_tokens``.

    Raises:
        TypeError: x, weight, bias or accum_dtype are not floating point, labels are not integers, or ignore_index
            is not an int.
        ValueError: shapes do not fit together, an unknown weight_layout, chunk_size not a positive int, a
            concrete label out of range, or a loss option out of its domain.

    Example:
        >>> loss = liger_jax.fused_linear_cross_entropy(hidden, lm_head_kernel, labels)
        >>> loss = liger_jax.fused_linear_cross_entropy(hidden, embedding_table, labels, weight_layout="vh")
    """
    implementation = _dispatch.resolve(
        implementation, "fused_linear_cross_entropy", _dispatch.logits_elements(labels, weight, weight_layout)
    )
    check_flags(return_token_accuracy=return_token_accuracy, return_predicted_tokens=return_predicted_tokens)
    settings = loss_settings(
        ignore_index=ignore_index,
        label_smoothing=label_smoothing,
        z_loss_scale=z_loss_scale,
        softcap=softcap,
        reduction=reduction,
        implementation=implementation,
        weighted=ce_weight is not None,
        token_scaling=use_token_scaling,
        return_argmax=return_token_accuracy or return_predicted_tokens,
    )
    n_classes = check_linear_operands(x, weight, bias, weight_layout, implementation)
    check_labels(labels, x.shape[:-1], "the leading axes of x", n_classes, ignore_index)
    check_class_weight(ce_weight, n_classes, implementation)
    class_weight = () if ce_weight is None else (jax.lax.stop_gradient(ce_weight),)
    check_accum_dtype(accum_dtype)
    check_chunk_size(chunk_size)
    if labels.size == 0:  # no rows to chunk: the reference's empty matmul
        logits = logits_reference(x, weight, bias, weight_layout)
        results = reduced_reference_results(logits, labels, class_weight, settings)
    else:
        plan = ChunkPlan.for_operands(x, weight, bias, weight_layout, chunk_size, accum_dtype)
        # Unflattened: merging a sharded sequence axis into the rows would make XLA gather them.
        rows = _CrossEntropyRows(settings)
        results = _fused_linear_cross_entropy(x, weight, bias, labels, class_weight, plan, rows)
    return finished_outputs(results, labels, settings, return_z_loss, return_token_accuracy, return_predicted_tokens)


def fused_linear_cross_entropy_reference(
    x: jax.Array,
    weight: jax.Array,
    labels: jax.Array,
    *,
    bias: jax.Array | None = None,
    weight_layout: WeightLayout = "hv",
    logits_dtype=None,
    **loss_options,
) -> jax.Array | tuple[jax.Array, jax.Array]:
    """Materialises the logits, then :func:`liger_jax.cross_entropy_reference`: the specification (and test
    oracle) of :func:`fused_linear_cross_entropy`, which computes the same without the ``N × V`` logits.

    The logits are ``x @ weight (+ bias)`` in ``result_type(x, weight)``; with ``logits_dtype`` the matmul and the
    bias sum are rounded to it as the chunked path rounds them, and so is the logits' gradient (tests give float64
    inputs and the dtype under test). ``loss_options`` are
    :func:`liger_jax.cross_entropy`'s keywords; shapes as :func:`fused_linear_cross_entropy`.
    """
    return cross_entropy_reference(
        logits_reference(x, weight, bias, weight_layout, logits_dtype), labels, **loss_options
    )


@dataclasses.dataclass(frozen=True)
class _CrossEntropyRows:
    """The chunk loop's row math (``_linear_chunks.RowMath``): per-row (loss, z_loss[, argmax as a float]) of
    labelled rows, and with per-row grad scales the logits' gradient (``row_losses_and_grads``); the class weight,
    when there is one, comes as the vocabulary operand."""

    settings: LossSettings

    @property
    def n_values(self) -> int:
        return 3 if self.settings.return_argmax else 2

    def __call__(self, logits, labels, *grad_scales, vocab_axes=(), vocab_operands=()):
        if not grad_scales:
            losses = vocab_parallel.row_losses(self.settings, vocab_axes) if vocab_axes else row_losses(self.settings)
            return self._values(losses(logits, labels, *vocab_operands)), None
        if vocab_axes:
            losses_and_grads = vocab_parallel.row_losses_and_grads(self.settings, vocab_axes)
        else:
            losses_and_grads = row_losses_and_grads(self.settings)
        grad_scale, *z_grad_scale = grad_scales
        dlogits, *values = losses_and_grads(logits, labels, grad_scale, *vocab_operands, *z_grad_scale)
        return self._values(values), dlogits

    def _values(self, values):
        loss, z_loss, *argmax = values
        return (loss, z_loss, *(a.astype(loss.dtype) for a in argmax))


def _run_chunks(x, weight, bias, labels, class_weight, grad_scales, plan: ChunkPlan, rows: _CrossEntropyRows):
    """Per-row ``(loss, z_loss[, argmax])``, and with ``grad_scales`` (``(grad_scale,)``, or ``(grad_scale,
    z_grad_scale)`` with a class weight) the gradients of :func:`row_losses_and_grads`."""
    row_operands = (labels, *(scale.astype(jnp.float32) for scale in grad_scales))
    return _linear_chunks.run_chunks(
        x, weight, bias, row_operands, plan, rows, rows.n_values, bool(grad_scales), vocab_operands=class_weight
    )


def _grad_scales(scales, settings: LossSettings):
    """The per-row scales the row math takes: the z-loss scale only with a class weight."""
    grad_scale, z_grad_scale = scales
    return (grad_scale, z_grad_scale) if settings.weighted else (grad_scale,)


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6))
def _fused_linear_cross_entropy(x, weight, bias, labels, class_weight, plan, rows):
    """``(x [..., H], weight, bias, labels [...], (class_weight,) or ()) -> (loss, z_loss[, argmax])`` reduced;
    without differentiation only losses."""
    results = _run_chunks(x, weight, bias, labels, class_weight, (), plan, rows)
    return _reduced(results, labels, class_weight, rows.settings)


def _fused_linear_cross_entropy_fwd(x, weight, bias, labels, class_weight, plan, rows):
    settings = rows.settings
    if settings.reduction == "none":
        # Per-row cotangents: the backward pass recomputes the chunks (see fused_linear_cross_entropy).
        results = _run_chunks(x, weight, bias, labels, class_weight, (), plan, rows)
        return _reduced(results, labels, class_weight, settings), (x, weight, bias, labels, class_weight)
    scales = _grad_scales(reduction_grad_scales(labels, settings, *class_weight), settings)
    results = _run_chunks(x, weight, bias, labels, class_weight, scales, plan, rows)
    residuals = (results.dx, results.dweight, results.dbias, labels, class_weight)
    return _reduced(results, labels, class_weight, settings), residuals


def _fused_linear_cross_entropy_bwd(plan, rows, residuals, cotangents):
    loss_cotangent = cotangents[0]  # z_loss and argmax leave without gradient
    if rows.settings.reduction == "none":
        x, weight, bias, labels, class_weight = residuals
        scales = _grad_scales((loss_cotangent, loss_cotangent), rows.settings)
        results = _run_chunks(x, weight, bias, labels, class_weight, scales, plan, rows)
        dx, dweight, dbias = results.dx, results.dweight, results.dbias
    else:
        dx, dweight, dbias, labels, class_weight = residuals
        dx = (dx * loss_cotangent).astype(plan.x_dtype)
        dweight = dweight * loss_cotangent
        dbias = None if dbias is None else dbias * loss_cotangent
    dweight, dbias = plan.parameter_grads(dweight, dbias)
    no_weight_grad = tuple(jnp.zeros_like(weight) for weight in class_weight)
    return dx, dweight, dbias, np.zeros(labels.shape, jax.dtypes.float0), no_weight_grad


_fused_linear_cross_entropy.defvjp(_fused_linear_cross_entropy_fwd, _fused_linear_cross_entropy_bwd)


def _reduced(results, labels, class_weight, settings: LossSettings):
    loss, z_loss, *argmax = results.values
    reduced = reduce_losses(loss, z_loss, labels, settings, *class_weight)
    return (*reduced, *(a.astype(jnp.int32) for a in argmax))
