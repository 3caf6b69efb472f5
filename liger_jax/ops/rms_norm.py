"""RMSNorm: reference, Triton launches, custom_vjp."""

import functools
from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np

from liger_jax import runtime
from liger_jax.ops import _checks, _dispatch
from liger_jax.ops._numerics import rounded
from liger_jax.ops._rows import ColumnSum, Rows, RowStats, row_launcher

CastingMode = Literal["llama", "gemma", "none"]
_CASTING_CODES = {"none": 0, "llama": 1, "gemma": 2}


def rms_norm(
    x: jax.Array,
    scale: jax.Array,
    *,
    epsilon: float = 1e-6,
    offset: float = 0.0,
    casting_mode: CastingMode = "llama",
    implementation: runtime.Implementation | None = None,
) -> jax.Array:
    r"""Root-mean-square normalisation over the last axis (Liger's RMSNorm).

    .. math::
        y = \frac{x}{\sqrt{\mathrm{mean}(x^2) + \epsilon}} \cdot (\mathrm{offset} + \mathrm{scale})

    Numerics: ``mean(x²)`` and ``rstd`` are always accumulated in fp32. ``casting_mode`` then says where rounding
    to ``x.dtype`` happens:

    * ``"llama"``: the normalised ``x · rstd`` is rounded to ``x.dtype``, then multiplied by ``offset + scale`` in
      fp32 and rounded once more (Llama, Mistral).
    * ``"gemma"``: everything in fp32, one rounding at the end (Gemma; also what ``flax.nnx.RMSNorm`` computes).
    * ``"none"``: ``rstd``, ``offset + scale`` and both products rounded to ``x.dtype``.

    The backward pass is computed in fp32 from the saved ``x`` and fp32 ``rstd`` (``y`` is not kept); dscale is
    summed from per-program fp32 partials, so gradients are bitwise reproducible.

    Args:
        x: ``[..., D]`` float32, bfloat16 or float16 (float64 too under ``"xla"``), rank ≥ 1; each leading
            index is one row.
        scale: ``[D]``, any of those float dtypes; dscale comes back in it.
        epsilon: added to ``mean(x²)``.
        offset: added to ``scale`` (1.0 for Gemma's ``(1 + w)`` weights).
        casting_mode: ``"llama"``, ``"gemma"`` or ``"none"``, as above.
        implementation: ``"triton"``, ``"interpret"``, ``"xla"`` or None for the default (see
            :mod:`liger_jax.runtime`).

    Returns:
        ``[..., D]`` array of ``x.dtype``.

    Raises:
        TypeError: x or scale is not floating point.
        ValueError: x has rank 0, scale is not ``(D,)`` or a setting is unknown.

    Example:
        >>> y = liger_jax.rms_norm(x, scale, epsilon=1e-6)
    """
    implementation = _dispatch.resolve(implementation, "rms_norm", np.size(x), _dispatch.row_length(x))
    _checks.check_floating("x", x, implementation)
    _checks.check_floating("scale", scale, implementation)
    _checks.check_min_rank("x", x, 1)
    _checks.check_shape("scale", scale, x.shape[-1:], "the last axis of x")
    _checks.check_choice("casting_mode", casting_mode, tuple(_CASTING_CODES))
    if implementation == "xla":
        return rms_norm_reference(x, scale, epsilon=epsilon, offset=offset, casting_mode=casting_mode)
    if x.size == 0:
        return jnp.zeros_like(x)
    return _rms_norm(x, scale, float(epsilon), float(offset), casting_mode, implementation)


def rms_norm_reference(
    x: jax.Array,
    scale: jax.Array,
    *,
    epsilon: float = 1e-6,
    offset: float = 0.0,
    casting_mode: CastingMode = "llama",
    rounding_dtype=None,
) -> jax.Array:
    """RMSNorm in plain jax.numpy: the specification of :func:`rms_norm` and its ``"xla"`` implementation.

    Computes in ``promote(x.dtype, float32)`` (float64 inputs stay float64) and rounds to ``rounding_dtype``
    (default ``x.dtype``) where ``casting_mode`` says. The roundings pass gradients straight through, so the
    gradient is the fp32 (or float64) gradient of the exact formula, as the kernels compute it. Tests get an exact
    oracle from float64 inputs with ``rounding_dtype`` set to the dtype under test. Shapes and dtypes as
    :func:`rms_norm`; the result has ``x.dtype``.
    """
    rounding_dtype = x.dtype if rounding_dtype is None else rounding_dtype
    compute = jnp.promote_types(x.dtype, jnp.float32)
    x_c = x.astype(compute)
    rstd = jax.lax.rsqrt(jnp.mean(x_c * x_c, axis=-1, keepdims=True) + epsilon)
    weight = (offset + scale.astype(compute)).reshape((1,) * (x.ndim - 1) + scale.shape)
    match casting_mode:
        case "llama":
            y = rounded(x_c * rstd, rounding_dtype) * weight
        case "gemma":
            y = x_c * rstd * weight
        case "none":
            y = rounded(x_c * rounded(rstd, rounding_dtype), rounding_dtype) * rounded(weight, rounding_dtype)
        case _:
            raise ValueError(f"casting_mode must be one of {tuple(_CASTING_CODES)}, got {casting_mode!r}")
    return rounded(y, rounding_dtype).astype(x.dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4, 5))
def _rms_norm(x, scale, epsilon, offset, casting_mode, implementation):
    y, _ = _forward_launcher(epsilon, offset, casting_mode, implementation)(x, scale)
    return y


def _rms_norm_fwd(x, scale, epsilon, offset, casting_mode, implementation):
    y, rstd = _forward_launcher(epsilon, offset, casting_mode, implementation)(x, scale)
    return y, (x, scale, rstd)


def _rms_norm_bwd(epsilon, offset, casting_mode, implementation, residuals, dy):
    del epsilon
    x, scale, rstd = residuals
    dx, dscale = _backward_launcher(offset, casting_mode, implementation)(dy, x, scale, rstd)
    return dx, dscale.astype(scale.dtype)


_rms_norm.defvjp(_rms_norm_fwd, _rms_norm_bwd)


def _forward_launcher(epsilon, offset, casting_mode, implementation):
    """``(x [..., D], scale [D]) -> (y [..., D] x.dtype, rstd [...] fp32)`` through the kernel, vmap-able."""
    from liger_jax.kernels import rms_norm as kernels

    return row_launcher(
        kernels.rms_norm_fwd,
        (Rows(), RowStats()),
        row_argnums=(0,),
        implementation=implementation,
        eps=epsilon,
        offset=offset,
        CASTING=_CASTING_CODES[casting_mode],
    )


def _backward_launcher(offset, casting_mode, implementation):
    """``(dy, x, scale, rstd) -> (dx [..., D] x.dtype, dscale [D] fp32)`` through the kernel, vmap-able."""
    from liger_jax.kernels import rms_norm as kernels

    return row_launcher(
        kernels.rms_norm_bwd,
        (Rows(), ColumnSum()),
        row_argnums=(0, 1, 3),
        implementation=implementation,
        shared_sums=1,
        offset=offset,
        CASTING=_CASTING_CODES[casting_mode],
    )
