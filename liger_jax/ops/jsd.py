"""Generalised Jensen-Shannon divergence between a student's and a teacher's log-probabilities (Liger's JSD).

Besides :func:`jsd` (the loss) this module holds the per-row math the fused linear distillation losses call on
their chunks' log-probabilities, one function for every implementation:

* :func:`jsd_terms`: the per-element terms in plain jax.numpy, the specification.
* :func:`jsd_row_losses` ``(student_logp, teacher_logp, labels) -> loss [...]``: fp32 per-row divergences.
* :func:`jsd_rows` ``(student_logp, teacher_logp, labels, grad_scale) -> (loss [...], dstudent [..., V])``: the
  same losses and ``grad_scale[row] · d(row loss)/d student_logp`` from the same single pass over both operands.

Rows whose label is ``ignore_index`` give 0 in all of them; ``labels=None`` counts every row.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np

from liger_jax import runtime
from liger_jax.ops import _dispatch
from liger_jax.ops._divergence_rows import (
    Divergence,
    check_operands,
    check_row_labels,
    reduced_loss,
    reduced_reference,
    row_labels,
    row_losses,
    row_losses_and_grads,
    weighted,
)

__all__ = ["jsd", "jsd_reference", "jsd_row_losses", "jsd_rows", "jsd_terms"]


def jsd(
    input: jax.Array,
    target: jax.Array,
    labels: jax.Array | None = None,
    *,
    beta: float = 0.5,
    ignore_index: int = -100,
    implementation: runtime.Implementation | None = None,
) -> jax.Array:
    r"""Generalised Jensen-Shannon divergence of a student from a teacher, summed over rows and averaged (Liger's
    ``LigerJSD``).

    With :math:`q = e^{\mathrm{input}}` (student) and :math:`p = e^{\mathrm{target}}` (teacher) per row, and
    :math:`m = \beta p + (1 - \beta) q`:

    .. math::
        \mathrm{JSD}_\beta = \beta\, \mathrm{KL}(p \,\|\, m) + (1 - \beta)\, \mathrm{KL}(q \,\|\, m)

    for :math:`0 < \beta < 1`; at Liger's limits ``beta=0`` is the forward KL :math:`\mathrm{KL}(p \,\|\, q)` and
    ``beta=1`` the reverse KL :math:`\mathrm{KL}(q \,\|\, p)` (not the limits of the formula, which vanish).
    The loss is the sum of the rows' divergences divided by the number of rows whose label is not ``ignore_index``
    (every row without ``labels``; 1 when none counts, so an all-ignored batch gives 0 and a zero gradient).
    Ignored rows contribute nothing. A class with probability 0 contributes 0 to a term it weighs
    (:math:`0 \log 0 = 0`): vocabularies masked to ``-inf`` in both operands give finite losses.

    Numerics: fp32 throughout, whatever the operands' dtypes; the loss is fp32 (Liger rounds it to the input's
    dtype). On the GPU the kernel's log of m is the hardware's approximate log2 (~1e-7 absolute beyond fp32
    rounding). The gradient is computed in the forward pass with the loss, in one read of both operands (as Liger
    does), kept in ``input.dtype`` and scaled by the cotangent in the backward pass. ``target`` gets no gradient (a
    teacher's), nor does ``labels``.

    Args:
        input: ``[..., V]`` the student's log-probabilities, float32, bfloat16 or float16 (float64 too under
            ``"xla"``).
        target: ``[..., V]`` the teacher's log-probabilities, any of those dtypes.
        labels: ``[...]`` integers or None; only which equal ``ignore_index`` matters (e.g. the shifted labels of
            an SFT batch).
        beta: ``β`` in ``[0, 1]``.
        ignore_index: label value of rows to skip.
        implementation: ``"triton"``, ``"interpret"``, ``"xla"`` or None for the default (see
            :mod:`liger_jax.runtime`).

    Returns:
        A scalar, fp32 (float64 for float64 operands under ``"xla"``).

    Raises:
        TypeError: an operand is not floating point, labels are not integers, or ignore_index is not an int.
        ValueError: operands of rank 0, of different shapes or without classes, labels not of shape
            ``input.shape[:-1]``, or beta outside ``[0, 1]``.

    Example:
        >>> loss = liger_jax.jsd(jax.nn.log_softmax(student_logits), jax.nn.log_softmax(teacher_logits), beta=0.5)
    """
    implementation = _dispatch.resolve(implementation, "jsd", np.size(input))
    divergence = _checked(input, target, labels, beta, ignore_index, implementation)
    labels = row_labels(labels, input.shape)
    if implementation == "xla":
        return reduced_reference(input, target, labels, divergence, "batchmean")
    return reduced_loss(input, target, labels, divergence, "batchmean")


def jsd_reference(
    input: jax.Array,
    target: jax.Array,
    labels: jax.Array | None = None,
    *,
    beta: float = 0.5,
    ignore_index: int = -100,
) -> jax.Array:
    """:func:`jsd` in plain jax.numpy: its specification and its ``"xla"`` implementation.

    Computes in ``promote(dtypes, float32)``, so float64 operands give a float64 oracle; the gradient comes from
    autodiff (``target`` under ``stop_gradient``). Arguments and result as :func:`jsd` (no argument checks).
    """
    divergence = _divergence(beta, ignore_index, labels is not None, "xla")
    return reduced_reference(input, target, row_labels(labels, input.shape), divergence, "batchmean")


def jsd_terms(input: jax.Array, target: jax.Array, divergence: Divergence) -> jax.Array:
    """The per-element terms of the JSD of log-probabilities ``input`` (student) and ``target`` (teacher) at
    ``divergence.beta``, ``[..., V]`` in their dtype; a row's divergence is their sum. See :func:`jsd`."""
    beta = divergence.beta
    # Where both log-probabilities are -inf every term is 0; the operands are zeroed there so that no NaN (from
    # -inf - -inf) reaches the gradient through the discarded branch.
    dead = (input == -jnp.inf) & (target == -jnp.inf)
    x, y = jnp.where(dead, 0.0, input), jnp.where(dead, 0.0, target)
    p, q = jnp.exp(y), jnp.exp(x)
    if beta == 0.0:
        terms = weighted(p, y - x)
    elif beta == 1.0:
        terms = weighted(q, x - y)
    else:
        log_m = jnp.logaddexp(math.log(beta) + y, math.log1p(-beta) + x)
        terms = weighted(beta * p, y - log_m) + weighted((1.0 - beta) * q, x - log_m)
    return jnp.where(dead, 0.0, terms)


