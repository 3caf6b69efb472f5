"""flax.nnx modules backed by liger_jax kernels, drop-in replacements for their flax.nnx namesakes."""

import jax
import jax.numpy as jnp
from flax import nnx

from liger_jax import runtime
from liger_jax.flax_layers import _groups, _options
from liger_jax.flax_layers.score_attention import NNXFusedNeighborhoodAttention, NNXMultiTokenAttention
from liger_jax.flax_layers.tiled_mlp import NNXTiledMLP
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


class Embed(nnx.Embed):
    """``flax.nnx.Embed`` whose lookup is :func:`liger_jax.embedding`: same arguments, same ``embedding`` param.

    Takes every ``nnx.Embed`` argument, plus ``implementation``. The rows are gathered from the table as stored
    and cast to ``dtype`` after, and their gradient is summed in fp32 (no ``[V, H]`` cast of the table, no
    bfloat16 scatter-add); values are flax's. ``attend`` is flax's.
    """

    def __init__(
        self,
        num_embeddings: int,
        features: int,
        *,
        implementation: runtime.Implementation | None = None,
        **flax_options,
    ):
        super().__init__(num_embeddings, features, **flax_options)
        self.implementation = implementation

    def __call__(self, inputs: jax.Array, out_sharding=None) -> jax.Array:
        """``inputs`` (integers, any shape) → ``inputs.shape + (features,)`` in ``dtype`` (None: the param's)."""
        if self.num_embeddings == 1:
            return super().__call__(inputs, out_sharding)

        def lookup(table, ids):
            return embedding(table, ids, dtype=self.dtype, implementation=self.implementation)

        if out_sharding is not None:
            lookup = jax.sharding.auto_axes(lookup, out_sharding=out_sharding)
        return lookup(self.embedding[...], inputs)


class RMSNorm(nnx.RMSNorm):
    """``flax.nnx.RMSNorm`` computed by :func:`liger_jax.rms_norm`: same arguments, same ``scale`` param.

    Takes every ``nnx.RMSNorm`` argument, plus ``offset`` (added to ``scale``, 1.0 for Gemma), ``casting_mode``
    (default ``"gemma"``: fp32 throughout, flax's own numerics) and ``implementation``. Inputs and params are
    promoted as flax promotes them, so outputs match ``nnx.RMSNorm`` in dtype and value. Normalising over an axis
    other than the last, ``axis_name``/``axis_index_groups`` and ``mask`` raise ValueError.
    """

    def __init__(
        self,
        num_features: int,
        *,
        offset: float = 0.0,
        casting_mode: CastingMode = "gemma",
        implementation: runtime.Implementation | None = None,
        **flax_options,
    ):
        super().__init__(num_features, **flax_options)
        _options.check_local_statistics("RMSNorm", self)
        _options.check_offset("RMSNorm", offset, self.use_scale)
        self.offset = offset
        self.casting_mode = casting_mode
        self.implementation = implementation

    def __call__(self, x: jax.Array, mask: jax.Array | None = None) -> jax.Array:
        """Normalises ``x [..., num_features]``; returns the same shape in flax's promoted dtype."""
        _options.check_normalization("RMSNorm", self, x.ndim, mask)
        scale = self.scale[...] if self.scale is not None else None
        x, scale = self.promote_dtype((x, scale), dtype=self.dtype)
        if scale is None:
            scale = jnp.ones(x.shape[-1:], x.dtype)
        return rms_norm(x, scale, **self._kernel_options())

    def _kernel_options(self) -> dict:
        return dict(
            epsilon=self.epsilon, offset=self.offset, casting_mode=self.casting_mode, implementation=self.implementation
        )

    def fused_add(self, x: jax.Array, residual: jax.Array | None) -> tuple[jax.Array, jax.Array]:
        """``(y, s)``: ``s = x + residual`` in x's dtype (x and residual ``[..., num_features]`` of one dtype; ``s``
        is x itself where residual is None) and ``y`` this norm of ``s``. Where flax's promotion keeps x's dtype
        (``dtype`` unset or x's, params no wider), one kernel computes both (:func:`liger_jax.fused_add_rms_norm`):
        a pre-norm block's residual add and the norm after it, whose backward adds the cotangent of ``s`` inside the
        norm's kernel instead of in a pass of its own; otherwise the add and this norm, as flax computes them."""
        scale = self.scale[...] if self.scale is not None else None
        if self.promote_dtype((x, scale), dtype=self.dtype)[0].dtype != x.dtype:
            total = x if residual is None else x + residual
            return RMSNorm.__call__(self, total), total
        _options.check_normalization(type(self).__name__, self, x.ndim, None)
        scale = jnp.ones(x.shape[-1:], x.dtype) if scale is None else scale.astype(x.dtype)
        return fused_add_rms_norm(x, residual, scale, **self._kernel_options())


