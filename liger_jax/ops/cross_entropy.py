"""Cross-entropy with integer labels: reference, custom_vjp over the Triton kernels (loss and lse forward, one
gradient pass backward)."""

import functools
from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np

from liger_jax import runtime
from liger_jax.ops import _checks, _dispatch
from liger_jax.ops._cross_entropy_checks import check_class_weight, check_flags, check_labels, loss_settings
from liger_jax.ops._cross_entropy_rows import (
    LossSettings,
    count_targets,
    reduce_losses,
    reduction_grad_scales,
    reference_row_losses,
    row_grads,
    row_losses,
    row_losses_and_lse,
)

Reduction = Literal["mean", "sum", "none"]


def cross_entropy(
    logits: jax.Array,
    labels: jax.Array,
    *,
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
    implementation: runtime.Implementation | None = None,
) -> jax.Array | tuple[jax.Array, ...]:
    r"""Softmax cross-entropy with integer labels (Liger's CrossEntropy), as ``torch.nn.functional.cross_entropy``.

    For a row of logits :math:`z` (after the optional softcap :math:`c = s \tanh(z / s)`, else :math:`c = z`) with
    label :math:`y`, :math:`V` classes, smoothing :math:`\alpha` and :math:`\mathrm{lse} = \log\sum_j e^{c_j}`:

    .. math::
        \ell = \mathrm{lse} - (1 - \alpha)\, c_y - \frac{\alpha}{V}\sum_j c_j + \lambda_z\, \mathrm{lse}^2

    which is ``optax.softmax_cross_entropy`` against ``optax.smooth_labels(one_hot(y), α)`` plus the z-loss
    :math:`\lambda_z \mathrm{lse}^2` (PaLM). Rows with ``labels == ignore_index`` contribute 0 loss and 0 gradient.
    Logits masked to ``-inf`` get probability 0 (with label smoothing their row's loss is ``+inf``, as in torch).

    With class weights :math:`w` (``ce_weight``, :math:`W = \sum_j w_j`) the cross-entropy part is torch's and
    Liger's weighted one, :math:`(1 - \alpha) w_y (\mathrm{lse} - c_y) + \frac{\alpha}{V}\sum_j w_j
    (\mathrm{lse} - c_j)`, and ``"mean"`` divides it by :math:`\sum w_{y}` over the non-ignored rows (a total of 0
    gives 0) while the z-loss stays a mean over those rows (Liger's convention). ``use_token_scaling`` multiplies
    each row's loss and z-loss by :math:`p_y = e^{c_y - \mathrm{lse}}`, held constant in the gradient (Liger's
    FLCE option).

    Numerics: softmax, loss and gradient are computed in fp32 whatever the logits dtype; losses come back in fp32.
    The forward pass reads the logits once and keeps them with each row's fp32 log-sum-exp; the backward pass
    reads them once more and writes ``cotangent · gradient`` in the logits dtype, rounded once after the target
    term was subtracted in fp32. Inside ``jit`` the gradient takes over the logits buffer when nothing else needs
    the logits (in a training step they are dead by then), so the loss holds no memory beyond the logits. (Liger
    instead writes the gradient during the forward pass; in JAX that costs a third pass over the logits, the
    backward's scaling by the cotangent, which torch skips for a cotangent of 1.)

    Args:
        logits: ``[..., V]`` float32, bfloat16 or float16 (float64 too under ``"xla"``).
        labels: ``[...]`` integers in ``[0, V)`` or ``ignore_index``.
        ignore_index: label value of rows to skip (padding); it may lie inside ``[0, V)``.
        label_smoothing: ``α`` in ``[0, 1]``.
        z_loss_scale: ``λ_z ≥ 0``; the z-loss is part of the returned loss.
        softcap: ``s > 0`` to cap the logits with ``s · tanh(z / s)`` (Gemma 2), or None.
        reduction: ``"mean"`` (over non-ignored rows; 0 when every row is ignored), ``"sum"`` or ``"none"``.
        return_z_loss: also return the z-loss term, reduced like the loss. It is for logging: it already is part of
            the loss and carries no gradient of its own (it is wrapped in ``stop_gradient``).
        ce_weight: optional ``[V]`` floating class weights ``>= 0`` (torch's ``weight``), not differentiated.
        use_token_scaling: scale each row's loss by its detached probability of the label.
        return_token_accuracy: also return whether each row's argmax (of the softcapped logits, the first on ties)
            is its label: float32, 0 for ignored rows; reduced to the mean over non-ignored rows (0 when none) for
            ``"mean"`` and ``"sum"``, per row for ``"none"``. Computed in the loss pass; no gradient.
        return_predicted_tokens: also return each row's argmax, ``[...]`` int32, -1 for ignored rows; no gradient.
        implementation: ``"triton"``, ``"interpret"``, ``"xla"`` or None for the default (see
            :mod:`liger_jax.runtime`).

    Returns:
        The loss, fp32 (float64 for float64 logits under ``"xla"``): a scalar, or ``[...]`` for ``"none"``. With
        any ``return_*`` flag, the tuple of the loss and, in this order, those requested of ``z_loss``,
        ``token_accuracy`` and ``predicted_tokens``. A traced label outside ``[0, V)`` (other than
        ``ignore_index``) makes its row's loss and z_loss NaN and its gradient zero; the kernels never read out of
        bounds.

    Raises:
        TypeError: logits or ce_weight are not floating point, labels are not integers, ignore_index is not an
            int, or a flag is not a bool.
        ValueError: logits have rank 0 or no classes, labels do not have shape ``logits.shape[:-1]``, ce_weight is
            not ``[V]`` or has a negative or non-finite weight, a concrete label is out of range, or an option is
            out of its domain.

    Example:
        >>> loss = liger_jax.cross_entropy(logits, labels, label_smoothing=0.1)
    """
    implementation = _dispatch.resolve(implementation, "cross_entropy", np.size(logits))
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
    _checks.check_floating("logits", logits, implementation)
    _checks.check_min_rank("logits", logits, 1)
    check_labels(labels, logits.shape[:-1], "the leading axes of logits", logits.shape[-1], ignore_index)
    check_class_weight(ce_weight, logits.shape[-1], implementation)
    class_weight = () if ce_weight is None else (jax.lax.stop_gradient(ce_weight),)
    if implementation == "xla" or labels.size == 0:
        results = reduced_reference_results(logits, labels, class_weight, settings)
    else:
        # Unflattened: merging a sharded sequence axis into the rows would make XLA gather them.
        results = _cross_entropy(logits, labels, class_weight, settings)
    return finished_outputs(results, labels, settings, return_z_loss, return_token_accuracy, return_predicted_tokens)


