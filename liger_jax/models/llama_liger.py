"""The liger swaps of :mod:`liger_jax.models.llama`'s own classes, registered with
:func:`liger_jax.flax_layers.register_swap` so that :func:`~liger_jax.flax_layers.apply_liger` replaces

* :class:`~liger_jax.models.llama.RotaryEmbedding` by :class:`liger_jax.flax_layers.nnx.RotaryEmbedding`
  (kind ``"rope"``),
* :class:`~liger_jax.models.llama.LlamaMLP` by :class:`liger_jax.flax_layers.nnx.SwiGLUMLP` on the same three
  projections (kind ``"swiglu"``),
* :class:`~liger_jax.models.llama.LMHead` by :class:`LigerLMHead` (kind ``"fused_linear_cross_entropy"``),
* :class:`~liger_jax.models.llama.LlamaDecoderLayer` by :class:`LigerLlamaDecoderLayer` (kind
  ``"fused_add_rms_norm"``).

Each replacement holds the original's submodules and Params and changes only how they are computed.
"""

from __future__ import annotations

import jax
from flax import nnx

from liger_jax import runtime
from liger_jax.flax_layers import nnx as liger_nnx
from liger_jax.flax_layers.swap import register_swap, swapped_or_none
from liger_jax.models.llama import IGNORE_INDEX, LlamaDecoderLayer, LlamaMLP, LMHead, RotaryEmbedding


class LigerLMHead(LMHead):
    """:class:`LMHead` whose loss is :class:`liger_jax.flax_layers.nnx.FusedLinearCrossEntropy`: the projection is
    fused into the cross-entropy and ``[B, S, V]`` logits never exist. Calling it still returns logits."""

    def __init__(
        self,
        embed: nnx.Embed | None,
        linear: nnx.Linear | None,
        *,
        implementation: runtime.Implementation | None = None,
    ):
        self.embed, self.linear = embed, linear
        self.implementation = implementation

    def loss(self, hidden: jax.Array, labels: jax.Array, *, ignore_index: int = IGNORE_INDEX) -> jax.Array:
        """Mean cross-entropy over labels that are not ``ignore_index`` (float32 scalar), as :meth:`LMHead.loss`.

        Args:
            hidden: ``[..., H]`` final hidden states.
            labels: ``hidden.shape[:-1]`` integer targets in ``[0, V)`` or ``ignore_index``.
            ignore_index: the label value that does not count.
        """
        head = self.embed if self.embed is not None else self.linear
        fused = liger_nnx.FusedLinearCrossEntropy(ignore_index=ignore_index, implementation=self.implementation)
        return fused(head, hidden, labels)


class LigerLlamaDecoderLayer(LlamaDecoderLayer):
    """:class:`LlamaDecoderLayer` whose residual add after the attention and the RMSNorm before the MLP are one
    kernel (:meth:`liger_jax.flax_layers.nnx.RMSNorm.fused_add`): the add's pass is saved, and the backward adds the
    residual's cotangent inside the norm's kernel. The input norm passes the layer's input on as the residual
    (``fused_add`` without a residual), so its backward adds the residual stream's cotangent inside its kernel too.
    The same submodules and Params; the same values."""

    def __init__(
        self,
        layer: LlamaDecoderLayer,
        input_layernorm: liger_nnx.RMSNorm,
        post_attention_layernorm: liger_nnx.RMSNorm,
    ):
        self.input_layernorm = input_layernorm
        self.self_attn = layer.self_attn
        self.post_attention_layernorm = post_attention_layernorm
        self.mlp = layer.mlp

    def __call__(self, x: jax.Array, positions: jax.Array) -> jax.Array:
        """``x [B, S, H]`` → ``[B, S, H]``, as :meth:`LlamaDecoderLayer.__call__`."""
        normed, x = self.input_layernorm.fused_add(x, None)
        attention = self.self_attn(normed, positions)
        normed, x = self.post_attention_layernorm.fused_add(attention, x)
        return x + self.mlp(normed)


def _layer(module: LlamaDecoderLayer, implementation):
    # The norms are liger's already where the rms_norm swap is on (children are swapped first); else their twins.
    norms = []
    for norm in (module.input_layernorm, module.post_attention_layernorm):
        if not isinstance(norm, liger_nnx.RMSNorm):
            norm = swapped_or_none(norm, implementation, kind="rms_norm")
        if not isinstance(norm, liger_nnx.RMSNorm):
            return None
        norms.append(norm)
    return LigerLlamaDecoderLayer(module, *norms)


def _rope(module: RotaryEmbedding, implementation):
    return liger_nnx.RotaryEmbedding(module.head_dim, base=module.base, implementation=implementation)


def _mlp(module: LlamaMLP, implementation):
    gate = module.gate_proj
    hidden_size, intermediate_size = gate.kernel.shape
    mlp = nnx.eval_shape(  # abstract: its own projections are replaced by the module's
        lambda: liger_nnx.SwiGLUMLP(
            hidden_size, intermediate_size, use_bias=gate.use_bias, implementation=implementation, rngs=nnx.Rngs(0)
        )
    )
    mlp.gate_proj, mlp.up_proj, mlp.down_proj = module.gate_proj, module.up_proj, module.down_proj
    return mlp


def _head(module: LMHead, implementation):
    return LigerLMHead(module.embed, module.linear, implementation=implementation)


register_swap(RotaryEmbedding, _rope, kind="rope")
register_swap(LlamaMLP, _mlp, kind="swiglu")
register_swap(LMHead, _head, kind="fused_linear_cross_entropy")
register_swap(LlamaDecoderLayer, _layer, kind="fused_add_rms_norm")