class FusedAddRMSNorm(RMSNorm):
    """Liger's ``LigerFusedAddRMSNorm``: :class:`RMSNorm`'s arguments and ``scale`` param, called on a block's
    output and the residual stream, ``y, s = norm(x, residual)`` with ``s = x + residual`` (the next residual) and
    ``y = RMSNorm(s)`` (see :meth:`RMSNorm.fused_add`)."""

    def __call__(self, x: jax.Array, residual: jax.Array) -> tuple[jax.Array, jax.Array]:  # type: ignore[override]
        """``(y, s)``, both ``x``'s shape in flax's promoted dtype."""
        return self.fused_add(x, residual)


class LayerNorm(nnx.LayerNorm):
    """``flax.nnx.LayerNorm`` computed by :func:`liger_jax.layer_norm`: same arguments, same ``scale``/``bias``.

    Takes every ``nnx.LayerNorm`` argument, plus ``implementation``. Inputs and params are promoted as flax
    promotes them (``promote_dtype``), so outputs match ``nnx.LayerNorm`` in dtype and value. The kernel always
    computes the variance in two exact fp32 passes; ``use_fast_variance`` is accepted for compatibility and changes
    nothing. Normalising over an axis other than the last, ``axis_name``/``axis_index_groups`` and ``mask`` raise
    ValueError.
    """

    def __init__(self, num_features: int, *, implementation: runtime.Implementation | None = None, **flax_options):
        super().__init__(num_features, **flax_options)
        _options.check_local_statistics("LayerNorm", self)
        self.implementation = implementation

    def __call__(self, x: jax.Array, *, mask: jax.Array | None = None) -> jax.Array:
        """Normalises ``x [..., num_features]``; returns the same shape in flax's promoted dtype."""
        _options.check_normalization("LayerNorm", self, x.ndim, mask)
        scale = self.scale[...] if self.scale is not None else None
        bias = self.bias[...] if self.bias is not None else None
        x, scale, bias = self.promote_dtype((x, scale, bias), dtype=self.dtype)
        return layer_norm(x, scale, bias, epsilon=self.epsilon, implementation=self.implementation)


class GroupNorm(nnx.GroupNorm):
    """``flax.nnx.GroupNorm`` computed by :func:`liger_jax.group_norm`: same arguments, same ``scale``/``bias``.

    Takes every ``nnx.GroupNorm`` argument, plus ``implementation``. Inputs and params are promoted as flax
    promotes them, so outputs match ``nnx.GroupNorm`` in dtype and value. The kernels compute the variance exactly
    in fp32; ``use_fast_variance`` is accepted for compatibility and changes nothing. ``reduction_axes`` other than
    flax's default (every axis but the first), ``axis_name``/``axis_index_groups`` and ``mask`` raise ValueError.
    """

    def __init__(
        self,
        num_features: int,
        num_groups: int | None = 32,
        group_size: int | None = None,
        *,
        implementation: runtime.Implementation | None = None,
        **flax_options,
    ):
        super().__init__(num_features, num_groups, group_size, **flax_options)
        _options.check_local_statistics("GroupNorm", self)
        self.implementation = implementation

    def __call__(self, x: jax.Array, *, mask: jax.Array | None = None) -> jax.Array:
        """Normalises ``x [batch, ..., num_features]``; returns the same shape in flax's promoted dtype."""
        _groups.check_group_normalization("GroupNorm", self, x.ndim, mask)
        scale = self.scale[...] if self.scale is not None else None
        bias = self.bias[...] if self.bias is not None else None
        x, scale, bias = self.promote_dtype((x, scale, bias), dtype=self.dtype)
        return group_norm(
            x, scale, bias, num_groups=self.num_groups, epsilon=self.epsilon, implementation=self.implementation
        )