def finished_outputs(results, labels, settings: LossSettings, return_z_loss, return_token_accuracy, return_predicted):
    """The public result of the cross-entropy ops from their reduced ``(loss, z_loss[, argmax [...]])``: the loss
    alone, or the tuple of it and the requested z-loss (detached), token accuracy and predicted tokens."""
    loss, z_loss, *argmax = results
    extras = ()
    if return_z_loss:  # z_loss is for logging; its gradient flows through loss, which contains it
        extras += (jax.lax.stop_gradient(z_loss),)
    if return_token_accuracy:
        correct = (argmax[0] == labels) & (labels != settings.ignore_index)
        if settings.reduction == "none":
            extras += (correct.astype(jnp.float32),)
        else:
            count = jnp.maximum(count_targets(labels, settings.ignore_index), 1.0)
            extras += (jnp.sum(correct, dtype=jnp.float32) / count,)
    if return_predicted:
        extras += (argmax[0],)
    return (loss, *extras) if extras else loss


def reduced_reference_results(logits, labels, class_weight, settings: LossSettings):
    """Reduced ``(loss, z_loss[, argmax [...]])`` of the reference; ``class_weight`` is ``(ce_weight,)`` or ``()``."""
    loss, z_loss, *argmax = reference_row_losses(logits, labels, settings, *class_weight)
    return (*reduce_losses(loss, z_loss, labels, settings, *class_weight), *argmax)


def cross_entropy_reference(
    logits: jax.Array,
    labels: jax.Array,
    *,
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
) -> jax.Array | tuple[jax.Array, ...]:
    """:func:`cross_entropy` in plain jax.numpy: its specification and its ``"xla"`` implementation.

    Computes in ``promote(logits.dtype, float32)``, so float64 logits give a float64 oracle; gradients come from
    autodiff. Arguments, results and the out-of-range-label behaviour as :func:`cross_entropy` (no argument checks).
    """
    settings = LossSettings(
        ignore_index,
        label_smoothing,
        z_loss_scale,
        softcap,
        reduction,
        "xla",
        weighted=ce_weight is not None,
        token_scaling=use_token_scaling,
        return_argmax=return_token_accuracy or return_predicted_tokens,
    )
    class_weight = () if ce_weight is None else (jax.lax.stop_gradient(ce_weight),)
    results = reduced_reference_results(logits, labels, class_weight, settings)
    return finished_outputs(results, labels, settings, return_z_loss, return_token_accuracy, return_predicted_tokens)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _cross_entropy(logits, labels, class_weight, settings):
    """``(logits [..., V], labels [...], (class_weight [V],) or ()) -> (loss, z_loss[, argmax [...]])`` reduced;
    without differentiation only the losses."""
    loss, z_loss, *argmax = row_losses(settings)(logits, labels, *class_weight)
    return (*reduce_losses(loss, z_loss, labels, settings, *class_weight), *argmax)


def _cross_entropy_fwd(logits, labels, class_weight, settings):
    loss, z_loss, lse, *argmax = row_losses_and_lse(settings)(logits, labels, *class_weight)
    reduced = (*reduce_losses(loss, z_loss, labels, settings, *class_weight), *argmax)
    return reduced, (logits, labels, class_weight, lse)


def _cross_entropy_bwd(settings, residuals, cotangents):
    logits, labels, class_weight, lse = residuals
    loss_cotangent = cotangents[0].astype(jnp.float32)  # z_loss and argmax leave without gradient
    grad_scale, z_grad_scale = (
        scale * loss_cotangent for scale in reduction_grad_scales(labels, settings, *class_weight)
    )
    z_operand = (z_grad_scale,) if settings.weighted else ()
    dlogits = row_grads(settings)(logits, labels, *class_weight, lse, grad_scale, *z_operand)
    no_weight_grad = tuple(jnp.zeros_like(weight) for weight in class_weight)
    return dlogits, np.zeros(labels.shape, jax.dtypes.float0), no_weight_grad


_cross_entropy.defvjp(_cross_entropy_fwd, _cross_entropy_bwd)
