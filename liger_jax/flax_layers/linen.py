"""flax.linen modules backed by liger_jax kernels, drop-in replacements for their flax.linen namesakes."""

import jax
import jax.numpy as jnp
from flax import linen as nn
from flax.linen import dtypes
from flax.linen.linear import default_kernel_init

from liger_jax import runtime
from liger_jax.flax_layers import _options
from liger_jax.ops import _checks
from liger_jax.ops.cross_entropy import Reduction, cross_entropy
from liger_jax.ops.fused_linear_cross_entropy import fused_linear_cross_entropy
from liger_jax.ops.glu import geglu, swiglu
from liger_jax.ops.layer_norm import layer_norm
from liger_jax.ops.rms_norm import CastingMode, rms_norm
from liger_jax.ops.rope import apply_rotary_pos_emb, rope_cos_sin


class RMSNorm(nn.RMSNorm):
    """``flax.linen.RMSNorm`` computed by :func:`liger_jax.rms_norm`: same fields, same ``scale`` param.

    Adds the fields ``offset`` (added to ``scale``, 1.0 for Gemma), ``casting_mode`` (default ``"gemma"``: fp32
    throughout, flax's own numerics) and ``implementation``. The output dtype is flax's (``dtype``, else the
    promotion of the input and param dtypes). Normalising over an axis other than the last,
    ``axis_name``/``axis_index_groups``, ``mask`` and ``force_float32_reductions=False`` raise ValueError.
    """

    offset: float = 0.0
    casting_mode: CastingMode = "gemma"
    implementation: runtime.Implementation | None = None

    @nn.compact
    def __call__(self, x: jax.Array, *, mask: jax.Array | None = None) -> jax.Array:
        """Normalises ``x [..., D]``; returns the same shape in flax's output dtype."""
        _options.check_normalization("RMSNorm", self, x.ndim, mask)
        if self.offset and not self.use_scale:
            raise ValueError("RMSNorm: offset needs use_scale=True (the offset is added to the scale)")
        if self.use_scale:
            scale = self.param("scale", self.scale_init, x.shape[-1:], self.param_dtype)
        else:
            scale = jnp.ones(x.shape[-1:], self.param_dtype)
        out_dtype = dtypes.canonicalize_dtype(x, scale if self.use_scale else None, dtype=self.dtype)
        y = rms_norm(
            x.astype(jnp.promote_types(x.dtype, out_dtype)),
            scale,
            epsilon=self.epsilon,
            offset=self.offset,
            casting_mode=self.casting_mode,
            implementation=self.implementation,
        )
        return y.astype(out_dtype)


class LayerNorm(nn.LayerNorm):
    """``flax.linen.LayerNorm`` computed by :func:`liger_jax.layer_norm`: same fields, same ``scale``/``bias``.

    Adds the field ``implementation``. The output dtype is flax's (``dtype``, else the promotion of the input and
    param dtypes); the kernel runs at the wider of the input and output dtypes, as flax computes. The variance is
    always two exact fp32 passes; ``use_fast_variance`` is accepted for compatibility and changes nothing.
    Normalising over an axis other than the last, ``axis_name``/``axis_index_groups``, ``mask`` and
    ``force_float32_reductions=False`` raise ValueError.
    """

    implementation: runtime.Implementation | None = None

    @nn.compact
    def __call__(self, x: jax.Array, *, mask: jax.Array | None = None) -> jax.Array:
        """Normalises ``x [..., D]``; returns the same shape in flax's output dtype."""
        _options.check_normalization("LayerNorm", self, x.ndim, mask)
        features = x.shape[-1:]
        scale = self.param("scale", self.scale_init, features, self.param_dtype) if self.use_scale else None
        bias = self.param("bias", self.bias_init, features, self.param_dtype) if self.use_bias else None
        out_dtype = dtypes.canonicalize_dtype(x, scale, bias, dtype=self.dtype)
        y = layer_norm(
            x.astype(jnp.promote_types(x.dtype, out_dtype)),
            scale,
            bias,
            epsilon=self.epsilon,
            implementation=self.implementation,
        )
        return y.astype(out_dtype)