def jsd_row_losses(
    student_logp: jax.Array,
    teacher_logp: jax.Array,
    labels: jax.Array | None = None,
    *,
    beta: float = 0.5,
    ignore_index: int = -100,
    implementation: runtime.Implementation | None = None,
) -> jax.Array:
    """Each row's JSD (not normalised), fp32 ``[...]``; 0 for ignored rows. One read of both operands.

    Args and the divergence as :func:`jsd`; the result is not differentiable under a kernel implementation (use
    :func:`jsd_rows` for the gradient). Arguments are checked as in :func:`jsd`.
    """
    implementation = runtime.resolve_implementation(implementation)
    divergence = _checked(student_logp, teacher_logp, labels, beta, ignore_index, implementation)
    return row_losses(divergence)(student_logp, teacher_logp, row_labels(labels, student_logp.shape))


def jsd_rows(
    student_logp: jax.Array,
    teacher_logp: jax.Array,
    labels: jax.Array | None,
    grad_scale: jax.Array,
    *,
    beta: float = 0.5,
    ignore_index: int = -100,
    implementation: runtime.Implementation | None = None,
) -> tuple[jax.Array, jax.Array]:
    """Each row's JSD and its gradient in the student's log-probabilities, from one read of both operands.

    For a fused loss that chains the gradient on itself (through the log-softmax and the head's matmul).

    Args:
        student_logp: ``[..., V]`` log-probabilities, as :func:`jsd`'s ``input``.
        teacher_logp: ``[..., V]`` log-probabilities, as :func:`jsd`'s ``target``.
        labels: ``[...]`` integers or None, as :func:`jsd`.
        grad_scale: ``[...]`` float: what each row's gradient is multiplied by (e.g. 1 / the counted rows).
        beta, ignore_index, implementation: as :func:`jsd`.

    Returns:
        ``(loss, dstudent)``: ``loss [...]`` fp32, each row's divergence (0 for ignored rows), and
        ``dstudent [..., V]`` in ``student_logp.dtype``, ``grad_scale[row] · d loss[row] / d student_logp``
        (0 for ignored rows). The teacher gets no gradient. Not differentiable itself under a kernel
        implementation.
    """
    implementation = runtime.resolve_implementation(implementation)
    divergence = _checked(student_logp, teacher_logp, labels, beta, ignore_index, implementation)
    labels = row_labels(labels, student_logp.shape)
    return row_losses_and_grads(divergence)(student_logp, teacher_logp, labels, grad_scale)


def _divergence(beta, ignore_index, has_labels, implementation) -> Divergence:
    return Divergence(
        "jsd", jsd_terms, implementation, beta=float(beta), ignore_index=int(ignore_index), has_labels=has_labels
    )


def _checked(input, target, labels, beta, ignore_index, implementation) -> Divergence:
    """The checks of :func:`jsd`, then its settings."""
    check_operands("input", input, "target", target, implementation)
    check_row_labels(labels, input.shape, ignore_index)
    if not 0.0 <= beta <= 1.0:
        raise ValueError(f"beta must be in [0, 1], got {beta!r}")
    return _divergence(beta, ignore_index, labels is not None, implementation)
