"""liger_jax recipes for Tunix's Gemma3 (``tunix.models.gemma3.model``); :func:`liger_jax.flax_layers.apply_liger`
imports this module the first time it meets one of its classes.

* ``RMSNorm`` (the decoder norms, the per-head query/key norms and the vision soft-embedding norm;
  ``x * rsqrt(mean(x²) + 1e-6) * (1 + scale)`` computed in x's dtype, rounded after each product): liger's
  ``"none"`` casting mode with offset 1, x's dtype promoted with the scale's out. Equal dtypes (Tunix's case:
  activations take the params' dtype) give Tunix's roundings; the rsqrt is taken in fp32 before rounding.
* ``FeedForward`` (``down_proj(gelu_tanh(gate_proj(x)) * up_proj(x))``): GeGLU.
* ``Attention``'s ``apply_rope`` (rotate-half, ``positions / base_frequency ** (2i / D) / scale_factor``, fp32
  tables), with each layer's own base and scale factor (local sliding-window layers and global ones differ).
* ``Embedder.encode`` (the rows gathered, times ``sqrt(embed_dim)`` in their dtype): :func:`liger_jax.embedding`
  gathers, its gradient summed in fp32. ``encode_vision`` is left as it is.

The SigLIP vision encoder's ``nnx.LayerNorm`` is swapped by the built-in ``layer_norm`` swap.
"""

from tunix.models.gemma3 import model

from liger_jax.integrations.tunix import _recipes

_EPSILON = 1e-6  # Tunix's Gemma3 RMSNorm hard-codes it


def _half_tables(inputs, positions, head_dim, base_frequency, scale_factor):
    del inputs
    return _recipes.sinusoids(positions, _recipes.timescale(head_dim, base_frequency), scale_factor)


_recipes.register(
    __name__,
    {
        model.RMSNorm: _recipes.rms_norm(
            weight="scale", epsilon=_EPSILON, casting_mode="none", offset=1.0, dtype="promoted"
        ),
        model.FeedForward: _recipes.gated_mlp(
            "geglu", constrain=lambda mlp, h: model.sharding_utils.shard(h, mlp.config.shd_config.act_btf)
        ),
        model.Attention: _recipes.rope("apply_rope", _half_tables),
        model.Embedder: _recipes.embedder(),
    },
)
