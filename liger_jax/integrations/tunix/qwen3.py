"""liger_jax recipes for Tunix's Qwen3 (``tunix.models.qwen3.model``); :func:`liger_jax.flax_layers.apply_liger`
imports this module the first time it meets one of its classes.

* ``RMSNorm`` (the decoder norms and the per-head ``q_norm``/``k_norm``; x and ``w`` cast to fp32,
  ``w * (x / sqrt(mean(x²) + norm_eps))``, one rounding to the module's ``dtype``): liger's ``"gemma"`` casting mode,
  the module's dtype out.
* ``MLP``: SwiGLU. The mixture-of-experts layer (megablox, TPU) is left as it is.
* ``Attention``'s ``apply_rope`` (rotate-half, ``positions / rope_theta ** (2i / D)``, the tables cast to the
  inputs' dtype). Tunix's Attention calls it without the config's ``rope_theta``, so the function's default applies,
  here as there.
* ``Embedder.encode`` (the rows gathered, then cast to ``dtype``): :func:`liger_jax.embedding` gathers, its
  gradient summed in fp32.
"""

from tunix.models.qwen3 import model

from liger_jax.integrations.tunix import _recipes


def _half_tables(inputs, positions, head_dim, rope_theta):
    cos, sin = _recipes.sinusoids(positions, _recipes.timescale(head_dim, rope_theta))
    return cos.astype(inputs.dtype), sin.astype(inputs.dtype)


_recipes.register(
    __name__,
    {
        model.RMSNorm: _recipes.rms_norm(weight="w", epsilon="norm_eps", casting_mode="gemma", dtype="module"),
        model.MLP: _recipes.gated_mlp("swiglu", constrain=lambda mlp, h: model.shard(h, mlp.shd_config.act_btf)),
        model.Attention: _recipes.rope("apply_rope", _half_tables),
        model.Embedder: _recipes.embedder(),
    },
)