class DyT(nnx.Module):
    """Dynamic Tanh, ``gamma · tanh(alpha · x) + beta`` (Liger's ``LigerDyT``), by :func:`liger_jax.dyt`.

    Params as Liger's: ``alpha`` ``(1,)`` initialised to ``init_alpha``, ``gamma`` ``(hidden_size,)`` ones and,
    with ``beta=True``, ``beta`` ``(hidden_size,)`` zeros; all ``param_dtype``. The output has x's dtype.

    Args:
        hidden_size: D, the last axis of the input.
        beta: whether there is a learnt shift.
        init_alpha: alpha's initial value.
        param_dtype: the params' dtype.
        implementation: ``"triton"``, ``"interpret"``, ``"xla"`` or None for the default.
    """

    def __init__(
        self,
        hidden_size: int,
        *,
        beta: bool = True,
        init_alpha: float = 0.5,
        param_dtype=jnp.float32,
        implementation: runtime.Implementation | None = None,
    ):
        self.alpha = nnx.Param(jnp.full((1,), init_alpha, param_dtype))
        self.gamma = nnx.Param(jnp.ones((hidden_size,), param_dtype))
        self.beta = nnx.Param(jnp.zeros((hidden_size,), param_dtype)) if beta else None
        self.implementation = implementation

    def __call__(self, x: jax.Array) -> jax.Array:
        """``x [..., hidden_size]`` → the same shape and dtype."""
        beta = self.beta[...] if self.beta is not None else None
        return dyt(x, self.alpha[...], self.gamma[...], beta, implementation=self.implementation)


class PolyNorm(nnx.Module):
    """PolyNorm, ``w0 · n(x³) + w1 · n(x²) + w2 · n(x) + b`` (Liger's ``LigerPolyNorm``), by
    :func:`liger_jax.poly_norm`.

    Params as Liger's (and PolyCom's): ``weight`` ``(3,)`` initialised to 1/3 each and ``bias`` ``()`` to 1.0, both
    ``param_dtype``. The output has x's dtype.

    Args:
        epsilon: added to each mean of squares.
        param_dtype: the params' dtype.
        implementation: ``"triton"``, ``"interpret"``, ``"xla"`` or None for the default.
    """

    def __init__(
        self,
        *,
        epsilon: float = 1e-6,
        param_dtype=jnp.float32,
        implementation: runtime.Implementation | None = None,
    ):
        self.weight = nnx.Param(jnp.full((3,), 1.0 / 3.0, param_dtype))
        self.bias = nnx.Param(jnp.ones((), param_dtype))
        self.epsilon = epsilon
        self.implementation = implementation

    def __call__(self, x: jax.Array) -> jax.Array:
        """``x [..., D]`` → the same shape and dtype."""
        return poly_norm(x, self.weight[...], self.bias[...], epsilon=self.epsilon, implementation=self.implementation)


class ModulatedRMSNorm(nnx.Module):
    """RMSNorm modulated by a scale and shift given at call time (AdaLN; Liger's ``LigerModulatedRMSNorm``), by
    :func:`liger_jax.modulated_rms_norm`.

    Params as Liger's: ``weight`` ``(hidden_size,)`` of ones (``init_fn="zeros"``: zeros, for ``offset=1.0``), none
    with ``elementwise_affine=False``; ``param_dtype``. The output has x's dtype.

    Args:
        hidden_size: D, the last axis of the input.
        epsilon: added to ``mean(x²)``.
        offset: added to ``weight``.
        casting_mode: ``"llama"``, ``"gemma"`` or ``"none"``, as :func:`liger_jax.rms_norm`.
        init_fn: ``"ones"`` or ``"zeros"``, the weight's initial value.
        elementwise_affine: whether there is a learnt weight.
        param_dtype: the weight's dtype.
        implementation: ``"triton"``, ``"interpret"``, ``"xla"`` or None for the default.
    """

    def __init__(
        self,
        hidden_size: int,
        *,
        epsilon: float = 1e-6,
        offset: float = 0.0,
        casting_mode: CastingMode = "llama",
        init_fn: str = "ones",
        elementwise_affine: bool = True,
        param_dtype=jnp.float32,
        implementation: runtime.Implementation | None = None,
    ):
        _checks.check_choice("init_fn", init_fn, ("ones", "zeros"))
        fill = jnp.ones if init_fn == "ones" else jnp.zeros
        self.weight = nnx.Param(fill((hidden_size,), param_dtype)) if elementwise_affine else None
        self.epsilon = epsilon
        self.offset = offset
        self.casting_mode = casting_mode
        self.implementation = implementation

    def __call__(self, x: jax.Array, scale: jax.Array, shift: jax.Array | None = None) -> jax.Array:
        """``x [..., hidden_size]`` modulated by ``scale`` and ``shift`` (see :func:`liger_jax.modulated_rms_norm`
        for their shapes) → x's shape and dtype."""
        return modulated_rms_norm(
            x,
            self.weight[...] if self.weight is not None else None,
            scale,
            shift,
            epsilon=self.epsilon,
            offset=self.offset,
            casting_mode=self.casting_mode,
            implementation=self.implementation,
        )


