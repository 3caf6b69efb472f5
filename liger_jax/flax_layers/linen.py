"""flax.linen modules backed by liger_jax kernels, drop-in replacements for their flax.linen namesakes."""

import jax
import jax.numpy as jnp
from flax import linen as nn
from flax.linen import dtypes
from flax.linen.linear import default_kernel_init

from liger_jax import runtime
from liger_jax.flax_layers import _groups, _options
from liger_jax.flax_layers.score_attention import LinenFusedNeighborhoodAttention, LinenMultiTokenAttention
from liger_jax.flax_layers.tiled_mlp import LinenTiledMLP
from liger_jax.ops import _checks
from liger_jax.ops.cross_entropy import Reduction, cross_entropy
from liger_jax.ops.dyt import dyt
from liger_jax.ops.embedding import embedding
from liger_jax.ops.fused_add_rms_norm import fused_add_rms_norm
from liger_jax.ops.fused_linear_cross_entropy import fused_linear_cross_entropy
from liger_jax.ops.fused_linear_distillation import fused_linear_distillation
from liger_jax.ops.fused_linear_jsd import fused_linear_jsd
from liger_jax.ops.fused_linear_logprobs import fused_linear_logprobs
from liger_jax.ops.glu import geglu, swiglu
from liger_jax.ops.group_norm import group_norm
from liger_jax.ops.jsd import jsd
from liger_jax.ops.kl_div import kl_div
from liger_jax.ops.layer_norm import layer_norm
from liger_jax.ops.modulated_rms_norm import modulated_rms_norm
from liger_jax.ops.poly_norm import poly_norm
from liger_jax.ops.qwen2vl_mrope import mrope_cos_sin, qwen2vl_mrope
from liger_jax.ops.relu_squared import relu_squared
from liger_jax.ops.rms_norm import CastingMode, rms_norm
from liger_jax.ops.rope import apply_rotary_pos_emb, rope_cos_sin
from liger_jax.ops.softmax import softmax
from liger_jax.ops.sparsemax import sparsemax
from liger_jax.ops.tvd import tvd


class Embed(nn.Embed):
    """``flax.linen.Embed`` whose lookup is :func:`liger_jax.embedding`: same fields, same ``embedding`` param.

    Takes every ``nn.Embed`` field, plus ``implementation``. The rows are gathered from the table as stored and
    cast to ``dtype`` after, and their gradient is summed in fp32 (no ``[V, H]`` cast of the table, no bfloat16
    scatter-add); values are flax's. ``attend`` is flax's.
    """

    implementation: runtime.Implementation | None = None

    def setup(self):
        # Run in the scope of the nn.Embed it stands in for (liger_intercept), whose setup made the param already.
        if self.has_variable("params", "embedding"):
            self.embedding = self.get_variable("params", "embedding")
        else:
            super().setup()

    def __call__(self, inputs: jax.Array) -> jax.Array:
        """``inputs`` (integers, any shape) → ``inputs.shape + (features,)`` in ``dtype`` (None: the param's)."""
        if self.num_embeddings == 1:
            return super().__call__(inputs)
        return embedding(self.embedding, inputs, dtype=self.dtype, implementation=self.implementation)


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
        _options.check_normalization(type(self).__name__, self, x.ndim, mask)
        scale, out_dtype = self._scale_and_output_dtype(x)
        return self._normalize(x, scale, out_dtype)

    def _scale_and_output_dtype(self, x: jax.Array) -> tuple[jax.Array, jnp.dtype]:
        """The ``scale`` param (ones without one) for ``x [..., D]`` and flax's output dtype."""
        _options.check_offset(type(self).__name__, self.offset, self.use_scale)
        if self.use_scale:
            scale = self.param("scale", self.scale_init, x.shape[-1:], self.param_dtype)
        else:
            scale = jnp.ones(x.shape[-1:], self.param_dtype)
        return scale, dtypes.canonicalize_dtype(x, scale if self.use_scale else None, dtype=self.dtype)

    def _kernel_options(self) -> dict:
        return dict(
            epsilon=self.epsilon, offset=self.offset, casting_mode=self.casting_mode, implementation=self.implementation
        )

    def _normalize(self, x: jax.Array, scale: jax.Array, out_dtype: jnp.dtype) -> jax.Array:
        y = rms_norm(x.astype(jnp.promote_types(x.dtype, out_dtype)), scale, **self._kernel_options())
        return y.astype(out_dtype)


