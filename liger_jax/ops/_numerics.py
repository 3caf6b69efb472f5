"""Numerics helpers shared by the references."""

import jax
import jax.numpy as jnp


def rounded(value: jax.Array, dtype) -> jax.Array:
    """``value`` rounded to ``dtype`` and back; the gradient passes straight through the rounding.

    A reference in float64 rounds where the kernel rounds (to ``dtype``) and stays differentiable like the kernel,
    whose backward pass ignores its forward roundings.
    """
    finfo = jnp.finfo(dtype)
    # reduce_precision, not a pair of casts: XLA on GPU may drop a convert pair as excess precision. It flushes
    # dtype's subnormals, which the casts keep.
    normal = jax.lax.reduce_precision(value, finfo.nexp, finfo.nmant)
    subnormal = value.astype(dtype).astype(value.dtype)
    rounding_error = jnp.where(jnp.abs(value) < finfo.smallest_normal, subnormal, normal) - value
    return value + jax.lax.stop_gradient(rounding_error)
