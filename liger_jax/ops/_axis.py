"""Ops over one axis of any position, computed by kernels over the last axis."""

import operator
from collections.abc import Callable

import jax
import jax.numpy as jnp


def normalized_axis(name: str, axis: object, ndim: int) -> int:
    """``axis`` as a non-negative index into ``ndim`` axes.

    Raises:
        TypeError: ``axis`` is not an int (a tuple of axes, a float, a bool).
        ValueError: ``axis`` is outside ``[-ndim, ndim)`` (every axis is, for a rank-0 array).
    """
    if isinstance(axis, bool) or not hasattr(axis, "__index__"):
        raise TypeError(f"{name} must be an int naming one axis, got {axis!r}")
    axis = operator.index(axis)
    if not -ndim <= axis < ndim:
        raise ValueError(f"{name}={axis} is out of range for an array of rank {ndim}; it must lie in [-{ndim}, {ndim})")
    return axis % ndim


def over_last_axis(fn: Callable[[jax.Array], jax.Array], x: jax.Array, axis: int) -> jax.Array:
    """``fn`` (a map over the last axis) applied along ``axis`` instead: ``axis`` is moved last and back, a
    transpose that XLA materialises, unless ``axis`` already is the last."""
    if axis == x.ndim - 1:
        return fn(x)
    return jnp.moveaxis(fn(jnp.moveaxis(x, axis, -1)), -1, axis)
