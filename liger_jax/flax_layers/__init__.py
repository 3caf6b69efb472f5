"""Flax modules backed by liger_jax kernels: ``nnx`` and ``linen`` drop-ins, and model swapping (``swap``)."""

from liger_jax.flax_layers.swap import KINDS, apply_liger, liger_intercept, register_swap

__all__ = ["KINDS", "apply_liger", "liger_intercept", "register_swap"]
