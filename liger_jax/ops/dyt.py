"""Dynamic Tanh (DyT): reference, Triton launches, custom_vjp."""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from liger_jax import runtime
from liger_jax.ops import _checks, _dispatch
from liger_jax.ops._heavy_rows import heavy_row_launcher
from liger_jax.ops._rows import ColumnSum, Rows, RowStats


def dyt(
    x: jax.Array,
    alpha: jax.Array,
    gamma: jax.Array,
    beta: jax.Array | None,
    *,
    implementation: runtime.Implementation | None = None,
) -> jax.Array:
    r"""Dynamic Tanh, the normalisation-free stand-in for LayerNorm (Zhu et al. 2025; Liger's DyT).

    .. math::
        y = \gamma \cdot \tanh(\alpha x) + \beta

    Numerics: everything in fp32, ``y`` rounded to ``x.dtype`` once. The forward pass saves only ``x``; the
    backward pass is fp32, with dgamma and dbeta summed from per-program fp32 partials and dalpha from per-row fp32
    sums (deterministic, no atomics).

    Args:
        x: ``[..., D]`` float32, bfloat16 or float16 (float64 too under ``"xla"``), rank ≥ 1.
        alpha: the learnt scalar, shape ``()`` or ``(1,)`` (Liger's), any of those float dtypes.
        gamma: ``[D]``, any of those float dtypes.
        beta: ``[D]``, any of those float dtypes, or None for no shift.
        implementation: ``"triton"``, ``"interpret"``, ``"xla"`` or None for the default (see
            :mod:`liger_jax.runtime`).

    Returns:
        ``[..., D]`` array of ``x.dtype``. Each gradient has its primal's shape and dtype.

    Raises:
        TypeError: an operand is not floating point.
        ValueError: x has rank 0, alpha has more than one element, gamma or beta is not ``(D,)``, or an unknown
            implementation.

    Example:
        >>> y = liger_jax.dyt(x, alpha, gamma, beta)
    """
    implementation = _dispatch.resolve(implementation, "dyt", np.size(x), _dispatch.row_length(x))
    _checks.check_floating("x", x, implementation)
    _checks.check_min_rank("x", x, 1)
    _checks.check_floating("alpha", alpha, implementation)
    if alpha.shape not in ((), (1,)):
        raise ValueError(f"alpha must be a scalar of shape () or (1,), got shape {alpha.shape}")
    for name, weight in (("gamma", gamma), ("beta", beta)):
        if weight is not None:
            _checks.check_floating(name, weight, implementation)
            _checks.check_shape(name, weight, x.shape[-1:], "the last axis of x")
    if implementation == "xla":
        return dyt_reference(x, alpha, gamma, beta)
    if x.size == 0:
        return jnp.zeros_like(x)
    # A missing beta is its identity: + 0 is exact in fp32.
    beta = jnp.zeros(x.shape[-1:], x.dtype) if beta is None else beta
    return _dyt(x, alpha, gamma, beta, implementation)


def dyt_reference(x: jax.Array, alpha: jax.Array, gamma: jax.Array, beta: jax.Array | None) -> jax.Array:
    """DyT in plain jax.numpy: the specification of :func:`dyt` and its ``"xla"`` implementation.

    Computes in ``promote(x.dtype, float32)`` (float64 inputs stay float64) and rounds to ``x.dtype`` at the end.
    Shapes and dtypes as :func:`dyt`.
    """
    compute = jnp.promote_types(x.dtype, jnp.float32)
    row_shape = (1,) * (x.ndim - 1) + x.shape[-1:]
    y = jnp.tanh(alpha.astype(compute).reshape(()) * x.astype(compute)) * gamma.astype(compute).reshape(row_shape)
    if beta is not None:
        y = y + beta.astype(compute).reshape(row_shape)
    return y.astype(x.dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _dyt(x, alpha, gamma, beta, implementation):
    (y,) = _forward(implementation, x.shape[-1])(x, alpha.reshape(()), gamma, beta)
    return y


def _dyt_fwd(x, alpha, gamma, beta, implementation):
    (y,) = _forward(implementation, x.shape[-1])(x, alpha.reshape(()), gamma, beta)
    return y, (x, alpha, gamma, beta)


def _dyt_bwd(implementation, residuals, dy):
    x, alpha, gamma, beta = residuals
    dx, dgamma, dbeta, dalpha_rows = _backward(implementation, x.shape[-1])(dy, x, alpha.reshape(()), gamma)
    dalpha = dalpha_rows.sum().reshape(alpha.shape).astype(alpha.dtype)
    return dx, dalpha, dgamma.astype(gamma.dtype), dbeta.astype(beta.dtype)


_dyt.defvjp(_dyt_fwd, _dyt_bwd)


def _forward(implementation, n_cols):
    """``(x [..., D], alpha [], gamma [D], beta [D]) -> (y [..., D] x.dtype,)`` through the kernel, vmap-able."""
    from liger_jax.kernels import dyt as kernels

    return heavy_row_launcher(
        kernels.dyt_fwd, (Rows(),), op="dyt", n_cols=n_cols, row_argnums=(0,), implementation=implementation
    )


def _backward(implementation, n_cols):
    """``(dy, x, alpha, gamma) -> (dx [..., D], dgamma [D] fp32, dbeta [D] fp32, dalpha per row [...] fp32)``."""
    from liger_jax.kernels import dyt as kernels

    return heavy_row_launcher(
        kernels.dyt_bwd,
        (Rows(), ColumnSum(), ColumnSum(), RowStats()),
        op="dyt",
        n_cols=n_cols,
        row_argnums=(0, 1),
        implementation=implementation,
    )
