"""liger_jax recipes for Tunix's Qwen2 / Qwen2.5 (``tunix.models.qwen2.model``);
:func:`liger_jax.flax_layers.apply_liger` imports this module the first time it meets one of its classes.

* ``RMSNorm`` (x and ``w`` cast to fp32, ``w * (x / sqrt(mean(x²) + norm_eps))``, one rounding to the module's
  ``dtype``): liger's ``"gemma"`` casting mode, the module's dtype out.
* ``MLP``: SwiGLU.
* ``Attention``'s ``apply_rotary_embedding(x, sin, cos)``: the model builds the ``[B, S, D/2]`` tables once (in x's
  dtype) and passes them to every layer; the kernel rotates with them as given.
* ``Embedder.encode`` (the rows gathered, then cast to ``dtype``): :func:`liger_jax.embedding` gathers, its
  gradient summed in fp32.
"""

from tunix.models.qwen2 import model

from liger_jax.integrations.tunix import _recipes


def _half_tables(x, sin, cos):
    del x
    return cos, sin


_recipes.register(
    __name__,
    {
        model.RMSNorm: _recipes.rms_norm(weight="w", epsilon="norm_eps", casting_mode="gemma", dtype="module"),
        model.MLP: _recipes.gated_mlp("swiglu", constrain=lambda mlp, h: model.shard(h, mlp.shd_config.act_btf)),
        model.Attention: _recipes.rope("apply_rotary_embedding", _half_tables, rotates="x"),
        model.Embedder: _recipes.embedder(),
    },
)
