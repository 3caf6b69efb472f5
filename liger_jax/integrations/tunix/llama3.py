"""liger_jax recipes for Tunix's Llama3 (``tunix.models.llama3.model``); :func:`liger_jax.flax_layers.apply_liger`
imports this module the first time it meets one of its classes.

* ``RMSNorm`` (``w * x / sqrt(mean(x²) + norm_eps)``, the mean in fp32, one rounding to x's dtype): liger's
  ``"gemma"`` casting mode (fp32 throughout), x's dtype out.
* ``MLP`` (``down_proj(silu(gate_proj(x)) * up_proj(x))``): SwiGLU.
* ``Attention``'s ``apply_rope`` (rotate-half, ``positions / rope_theta ** (2i / D)``, fp32 tables). Tunix's
  Attention calls it without the config's ``rope_theta``, so the function's default applies, here as there; Tunix
  has no Llama 3.1 frequency scaling.
* ``Embedder.encode`` (``input_embedding[(x,)]``): :func:`liger_jax.embedding` gathers, its gradient summed in fp32.
"""

from tunix.models.llama3 import model

from liger_jax.integrations.tunix import _recipes


def _half_tables(inputs, positions, head_dim, rope_theta):
    del inputs
    return _recipes.sinusoids(positions, _recipes.timescale(head_dim, rope_theta))


_recipes.register(
    __name__,
    {
        model.RMSNorm: _recipes.rms_norm(weight="w", epsilon="norm_eps", casting_mode="gemma"),
        model.MLP: _recipes.gated_mlp("swiglu", constrain=lambda mlp, h: model.shard(h, mlp.shd_config.act_btf)),
        model.Attention: _recipes.rope("apply_rope", _half_tables),
        model.Embedder: _recipes.embedder(),
    },
)
