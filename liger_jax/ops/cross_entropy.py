"""Cross-entropy with integer labels: reference, custom_vjp over the Triton kernels (loss and lse forward, one
gradient pass backward)."""

import functools
from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np

from liger_jax import runtime
from liger_jax.ops import _checks, _dispatch
from liger_jax.ops._cross_entropy_checks import check_labels, loss_settings
from liger_jax.ops._cross_entropy_rows import (
    LossSettings,
    reduce_rows,
    reduced_reference_losses,
    reduction_grad_scale,
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
    implementation: runtime.Implementation | None = None,
) -> jax.Array | tuple[jax.Array, jax.Array]:
    r"""Softmax cross-entropy with integer labels (Liger's CrossEntropy), as ``torch.nn.functional.cross_entropy``.

    For a row of logits :math:`z` (after the optional softcap :math:`c = s \tanh(z / s)`, else :math:`c = z`) with
    label :math:`y`, :math:`V` classes, smoothing :math:`\alpha` and :math:`\mathrm{lse} = \log\sum_j e^{c_j}`:

    .. math::
        \ell = \mathrm{lse} - (1 - \alpha)\, c_y - \frac{\alpha}{V}\sum_j c_j + \lambda_z\, \mathrm{lse}^2

    which is ``optax.softmax_cross_entropy`` against ``optax.smooth_labels(one_hot(y), α)`` plus the z-loss
    :math:`\lambda_z \mathrm{lse}^2` (PaLM). Rows with ``labels == ignore_index`` contribute 0 loss and 0 gradient.
    Logits masked to ``-inf`` get probability 0 (with label smoothing their row's loss is ``+inf``, as in torch).

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
        implementation: ``"triton"``, ``"interpret"``, ``"xla"`` or None for the default (see
            :mod:`liger_jax.runtime`).

    Returns:
        The loss, fp32 (float64 for float64 logits under ``"xla"``): a scalar, or ``[...]`` for ``"none"``; with
        ``return_z_loss``, the tuple ``(loss, z_loss)``. A traced label outside ``[0, V)`` (other than
        ``ignore_index``) makes its row's loss NaN and its gradient zero; the kernels never read out of bounds.

    Raises:
        TypeError: logits are not floating point, labels are not integers, or ignore_index is not an int.
        ValueError: logits have rank 0 or no classes, labels do not have shape ``logits.shape[:-1]``, a concrete
            label is out of range, or an option is out of its domain.

    Example:
        >>> loss = liger_jax.cross_entropy(logits, labels, label_smoothing=0.1)
    """
    implementation = _dispatch.resolve(implementation, "cross_entropy", np.size(logits))
    settings = loss_settings(
        ignore_index=ignore_index,
        label_smoothing=label_smoothing,
        z_loss_scale=z_loss_scale,
        softcap=softcap,
        reduction=reduction,
        implementation=implementation,
    )
    _checks.check_floating("logits", logits, implementation)
    _checks.check_min_rank("logits", logits, 1)
    check_labels(labels, logits.shape[:-1], "the leading axes of logits", logits.shape[-1], ignore_index)
    if implementation == "xla" or labels.size == 0:
        loss, z_loss = reduced_reference_losses(logits, labels, settings)
    else:
        # Unflattened: merging a sharded sequence axis into the rows would make XLA gather them.
        loss, z_loss = _cross_entropy(logits, labels, settings)
    # z_loss is for logging; its gradient flows through loss, which contains it.
    return (loss, jax.lax.stop_gradient(z_loss)) if return_z_loss else loss


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
) -> jax.Array | tuple[jax.Array, jax.Array]:
    """:func:`cross_entropy` in plain jax.numpy: its specification and its ``"xla"`` implementation.

    Computes in ``promote(logits.dtype, float32)``, so float64 logits give a float64 oracle; gradients come from
    autodiff. Arguments, results and the out-of-range-label behaviour as :func:`cross_entropy` (no argument checks).
    """
    settings = LossSettings(ignore_index, label_smoothing, z_loss_scale, softcap, reduction, "xla")
    loss, z_loss = reduced_reference_losses(logits, labels, settings)
    return (loss, jax.lax.stop_gradient(z_loss)) if return_z_loss else loss


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _cross_entropy(logits, labels, settings):
    """``(logits [..., V], labels [...]) -> (loss, z_loss)`` reduced; without differentiation only the losses."""
    loss, z_loss = row_losses(settings)(logits, labels)
    return reduce_rows(loss, labels, settings), reduce_rows(z_loss, labels, settings)


def _cross_entropy_fwd(logits, labels, settings):
    loss, z_loss, lse = row_losses_and_lse(settings)(logits, labels)
    reduced = reduce_rows(loss, labels, settings), reduce_rows(z_loss, labels, settings)
    return reduced, (logits, labels, lse)


def _cross_entropy_bwd(settings, residuals, cotangents):
    logits, labels, lse = residuals
    loss_cotangent, _ = cotangents  # z_loss leaves cross_entropy through stop_gradient: its cotangent is zero
    grad_scale = reduction_grad_scale(labels, settings) * loss_cotangent.astype(jnp.float32)
    dlogits = row_grads(settings)(logits, labels, lse, grad_scale)
    return dlogits, np.zeros(labels.shape, jax.dtypes.float0)


_cross_entropy.defvjp(_cross_entropy_fwd, _cross_entropy_bwd)
