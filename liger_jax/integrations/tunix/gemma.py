"""liger_jax recipes for Tunix's Gemma and Gemma 2 (``tunix.models.gemma.model``);
:func:`liger_jax.flax_layers.apply_liger` imports this module the first time it meets one of its classes.

* ``RMSNorm`` (``x * rsqrt(mean(x²) + 1e-6) * (1 + scale)``, computed in x's dtype, rounded after each product):
  liger's ``"none"`` casting mode with offset 1, x's dtype promoted with the scale's out. Equal dtypes (Tunix's
  case: activations take the params' dtype) give Tunix's roundings; the rsqrt is taken in fp32 before rounding.
* ``FeedForward`` (``down_proj(gelu_tanh(gate_proj(x)) * up_proj(x))``): GeGLU.
* ``Attention``'s ``apply_rope`` (rotate-half, ``positions / max_wavelength ** (2i / D)``, fp32 tables).
* ``Embedder.encode`` (the rows gathered, times ``sqrt(embed_dim)`` in their dtype): :func:`liger_jax.embedding`
  gathers, its gradient summed in fp32.
"""

from tunix.models.gemma import model

from liger_jax.integrations.tunix import _recipes

_EPSILON = 1e-6  # Tunix's Gemma RMSNorm hard-codes it


def _half_tables(inputs, positions, head_dim, max_wavelength):
    del inputs
    return _recipes.sinusoids(positions, _recipes.timescale(head_dim, max_wavelength))


_recipes.register(
    __name__,
    {
        model.RMSNorm: _recipes.rms_norm(
            weight="scale", epsilon=_EPSILON, casting_mode="none", offset=1.0, dtype="promoted"
        ),
        model.FeedForward: _recipes.gated_mlp(
            "geglu", constrain=lambda mlp, h: model.shard(h, mlp.config.shd_config.act_btf)
        ),
        model.Attention: _recipes.rope("apply_rope", _half_tables),
        model.Embedder: _recipes.embedder(),
    },
)
