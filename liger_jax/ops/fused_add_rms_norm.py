"""Fused residual add + RMSNorm: reference, Triton launches, custom_vjp."""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from liger_jax import runtime
from liger_jax.ops import _checks, _dispatch
from liger_jax.ops._numerics import rounded
from liger_jax.ops._rows import ColumnSum, Rows, RowStats, row_launcher
from liger_jax.ops.rms_norm import _CASTING_CODES, CastingMode, rms_norm_reference
from liger_jax.ops.rms_norm import _forward_launcher as _rms_norm_forward


def fused_add_rms_norm(
    x: jax.Array,
    residual: jax.Array | None,
    scale: jax.Array,
    *,
    epsilon: float = 1e-6,
    offset: float = 0.0,
    casting_mode: CastingMode = "llama",
    implementation: runtime.Implementation | None = None,
) -> tuple[jax.Array, jax.Array]:
    r"""The residual add of a pre-norm block fused with the RMSNorm that follows it (Liger's FusedAddRMSNorm).

    .. math::
        s = x + \mathrm{residual}, \qquad
        y = \frac{s}{\sqrt{\mathrm{mean}(s^2) + \epsilon}} \cdot (\mathrm{offset} + \mathrm{scale})

    One kernel reads ``x`` and ``residual`` once and writes both ``y`` and ``s``, instead of an add that writes
    ``s`` and a norm that reads it back. With ``residual`` None there is no add: ``s`` is ``x`` itself, as for a
    pre-norm block's first norm, whose input is also the residual stream; the backward still adds the cotangent
    of ``s`` inside the norm's kernel, instead of in an add of its own.

    Numerics: ``s`` is ``x + residual`` rounded to ``x.dtype`` (the native add), and ``y`` is exactly
    ``rms_norm(s, scale, epsilon=epsilon, offset=offset, casting_mode=casting_mode)`` (see
    :func:`liger_jax.rms_norm` for ``casting_mode``). The forward pass saves ``s`` (an output anyway) and the
    fp32 rstd; the backward pass adds the cotangent of ``s`` to RMSNorm's dx in fp32 and gives that one array to
    both ``x`` and ``residual``; dscale is summed from per-program fp32 partials (bitwise reproducible).

    Args:
        x: ``[..., D]`` float32, bfloat16 or float16 (float64 too under ``"xla"``), rank ≥ 1; each leading
            index is one row.
        residual: the same shape and dtype as ``x``, or None (``s = x``).
        scale: ``[D]``, any of those float dtypes; dscale comes back in it.
        epsilon: added to ``mean(s²)``.
        offset: added to ``scale`` (1.0 for Gemma's ``(1 + w)`` weights).
        casting_mode: ``"llama"``, ``"gemma"`` or ``"none"``, as in :func:`liger_jax.rms_norm`.
        implementation: ``"triton"``, ``"interpret"``, ``"xla"`` or None for the default (see
            :mod:`liger_jax.runtime`).

    Returns:
        ``(y, s)``: the normalised sum and the sum itself, both ``[..., D]`` of ``x.dtype``; ``s`` is the next
        block's residual (``x`` itself when ``residual`` is None). Gradients: ``x`` and ``residual`` each get
        ``ds``, the cotangent of ``s`` plus RMSNorm's backward at ``s``.

    Raises:
        TypeError: x, residual or scale is not floating point, or residual's dtype differs from x's.
        ValueError: x has rank 0, residual's shape differs from x's, scale is not ``(D,)`` or a setting is unknown.

    Example:
        >>> hidden, residual = liger_jax.fused_add_rms_norm(attention_out, residual, scale)
    """
    implementation = _dispatch.resolve(implementation, "fused_add_rms_norm", np.size(x), _dispatch.row_length(x))
    _checks.check_floating("x", x, implementation)
    _checks.check_floating("scale", scale, implementation)
    _checks.check_min_rank("x", x, 1)
    if residual is not None:
        _checks.check_floating("residual", residual, implementation)
        _checks.check_shape("residual", residual, x.shape, "the shape of x")
        _checks.check_dtype("residual", residual, x.dtype, "the dtype of x")
    _checks.check_shape("scale", scale, x.shape[-1:], "the last axis of x")
    _checks.check_choice("casting_mode", casting_mode, tuple(_CASTING_CODES))
    if implementation == "xla":
        return fused_add_rms_norm_reference(
            x, residual, scale, epsilon=epsilon, offset=offset, casting_mode=casting_mode
        )
    if x.size == 0:
        return jnp.zeros_like(x), jnp.zeros_like(x)
    settings = (float(epsilon), float(offset), casting_mode, implementation)
    if residual is None:
        return _rms_norm_passing_input(x, scale, *settings)
    return _fused_add_rms_norm(x, residual, scale, *settings)


