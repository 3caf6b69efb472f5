"""LayerNorm: reference, Triton launches, custom_vjp."""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from liger_jax import runtime
from liger_jax.ops import _checks, _dispatch, _tiling
from liger_jax.ops._rows import ColumnSum, Rows, RowStats, row_launcher


def layer_norm(
    x: jax.Array,
    scale: jax.Array | None,
    bias: jax.Array | None,
    *,
    epsilon: float = 1e-5,
    implementation: runtime.Implementation | None = None,
) -> jax.Array:
    r"""Layer normalisation over the last axis (Liger's LayerNorm).

    .. math::
        y = \frac{x - \mathrm{mean}(x)}{\sqrt{\mathrm{var}(x) + \epsilon}} \cdot \mathrm{scale} + \mathrm{bias}

    Numerics: the mean, the variance (two-pass, ``mean((x - mean)²)``), the normalisation, scale and bias are all
    computed in fp32; ``y`` is rounded to ``x.dtype`` once. The forward pass saves ``x`` and the fp32 mean and
    rstd of each row (``y`` is not kept); the backward pass is one fp32 pass over the rows, and dscale/dbias are
    summed from per-program fp32 partials, so gradients are bitwise reproducible.

    Args:
        x: ``[..., D]`` float32, bfloat16 or float16 (float64 too under ``"xla"``), rank ≥ 1; each leading
            index is one row.
        scale: ``[D]`` of any of those float dtypes, or None for no scale; dscale comes back in its dtype.
        bias: ``[D]`` of any of those float dtypes, or None for no bias; dbias comes back in its dtype.
        epsilon: added to the variance.
        implementation: ``"triton"``, ``"interpret"``, ``"xla"`` or None for the default (see
            :mod:`liger_jax.runtime`).

    Returns:
        ``[..., D]`` array of ``x.dtype``.

    Raises:
        TypeError: x, scale or bias is not floating point.
        ValueError: x has rank 0, scale or bias is not ``(D,)``, or an unknown implementation.

    Example:
        >>> y = liger_jax.layer_norm(x, scale, bias, epsilon=1e-5)
    """
    implementation = _dispatch.resolve(implementation, "layer_norm", np.size(x), _dispatch.row_length(x))
    _checks.check_floating("x", x, implementation)
    _checks.check_min_rank("x", x, 1)
    for name, weight in (("scale", scale), ("bias", bias)):
        if weight is not None:
            _checks.check_floating(name, weight, implementation)
            _checks.check_shape(name, weight, x.shape[-1:], "the last axis of x")
    if implementation == "xla":
        return layer_norm_reference(x, scale, bias, epsilon=epsilon)
    if x.size == 0:
        return jnp.zeros_like(x)
    # A missing weight is its identity: x · 1 and x + 0 are exact in fp32, so the numerics do not change.
    scale = jnp.ones(x.shape[-1:], x.dtype) if scale is None else scale
    bias = jnp.zeros(x.shape[-1:], x.dtype) if bias is None else bias
    return _layer_norm(x, scale, bias, float(epsilon), implementation)


def layer_norm_reference(
    x: jax.Array, scale: jax.Array | None, bias: jax.Array | None, *, epsilon: float = 1e-5
) -> jax.Array:
    """LayerNorm in plain jax.numpy: the specification of :func:`layer_norm` and its ``"xla"`` implementation.

    Computes in ``promote(x.dtype, float32)`` (float64 inputs stay float64, the tests' exact oracle) and rounds
    to ``x.dtype`` at the end. Shapes and dtypes as :func:`layer_norm`.
    """
    compute = jnp.promote_types(x.dtype, jnp.float32)
    x_c = x.astype(compute)
    centred = x_c - jnp.mean(x_c, axis=-1, keepdims=True)
    y = centred * jax.lax.rsqrt(jnp.mean(centred * centred, axis=-1, keepdims=True) + epsilon)
    row_shape = (1,) * (x.ndim - 1) + x.shape[-1:]
    if scale is not None:
        y = y * scale.astype(compute).reshape(row_shape)
    if bias is not None:
        y = y + bias.astype(compute).reshape(row_shape)
    return y.astype(x.dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _layer_norm(x, scale, bias, epsilon, implementation):
    y, _, _ = _forward(implementation, epsilon)(x, scale, bias)
    return y


def _layer_norm_fwd(x, scale, bias, epsilon, implementation):
    y, mean, rstd = _forward(implementation, epsilon)(x, scale, bias)
    return y, (x, scale, bias, mean, rstd)


def _layer_norm_bwd(epsilon, implementation, residuals, dy):
    del epsilon
    x, scale, bias, mean, rstd = residuals
    sums_given = _tiling.separate_row_sums(x.shape[-1], _tiling.current_override())
    # Without SUMS_GIVEN the kernel reads no row sums: mean and rstd stand in for them.
    sums = _row_sums(implementation)(dy, x, scale, mean, rstd) if sums_given else (mean, rstd)
    dx, dscale, dbias = _backward(implementation, sums_given)(dy, x, scale, mean, rstd, *sums)
    return dx, dscale.astype(scale.dtype), dbias.astype(bias.dtype)


_layer_norm.defvjp(_layer_norm_fwd, _layer_norm_bwd)


def _forward(implementation, epsilon):
    """``(x [..., D], scale [D], bias [D]) -> (y [..., D] x.dtype, mean [...] fp32, rstd [...] fp32)``."""
    from liger_jax.kernels import layer_norm as kernels

    return row_launcher(
        kernels.layer_norm_fwd,
        (Rows(), RowStats(), RowStats()),
        row_argnums=(0,),
        implementation=implementation,
        eps=epsilon,
    )


def _row_sums(implementation):
    """``(dy, x, scale, mean, rstd) -> (Σ g [...] fp32, Σ g · n [...] fp32)`` of each row, g = dy · scale and n the
    normalised x."""
    from liger_jax.kernels import layer_norm as kernels

    return row_launcher(
        kernels.layer_norm_bwd_row_sums,
        (RowStats(), RowStats()),
        row_argnums=(0, 1, 3, 4),
        implementation=implementation,
    )


def _backward(implementation, sums_given):
    """``(dy, x, scale, mean, rstd, sum_g, sum_gn) -> (dx [..., D] x.dtype, dscale [D] fp32, dbias [D] fp32)``; the
    row sums (``_row_sums``'s) are read only where ``sums_given``."""
    from liger_jax.kernels import layer_norm as kernels

    return row_launcher(
        kernels.layer_norm_bwd,
        (Rows(), ColumnSum(), ColumnSum()),
        row_argnums=(0, 1, 3, 4, 5, 6),
        implementation=implementation,
        shared_sums=2,
        SUMS_GIVEN=sums_given,
    )
