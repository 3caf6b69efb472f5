"""A Llama-3-style decoder in flax.nnx, written with plain flax and jax parts only.

Nothing here calls liger_jax: the model is what a user already has (``nnx.Embed``, ``nnx.RMSNorm``,
``nnx.Linear``, ``jax.nn.dot_product_attention`` with grouped-query heads and a causal mask, rotate-half RoPE in
jax.numpy, a SwiGLU MLP, an LM head or tied embeddings). :func:`liger_jax.flax_layers.apply_liger` turns it into
the kernel-backed model in place; :mod:`liger_jax.models.llama_liger` registers the swaps for the classes below
that flax does not define (:class:`RotaryEmbedding`, :class:`LlamaMLP`, :class:`LMHead`).

Example:
    >>> config = llama_config("tiny")
    >>> model = LlamaForCausalLM(config, rngs=nnx.Rngs(0))
    >>> loss = model.loss(tokens[:, :-1], tokens[:, 1:])
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import jax
import jax.numpy as jnp
from flax import nnx

IGNORE_INDEX = -100
_INIT_STD = 0.02  # Llama's initializer_range: N(0, 0.02²) for every kernel and the embedding.

AttentionImplementation = Literal["xla", "cudnn"]


@dataclasses.dataclass(frozen=True)
class LlamaConfig:
    """Shapes and numerics of a :class:`LlamaForCausalLM`.

    Attributes:
        vocab_size: V, the number of token ids.
        hidden_size: H, the residual-stream width.
        intermediate_size: I, the SwiGLU MLP width.
        num_layers: decoder layers.
        num_heads: query heads; ``hidden_size`` must be ``num_heads * head_dim``.
        num_kv_heads: key/value heads (grouped-query attention); must divide ``num_heads``.
        head_dim: per-head width D, even (RoPE rotates pairs); None: ``hidden_size // num_heads``, filled in on
            construction (so vary presets with :func:`llama_config`, which derives it afresh, rather than
            ``dataclasses.replace``).
        rope_base: RoPE's θ (500000 for Llama 3; no Llama-3.1 long-context frequency scaling is applied).
        rms_norm_eps: epsilon of every RMSNorm.
        tie_embeddings: the LM head reuses the ``[V, H]`` embedding (Llama-3.2-1B) instead of its own ``[H, V]``.
        dtype: compute dtype of activations and matmuls ("float32", "bfloat16" or "float16").
        param_dtype: dtype the parameters are stored (and trained) in.
        remat: rematerialise each decoder layer in the backward pass (``nnx.remat``), trading FLOPs for memory.
        attention: ``jax.nn.dot_product_attention``'s implementation, None for jax's choice (XLA); "cudnn" is
            the fused GPU kernel (bf16/fp16 only).
    """

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int | None = None
    rope_base: float = 500_000.0
    rms_norm_eps: float = 1e-5
    tie_embeddings: bool = False
    dtype: str = "float32"
    param_dtype: str = "float32"
    remat: bool = False
    attention: AttentionImplementation | None = None

    def __post_init__(self):
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"LlamaConfig.{name} must be a positive int, got {value!r}")
        if self.head_dim is None:
            if self.hidden_size % self.num_heads:
                raise ValueError(
                    f"LlamaConfig: hidden_size={self.hidden_size} is not a multiple of num_heads={self.num_heads}; "
                    "set head_dim explicitly"
                )
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_heads)
        if self.head_dim < 2 or self.head_dim % 2:
            raise ValueError(
                f"LlamaConfig.head_dim must be a positive even int (RoPE rotates pairs), got {self.head_dim}"
            )
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"LlamaConfig: num_kv_heads={self.num_kv_heads} must divide num_heads={self.num_heads} (GQA groups)"
            )
        for name in ("dtype", "param_dtype"):
            if getattr(self, name) not in ("float32", "bfloat16", "float16"):
                raise ValueError(
                    f"LlamaConfig.{name} must be 'float32', 'bfloat16' or 'float16', got {getattr(self, name)!r}"
                )
        if self.attention not in (None, "xla", "cudnn"):
            raise ValueError(f"LlamaConfig.attention must be None, 'xla' or 'cudnn', got {self.attention!r}")

    @property
    def num_params(self) -> int:
        """Parameter count (the tied embedding counted once)."""
        D, H, V = self.head_dim, self.hidden_size, self.vocab_size
        attention = H * D * (2 * self.num_heads + 2 * self.num_kv_heads)
        per_layer = attention + 3 * H * self.intermediate_size + 2 * H
        return V * H * (1 if self.tie_embeddings else 2) + self.num_layers * per_layer + H


# The presets, as LlamaConfig keyword arguments (head_dim is derived from each final hidden_size and num_heads).
PRESETS: dict[str, dict] = {
    # ~1.6M params: trains on the byte-level corpus in a few minutes on 2 CPU cores.
    "tiny": dict(
        vocab_size=256,
        hidden_size=192,
        intermediate_size=512,
        num_layers=4,
        num_heads=6,
        num_kv_heads=2,
        rope_base=10_000.0,
        tie_embeddings=True,
    ),
    # Liger's convergence-test "mini Llama 3" (test_mini_models.py): 4 layers of hidden 1024, vocab 32000.
    "mini": dict(
        vocab_size=32_000, hidden_size=1024, intermediate_size=2048, num_layers=4, num_heads=8, num_kv_heads=2
    ),
    # ~125M params, GPT-2-small sized, with Llama-2's 32000-token vocabulary and an untied head.
    "small": dict(
        vocab_size=32_000, hidden_size=768, intermediate_size=2048, num_layers=12, num_heads=12, num_kv_heads=4
    ),
    # Llama-3.2-1B's shapes (1.24B params): 16 layers, 32 query / 8 key-value heads of 64, tied 128256 vocabulary.
    "1b": dict(
        vocab_size=128_256,
        hidden_size=2048,
        intermediate_size=8192,
        num_layers=16,
        num_heads=32,
        num_kv_heads=8,
        tie_embeddings=True,
    ),
}


def llama_config(name: str, **overrides) -> LlamaConfig:
    """The preset ``name`` of :data:`PRESETS` ("tiny", "mini", "small", "1b") with fields set by ``overrides``.

    Raises:
        ValueError: an unknown preset name, or overrides that make an invalid config.
    """
    if name not in PRESETS:
        raise ValueError(f"unknown Llama preset {name!r}; choose one of {tuple(PRESETS)}")
    return LlamaConfig(**{**PRESETS[name], **overrides})


def _dense(in_features: int, out_features: int, config: LlamaConfig, rngs: nnx.Rngs) -> nnx.Linear:
    return nnx.Linear(
        in_features,
        out_features,
        use_bias=False,
        dtype=jnp.dtype(config.dtype),
        param_dtype=jnp.dtype(config.param_dtype),
        kernel_init=nnx.initializers.normal(_INIT_STD),
        rngs=rngs,
    )


def _rms_norm(config: LlamaConfig, rngs: nnx.Rngs) -> nnx.RMSNorm:
    return nnx.RMSNorm(
        config.hidden_size,
        epsilon=config.rms_norm_eps,
        dtype=jnp.dtype(config.dtype),
        param_dtype=jnp.dtype(config.param_dtype),
        rngs=rngs,
    )


def rope_frequencies(positions: jax.Array, head_dim: int, base: float) -> tuple[jax.Array, jax.Array]:
    """``cos`` and ``sin`` of RoPE's angles in the rotate-half layout, in fp32.

    Args:
        positions: ``[S]`` or ``[B, S]`` integer token positions.
        head_dim: D, even.
        base: θ; pair ``i`` turns by ``position · θ^(-2i/D)``.

    Returns:
        ``(cos, sin)``, each ``positions.shape + (D,)`` float32, the D/2 angles repeated twice.
    """
    inverse_frequency = 1.0 / base ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim)  # as HF Llama
    angles = positions.astype(jnp.float32)[..., None] * inverse_frequency.reshape((1,) * positions.ndim + (-1,))
    angles = jnp.concatenate([angles, angles], axis=-1)
    return jnp.cos(angles), jnp.sin(angles)


def _rotate_half(x: jax.Array) -> jax.Array:
    first, second = jnp.split(x, 2, axis=-1)
    return jnp.concatenate([-second, first], axis=-1)


class RotaryEmbedding(nnx.Module):
    """Rotary position embedding (rotate-half layout, as Hugging Face Llama) applied to queries and keys."""

    def __init__(self, head_dim: int, base: float):
        self.head_dim = head_dim
        self.base = base

    def __call__(self, q: jax.Array, k: jax.Array, positions: jax.Array) -> tuple[jax.Array, jax.Array]:
        """Rotates ``q [B, S, Hq, D]`` and ``k [B, S, Hkv, D]`` by ``positions [S]`` or ``[B, S]``.

        cos/sin are computed in fp32 and rounded to ``q.dtype``; the rotation runs in ``q.dtype``. Returns
        ``(q, k)`` with their shapes and dtypes.
        """
        cos, sin = rope_frequencies(positions, self.head_dim, self.base)
        broadcast = (1,) * (3 - cos.ndim) + cos.shape[:-1] + (1, self.head_dim)  # → [B or 1, S, 1, D]
        cos, sin = cos.reshape(broadcast), sin.reshape(broadcast)
        return tuple(x * cos.astype(x.dtype) + _rotate_half(x) * sin.astype(x.dtype) for x in (q, k))


class LlamaAttention(nnx.Module):
    """Causal grouped-query self-attention with RoPE: q/k/v/o projections without bias."""

    def __init__(self, config: LlamaConfig, *, rngs: nnx.Rngs):
        D, H = config.head_dim, config.hidden_size
        self.num_heads, self.num_kv_heads, self.head_dim = config.num_heads, config.num_kv_heads, D
        self.attention = config.attention
        self.q_proj = _dense(H, config.num_heads * D, config, rngs)
        self.k_proj = _dense(H, config.num_kv_heads * D, config, rngs)
        self.v_proj = _dense(H, config.num_kv_heads * D, config, rngs)
        self.o_proj = _dense(config.num_heads * D, H, config, rngs)
        self.rotary = RotaryEmbedding(D, config.rope_base)

    def __call__(self, x: jax.Array, positions: jax.Array) -> jax.Array:
        """``x [B, S, H]`` → ``[B, S, H]``; position ``s`` attends to positions ``≤ s``."""
        B, S, _ = x.shape
        q = self.q_proj(x).reshape(B, S, self.num_heads, self.head_dim)
        k = self.k_proj(x).reshape(B, S, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).reshape(B, S, self.num_kv_heads, self.head_dim)
        q, k = self.rotary(q, k, positions)
        out = jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation=self.attention)
        return self.o_proj(out.reshape(B, S, self.num_heads * self.head_dim))


class LlamaMLP(nnx.Module):
    """The SwiGLU feed-forward block: ``down_proj(silu(gate_proj(x)) · up_proj(x))``."""

    def __init__(self, config: LlamaConfig, *, rngs: nnx.Rngs):
        self.gate_proj = _dense(config.hidden_size, config.intermediate_size, config, rngs)
        self.up_proj = _dense(config.hidden_size, config.intermediate_size, config, rngs)
        self.down_proj = _dense(config.intermediate_size, config.hidden_size, config, rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        """``x [..., H]`` → ``[..., H]`` in the compute dtype."""
        return self.down_proj(jax.nn.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaDecoderLayer(nnx.Module):
    """Pre-norm block: ``x + attn(norm(x))``, then ``x + mlp(norm(x))``."""

    def __init__(self, config: LlamaConfig, *, rngs: nnx.Rngs):
        self.input_layernorm = _rms_norm(config, rngs)
        self.self_attn = LlamaAttention(config, rngs=rngs)
        self.post_attention_layernorm = _rms_norm(config, rngs)
        self.mlp = LlamaMLP(config, rngs=rngs)

    def __call__(self, x: jax.Array, positions: jax.Array) -> jax.Array:
        """``x [B, S, H]`` → ``[B, S, H]``."""
        x = x + self.self_attn(self.input_layernorm(x), positions)
        return x + self.mlp(self.post_attention_layernorm(x))


class LMHead(nnx.Module):
    """Projects hidden states onto the vocabulary and scores them with cross-entropy.

    The weight is the tied ``embed.embedding [V, H]`` or its own ``linear.kernel [H, V]``. :meth:`loss` is given
    the hidden states and labels (not logits), so a swap can fuse the projection into the loss
    (:func:`liger_jax.fused_linear_cross_entropy`) and never build ``[B, S, V]`` logits.
    """

    def __init__(self, config: LlamaConfig, *, embed: nnx.Embed | None, rngs: nnx.Rngs):
        self.embed = embed
        self.linear = None if embed is not None else _dense(config.hidden_size, config.vocab_size, config, rngs)

    def __call__(self, hidden: jax.Array) -> jax.Array:
        """Logits ``[..., V]`` of ``hidden [..., H]``, in the compute dtype."""
        return self.embed.attend(hidden) if self.embed is not None else self.linear(hidden)

    def loss(self, hidden: jax.Array, labels: jax.Array, *, ignore_index: int = IGNORE_INDEX) -> jax.Array:
        """Mean next-token cross-entropy over the labels that are not ``ignore_index``.

        Logits are computed in the compute dtype, then log-softmax in fp32.

        Args:
            hidden: ``[..., H]`` final hidden states.
            labels: ``hidden.shape[:-1]`` integer targets in ``[0, V)`` or ``ignore_index``.
            ignore_index: the label value that does not count.

        Returns:
            A float32 scalar (0 when every label is ignored).
        """
        logits = self(hidden).astype(jnp.float32)
        keep = labels != ignore_index
        safe_labels = jnp.where(keep, labels, 0)
        picked = jnp.take_along_axis(logits, safe_labels[..., None], axis=-1)[..., 0]
        losses = jnp.where(keep, jax.nn.logsumexp(logits, axis=-1) - picked, 0.0)
        return jnp.sum(losses) / jnp.maximum(jnp.sum(keep), 1)


def _run_layer(layer: LlamaDecoderLayer, x: jax.Array, positions: jax.Array) -> jax.Array:
    return layer(x, positions)


class LlamaForCausalLM(nnx.Module):
    """Llama-3-style causal language model.

    Example:
        >>> model = LlamaForCausalLM(llama_config("tiny"), rngs=nnx.Rngs(0))
        >>> logits = model(tokens)  # [B, S, V]
    """

    def __init__(self, config: LlamaConfig, *, rngs: nnx.Rngs):
        self.config = config
        self.embed_tokens = nnx.Embed(
            config.vocab_size,
            config.hidden_size,
            dtype=jnp.dtype(config.dtype),
            param_dtype=jnp.dtype(config.param_dtype),
            embedding_init=nnx.initializers.normal(_INIT_STD),
            rngs=rngs,
        )
        self.layers = nnx.List([LlamaDecoderLayer(config, rngs=rngs) for _ in range(config.num_layers)])
        self.norm = _rms_norm(config, rngs)
        self.lm_head = LMHead(config, embed=self.embed_tokens if config.tie_embeddings else None, rngs=rngs)

    def hidden_states(self, tokens: jax.Array, positions: jax.Array | None = None) -> jax.Array:
        """Final normalised hidden states ``[B, S, H]`` (compute dtype) of ``tokens [B, S]``.

        Args:
            tokens: ``[B, S]`` integer ids in ``[0, V)``.
            positions: ``[S]`` or ``[B, S]`` positions for RoPE; default ``0 … S-1``.
        """
        if tokens.ndim != 2:
            raise ValueError(f"tokens must have shape [batch, seq], got {tokens.shape}")
        positions = jnp.arange(tokens.shape[1], dtype=jnp.int32) if positions is None else positions
        run_layer = nnx.remat(_run_layer) if self.config.remat else _run_layer
        x = self.embed_tokens(tokens)
        for layer in self.layers:
            x = run_layer(layer, x, positions)
        return self.norm(x)

    def __call__(self, tokens: jax.Array, positions: jax.Array | None = None) -> jax.Array:
        """Logits ``[B, S, V]`` (compute dtype) of ``tokens [B, S]``."""
        return self.lm_head(self.hidden_states(tokens, positions))

    def loss(self, tokens: jax.Array, labels: jax.Array, positions: jax.Array | None = None) -> jax.Array:
        """Mean cross-entropy of predicting ``labels [B, S]`` from ``tokens [B, S]``; labels may be -100 (ignored).

        Returns a float32 scalar; see :meth:`LMHead.loss`.
        """
        if labels.shape != tokens.shape:
            raise ValueError(f"labels must have the shape of tokens {tokens.shape}, got {labels.shape}")
        return self.lm_head.loss(self.hidden_states(tokens, positions), labels)