def fused_add_rms_norm_reference(
    x: jax.Array,
    residual: jax.Array | None,
    scale: jax.Array,
    *,
    epsilon: float = 1e-6,
    offset: float = 0.0,
    casting_mode: CastingMode = "llama",
    rounding_dtype=None,
) -> tuple[jax.Array, jax.Array]:
    """Fused add + RMSNorm in plain jax.numpy: the specification of :func:`fused_add_rms_norm` and its ``"xla"``
    implementation.

    The sum is computed in ``promote(x.dtype, float32)`` and rounded to ``rounding_dtype`` (default ``x.dtype``),
    then normalised by :func:`liger_jax.rms_norm_reference` with the same ``rounding_dtype``. Roundings pass
    gradients straight through, so float64 inputs with ``rounding_dtype`` set to the dtype under test give the
    tests an exact oracle. Shapes and dtypes as :func:`fused_add_rms_norm`.
    """
    rounding_dtype = x.dtype if rounding_dtype is None else rounding_dtype
    compute = jnp.promote_types(x.dtype, jnp.float32)
    if residual is None:
        total = x
    else:
        total = rounded(x.astype(compute) + residual.astype(compute), rounding_dtype).astype(x.dtype)
    normed = rms_norm_reference(
        total, scale, epsilon=epsilon, offset=offset, casting_mode=casting_mode, rounding_dtype=rounding_dtype
    )
    return normed, total


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5, 6))
def _fused_add_rms_norm(x, residual, scale, epsilon, offset, casting_mode, implementation):
    normed, total, _ = _forward(epsilon, offset, casting_mode, implementation)(x, residual, scale)
    return normed, total


def _fused_add_rms_norm_fwd(x, residual, scale, epsilon, offset, casting_mode, implementation):
    normed, total, rstd = _forward(epsilon, offset, casting_mode, implementation)(x, residual, scale)
    return (normed, total), (total, scale, rstd)


def _fused_add_rms_norm_bwd(epsilon, offset, casting_mode, implementation, residuals, cotangents):
    del epsilon
    total, scale, rstd = residuals
    dnormed, dtotal = cotangents
    dsum, dscale = _backward(offset, casting_mode, implementation)(dnormed, dtotal, total, scale, rstd)
    return dsum, dsum, dscale.astype(scale.dtype)


_fused_add_rms_norm.defvjp(_fused_add_rms_norm_fwd, _fused_add_rms_norm_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4, 5))
def _rms_norm_passing_input(x, scale, epsilon, offset, casting_mode, implementation):
    normed, _ = _rms_norm_forward(epsilon, offset, casting_mode, implementation)(x, scale)
    return normed, x


def _rms_norm_passing_input_fwd(x, scale, epsilon, offset, casting_mode, implementation):
    normed, rstd = _rms_norm_forward(epsilon, offset, casting_mode, implementation)(x, scale)
    return (normed, x), (x, scale, rstd)


def _rms_norm_passing_input_bwd(epsilon, offset, casting_mode, implementation, residuals, cotangents):
    dx, _, dscale = _fused_add_rms_norm_bwd(epsilon, offset, casting_mode, implementation, residuals, cotangents)
    return dx, dscale


_rms_norm_passing_input.defvjp(_rms_norm_passing_input_fwd, _rms_norm_passing_input_bwd)


def _forward(epsilon, offset, casting_mode, implementation):
    """``(x, residual, scale) -> (y [..., D], s [..., D], rstd [...] fp32)`` through the kernel, vmap-able."""
    from liger_jax.kernels import rms_norm as kernels

    return row_launcher(
        kernels.fused_add_rms_norm_fwd,
        (Rows(), Rows(), RowStats()),
        row_argnums=(0, 1),
        implementation=implementation,
        eps=epsilon,
        offset=offset,
        CASTING=_CASTING_CODES[casting_mode],
    )


def _backward(offset, casting_mode, implementation):
    """``(dy, ds, s, scale, rstd) -> (dx = dresidual [..., D] x.dtype, dscale [D] fp32)``.

    dx gets a buffer of its own: written over ds, it would cost XLA a copy whenever ds is still live (as when the
    sum's cotangent is the sum itself, a residual of this very backward)."""
    from liger_jax.kernels import rms_norm as kernels

    return row_launcher(
        kernels.fused_add_rms_norm_bwd,
        (Rows(), ColumnSum()),
        row_argnums=(0, 1, 2, 4),
        implementation=implementation,
        shared_sums=1,
        offset=offset,
        CASTING=_CASTING_CODES[casting_mode],
    )
