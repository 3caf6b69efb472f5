"""Sparsemax over one axis: reference, Triton launches, custom_vjp (the backward from the output's support)."""

import jax
import jax.numpy as jnp

from liger_jax import runtime
from liger_jax.ops import _row_maps


def sparsemax(x: jax.Array, *, axis: int = -1, implementation: runtime.Implementation | None = None) -> jax.Array:
    r"""Sparsemax along one axis (Liger's Sparsemax; Martins & Astudillo, 2016): the Euclidean projection of each
    slice onto the probability simplex, a softmax with exact zeros.

    .. math::
        y = \operatorname*{arg\,min}_{p \ge 0,\ \sum_i p_i = 1} \lVert p - x \rVert^2, \qquad
        y_i = \max(x_i - \tau, 0), \quad \sum_i \max(x_i - \tau, 0) = 1

    Numerics: τ and y are computed in fp32 whatever the input dtype, y rounded once to ``x.dtype``. The kernels find
    τ without sorting (see ``liger_jax.kernels.sparsemax``). The backward pass keeps only y and computes, over the
    support :math:`S = \{i : y_i > 0\}` of the stored y,

    .. math::
        dx_i = dy_i - \frac{1}{|S|}\sum_{j \in S} dy_j \quad (i \in S), \qquad dx_i = 0 \quad (i \notin S)

    in fp32, one pass over ``(dy, y)``; dx comes back in ``x.dtype``. (A float16 output below 2⁻²⁴ rounds to 0 and
    leaves the support.) Tied inputs are treated alike: they are all in the support or all out of it.

    Args:
        x: any shape of rank ≥ 1, float32, bfloat16 or float16 (float64 too under ``"xla"``); finite.
        axis: the axis to project along, one int. The kernels work along the last axis: another axis is moved last
            and back, which costs XLA a transpose of x and of y (and of dy and dx in the backward pass).
        implementation: ``"triton"``, ``"interpret"``, ``"xla"`` or None for the default (see
            :mod:`liger_jax.runtime`).

    Returns:
        An array of x's shape and dtype whose slices along ``axis`` are sparse probability vectors.

    Raises:
        TypeError: x is not floating point, or axis is not an int.
        ValueError: x has rank 0, or axis is out of range.

    Example:
        >>> attention = liger_jax.sparsemax(scores, axis=-1)
    """
    return _row_maps.along_axis(x, axis, implementation, "sparsemax", sparsemax_reference, _kernels)


def sparsemax_reference(x: jax.Array, *, axis: int = -1) -> jax.Array:
    r"""Sparsemax in plain jax.numpy by sorting: the specification of :func:`sparsemax` and its ``"xla"``
    implementation.

    With :math:`z` the slice sorted in decreasing order, the support has the :math:`k` largest entries,
    :math:`k = \max\{j : 1 + j z_j > \sum_{i \le j} z_i\}`, and :math:`\tau = (\sum_{i \le k} z_i - 1) / k`.
    Computed in ``promote(x.dtype, float32)`` (float64 inputs stay float64) and rounded to x's dtype; its gradient
    is autodiff's through the sort, with the support :math:`\{i : x_i > \tau\}` (an entry equal to τ is outside).
    """
    compute = jnp.promote_types(x.dtype, jnp.float32)
    z = jnp.moveaxis(x.astype(compute), axis, -1)
    descending = -jnp.sort(-z, axis=-1)
    prefix_sums = jnp.cumsum(descending, axis=-1)
    ranks = jax.lax.broadcasted_iota(compute, z.shape, z.ndim - 1) + 1.0  # j, from 1, at every entry
    support_size = jnp.sum(1.0 + ranks * descending > prefix_sums, axis=-1, keepdims=True)
    tau = (jnp.take_along_axis(prefix_sums, support_size - 1, axis=-1) - 1.0) / support_size.astype(compute)
    # Not jnp.maximum, whose gradient at an entry equal to τ is split in halves: the support is {x > τ}.
    y = jnp.where(z > tau, z - tau, 0.0)
    return jnp.moveaxis(y, -1, axis).astype(x.dtype)


def _kernels():
    """``(forward, backward)`` kernels, imported when first launched (the module imports triton)."""
    from liger_jax.kernels import sparsemax as kernels

    return kernels.sparsemax_fwd, kernels.sparsemax_bwd
