"""Flax modules backed by liger_jax kernels: ``nnx`` and ``linen`` drop-ins, and model swapping (``swap``)."""