class RotaryEmbedding(nnx.Module):
    """Rotary position embedding of queries and keys: :func:`liger_jax.rope_cos_sin` then
    :func:`liger_jax.apply_rotary_pos_emb`, one kernel for q and k. No params.

    Args:
        head_dim: D, even.
        base: the wavelength base (``rope_theta``).
        interleaved: GPT-J pairs ``(2i, 2i+1)`` instead of rotate-half (Llama, NeoX).
        rotary_dim: rotate only this many leading features of each head (partial rotary: Phi, GPT-NeoX); None for
            all of them.
        implementation: ``"triton"``, ``"interpret"``, ``"xla"`` or None for the default.
    """

    def __init__(
        self,
        head_dim: int,
        *,
        base: float = 10000.0,
        interleaved: bool = False,
        rotary_dim: int | None = None,
        implementation: runtime.Implementation | None = None,
    ):
        self.head_dim = head_dim
        self.base = base
        self.interleaved = interleaved
        self.rotary_dim = rotary_dim
        self.implementation = implementation

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


class MultimodalRotaryEmbedding(nnx.Module):
    """Qwen2-VL's multimodal rotary embedding of queries and keys: :func:`liger_jax.mrope_cos_sin` then
    :func:`liger_jax.qwen2vl_mrope`. No params.

    Args:
        head_dim: D, even.
        mrope_section: three ints summing to D/2: the pairs rotated by temporal, height and width positions.
        base: the wavelength base (``rope_theta``).
        implementation: ``"triton"``, ``"interpret"``, ``"xla"`` or None for the default.
    """

    def __init__(
        self,
        head_dim: int,
        mrope_section: tuple[int, int, int],
        *,
        base: float = 10000.0,
        implementation: runtime.Implementation | None = None,
    ):
        self.head_dim = head_dim
        self.mrope_section = tuple(mrope_section)
        self.base = base
        self.implementation = implementation

    def __call__(self, q: jax.Array, k: jax.Array, position_ids: jax.Array) -> tuple[jax.Array, jax.Array]:
        """Rotates ``q [B, S, Hq, D]`` and ``k [B, S, Hkv, D]`` by integer ``position_ids [3, B, S]``; returns
        ``(q_rot, k_rot)`` in their dtypes. fp32 tables."""
        cos, sin = mrope_cos_sin(position_ids, self.head_dim, base=self.base)
        return qwen2vl_mrope(q, k, cos, sin, self.mrope_section, implementation=self.implementation)


class _GatedMLP(nnx.Module):
    """``down_proj(gate(gate_proj(x), up_proj(x)))`` with three ``nnx.Linear`` (Llama/Gemma names); subclasses set
    ``_gate`` to the op."""

    def __init__(
        self,
        hidden_size: int,
        intermediate_size: int,
        *,
        use_bias: bool = False,
        implementation: runtime.Implementation | None = None,
        rngs: nnx.Rngs,
        **linear_options,
    ):
        def linear(in_features, out_features):
            return nnx.Linear(in_features, out_features, use_bias=use_bias, rngs=rngs, **linear_options)

        self.gate_proj = linear(hidden_size, intermediate_size)
        self.up_proj = linear(hidden_size, intermediate_size)
        self.down_proj = linear(intermediate_size, hidden_size)
        self.implementation = implementation

    def __call__(self, x: jax.Array) -> jax.Array:
        """Maps ``x [..., hidden_size]`` to ``[..., hidden_size]`` in the Linear layers' dtype."""
        return self.down_proj(self._gate(self.gate_proj(x), self.up_proj(x), implementation=self.implementation))


class SwiGLUMLP(_GatedMLP):
    """The Llama MLP, ``down_proj(silu(gate_proj(x)) * up_proj(x))``, gated by :func:`liger_jax.swiglu`.

    Params ``gate_proj``, ``up_proj`` (``hidden_size → intermediate_size``) and ``down_proj`` (back), each an
    ``nnx.Linear`` with ``kernel`` (and ``bias`` with ``use_bias=True``; no bias by default, as in Llama).

    Args:
        hidden_size: features of the input and output.
        intermediate_size: features of the gate.
        use_bias: biases on the three projections.
        implementation: ``"triton"``, ``"interpret"``, ``"xla"`` or None for the default.
        rngs: initialises the kernels.
        **linear_options: passed to every ``nnx.Linear``: ``dtype``, ``param_dtype``, ``precision``,
            ``kernel_init``, ``bias_init``, ...
    """

    _gate = staticmethod(swiglu)


