"""flax.nnx modules backed by liger_jax kernels, drop-in replacements for their flax.nnx namesakes."""

import jax
import jax.numpy as jnp
from flax import nnx

from liger_jax import runtime
from liger_jax.flax_layers import _options
from liger_jax.ops.cross_entropy import Reduction, cross_entropy
from liger_jax.ops.fused_linear_cross_entropy import fused_linear_cross_entropy
from liger_jax.ops.glu import geglu, swiglu
from liger_jax.ops.layer_norm import layer_norm
from liger_jax.ops.rms_norm import CastingMode, rms_norm
from liger_jax.ops.rope import apply_rotary_pos_emb, rope_cos_sin


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
        _options.check_unset("RMSNorm", axis_name=self.axis_name, axis_index_groups=self.axis_index_groups)
        if offset and not self.use_scale:
            raise ValueError("RMSNorm: offset needs use_scale=True (the offset is added to the scale)")
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
        return rms_norm(
            x,
            scale,
            epsilon=self.epsilon,
            offset=self.offset,
            casting_mode=self.casting_mode,
            implementation=self.implementation,
        )


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
        _options.check_unset("LayerNorm", axis_name=self.axis_name, axis_index_groups=self.axis_index_groups)
        self.implementation = implementation

    def __call__(self, x: jax.Array, *, mask: jax.Array | None = None) -> jax.Array:
        """Normalises ``x [..., num_features]``; returns the same shape in flax's promoted dtype."""
        _options.check_normalization("LayerNorm", self, x.ndim, mask)
        scale = self.scale[...] if self.scale is not None else None
        bias = self.bias[...] if self.bias is not None else None
        x, scale, bias = self.promote_dtype((x, scale, bias), dtype=self.dtype)
        return layer_norm(x, scale, bias, epsilon=self.epsilon, implementation=self.implementation)


class RotaryEmbedding(nnx.Module):
    """Rotary position embedding of queries and keys: :func:`liger_jax.rope_cos_sin` then
    :func:`liger_jax.apply_rotary_pos_emb`, one kernel for q and k. No params.

    Args:
        head_dim: D, even.
        base: the wavelength base (``rope_theta``).
        interleaved: GPT-J pairs ``(2i, 2i+1)`` instead of rotate-half (Llama, NeoX).
        implementation: ``"triton"``, ``"interpret"``, ``"xla"`` or None for the default.
    """

    def __init__(
        self,
        head_dim: int,
        *,
        base: float = 10000.0,
        interleaved: bool = False,
        implementation: runtime.Implementation | None = None,
    ):
        self.head_dim = head_dim
        self.base = base
        self.interleaved = interleaved
        self.implementation = implementation

    def __call__(self, q: jax.Array, k: jax.Array, positions: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
        """Rotates ``q [B, S, Hq, D]`` and ``k [B, S, Hkv, D]`` by integer ``positions`` ``[S]`` or ``[B, S]``
        (default ``arange(S)``); returns ``(q_rot, k_rot)`` in their dtypes. fp32 tables."""
        positions = jnp.arange(q.shape[1]) if positions is None else positions
        cos, sin = rope_cos_sin(positions, self.head_dim, base=self.base, interleaved=self.interleaved)
        return apply_rotary_pos_emb(q, k, cos, sin, interleaved=self.interleaved, implementation=self.implementation)


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
        implementation: runtime.Implementation | None = None,
    ):
        self.ignore_index = ignore_index
        self.label_smoothing = label_smoothing
        self.z_loss_scale = z_loss_scale
        self.softcap = softcap
        self.reduction = reduction
        self.return_z_loss = return_z_loss
        self.implementation = implementation


class CrossEntropyLoss(_CrossEntropyOptions):
    """:func:`liger_jax.cross_entropy` as a module (Liger's ``LigerCrossEntropyLoss``); no params.

    Keyword arguments as :func:`liger_jax.cross_entropy`: ``ignore_index``, ``label_smoothing``, ``z_loss_scale``,
    ``softcap``, ``reduction``, ``return_z_loss``, ``implementation``.

    Example:
        >>> loss = CrossEntropyLoss(label_smoothing=0.1)(model.lm_head(hidden), labels)
    """

    def __call__(self, logits: jax.Array, labels: jax.Array) -> jax.Array | tuple[jax.Array, jax.Array]:
        """The loss of ``logits [..., V]`` against integer ``labels [...]``, as :func:`liger_jax.cross_entropy`."""
        return cross_entropy(logits, labels, **_options.loss_options(self))


class FusedLinearCrossEntropy(_CrossEntropyOptions):
    """An LM head's loss without its logits, through :func:`liger_jax.fused_linear_cross_entropy`; no params.

    ``FusedLinearCrossEntropy()(head, hidden, labels)`` computes ``CrossEntropyLoss()(head(hidden), labels)`` for an
    ``nnx.Linear`` head (its ``kernel [H, V]`` and ``bias``) and ``CrossEntropyLoss()(head.attend(hidden), labels)``
    for a tied ``nnx.Embed`` (its ``embedding [V, H]``, used in place), so switching an LM head's loss is one line.
    Inputs and params are promoted to the head's ``dtype`` as the head does it; its ``precision`` and custom
    ``dot_general`` are not used.

    Keyword arguments as :func:`liger_jax.fused_linear_cross_entropy`: the loss options of :class:`CrossEntropyLoss`,
    plus ``accum_dtype`` and ``chunk_size``.

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
            implementation=implementation,
        )
        self.accum_dtype = accum_dtype
        self.chunk_size = chunk_size

    def __call__(
        self, head: nnx.Linear | nnx.Embed, hidden: jax.Array, labels: jax.Array
    ) -> jax.Array | tuple[jax.Array, jax.Array]:
        """The loss of ``head`` applied to ``hidden [..., H]`` against integer ``labels [...]``.

        Raises:
            TypeError: ``head`` is neither an ``nnx.Linear`` nor an ``nnx.Embed``.
        """
        if isinstance(head, nnx.Linear):
            bias = head.bias[...] if head.bias is not None else None
            hidden, weight, bias = head.promote_dtype((hidden, head.kernel[...], bias), dtype=head.dtype)
            layout = "hv"
        elif isinstance(head, nnx.Embed):
            hidden, weight = head.promote_dtype((hidden, head.embedding[...]), dtype=head.dtype)
            bias, layout = None, "vh"
        else:
            raise TypeError(f"FusedLinearCrossEntropy: head must be an nnx.Linear or nnx.Embed, got {type(head)}")
        return fused_linear_cross_entropy(
            hidden,
            weight,
            labels,
            bias=bias,
            weight_layout=layout,
            accum_dtype=self.accum_dtype,
            chunk_size=self.chunk_size,
            **_options.loss_options(self),
        )
