"""Kullback-Leibler divergence of log-probabilities from a target distribution (Liger's KLDivLoss).

:func:`kl_div_rows` is the per-row form for fused losses: ``(input, target, grad_scale) -> (loss [...], dinput)``
from one read of both operands, as :func:`liger_jax.ops.jsd.jsd_rows`.
"""

import functools
from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np

from liger_jax import runtime
from liger_jax.ops import _checks, _dispatch
from liger_jax.ops._divergence_rows import (
    REDUCTIONS,
    Divergence,
    check_operands,
    reduce,
    reduced_reference,
    reduction_scale,
    reference_losses,
    row_labels,
    row_losses,
    row_losses_and_grads,
    weighted,
)

__all__ = ["kl_div", "kl_div_reference", "kl_div_rows", "kl_div_terms"]

Reduction = Literal["batchmean", "sum", "mean", "none"]


def kl_div(
    input: jax.Array,
    target: jax.Array,
    *,
    reduction: Reduction = "batchmean",
    log_target: bool = False,
    eps: float = 1e-10,
    implementation: runtime.Implementation | None = None,
) -> jax.Array:
    r"""KL divergence of ``input`` (log-probabilities) from ``target``, as ``torch.nn.functional.kl_div`` (Liger's
    ``LigerKLDIVLoss``).

    Per element, with :math:`x` the input and :math:`y` the target:

    .. math::
        \ell = y\,(\log \max(y, \epsilon) - x) \quad\text{or, with log\_target,}\quad \ell = e^{y}\,(y - x)

    so a row's sum is :math:`\mathrm{KL}(p \,\|\, q)` for target probabilities :math:`p` and :math:`q = e^x`.
    A term whose target probability is exactly 0 is 0 (:math:`0 \log 0 = 0`, also against an input of ``-inf``).
    ``reduction``: ``"batchmean"`` divides the sum by the number of rows, all leading axes together (Liger's
    ``[BT, V]``; torch's own kl_div divides by the first axis only), ``"mean"`` by the number of elements,
    ``"sum"`` sums, ``"none"`` keeps every element.

    Numerics: fp32 whatever the operands' dtypes; the loss is fp32 (on the GPU the kernel's log of the target is
    the hardware's approximate log2, ~1e-7 absolute beyond fp32 rounding). The forward pass reads both operands once;
    the gradient, :math:`-y` (or :math:`-e^y`) times the cotangent and the reduction's scale, does not depend on
    the input: the backward pass computes it from the target alone, an elementwise op XLA fuses with its
    neighbours. ``target`` gets no gradient (as in Liger).

    Args:
        input: ``[..., V]`` log-probabilities, float32, bfloat16 or float16 (float64 too under ``"xla"``).
        target: ``[..., V]`` probabilities (log-probabilities with ``log_target``), any of those dtypes.
        reduction: ``"batchmean"``, ``"mean"``, ``"sum"`` or ``"none"``.
        log_target: whether ``target`` holds log-probabilities.
        eps: floor of the target probabilities under the log (without ``log_target``), > 0.
        implementation: ``"triton"``, ``"interpret"``, ``"xla"`` or None for the default (see
            :mod:`liger_jax.runtime`).

    Returns:
        fp32 (float64 for float64 operands under ``"xla"``): a scalar, or ``[..., V]`` for ``"none"``.

    Raises:
        TypeError: an operand is not floating point.
        ValueError: operands of rank 0, of different shapes or without classes, an unknown reduction, or eps not
            a finite positive number.

    Example:
        >>> loss = liger_jax.kl_div(jax.nn.log_softmax(logits), teacher_probs, reduction="batchmean")
    """
    implementation = _dispatch.resolve(implementation, "kl_div", np.size(input))
    divergence = _checked(input, target, reduction, log_target, eps, implementation)
    if implementation == "xla" or input.size == 0:
        return reduced_reference(input, target, row_labels(None, input.shape), divergence, reduction)
    return _kl_div(input, target, divergence, reduction)


def kl_div_reference(
    input: jax.Array,
    target: jax.Array,
    *,
    reduction: Reduction = "batchmean",
    log_target: bool = False,
    eps: float = 1e-10,
) -> jax.Array:
    """:func:`kl_div` in plain jax.numpy: its specification and its ``"xla"`` implementation.

    Computes in ``promote(dtypes, float32)``, so float64 operands give a float64 oracle; the gradient comes from
    autodiff (``target`` under ``stop_gradient``). Arguments and result as :func:`kl_div` (no argument checks).
    """
    divergence = _divergence(reduction, log_target, eps, "xla")
    return reduced_reference(input, target, row_labels(None, input.shape), divergence, reduction)


def kl_div_terms(input: jax.Array, target: jax.Array, divergence: Divergence) -> jax.Array:
    """The per-element terms of :func:`kl_div` (``divergence.log_target``, ``divergence.eps``), ``[..., V]``."""
    if divergence.log_target:
        return weighted(jnp.exp(target), target - input)
    return weighted(target, jnp.log(jnp.maximum(target, divergence.eps)) - input)


def kl_div_rows(
    input: jax.Array,
    target: jax.Array,
    grad_scale: jax.Array,
    *,
    log_target: bool = False,
    eps: float = 1e-10,
    implementation: runtime.Implementation | None = None,
) -> tuple[jax.Array, jax.Array]:
    """Each row's KL divergence and ``grad_scale[row] ·`` its gradient in ``input``, from one read of both operands.

    Args:
        input, target, log_target, eps, implementation: as :func:`kl_div`.
        grad_scale: ``[...]`` float, what each row's gradient is multiplied by.

    Returns:
        ``(loss [...] fp32, dinput [..., V] input.dtype)``. Not differentiable itself under a kernel implementation.
    """
    implementation = runtime.resolve_implementation(implementation)
    divergence = _checked(input, target, "sum", log_target, eps, implementation)
    return row_losses_and_grads(divergence)(input, target, row_labels(None, input.shape), grad_scale)


def _divergence(reduction, log_target, eps, implementation) -> Divergence:
    return Divergence(
        "kl_div",
        kl_div_terms,
        implementation,
        log_target=bool(log_target),
        eps=float(eps),
        elementwise=reduction == "none",
    )


def _checked(input, target, reduction, log_target, eps, implementation) -> Divergence:
    """The checks of :func:`kl_div`, then its settings."""
    check_operands("input", input, "target", target, implementation)
    _checks.check_choice("reduction", reduction, REDUCTIONS)
    if not (np.isfinite(eps) and eps > 0.0):
        raise ValueError(f"eps must be a finite number > 0, got {eps!r}")
    return _divergence(reduction, log_target, eps, implementation)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _kl_div(input, target, divergence, reduction):
    labels = row_labels(None, input.shape)
    return reduce(row_losses(divergence)(input, target, labels), labels, input.shape[-1], reduction, divergence)


def _kl_div_fwd(input, target, divergence, reduction):
    return _kl_div(input, target, divergence, reduction), (input, target)


def _kl_div_bwd(divergence, reduction, residuals, cotangent):
    # The gradient of the reference terms; under jit XLA keeps only what it reads, the target (not the input).
    input, target = residuals
    labels = row_labels(None, input.shape)
    losses, pullback = jax.vjp(lambda input: reference_losses(input, target, labels, divergence), input)
    scale = reduction_scale(labels, input.shape[-1], reduction, divergence) * cotangent.astype(jnp.float32)
    (dinput,) = pullback(jnp.broadcast_to(scale, losses.shape).astype(losses.dtype))
    return dinput.astype(input.dtype), None


_kl_div.defvjp(_kl_div_fwd, _kl_div_bwd)
