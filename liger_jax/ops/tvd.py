"""Total variation distance between two distributions given as probabilities (Liger's TVDLoss).

:func:`tvd_rows` is the per-row form for fused losses: ``(input, target, labels, grad_scale) -> (loss [...],
dinput)`` from one read of both operands, as :func:`liger_jax.ops.jsd.jsd_rows`.
"""

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
    check_row_labels,
    reduced_loss,
    reduced_reference,
    row_labels,
    row_losses_and_grads,
)

__all__ = ["tvd", "tvd_reference", "tvd_rows", "tvd_terms"]

Reduction = Literal["batchmean", "sum", "mean", "none"]


def tvd(
    input: jax.Array,
    target: jax.Array,
    labels: jax.Array | None = None,
    *,
    reduction: Reduction = "batchmean",
    ignore_index: int = -100,
    implementation: runtime.Implementation | None = None,
) -> jax.Array:
    r"""Total variation distance of ``input`` from ``target``, both probabilities (Liger's ``LigerTVDLoss``).

    Per element :math:`\ell = \tfrac12 |x - y|`, so a row's sum is :math:`\mathrm{TVD}(x, y)`; its gradient in
    :math:`x` is :math:`\tfrac12 \operatorname{sign}(x - y)`, 0 where :math:`x = y`. Rows whose label is
    ``ignore_index`` contribute nothing. ``reduction``: ``"batchmean"`` divides the sum by the number of rows that
    count (not ignored; every row without ``labels``), ``"mean"`` by that number times V, ``"sum"`` sums,
    ``"none"`` keeps every element (0 in ignored rows). Where no row counts the divisor is 1: the loss and its
    gradient are 0 (Liger divides by zero).

    Numerics: fp32 whatever the operands' dtypes; the loss is fp32. The gradient is computed in the forward pass
    with the loss, in one read of both operands (as Liger does); its sign is kept in 2 bits an element (an eighth of a
    bf16 gradient's bytes) and scaled by ½, the reduction's divisor and the cotangent in the backward pass. ``target``
    and ``labels`` get no gradient (as in Liger). With ``"none"`` the default implementation is ``"xla"`` (XLA fuses
    the per-element losses and gradient into one pass; see ``liger_jax.ops._dispatch``).

    Args:
        input: ``[..., V]`` probabilities, float32, bfloat16 or float16 (float64 too under ``"xla"``).
        target: ``[..., V]`` probabilities, any of those dtypes.
        labels: ``[...]`` integers or None; only which equal ``ignore_index`` matters.
        reduction: ``"batchmean"``, ``"mean"``, ``"sum"`` or ``"none"``.
        ignore_index: label value of rows to skip.
        implementation: ``"triton"``, ``"interpret"``, ``"xla"`` or None for the default (see
            :mod:`liger_jax.runtime`).

    Returns:
        fp32 (float64 for float64 operands under ``"xla"``): a scalar, or ``[..., V]`` for ``"none"``.

    Raises:
        TypeError: an operand is not floating point, labels are not integers, or ignore_index is not an int.
        ValueError: operands of rank 0, of different shapes or without classes, labels not of shape
            ``input.shape[:-1]``, or an unknown reduction.

    Example:
        >>> loss = liger_jax.tvd(jax.nn.softmax(student_logits), jax.nn.softmax(teacher_logits), labels)
    """
    kernel_rule = "tvd_elementwise" if reduction == "none" else "tvd"
    implementation = _dispatch.resolve(implementation, kernel_rule, np.size(input))
    divergence = _checked(input, target, labels, reduction, ignore_index, implementation)
    labels = row_labels(labels, input.shape)
    if implementation == "xla":
        return reduced_reference(input, target, labels, divergence, reduction)
    return reduced_loss(input, target, labels, divergence, reduction)


def tvd_reference(
    input: jax.Array,
    target: jax.Array,
    labels: jax.Array | None = None,
    *,
    reduction: Reduction = "batchmean",
    ignore_index: int = -100,
) -> jax.Array:
    """:func:`tvd` in plain jax.numpy: its specification and its ``"xla"`` implementation.

    Computes in ``promote(dtypes, float32)``, so float64 operands give a float64 oracle; the gradient comes from
    autodiff (``target`` under ``stop_gradient``). Arguments and result as :func:`tvd` (no argument checks).
    """
    divergence = _divergence(labels is not None, reduction, ignore_index, "xla")
    return reduced_reference(input, target, row_labels(labels, input.shape), divergence, reduction)


def tvd_terms(input: jax.Array, target: jax.Array, divergence: Divergence) -> jax.Array:
    """The per-element terms of :func:`tvd`, ``|x - y| / 2``, ``[..., V]``, written as ``(x - y) · sign(x - y) / 2``
    so that autodiff gives Liger's gradient ``sign(x - y) / 2`` (0 where x = y; ``jnp.abs`` would give 1/2)."""
    del divergence
    difference = input - target
    return 0.5 * difference * jnp.sign(difference)


def tvd_rows(
    input: jax.Array,
    target: jax.Array,
    labels: jax.Array | None,
    grad_scale: jax.Array,
    *,
    ignore_index: int = -100,
    implementation: runtime.Implementation | None = None,
) -> tuple[jax.Array, jax.Array]:
    """Each row's TVD and ``grad_scale[row] ·`` its gradient in ``input``, from one read of both operands.

    Args:
        input, target, labels, ignore_index, implementation: as :func:`tvd`.
        grad_scale: ``[...]`` float, what each row's gradient is multiplied by.

    Returns:
        ``(loss [...] fp32, dinput [..., V] input.dtype)``, 0 for ignored rows. Not differentiable itself under a
        kernel implementation.
    """
    implementation = runtime.resolve_implementation(implementation)
    divergence = _checked(input, target, labels, "sum", ignore_index, implementation)
    return row_losses_and_grads(divergence)(input, target, row_labels(labels, input.shape), grad_scale)


def _divergence(has_labels, reduction, ignore_index, implementation) -> Divergence:
    return Divergence(
        "tvd",
        tvd_terms,
        implementation,
        ignore_index=int(ignore_index),
        has_labels=has_labels,
        elementwise=reduction == "none",
    )


def _checked(input, target, labels, reduction, ignore_index, implementation) -> Divergence:
    """The checks of :func:`tvd`, then its settings."""
    check_operands("input", input, "target", target, implementation)
    check_row_labels(labels, input.shape, ignore_index)
    _checks.check_choice("reduction", reduction, REDUCTIONS)
    return _divergence(labels is not None, reduction, ignore_index, implementation)