class FusedAddRMSNorm(RMSNorm):
    """Liger's ``LigerFusedAddRMSNorm``: :class:`RMSNorm`'s fields and ``scale`` param, called on a block's output
    and the residual stream, ``y, s = norm(x, residual)`` with ``s = x + residual`` (the next residual, in x's
    dtype; x itself where residual is None) and ``y = RMSNorm(s)``. Where flax's promotion keeps x's dtype, one
    kernel computes both (:func:`liger_jax.fused_add_rms_norm`); otherwise the add and the norm, as flax computes
    them."""

    @nn.compact
    def __call__(  # type: ignore[override]
        self, x: jax.Array, residual: jax.Array | None
    ) -> tuple[jax.Array, jax.Array]:
        """``(y, s)``: y ``x``'s shape in flax's output dtype, s in x's; residual must match x's shape and dtype."""
        _options.check_normalization(type(self).__name__, self, x.ndim, None)
        scale, out_dtype = self._scale_and_output_dtype(x)
        if jnp.promote_types(x.dtype, out_dtype) != x.dtype:
            total = x if residual is None else x + residual
            return self._normalize(total, scale, out_dtype), total
        y, total = fused_add_rms_norm(x, residual, scale, **self._kernel_options())
        return y.astype(out_dtype), total


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


class GroupNorm(nn.GroupNorm):
    """``flax.linen.GroupNorm`` computed by :func:`liger_jax.group_norm`: same fields, same ``scale``/``bias``.

    Adds the field ``implementation``. The output dtype is flax's (``dtype``, else the promotion of the input and
    param dtypes); the kernel runs at the wider of the input and output dtypes, as flax computes. The variance is
    exact fp32; ``use_fast_variance`` is accepted for compatibility and changes nothing. ``reduction_axes`` other
    than flax's default (every axis but the first), ``axis_name``/``axis_index_groups``, ``mask`` and
    ``force_float32_reductions=False`` raise ValueError.
    """

    implementation: runtime.Implementation | None = None

    @nn.compact
    def __call__(self, x: jax.Array, *, mask: jax.Array | None = None) -> jax.Array:
        """Normalises ``x [batch, ..., C]``; returns the same shape in flax's output dtype."""
        _groups.check_group_normalization("GroupNorm", self, x.ndim, mask)
        num_groups = _groups.group_count("GroupNorm", self.num_groups, self.group_size, x.shape[-1])
        features = x.shape[-1:]
        scale = self.param("scale", self.scale_init, features, self.param_dtype) if self.use_scale else None
        bias = self.param("bias", self.bias_init, features, self.param_dtype) if self.use_bias else None
        out_dtype = dtypes.canonicalize_dtype(x, scale, bias, dtype=self.dtype)
        y = group_norm(
            x.astype(jnp.promote_types(x.dtype, out_dtype)),
            scale,
            bias,
            num_groups=num_groups,
            epsilon=self.epsilon,
            implementation=self.implementation,
        )
        return y.astype(out_dtype)


