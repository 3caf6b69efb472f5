"""PolyNorm: reference, Triton launches, custom_vjp."""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from liger_jax import runtime
from liger_jax.ops import _checks, _dispatch, _tiling
from liger_jax.ops._heavy_rows import heavy_row_launcher
from liger_jax.ops._rows import Rows, RowStats


def poly_norm(
    x: jax.Array,
    weight: jax.Array,
    bias: jax.Array,
    *,
    epsilon: float = 1e-6,
    implementation: runtime.Implementation | None = None,
) -> jax.Array:
    r"""PolyNorm, the polynomial-composition activation's normalisation (Zhuo et al. 2024, PolyCom; Liger's PolyNorm).

    .. math::
        y = w_0 \, n(x^3) + w_1 \, n(x^2) + w_2 \, n(x) + b, \qquad n(u) = \frac{u}{\sqrt{\mathrm{mean}(u^2) +
        \epsilon}}

    with the means over the last axis. Numerics: powers, means, rstd and the sum all in fp32, ``y`` rounded to
    ``x.dtype`` once. The forward pass saves ``x`` and the three fp32 rstd of each row; the backward pass is fp32,
    and dweight/dbias are summed from per-row fp32 terms (deterministic, no atomics).

    Args:
        x: ``[..., D]`` float32, bfloat16 or float16 (float64 too under ``"xla"``), rank ≥ 1, D at most
            ``MAX_BACKWARD_TILE_COLS`` (16384) for the kernels.
        weight: ``(3,)``: ``(w0, w1, w2)``, any of those float dtypes.
        bias: the scalar b, shape ``()`` or ``(1,)``, any of those float dtypes.
        epsilon: added to each mean of squares.
        implementation: ``"triton"``, ``"interpret"``, ``"xla"`` or None for the default (see
            :mod:`liger_jax.runtime`).

    Returns:
        ``[..., D]`` array of ``x.dtype``. Each gradient has its primal's shape and dtype.

    Raises:
        TypeError: an operand is not floating point.
        ValueError: x has rank 0 or (for the kernels) rows longer than 16384, weight is not ``(3,)``, bias has more
            than one element, or an unknown implementation.

    Example:
        >>> y = liger_jax.poly_norm(x, jnp.full((3,), 1 / 3), jnp.ones(()))
    """
    implementation = _dispatch.resolve(implementation, "poly_norm", np.size(x))
    _checks.check_floating("x", x, implementation)
    _checks.check_min_rank("x", x, 1)
    _checks.check_floating("weight", weight, implementation)
    _checks.check_shape("weight", weight, (3,), "one weight per power of x")
    _checks.check_floating("bias", bias, implementation)
    if bias.shape not in ((), (1,)):
        raise ValueError(f"bias must be a scalar of shape () or (1,), got shape {bias.shape}")
    if implementation == "xla":
        return poly_norm_reference(x, weight, bias, epsilon=epsilon)
    _checks.check_max_cols("x", x.shape[-1], _tiling.MAX_BACKWARD_TILE_COLS)
    if x.size == 0:
        return jnp.zeros_like(x)
    return _poly_norm(x, weight, bias, float(epsilon), implementation)


def poly_norm_reference(x: jax.Array, weight: jax.Array, bias: jax.Array, *, epsilon: float = 1e-6) -> jax.Array:
    """PolyNorm in plain jax.numpy: the specification of :func:`poly_norm` and its ``"xla"`` implementation.

    Computes in ``promote(x.dtype, float32)`` (float64 inputs stay float64) and rounds to ``x.dtype`` at the end.
    Shapes and dtypes as :func:`poly_norm`.
    """
    compute = jnp.promote_types(x.dtype, jnp.float32)
    x_c = x.astype(compute)
    w = weight.astype(compute)

    def normalized(u):
        return u * jax.lax.rsqrt(jnp.mean(u * u, axis=-1, keepdims=True) + epsilon)

    y = w[0] * normalized(x_c**3) + w[1] * normalized(x_c**2) + w[2] * normalized(x_c) + bias.astype(compute).sum()
    return y.astype(x.dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _poly_norm(x, weight, bias, epsilon, implementation):
    y, *_ = _forward(epsilon, implementation, x.shape[-1])(x, *weight, bias.reshape(()))
    return y


def _poly_norm_fwd(x, weight, bias, epsilon, implementation):
    y, *rstd = _forward(epsilon, implementation, x.shape[-1])(x, *weight, bias.reshape(()))
    return y, (x, weight, bias, *rstd)


def _poly_norm_bwd(epsilon, implementation, residuals, dy):
    del epsilon
    x, weight, bias, *rstd = residuals
    dx, *row_terms = _backward(implementation, x.shape[-1])(dy, x, *weight, *rstd)
    dweight, dbias = jnp.stack([term.sum() for term in row_terms[:3]]), row_terms[3].sum()
    return dx, dweight.astype(weight.dtype), dbias.reshape(bias.shape).astype(bias.dtype)


_poly_norm.defvjp(_poly_norm_fwd, _poly_norm_bwd)


def _forward(epsilon, implementation, n_cols):
    """``(x [..., D], w0, w1, w2, b []) -> (y [..., D] x.dtype, rstd of x³, x², x [...] fp32)``, vmap-able."""
    from liger_jax.kernels import poly_norm as kernels

    return heavy_row_launcher(
        kernels.poly_norm_fwd,
        (Rows(), RowStats(), RowStats(), RowStats()),
        op="poly_norm",
        n_cols=n_cols,
        one_tile=True,
        row_argnums=(0,),
        implementation=implementation,
        eps=epsilon,
    )


def _backward(implementation, n_cols):
    """``(dy, x, w0, w1, w2, rstd3, rstd2, rstd1) -> (dx [..., D], dw0, dw1, dw2, dbias terms per row [...] fp32)``."""
    from liger_jax.kernels import poly_norm as kernels

    return heavy_row_launcher(
        kernels.poly_norm_bwd,
        (Rows(), RowStats(), RowStats(), RowStats(), RowStats()),
        op="poly_norm",
        n_cols=n_cols,
        one_tile=True,
        row_argnums=(0, 1, 5, 6, 7),
        implementation=implementation,
    )