class GEGLUMLP(_GatedMLP):
    """The Gemma MLP, ``down_proj(gelu_tanh(gate_proj(x)) * up_proj(x))``, gated by :func:`liger_jax.geglu`.

    Arguments and params as :class:`SwiGLUMLP`.
    """

    _gate = staticmethod(geglu)


# Any MLP computed tile by tile over the sequence with recompute (see liger_jax.flax_layers.tiled_mlp).
TiledMLP = NNXTiledMLP

# Attention-score layers, flax-style params (see liger_jax.flax_layers.score_attention).
MultiTokenAttention = NNXMultiTokenAttention
FusedNeighborhoodAttention = NNXFusedNeighborhoodAttention


class Softmax(nnx.Module):
    """:func:`liger_jax.softmax` as a layer (Liger's ``LigerSoftmax``); no params.

    Args:
        axis: the axis to normalise over.
        implementation: ``"triton"``, ``"interpret"``, ``"xla"`` or None for the default.
    """

    def __init__(self, *, axis: int = -1, implementation: runtime.Implementation | None = None):
        self.axis = axis
        self.implementation = implementation

    def __call__(self, x: jax.Array) -> jax.Array:
        """Probabilities along ``axis``: x's shape and dtype."""
        return softmax(x, axis=self.axis, implementation=self.implementation)


class Sparsemax(nnx.Module):
    """:func:`liger_jax.sparsemax` as a layer (Liger's ``LigerSparsemax``); no params. Arguments as
    :class:`Softmax`."""

    def __init__(self, *, axis: int = -1, implementation: runtime.Implementation | None = None):
        self.axis = axis
        self.implementation = implementation

    def __call__(self, x: jax.Array) -> jax.Array:
        """Sparse probabilities along ``axis``: x's shape and dtype."""
        return sparsemax(x, axis=self.axis, implementation=self.implementation)


class ReLUSquared(nnx.Module):
    """:func:`liger_jax.relu_squared` as an activation layer (Liger's ``LigerReLUSquared``); no params.

    Args:
        implementation: ``"triton"``, ``"interpret"``, ``"xla"`` or None for the default.
    """

    def __init__(self, *, implementation: runtime.Implementation | None = None):
        self.implementation = implementation

    def __call__(self, x: jax.Array) -> jax.Array:
        """max(x, 0)², elementwise: x's shape and dtype."""
        return relu_squared(x, implementation=self.implementation)


class _CrossEntropyOptions(nnx.Module):
    """Holds the options of :func:`liger_jax.cross_entropy` (no params)."""

    def __init__(
        self,
        *,
        ignore_index: int = -100,
        label_smoothing: float = 0.0,
        z_loss_scale: float = 0.0,
        softcap: float | None = None,
        reduction: Reduction = "mean",
        return_z_loss: bool = False,
        use_token_scaling: bool = False,
        return_token_accuracy: bool = False,
        return_predicted_tokens: bool = False,
        implementation: runtime.Implementation | None = None,
    ):
        self.ignore_index = ignore_index
        self.label_smoothing = label_smoothing
        self.z_loss_scale = z_loss_scale
        self.softcap = softcap
        self.reduction = reduction
        self.return_z_loss = return_z_loss
        self.use_token_scaling = use_token_scaling
        self.return_token_accuracy = return_token_accuracy
        self.return_predicted_tokens = return_predicted_tokens
        self.implementation = implementation


class CrossEntropyLoss(_CrossEntropyOptions):
    """:func:`liger_jax.cross_entropy` as a module (Liger's ``LigerCrossEntropyLoss``); no params.

    Keyword arguments as :func:`liger_jax.cross_entropy`: ``ignore_index``, ``label_smoothing``, ``z_loss_scale``,
    ``softcap``, ``reduction``, ``return_z_loss``, ``use_token_scaling``, ``return_token_accuracy``,
    ``return_predicted_tokens``, ``implementation``. The class weights (Liger's ``weight``) are an array, so they
    are an argument of the call, ``ce_weight``.

    Example:
        >>> loss = CrossEntropyLoss(label_smoothing=0.1)(model.lm_head(hidden), labels)
    """

    def __call__(
        self, logits: jax.Array, labels: jax.Array, ce_weight: jax.Array | None = None
    ) -> jax.Array | tuple[jax.Array, ...]:
        """The loss of ``logits [..., V]`` against integer ``labels [...]`` (optionally weighted per class by
        ``ce_weight [V]``), as :func:`liger_jax.cross_entropy`."""
        return cross_entropy(logits, labels, ce_weight=ce_weight, **_options.loss_options(self))


