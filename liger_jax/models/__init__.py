"""Reference models written with plain Flax parts, and the liger swaps for their own classes.

Importing this package registers those swaps (:mod:`liger_jax.models.llama_liger`), so
:func:`liger_jax.flax_layers.apply_liger` turns a :class:`LlamaForCausalLM` into the kernel-backed model.
"""

from liger_jax.models import llama_liger
from liger_jax.models.llama import PRESETS, LlamaConfig, LlamaForCausalLM, llama_config

__all__ = ["PRESETS", "LlamaConfig", "LlamaForCausalLM", "llama_config", "llama_liger"]
