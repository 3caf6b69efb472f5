"""liger_jax recipes for Tunix's Gemma4 (``tunix.models.gemma4.model``); :func:`liger_jax.flax_layers.apply_liger`
imports this module the first time it meets one of its classes.

* ``RMSNorm`` (x cast to fp32, ``x * rsqrt(mean(x²) + 1e-6) * scale``, one rounding to the module's ``dtype``; the
  scale starts at 1, no offset): liger's ``"gemma"`` casting mode, the module's dtype out. The parameter-free value
  norm inside the attention is Tunix's inline code and stays.
* ``FeedForward``: GeGLU. The mixture-of-experts layer (``moe.MoERagged``) is left as it is.
* ``Attention``'s ``apply_rope`` (rotate-half over the first ``rope_proportion`` of the pairs: the rest get an
  infinite timescale, so they are not rotated; ``positions / base_frequency ** ((2 / D) i) / scale_factor``, fp32
  tables), with each layer's own base, scale factor and proportion.
* ``Embedder.encode`` (the rows gathered, times ``sqrt(embed_dim)``, cast to ``dtype``): :func:`liger_jax.embedding`
  gathers, its gradient summed in fp32. The per-layer inputs' table (``encode_per_layer_input``) is left as it is.
"""

import jax.numpy as jnp
from tunix.models.gemma4 import model

from liger_jax.integrations.tunix import _recipes

_EPSILON = 1e-6  # Tunix's Gemma4 RMSNorm hard-codes it


def _half_tables(inputs, positions, base_frequency, scale_factor, rope_proportion):
    head_dim = inputs.shape[-1]
    rotated_pairs = int(rope_proportion * head_dim // 2)
    exponents = (2.0 / head_dim) * jnp.arange(0, rotated_pairs, dtype=jnp.float32)
    timescales = jnp.pad(base_frequency**exponents, (0, head_dim // 2 - rotated_pairs), constant_values=jnp.inf)
    return _recipes.sinusoids(positions, timescales, scale_factor)


_recipes.register(
    __name__,
    {
        model.RMSNorm: _recipes.rms_norm(weight="scale", epsilon=_EPSILON, casting_mode="gemma", dtype="module"),
        model.FeedForward: _recipes.gated_mlp("geglu", constrain=None),
        model.Attention: _recipes.rope("apply_rope", _half_tables),
        model.Embedder: _recipes.embedder(),
    },
)
