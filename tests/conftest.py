"""Test setup: Triton's interpreter on machines without a GPU, float64 references, strict rank promotion."""

import os

import jax

if jax.default_backend() == "cpu":
    # Must precede the first import of triton: Triton decides at decoration time whether a kernel is interpreted.
    os.environ.setdefault("TRITON_INTERPRET", "1")

jax.config.update("jax_enable_x64", True)
jax.config.update("jax_numpy_rank_promotion", "raise")