def head_operands(module: str, head: nnx.Linear | nnx.Embed, hidden: jax.Array):
    """``(hidden, weight, bias, weight_layout)`` of an LM head for the fused ops: an ``nnx.Linear``'s ``kernel
    [H, V]`` and ``bias`` ("hv"), or a tied ``nnx.Embed``'s ``embedding [V, H]`` used in place ("vh"), promoted to
    the head's ``dtype`` as the head promotes them.

    Raises:
        TypeError: ``head`` is neither an ``nnx.Linear`` nor an ``nnx.Embed`` (``module`` names the caller).
    """
    if isinstance(head, nnx.Linear):
        bias = head.bias[...] if head.bias is not None else None
        hidden, weight, bias = head.promote_dtype((hidden, head.kernel[...], bias), dtype=head.dtype)
        return hidden, weight, bias, "hv"
    if isinstance(head, nnx.Embed):
        hidden, weight = head.promote_dtype((hidden, head.embedding[...]), dtype=head.dtype)
        return hidden, weight, None, "vh"
    raise TypeError(f"{module}: head must be an nnx.Linear or nnx.Embed, got {type(head)}")


class FusedLinearCrossEntropy(_CrossEntropyOptions):
    """An LM head's loss without its logits, through :func:`liger_jax.fused_linear_cross_entropy`; no params.

    ``FusedLinearCrossEntropy()(head, hidden, labels)`` computes ``CrossEntropyLoss()(head(hidden), labels)`` for an
    ``nnx.Linear`` head (its ``kernel [H, V]`` and ``bias``) and ``CrossEntropyLoss()(head.attend(hidden), labels)``
    for a tied ``nnx.Embed`` (its ``embedding [V, H]``, used in place), so switching an LM head's loss is one line.
    Inputs and params are promoted to the head's ``dtype`` as the head does it; its ``precision`` and custom
    ``dot_general`` are not used.

    Keyword arguments as :func:`liger_jax.fused_linear_cross_entropy`: the loss options of :class:`CrossEntropyLoss`,
    plus ``accum_dtype`` and ``chunk_size``; ``ce_weight`` is an argument of the call.

    Example:
        >>> loss = CrossEntropyLoss()(model.lm_head(hidden), labels)  # before: [..., V] logits
        >>> loss = FusedLinearCrossEntropy()(model.lm_head, hidden, labels)  # after: no logits
    """

    def __init__(
        self,
        *,
        ignore_index: int = -100,
        label_smoothing: float = 0.0,
        z_loss_scale: float = 0.0,
        softcap: float | None = None,
        reduction: Reduction = "mean",
        return_z_loss: bool = False,
        use_token_scaling: bool = False,
        return_token_accuracy: bool = False,
        return_predicted_tokens: bool = False,
        accum_dtype=jnp.float32,
        chunk_size: int | None = None,
        implementation: runtime.Implementation | None = None,
    ):
        super().__init__(
            ignore_index=ignore_index,
            label_smoothing=label_smoothing,
            z_loss_scale=z_loss_scale,
            softcap=softcap,
            reduction=reduction,
            return_z_loss=return_z_loss,
            use_token_scaling=use_token_scaling,
            return_token_accuracy=return_token_accuracy,
            return_predicted_tokens=return_predicted_tokens,
            implementation=implementation,
        )
        self.accum_dtype = accum_dtype
        self.chunk_size = chunk_size

    def __call__(
        self, head: nnx.Linear | nnx.Embed, hidden: jax.Array, labels: jax.Array, ce_weight: jax.Array | None = None
    ) -> jax.Array | tuple[jax.Array, ...]:
        """The loss of ``head`` applied to ``hidden [..., H]`` against integer ``labels [...]`` (optionally weighted
        per class by ``ce_weight [V]``).

        Raises:
            TypeError: ``head`` is neither an ``nnx.Linear`` nor an ``nnx.Embed``.
        """
        hidden, weight, bias, layout = head_operands("FusedLinearCrossEntropy", head, hidden)
        return fused_linear_cross_entropy(
            hidden,
            weight,
            labels,
            bias=bias,
            weight_layout=layout,
            accum_dtype=self.accum_dtype,
            chunk_size=self.chunk_size,
            ce_weight=ce_weight,
            **_options.loss_options(self),
        )