class RotaryEmbedding(nn.Module):
    """Rotary position embedding of queries and keys: :func:`liger_jax.rope_cos_sin` then
    :func:`liger_jax.apply_rotary_pos_emb`, one kernel for q and k. No params; fields as the NNX
    :class:`liger_jax.flax_layers.nnx.RotaryEmbedding` arguments (``head_dim``, ``base``, ``interleaved``,
    ``implementation``).
    """

    head_dim: int
    base: float = 10000.0
    interleaved: bool = False
    implementation: runtime.Implementation | None = None

    def __call__(self, q: jax.Array, k: jax.Array, positions: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
        """Rotates ``q [B, S, Hq, D]`` and ``k [B, S, Hkv, D]`` by integer ``positions`` ``[S]`` or ``[B, S]``
        (default ``arange(S)``); returns ``(q_rot, k_rot)`` in their dtypes. fp32 tables."""
        positions = jnp.arange(q.shape[1]) if positions is None else positions
        cos, sin = rope_cos_sin(positions, self.head_dim, base=self.base, interleaved=self.interleaved)
        return apply_rotary_pos_emb(q, k, cos, sin, interleaved=self.interleaved, implementation=self.implementation)


class _GatedMLP(nn.Module):
    """``down_proj(gate(gate_proj(x), up_proj(x)))`` with three ``nn.Dense`` (Llama/Gemma names); subclasses set
    ``_gate`` to the op."""

    intermediate_size: int
    use_bias: bool = False
    dtype: jnp.dtype | None = None
    param_dtype: jnp.dtype = jnp.float32
    precision: jax.lax.PrecisionLike = None
    kernel_init: nn.initializers.Initializer = default_kernel_init
    bias_init: nn.initializers.Initializer = nn.initializers.zeros_init()
    implementation: runtime.Implementation | None = None

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        """Maps ``x [..., hidden]`` to ``[..., hidden]`` in the Dense layers' dtype."""

        def dense(features, name):
            return nn.Dense(
                features,
                use_bias=self.use_bias,
                dtype=self.dtype,
                param_dtype=self.param_dtype,
                precision=self.precision,
                kernel_init=self.kernel_init,
                bias_init=self.bias_init,
                name=name,
            )

        gate = dense(self.intermediate_size, "gate_proj")(x)
        up = dense(self.intermediate_size, "up_proj")(x)
        return dense(x.shape[-1], "down_proj")(self._gate(gate, up, implementation=self.implementation))


class SwiGLUMLP(_GatedMLP):
    """The Llama MLP, ``down_proj(silu(gate_proj(x)) * up_proj(x))``, gated by :func:`liger_jax.swiglu`.

    Params ``gate_proj``, ``up_proj`` (``x.shape[-1] → intermediate_size``) and ``down_proj`` (back), each an
    ``nn.Dense`` with ``kernel`` (and ``bias`` with ``use_bias=True``; no bias by default, as in Llama). The other
    fields (``dtype``, ``param_dtype``, ``precision``, ``kernel_init``, ``bias_init``) are passed to every Dense;
    ``implementation`` picks the kernel.
    """

    _gate = staticmethod(swiglu)


class GEGLUMLP(_GatedMLP):
    """The Gemma MLP, ``down_proj(gelu_tanh(gate_proj(x)) * up_proj(x))``, gated by :func:`liger_jax.geglu`.

    Fields and params as :class:`SwiGLUMLP`.
    """

    _gate = staticmethod(geglu)


class CrossEntropyLoss(nn.Module):
    """:func:`liger_jax.cross_entropy` as a module (Liger's ``LigerCrossEntropyLoss``); no params.

    Fields as :func:`liger_jax.cross_entropy`'s keyword arguments.

    Example:
        >>> loss = CrossEntropyLoss(label_smoothing=0.1)(logits, labels)
    """

    ignore_index: int = -100
    label_smoothing: float = 0.0
    z_loss_scale: float = 0.0
    softcap: float | None = None
    reduction: Reduction = "mean"
    return_z_loss: bool = False
    implementation: runtime.Implementation | None = None

    def __call__(self, logits: jax.Array, labels: jax.Array) -> jax.Array | tuple[jax.Array, jax.Array]:
        """The loss of ``logits [..., V]`` against integer ``labels [...]``, as :func:`liger_jax.cross_entropy`."""
        return cross_entropy(logits, labels, **_options.loss_options(self))


class FusedLinearCrossEntropy(nn.Module):
    """An ``nn.Dense(features)`` LM head fused with its loss (:func:`liger_jax.fused_linear_cross_entropy`).

    Creates the params ``nn.Dense`` would, ``kernel [H, features]`` and (``use_bias``) ``bias [features]``, with
    the same initialisers and dtype promotion, and returns the loss instead of the logits, so an LM head switches
    in one line and its checkpoints still load::

        logits = nn.Dense(vocab, use_bias=False, name="lm_head")(hidden); loss = loss_fn(logits, labels)
        loss = FusedLinearCrossEntropy(vocab, use_bias=False, name="lm_head")(hidden, labels)

    For a head tied to an ``nn.Embed``, pass its table, ``embedding=embed.embedding`` (``[features, H]``, used in
    place as ``nn.Embed.attend`` uses it); then no kernel is created.

    Fields: ``features``, ``use_bias``, ``dtype``, ``param_dtype``, ``kernel_init``, ``bias_init`` as ``nn.Dense``;
    the loss options of :class:`CrossEntropyLoss`; ``accum_dtype`` and ``chunk_size`` as
    :func:`liger_jax.fused_linear_cross_entropy`.
    """

    features: int
    use_bias: bool = True
    dtype: jnp.dtype | None = None
    param_dtype: jnp.dtype = jnp.float32
    kernel_init: nn.initializers.Initializer = default_kernel_init
    bias_init: nn.initializers.Initializer = nn.initializers.zeros_init()
    ignore_index: int = -100
    label_smoothing: float = 0.0
    z_loss_scale: float = 0.0
    softcap: float | None = None
    reduction: Reduction = "mean"
    return_z_loss: bool = False
    accum_dtype: jnp.dtype = jnp.float32
    chunk_size: int | None = None
    implementation: runtime.Implementation | None = None

    @nn.compact
    def __call__(
        self, inputs: jax.Array, labels: jax.Array, embedding: jax.Array | None = None
    ) -> jax.Array | tuple[jax.Array, jax.Array]:
        """The loss of the head applied to ``inputs [..., H]`` against integer ``labels [...]``.

        Args:
            inputs: ``[..., H]`` hidden states.
            labels: ``inputs.shape[:-1]`` integers in ``[0, features)`` or ``ignore_index``.
            embedding: optional tied table ``[features, H]`` to use instead of an own kernel.

        Returns:
            As :func:`liger_jax.fused_linear_cross_entropy`.
        """
        if embedding is None:
            kernel = self.param("kernel", self.kernel_init, (inputs.shape[-1], self.features), self.param_dtype)
            layout = "hv"
        else:
            _checks.check_shape("embedding", embedding, (self.features, inputs.shape[-1]), "[features, H of inputs]")
            kernel, layout = embedding, "vh"
        bias = self.param("bias", self.bias_init, (self.features,), self.param_dtype) if self.use_bias else None
        inputs, kernel, bias = dtypes.promote_dtype(inputs, kernel, bias, dtype=self.dtype)
        return fused_linear_cross_entropy(
            inputs,
            kernel,
            labels,
            bias=bias,
            weight_layout=layout,
            accum_dtype=self.accum_dtype,
            chunk_size=self.chunk_size,
            **_options.loss_options(self),
        )