class DyT(nn.Module):
    """Dynamic Tanh (Liger's ``LigerDyT``) by :func:`liger_jax.dyt`; fields and params as the NNX
    :class:`liger_jax.flax_layers.nnx.DyT` (``alpha`` ``(1,)``, ``gamma``, ``beta``), D read from the input."""

    beta: bool = True
    init_alpha: float = 0.5
    param_dtype: jnp.dtype = jnp.float32
    implementation: runtime.Implementation | None = None

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        """``x [..., D]`` → the same shape and dtype."""
        features = x.shape[-1:]
        alpha = self.param("alpha", nn.initializers.constant(self.init_alpha), (1,), self.param_dtype)
        gamma = self.param("gamma", nn.initializers.ones_init(), features, self.param_dtype)
        beta = self.param("beta", nn.initializers.zeros_init(), features, self.param_dtype) if self.beta else None
        return dyt(x, alpha, gamma, beta, implementation=self.implementation)


class PolyNorm(nn.Module):
    """PolyNorm (Liger's ``LigerPolyNorm``) by :func:`liger_jax.poly_norm`; fields and params as the NNX
    :class:`liger_jax.flax_layers.nnx.PolyNorm` (``weight`` ``(3,)`` of 1/3, ``bias`` ``()`` of 1.0)."""

    epsilon: float = 1e-6
    param_dtype: jnp.dtype = jnp.float32
    implementation: runtime.Implementation | None = None

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        """``x [..., D]`` → the same shape and dtype."""
        weight = self.param("weight", nn.initializers.constant(1.0 / 3.0), (3,), self.param_dtype)
        bias = self.param("bias", nn.initializers.ones_init(), (), self.param_dtype)
        return poly_norm(x, weight, bias, epsilon=self.epsilon, implementation=self.implementation)


class ModulatedRMSNorm(nn.Module):
    """Modulated RMSNorm (AdaLN; Liger's ``LigerModulatedRMSNorm``) by :func:`liger_jax.modulated_rms_norm`; fields
    and params as the NNX :class:`liger_jax.flax_layers.nnx.ModulatedRMSNorm` (``weight``), D read from the input."""

    epsilon: float = 1e-6
    offset: float = 0.0
    casting_mode: CastingMode = "llama"
    init_fn: str = "ones"
    elementwise_affine: bool = True
    param_dtype: jnp.dtype = jnp.float32
    implementation: runtime.Implementation | None = None

    @nn.compact
    def __call__(self, x: jax.Array, scale: jax.Array, shift: jax.Array | None = None) -> jax.Array:
        """``x [..., D]`` modulated by ``scale`` and ``shift`` → x's shape and dtype."""
        _checks.check_choice("init_fn", self.init_fn, ("ones", "zeros"))
        init = nn.initializers.ones_init() if self.init_fn == "ones" else nn.initializers.zeros_init()
        weight = self.param("weight", init, x.shape[-1:], self.param_dtype) if self.elementwise_affine else None
        return modulated_rms_norm(
            x,
            weight,
            scale,
            shift,
            epsilon=self.epsilon,
            offset=self.offset,
            casting_mode=self.casting_mode,
            implementation=self.implementation,
        )


