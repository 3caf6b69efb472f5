"""Softmax over one axis: reference, Triton launches, custom_vjp (the backward from the output)."""

import jax
import jax.numpy as jnp

from liger_jax import runtime
from liger_jax.ops import _row_maps


def softmax(x: jax.Array, *, axis: int = -1, implementation: runtime.Implementation | None = None) -> jax.Array:
    r"""Softmax along one axis (Liger's Softmax), as ``jax.nn.softmax(x, axis)``.

    .. math::
        y_i = \frac{e^{x_i - \max_j x_j}}{\sum_k e^{x_k - \max_j x_j}}

    Numerics: computed in fp32 whatever the input dtype and rounded once to ``x.dtype``. Entries of ``-inf`` (masked
    logits) get probability 0; a row that is ``-inf`` throughout is NaN, as in ``jax.nn.softmax``. The backward pass
    keeps only y (x is not saved) and computes ``dx = y · (dy - Σ dy · y)`` in fp32 from the y the forward rounded,
    one pass over ``(dy, y)``; dx comes back in ``x.dtype``. Each row's gradient sums to zero.

    Args:
        x: any shape of rank ≥ 1, float32, bfloat16 or float16 (float64 too under ``"xla"``).
        axis: the axis to normalise over, one int. The kernels work along the last axis: another axis is moved
            last and back, which costs XLA a transpose of x and of y (and of dy and dx in the backward pass).
        implementation: ``"triton"``, ``"interpret"``, ``"xla"`` or None for the default (see
            :mod:`liger_jax.runtime`).

    Returns:
        An array of x's shape and dtype whose slices along ``axis`` are probability vectors.

    Raises:
        TypeError: x is not floating point, or axis is not an int.
        ValueError: x has rank 0, or axis is out of range.

    Example:
        >>> probabilities = liger_jax.softmax(scores, axis=-1)
    """
    return _row_maps.along_axis(x, axis, implementation, "softmax", softmax_reference, _kernels)


def softmax_reference(x: jax.Array, *, axis: int = -1) -> jax.Array:
    """Softmax in plain jax.numpy: the specification of :func:`softmax` and its ``"xla"`` implementation.

    ``jax.nn.softmax`` computed in ``promote(x.dtype, float32)`` (float64 inputs stay float64) and rounded to x's
    dtype; its gradient is autodiff's.
    """
    compute = jnp.promote_types(x.dtype, jnp.float32)
    return jax.nn.softmax(x.astype(compute), axis=axis).astype(x.dtype)


def _kernels():
    """``(forward, backward)`` kernels, imported when first launched (the module imports triton)."""
    from liger_jax.kernels import softmax as kernels

    return kernels.softmax_fwd, kernels.softmax_bwd
