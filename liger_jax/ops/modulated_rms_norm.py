"""Modulated RMSNorm (AdaLN): reference, Triton launches, custom_vjp."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from liger_jax import runtime
from liger_jax.ops import _checks, _dispatch, _tiling
from liger_jax.ops._heavy_rows import heavy_row_launcher
from liger_jax.ops._modulation_groups import grouped_backward, grouped_forward
from liger_jax.ops._numerics import rounded
from liger_jax.ops._rows import ColumnSum, Rows, RowStats
from liger_jax.ops.rms_norm import _CASTING_CODES, CastingMode, rms_norm_reference


def modulated_rms_norm(
    x: jax.Array,
    weight: jax.Array | None,
    scale: jax.Array,
    shift: jax.Array | None = None,
    *,
    epsilon: float = 1e-6,
    offset: float = 0.0,
    casting_mode: CastingMode = "llama",
    implementation: runtime.Implementation | None = None,
) -> jax.Array:
    r"""RMSNorm modulated by a per-example or per-token scale and shift (AdaLN; Liger's ModulatedRMSNorm).

    .. math::
        y = \mathrm{RMSNorm}(x) \cdot (1 + \mathrm{scale}) + \mathrm{shift}

    ``RMSNorm(x)`` is :func:`liger_jax.rms_norm` of ``x`` with ``weight`` (none: no weight, and ``offset`` is
    ignored, as Liger does), ``epsilon``, ``offset`` and ``casting_mode``, rounded to ``x.dtype`` as that op
    returns it; the modulation is fp32 and ``y`` is rounded to ``x.dtype`` once.

    The modulation broadcasts over x's leading axes from the front: ``scale`` is ``[D]`` (one modulation for every
    token), ``[B, D]`` or ``[B, 1, D]`` for ``x [B, T, D]`` (one per example), or shaped like x (one per token); in
    general ``scale.shape[:-1]``, less trailing 1s, must be a prefix of ``x.shape[:-1]``. ``shift`` has scale's
    shape. The forward pass saves ``x`` and fp32 rstd per row; the backward pass is fp32, and dweight (and a shared
    modulation's gradients) are summed from per-program fp32 partials (deterministic, no atomics). Each pass is one
    launch whose rows shard freely (and a shared modulation's rows, with the rows they modulate).

    Args:
        x: ``[..., D]`` float32, bfloat16 or float16 (float64 too under ``"xla"``), rank ≥ 1; D at most 16384 for
            the kernels.
        weight: ``[D]`` or None.
        scale: the modulation's scale, as above.
        shift: the modulation's shift, scale's shape, or None.
        epsilon: added to ``mean(x²)``.
        offset: added to ``weight`` (1.0 for Gemma's ``(1 + w)``).
        casting_mode: ``"llama"``, ``"gemma"`` or ``"none"``, as :func:`liger_jax.rms_norm`.
        implementation: ``"triton"``, ``"interpret"``, ``"xla"`` or None for the default (see
            :mod:`liger_jax.runtime`).

    Returns:
        ``[..., D]`` array of ``x.dtype``. Each gradient has its primal's shape and dtype.

    Raises:
        TypeError: an operand is not floating point.
        ValueError: shapes that do not broadcast as above, an unknown setting, or rows longer than 16384 for the
            kernels.

    Example:
        >>> y = liger_jax.modulated_rms_norm(x, weight, scale, shift)  # x [B, T, D], scale and shift [B, D]
    """
    implementation = _dispatch.resolve(implementation, "modulated_rms_norm", np.size(x), _dispatch.row_length(x))
    _checks.check_floating("x", x, implementation)
    _checks.check_min_rank("x", x, 1)
    if weight is not None:
        _checks.check_floating("weight", weight, implementation)
        _checks.check_shape("weight", weight, x.shape[-1:], "the last axis of x")
    _checks.check_floating("scale", scale, implementation)
    _checks.check_min_rank("scale", scale, 1)
    _checks.check_shape("scale", scale, scale.shape[:-1] + x.shape[-1:], "its last axis is x's")
    modulated = _modulated_axes(x.shape, scale.shape)
    if shift is not None:
        _checks.check_floating("shift", shift, implementation)
        _checks.check_shape("shift", shift, scale.shape, "scale's shape")
    _checks.check_choice("casting_mode", casting_mode, tuple(_CASTING_CODES))
    if implementation == "xla":
        return modulated_rms_norm_reference(
            x, weight, scale, shift, epsilon=epsilon, offset=offset, casting_mode=casting_mode
        )
    _checks.check_max_cols("x", x.shape[-1], _tiling.MAX_BACKWARD_TILE_COLS)
    if x.size == 0:
        return jnp.zeros_like(x)
    # No weight is a weight of ones without offset: x · 1 is exact, so the numerics do not change.
    offset = float(offset) if weight is not None else 0.0
    weight = jnp.ones(x.shape[-1:], x.dtype) if weight is None else weight
    settings = (float(epsilon), offset, casting_mode, implementation, modulated)
    return _modulated_rms_norm(x, weight, scale, shift, *settings)


def modulated_rms_norm_reference(
    x: jax.Array,
    weight: jax.Array | None,
    scale: jax.Array,
    shift: jax.Array | None = None,
    *,
    epsilon: float = 1e-6,
    offset: float = 0.0,
    casting_mode: CastingMode = "llama",
    rounding_dtype=None,
) -> jax.Array:
    """Modulated RMSNorm in plain jax.numpy: the specification of :func:`modulated_rms_norm` and its ``"xla"``
    implementation.

    ``RMSNorm(x)`` is :func:`liger_jax.rms_norm_reference`'s; the modulation is computed in
    ``promote(x.dtype, float32)`` and rounded to ``rounding_dtype`` (default ``x.dtype``), through which gradients
    pass straight, as the kernels compute them. Shapes and dtypes as :func:`modulated_rms_norm`.
    """
    rounding_dtype = x.dtype if rounding_dtype is None else rounding_dtype
    if weight is None:
        weight, offset = jnp.ones(x.shape[-1:], x.dtype), 0.0
    normed = rms_norm_reference(
        x, weight, epsilon=epsilon, offset=offset, casting_mode=casting_mode, rounding_dtype=rounding_dtype
    )
    compute = jnp.promote_types(x.dtype, jnp.float32)
    prefix = _modulated_axes(x.shape, scale.shape)
    broadcast_shape = x.shape[:prefix] + (1,) * (x.ndim - 1 - prefix) + x.shape[-1:]
    y = normed.astype(compute) * (1.0 + scale.astype(compute).reshape(broadcast_shape))
    if shift is not None:
        y = y + shift.astype(compute).reshape(broadcast_shape)
    return rounded(y, rounding_dtype).astype(x.dtype)


def _modulated_axes(x_shape, scale_shape) -> int:
    """How many leading axes of x the modulation varies along (x.ndim - 1: one per token); raises ValueError unless
    ``scale_shape[:-1]`` less trailing 1s is a prefix of ``x_shape[:-1]``."""
    leading = list(scale_shape[:-1])
    while leading and leading[-1] == 1:
        leading.pop()
    if tuple(leading) != tuple(x_shape[: len(leading)]) or len(leading) > len(x_shape) - 1:
        raise ValueError(
            f"scale must broadcast over x's leading axes from the front: scale.shape[:-1] less trailing 1s must be a "
            f"prefix of x.shape[:-1] = {tuple(x_shape[:-1])}, got scale shape {tuple(scale_shape)}"
        )
    return len(leading)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6, 7, 8))
def _modulated_rms_norm(x, weight, scale, shift, epsilon, offset, casting_mode, implementation, modulated):
    y, _ = _forward(x, weight, scale, shift, epsilon, offset, casting_mode, implementation, modulated)
    return y


def _modulated_rms_norm_fwd(x, weight, scale, shift, epsilon, offset, casting_mode, implementation, modulated):
    y, rstd = _forward(x, weight, scale, shift, epsilon, offset, casting_mode, implementation, modulated)
    return y, (x, weight, scale, shift, rstd)


def _modulated_rms_norm_bwd(epsilon, offset, casting_mode, implementation, modulated, residuals, dy):
    del epsilon
    x, weight, scale, shift, rstd = residuals
    from liger_jax.kernels import modulated_rms_norm as kernels

    settings = {"offset": offset, "CASTING": _CASTING_CODES[casting_mode]}
    if modulated == x.ndim - 1:
        backward = heavy_row_launcher(
            kernels.modulated_rms_norm_bwd_per_row,
            (Rows(), ColumnSum(), Rows(like=3)),
            op="modulated_rms_norm",
            n_cols=x.shape[-1],
            one_tile=True,
            row_argnums=(0, 1, 3, 4),
            implementation=implementation,
            **settings,
        )
        dx, dweight, dscale = backward(dy, x, weight, scale.reshape(x.shape), rstd)
        # y depends on shift elementwise: its cotangent is dy.
        dshift = dy
    else:
        n_groups, rows = _groups(modulated, x)
        dx, dweight, dscale, dshift = grouped_backward(implementation, **settings)(
            dy.reshape(n_groups, rows, -1),
            x.reshape(n_groups, rows, -1),
            weight,
            scale.reshape(n_groups, -1),
            rstd.reshape(n_groups, rows),
        )
        dx = dx.reshape(x.shape)
    dshift = None if shift is None else dshift.reshape(shift.shape).astype(shift.dtype)
    return dx, dweight.astype(weight.dtype), dscale.reshape(scale.shape).astype(scale.dtype), dshift


_modulated_rms_norm.defvjp(_modulated_rms_norm_fwd, _modulated_rms_norm_bwd)


def _groups(modulated: int, x: jax.Array) -> tuple[int, int]:
    """``(S, rows per group)``: the modulation rows and the rows of x each one modulates."""
    n_groups = math.prod(x.shape[:modulated])
    return n_groups, math.prod(x.shape[:-1]) // n_groups


def _forward(x, weight, scale, shift, epsilon, offset, casting_mode, implementation, modulated):
    """``(y [..., D] x.dtype, rstd [...] fp32)`` in one launch: a modulation row per row of x, or per group of rows
    (``ops._modulation_groups``)."""
    from liger_jax.kernels import modulated_rms_norm as kernels

    settings = {"eps": epsilon, "offset": offset, "CASTING": _CASTING_CODES[casting_mode]}
    settings["HAS_SHIFT"] = shift is not None
    # Without a shift the kernel never reads its shift operand: scale stands in.
    shift = scale if shift is None else shift
    if modulated == x.ndim - 1:
        forward = heavy_row_launcher(
            kernels.modulated_rms_norm_fwd,
            (Rows(), RowStats()),
            op="modulated_rms_norm",
            n_cols=x.shape[-1],
            one_tile=True,
            row_argnums=(0, 2, 3),
            implementation=implementation,
            ROWS_PER_MODULATION=1,
            **settings,
        )
        return forward(x, weight, scale.reshape(x.shape), shift.reshape(x.shape))
    n_groups, rows = _groups(modulated, x)
    y, rstd = grouped_forward(implementation, **settings)(
        x.reshape(n_groups, rows, -1), weight, scale.reshape(n_groups, -1), shift.reshape(n_groups, -1)
    )
    return y.reshape(x.shape), rstd.reshape(x.shape[:-1])