class KLDivLoss(nnx.Module):
    """:func:`liger_jax.kl_div` as a module (Liger's ``LigerKLDIVLoss``); no params.

    Keyword arguments as :func:`liger_jax.kl_div`: ``reduction``, ``log_target``, ``eps``, ``implementation``.

    Example:
        >>> loss = KLDivLoss(reduction="batchmean")(jax.nn.log_softmax(logits), teacher_probs)
    """

    def __init__(
        self,
        *,
        reduction: str = "batchmean",
        log_target: bool = False,
        eps: float = 1e-10,
        implementation: runtime.Implementation | None = None,
    ):
        self.reduction = reduction
        self.log_target = log_target
        self.eps = eps
        self.implementation = implementation

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


class JSDLoss(nnx.Module):
    """:func:`liger_jax.jsd` as a module (Liger's ``LigerJSD``); no params.

    Keyword arguments as :func:`liger_jax.jsd`: ``beta``, ``ignore_index``, ``implementation``.

    Example:
        >>> loss = JSDLoss(beta=0.5)(jax.nn.log_softmax(student_logits), jax.nn.log_softmax(teacher_logits), labels)
    """

    def __init__(
        self, *, beta: float = 0.5, ignore_index: int = -100, implementation: runtime.Implementation | None = None
    ):
        self.beta = beta
        self.ignore_index = ignore_index
        self.implementation = implementation

    def __call__(self, input: jax.Array, target: jax.Array, labels: jax.Array | None = None) -> jax.Array:
        """The JSD of student log-probabilities ``input [..., V]`` from the teacher's ``target [..., V]``, rows with
        ``labels [...] == ignore_index`` skipped, as :func:`liger_jax.jsd`."""
        return jsd(
            input, target, labels, beta=self.beta, ignore_index=self.ignore_index, implementation=self.implementation
        )


class TVDLoss(nnx.Module):
    """:func:`liger_jax.tvd` as a module (Liger's ``LigerTVDLoss``); no params.

    Keyword arguments as :func:`liger_jax.tvd`: ``reduction``, ``ignore_index``, ``implementation``.

    Example:
        >>> loss = TVDLoss()(jax.nn.softmax(student_logits), jax.nn.softmax(teacher_logits), labels)
    """

    def __init__(
        self,
        *,
        reduction: str = "batchmean",
        ignore_index: int = -100,
        implementation: runtime.Implementation | None = None,
    ):
        self.reduction = reduction
        self.ignore_index = ignore_index
        self.implementation = implementation

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


class FusedLinearLogProbs(nnx.Module):
    """Per-token log-probs of an LM head without its logits, through :func:`liger_jax.fused_linear_logprobs`; no
    params.

    ``FusedLinearLogProbs()(head, hidden, tokens)`` is ``log_softmax(head(hidden) / T)[tokens]`` for an
    ``nnx.Linear`` head, or with a tied ``nnx.Embed`` (``head.attend``), as :class:`FusedLinearCrossEntropy` takes
    heads.

    Args:
        temperature, return_entropy, chunk_size, implementation: as :func:`liger_jax.fused_linear_logprobs`.

    Example:
        >>> logps = FusedLinearLogProbs(temperature=0.7)(model.lm_head, hidden, sampled_tokens)
    """

    def __init__(
        self,
        *,
        temperature: float = 1.0,
        return_entropy: bool = False,
        chunk_size: int | None = None,
        implementation: runtime.Implementation | None = None,
    ):
        self.temperature = temperature
        self.return_entropy = return_entropy
        self.chunk_size = chunk_size
        self.implementation = implementation

    def __call__(
        self, head: nnx.Linear | nnx.Embed, hidden: jax.Array, tokens: jax.Array
    ) -> jax.Array | tuple[jax.Array, jax.Array]:
        """Log-probs ``[...]`` of integer ``tokens [...]`` under ``head`` applied to ``hidden [..., H]`` (and the
        entropy with ``return_entropy``), as :func:`liger_jax.fused_linear_logprobs`."""
        hidden, weight, bias, layout = head_operands("FusedLinearLogProbs", head, hidden)
        return fused_linear_logprobs(
            hidden,
            weight,
            tokens,
            bias=bias,
            temperature=self.temperature,
            return_entropy=self.return_entropy,
            weight_layout=layout,
            chunk_size=self.chunk_size,
            implementation=self.implementation,
        )