class RotaryEmbedding(nn.Module):
    """Rotary position embedding of queries and keys: :func:`liger_jax.rope_cos_sin` then
    :func:`liger_jax.apply_rotary_pos_emb`, one kernel for q and k. No params; fields as the NNX
    :class:`liger_jax.flax_layers.nnx.RotaryEmbedding` arguments (``head_dim``, ``base``, ``interleaved``,
    ``rotary_dim``, ``implementation``).
    """

    head_dim: int
    base: float = 10000.0
    interleaved: bool = False
    implementation: runtime.Implementation | None = None
    rotary_dim: int | None = None

    def __call__(self, q: jax.Array, k: jax.Array, positions: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
        """Rotates ``q [B, S, Hq, D]`` and ``k [B, S, Hkv, D]`` by integer ``positions`` ``[S]`` or ``[B, S]``
        (default ``arange(S)``); returns ``(q_rot, k_rot)`` in their dtypes. fp32 tables."""
        positions = jnp.arange(q.shape[1]) if positions is None else positions
        cos, sin = rope_cos_sin(
            positions, self.head_dim, base=self.base, interleaved=self.interleaved, rotary_dim=self.rotary_dim
        )
        return apply_rotary_pos_emb(
            q,
            k,
            cos,
            sin,
            interleaved=self.interleaved,
            rotary_dim=self.rotary_dim,
            implementation=self.implementation,
        )


class MultimodalRotaryEmbedding(nn.Module):
    """Qwen2-VL's multimodal rotary embedding (:func:`liger_jax.mrope_cos_sin` then :func:`liger_jax.qwen2vl_mrope`).
    No params; fields as the NNX :class:`liger_jax.flax_layers.nnx.MultimodalRotaryEmbedding` arguments."""

    head_dim: int
    mrope_section: tuple[int, int, int]
    base: float = 10000.0
    implementation: runtime.Implementation | None = None

    def __call__(self, q: jax.Array, k: jax.Array, position_ids: jax.Array) -> tuple[jax.Array, jax.Array]:
        """Rotates ``q [B, S, Hq, D]`` and ``k [B, S, Hkv, D]`` by integer ``position_ids [3, B, S]``."""
        cos, sin = mrope_cos_sin(position_ids, self.head_dim, base=self.base)
        return qwen2vl_mrope(q, k, cos, sin, self.mrope_section, implementation=self.implementation)


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


# Any MLP computed tile by tile over the sequence with recompute (see liger_jax.flax_layers.tiled_mlp).
TiledMLP = LinenTiledMLP

# Attention-score layers, flax-style params (see liger_jax.flax_layers.score_attention).
MultiTokenAttention = LinenMultiTokenAttention
FusedNeighborhoodAttention = LinenFusedNeighborhoodAttention


class Softmax(nn.Module):
    """:func:`liger_jax.softmax` as a layer (Liger's ``LigerSoftmax``); no params. Fields ``axis`` (the axis to
    normalise over) and ``implementation``."""

    axis: int = -1
    implementation: runtime.Implementation | None = None

    def __call__(self, x: jax.Array) -> jax.Array:
        """Probabilities along ``axis``: x's shape and dtype."""
        return softmax(x, axis=self.axis, implementation=self.implementation)


class Sparsemax(nn.Module):
    """:func:`liger_jax.sparsemax` as a layer (Liger's ``LigerSparsemax``); no params. Fields as :class:`Softmax`."""

    axis: int = -1
    implementation: runtime.Implementation | None = None

    def __call__(self, x: jax.Array) -> jax.Array:
        """Sparse probabilities along ``axis``: x's shape and dtype."""
        return sparsemax(x, axis=self.axis, implementation=self.implementation)


class ReLUSquared(nn.Module):
    """:func:`liger_jax.relu_squared` as an activation layer (Liger's ``LigerReLUSquared``); no params. Field
    ``implementation``."""

    implementation: runtime.Implementation | None = None

    def __call__(self, x: jax.Array) -> jax.Array:
        """max(x, 0)², elementwise: x's shape and dtype."""
        return relu_squared(x, implementation=self.implementation)


class CrossEntropyLoss(nn.Module):
    """:func:`liger_jax.cross_entropy` as a module (Liger's ``LigerCrossEntropyLoss``); no params.

    Fields as :func:`liger_jax.cross_entropy`'s keyword arguments; the class weights (an array) are an argument of
    the call, ``ce_weight``.

    Example:
        >>> loss = CrossEntropyLoss(label_smoothing=0.1)(logits, labels)
    """

    ignore_index: int = -100
    label_smoothing: float = 0.0
    z_loss_scale: float = 0.0
    softcap: float | None = None
    reduction: Reduction = "mean"
    return_z_loss: bool = False
    use_token_scaling: bool = False
    return_token_accuracy: bool = False
    return_predicted_tokens: bool = False
    implementation: runtime.Implementation | None = None

    def __call__(
        self, logits: jax.Array, labels: jax.Array, ce_weight: jax.Array | None = None
    ) -> jax.Array | tuple[jax.Array, ...]:
        """The loss of ``logits [..., V]`` against integer ``labels [...]`` (optionally weighted per class by
        ``ce_weight [V]``), as :func:`liger_jax.cross_entropy`."""
        return cross_entropy(logits, labels, ce_weight=ce_weight, **_options.loss_options(self))


class _DenseHead(nn.Module):
    """The params of an ``nn.Dense(features)`` LM head, ``kernel [H, features]`` and (``use_bias``) ``bias
    [features]``, created with Dense's initialisers and dtype promotion, for the fused losses that never build its
    output; or a tied ``nn.Embed`` table passed at call time instead of the kernel."""

    features: int
    use_bias: bool = True
    dtype: jnp.dtype | None = None
    param_dtype: jnp.dtype = jnp.float32
    kernel_init: nn.initializers.Initializer = default_kernel_init
    bias_init: nn.initializers.Initializer = nn.initializers.zeros_init()

    def _head(self, inputs: jax.Array, embedding: jax.Array | None):
        """``(inputs, weight, bias, weight_layout)``: the own kernel ("hv"), or ``embedding [features, H]`` in
        place ("vh"); promoted to ``dtype``."""
        if embedding is None:
            kernel = self.param("kernel", self.kernel_init, (inputs.shape[-1], self.features), self.param_dtype)
            layout = "hv"
        else:
            _checks.check_shape("embedding", embedding, (self.features, inputs.shape[-1]), "[features, H of inputs]")
            kernel, layout = embedding, "vh"
        bias = self.param("bias", self.bias_init, (self.features,), self.param_dtype) if self.use_bias else None
        inputs, kernel, bias = dtypes.promote_dtype(inputs, kernel, bias, dtype=self.dtype)
        return inputs, kernel, bias, layout


class FusedLinearCrossEntropy(_DenseHead):
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
    :func:`liger_jax.fused_linear_cross_entropy`; ``ce_weight`` is an argument of the call.
    """

    ignore_index: int = -100
    label_smoothing: float = 0.0
    z_loss_scale: float = 0.0
    softcap: float | None = None
    reduction: Reduction = "mean"
    return_z_loss: bool = False
    use_token_scaling: bool = False
    return_token_accuracy: bool = False
    return_predicted_tokens: bool = False
    accum_dtype: jnp.dtype = jnp.float32
    chunk_size: int | None = None
    implementation: runtime.Implementation | None = None

    @nn.compact
    def __call__(
        self,
        inputs: jax.Array,
        labels: jax.Array,
        embedding: jax.Array | None = None,
        ce_weight: jax.Array | None = None,
    ) -> jax.Array | tuple[jax.Array, ...]:
        """The loss of the head applied to ``inputs [..., H]`` against integer ``labels [...]``.

        Args:
            inputs: ``[..., H]`` hidden states.
            labels: ``inputs.shape[:-1]`` integers in ``[0, features)`` or ``ignore_index``.
            embedding: optional tied table ``[features, H]`` to use instead of an own kernel.
            ce_weight: optional class weights ``[features]``, as :func:`liger_jax.fused_linear_cross_entropy`.

        Returns:
            As :func:`liger_jax.fused_linear_cross_entropy`.
        """
        inputs, kernel, bias, layout = self._head(inputs, embedding)
        return fused_linear_cross_entropy(
            inputs,
            kernel,
            labels,
            bias=bias,
            weight_layout=layout,
            accum_dtype=self.accum_dtype,
            chunk_size=self.chunk_size,
            ce_weight=ce_weight,
            **_options.loss_options(self),
        )


class KLDivLoss(nn.Module):
    """:func:`liger_jax.kl_div` as a module (Liger's ``LigerKLDIVLoss``); no params.

    Fields as :func:`liger_jax.kl_div`'s keyword arguments.

    Example:
        >>> loss = KLDivLoss(reduction="batchmean")(jax.nn.log_softmax(logits), teacher_probs)
    """

    reduction: str = "batchmean"
    log_target: bool = False
    eps: float = 1e-10
    implementation: runtime.Implementation | None = None

    def __call__(self, input: jax.Array, target: jax.Array) -> jax.Array:
        """The divergence of log-probabilities ``input [..., V]`` from ``target``, as :func:`liger_jax.kl_div`."""
        return kl_div(
            input,
            target,
            reduction=self.reduction,
            log_target=self.log_target,
            eps=self.eps,
            implementation=self.implementation,
        )


class JSDLoss(nn.Module):
    """:func:`liger_jax.jsd` as a module (Liger's ``LigerJSD``); no params.

    Fields as :func:`liger_jax.jsd`'s keyword arguments.

    Example:
        >>> loss = JSDLoss(beta=0.5)(jax.nn.log_softmax(student_logits), jax.nn.log_softmax(teacher_logits), labels)
    """

    beta: float = 0.5
    ignore_index: int = -100
    implementation: runtime.Implementation | None = None

    def __call__(self, input: jax.Array, target: jax.Array, labels: jax.Array | None = None) -> jax.Array:
        """The JSD of student log-probabilities ``input [..., V]`` from the teacher's ``target [..., V]``, rows with
        ``labels [...] == ignore_index`` skipped, as :func:`liger_jax.jsd`."""
        return jsd(
            input, target, labels, beta=self.beta, ignore_index=self.ignore_index, implementation=self.implementation
        )


class TVDLoss(nn.Module):
    """:func:`liger_jax.tvd` as a module (Liger's ``LigerTVDLoss``); no params.

    Fields as :func:`liger_jax.tvd`'s keyword arguments.

    Example:
        >>> loss = TVDLoss()(jax.nn.softmax(student_logits), jax.nn.softmax(teacher_logits), labels)
    """

    reduction: str = "batchmean"
    ignore_index: int = -100
    implementation: runtime.Implementation | None = None

    def __call__(self, input: jax.Array, target: jax.Array, labels: jax.Array | None = None) -> jax.Array:
        """The distance of probabilities ``input [..., V]`` from ``target [..., V]``, rows with
        ``labels [...] == ignore_index`` skipped, as :func:`liger_jax.tvd`."""
        return tvd(
            input,
            target,
            labels,
            reduction=self.reduction,
            ignore_index=self.ignore_index,
            implementation=self.implementation,
        )


class FusedLinearLogProbs(_DenseHead):
    """An ``nn.Dense(features)`` LM head that returns per-token log-probs without its logits
    (:func:`liger_jax.fused_linear_logprobs`).

    Params and the tied-``embedding`` form as :class:`FusedLinearCrossEntropy`, so ``nn.Dense(vocab,
    name="lm_head")`` switches in one line. Fields: Dense's, then ``temperature``, ``return_entropy``,
    ``chunk_size`` and ``implementation`` as :func:`liger_jax.fused_linear_logprobs`.
    """

    temperature: float = 1.0
    return_entropy: bool = False
    chunk_size: int | None = None
    implementation: runtime.Implementation | None = None

    @nn.compact
    def __call__(
        self, inputs: jax.Array, tokens: jax.Array, embedding: jax.Array | None = None
    ) -> jax.Array | tuple[jax.Array, jax.Array]:
        """Log-probs ``[...]`` of integer ``tokens [...]`` under the head applied to ``inputs [..., H]`` (and the
        entropy with ``return_entropy``); ``embedding`` as :class:`FusedLinearCrossEntropy`."""
        inputs, kernel, bias, layout = self._head(inputs, embedding)
        return fused_linear_logprobs(
            inputs,
            kernel,
            tokens,
            bias=bias,
            temperature=self.temperature,
            return_entropy=self.return_entropy,
            weight_layout=layout,
            chunk_size=self.chunk_size,
            implementation=self.implementation,
        )


class FusedLinearJSD(_DenseHead):
    """The student's ``nn.Dense(features)`` LM head fused with Liger's JSD against a frozen teacher head
    (:func:`liger_jax.fused_linear_jsd`); neither model's logits are built.

    The student's params as :class:`FusedLinearCrossEntropy`; the teacher's head comes in at call time (a frozen
    model's params, no gradient). Fields: Dense's, then ``beta``, ``ignore_index``, ``temperature``,
    ``accum_dtype``, ``chunk_size`` and ``implementation`` as :func:`liger_jax.fused_linear_jsd`.
    """

    beta: float = 0.5
    ignore_index: int = -100
    temperature: float = 1.0
    accum_dtype: jnp.dtype = jnp.float32
    chunk_size: int | None = None
    implementation: runtime.Implementation | None = None

    @nn.compact
    def __call__(
        self,
        inputs: jax.Array,
        teacher_inputs: jax.Array,
        teacher_kernel: jax.Array,
        labels: jax.Array | None = None,
        teacher_bias: jax.Array | None = None,
        embedding: jax.Array | None = None,
    ) -> jax.Array:
        """The scalar loss of the head on ``inputs [..., H]`` against the teacher's ``teacher_kernel`` (``[H_t,
        features]``, or ``[features, H_t]`` with a tied ``embedding``) on ``teacher_inputs [..., H_t]``."""
        inputs, kernel, bias, layout = self._head(inputs, embedding)
        return fused_linear_jsd(
            inputs,
            kernel,
            teacher_inputs,
            teacher_kernel,
            labels,
            beta=self.beta,
            ignore_index=self.ignore_index,
            temperature=self.temperature,
            student_bias=bias,
            teacher_bias=teacher_bias,
            weight_layout=layout,
            accum_dtype=self.accum_dtype,
            chunk_size=self.chunk_size,
            implementation=self.implementation,
        )


class FusedLinearDistillationLoss(_DenseHead):
    """The student's ``nn.Dense(features)`` LM head fused with Liger's distillation loss against a frozen teacher
    head (:func:`liger_jax.fused_linear_distillation`: hard cross-entropy plus a JSD, KL, TVD or cosine soft loss).

    The student's params as :class:`FusedLinearCrossEntropy`; the teacher's head comes in at call time. Fields:
    Dense's, then the loss options of :func:`liger_jax.fused_linear_distillation`.
    """

    divergence: str = "jsd"
    weight_hard_loss: float = 0.5
    weight_soft_loss: float = 0.5
    beta: float = 0.5
    temperature: float = 1.0
    ignore_index: int = -100
    return_soft_hard_loss: bool = False
    accum_dtype: jnp.dtype = jnp.float32
    chunk_size: int | None = None
    implementation: runtime.Implementation | None = None

    @nn.compact
    def __call__(
        self,
        inputs: jax.Array,
        teacher_inputs: jax.Array,
        teacher_kernel: jax.Array,
        labels: jax.Array,
        teacher_bias: jax.Array | None = None,
        embedding: jax.Array | None = None,
    ) -> jax.Array | tuple[jax.Array, jax.Array, jax.Array]:
        """The loss (and with ``return_soft_hard_loss`` the soft and hard losses); arguments as
        :class:`FusedLinearJSD`, ``labels [...]`` integers in ``[0, features)`` or ``ignore_index``."""
        inputs, kernel, bias, layout = self._head(inputs, embedding)
        return fused_linear_distillation(
            inputs,
            kernel,
            teacher_inputs,
            teacher_kernel,
            labels,
            divergence=self.divergence,
            weight_hard_loss=self.weight_hard_loss,
            weight_soft_loss=self.weight_soft_loss,
            beta=self.beta,
            temperature=self.temperature,
            ignore_index=self.ignore_index,
            student_bias=bias,
            teacher_bias=teacher_bias,
            return_soft_hard_loss=self.return_soft_hard_loss,
            weight_layout=layout,
            accum_dtype=self.accum_dtype,
            chunk_size=self.chunk_size,
            implementation=self.implementation,
        )