def _student_and_teacher(module: str, student_head, student_hidden, teacher_head, teacher_hidden):
    """Both heads' operands for the distillation ops, which take one weight layout for both."""
    student = head_operands(module, student_head, student_hidden)
    teacher = head_operands(module, teacher_head, teacher_hidden)
    if student[3] != teacher[3]:
        raise ValueError(f"{module}: the student and teacher heads must both be nnx.Linear or both nnx.Embed")
    return student, jax.lax.stop_gradient(teacher[:3])


class FusedLinearJSD(nnx.Module):
    """Liger's ``LigerFusedLinearJSD``: the JSD between a student's and a teacher's LM heads without their logits,
    through :func:`liger_jax.fused_linear_jsd`; no params. The teacher gets no gradient.

    Args:
        beta, ignore_index, temperature, accum_dtype, chunk_size, implementation: as :func:`liger_jax.fused_linear_jsd`.

    Example:
        >>> loss = FusedLinearJSD(beta=0.5)(student.lm_head, h_student, teacher.lm_head, h_teacher, labels)
    """

    def __init__(
        self,
        *,
        beta: float = 0.5,
        ignore_index: int = -100,
        temperature: float = 1.0,
        accum_dtype=jnp.float32,
        chunk_size: int | None = None,
        implementation: runtime.Implementation | None = None,
    ):
        self.beta = beta
        self.ignore_index = ignore_index
        self.temperature = temperature
        self.accum_dtype = accum_dtype
        self.chunk_size = chunk_size
        self.implementation = implementation

    def __call__(self, student_head, student_hidden, teacher_head, teacher_hidden, labels=None) -> jax.Array:
        """The scalar loss of ``student_head(student_hidden [..., H_s])`` against ``teacher_head(teacher_hidden
        [..., H_t])``, rows with ``labels [...] == ignore_index`` skipped; heads as :class:`FusedLinearLogProbs`."""
        (x, weight, bias, layout), (teacher_x, teacher_weight, teacher_bias) = _student_and_teacher(
            "FusedLinearJSD", student_head, student_hidden, teacher_head, teacher_hidden
        )
        return fused_linear_jsd(
            x,
            weight,
            teacher_x,
            teacher_weight,
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


class FusedLinearDistillationLoss(nnx.Module):
    """Hard cross-entropy plus a soft divergence from a teacher, through both LM heads without their logits
    (:func:`liger_jax.fused_linear_distillation`: Liger's chunked JSD, KL, TVD and cosine distillation losses); no
    params. The teacher gets no gradient.

    Args:
        divergence, weight_hard_loss, weight_soft_loss, beta, temperature, ignore_index, return_soft_hard_loss,
            accum_dtype, chunk_size, implementation: as :func:`liger_jax.fused_linear_distillation`.

    Example:
        >>> loss_fn = FusedLinearDistillationLoss(divergence="kl", temperature=2.0)
        >>> loss = loss_fn(student.lm_head, h_student, teacher.lm_head, h_teacher, labels)
    """

    def __init__(
        self,
        *,
        divergence: str = "jsd",
        weight_hard_loss: float = 0.5,
        weight_soft_loss: float = 0.5,
        beta: float = 0.5,
        temperature: float = 1.0,
        ignore_index: int = -100,
        return_soft_hard_loss: bool = False,
        accum_dtype=jnp.float32,
        chunk_size: int | None = None,
        implementation: runtime.Implementation | None = None,
    ):
        self.divergence = divergence
        self.weight_hard_loss = weight_hard_loss
        self.weight_soft_loss = weight_soft_loss
        self.beta = beta
        self.temperature = temperature
        self.ignore_index = ignore_index
        self.return_soft_hard_loss = return_soft_hard_loss
        self.accum_dtype = accum_dtype
        self.chunk_size = chunk_size
        self.implementation = implementation

    def __call__(
        self, student_head, student_hidden, teacher_head, teacher_hidden, labels
    ) -> jax.Array | tuple[jax.Array, jax.Array, jax.Array]:
        """The loss (and with ``return_soft_hard_loss`` the soft and hard losses) of ``student_head`` applied to
        ``student_hidden [..., H_s]`` against ``teacher_head`` on ``teacher_hidden [..., H_t]`` and integer
        ``labels [...]``; heads as :class:`FusedLinearLogProbs`."""
        (x, weight, bias, layout), (teacher_x, teacher_weight, teacher_bias) = _student_and_teacher(
            "FusedLinearDistillationLoss", student_head, student_hidden, teacher_head, teacher_hidden
        )
        return fused_linear_distillation(
            x,
            weight,
            teacher_x,
            teacher_weight,
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
