"""Flax NNX and linen layers of the attention-score ops: multi-token attention (a learned convolution over attention
scores, Liger's ``LigerMultiTokenAttention``) and neighborhood attention (projections around
:func:`liger_jax.fused_neighborhood_attention`, Liger's ``LigerFusedNeighborhoodAttention``).

Exported as ``MultiTokenAttention`` and ``FusedNeighborhoodAttention`` by :mod:`liger_jax.flax_layers.nnx` and
:mod:`liger_jax.flax_layers.linen`. Flax has no such layers: params follow flax's own names and layouts (a conv's
``kernel [kh, kw, in / groups, out]`` and ``bias``; ``nnx.Linear``/``nn.Dense`` projections).
"""

from collections.abc import Callable

import jax
import jax.numpy as jnp
from flax import linen as nn
from flax import nnx

from liger_jax import runtime
from liger_jax.ops._checks import check_int
from liger_jax.ops._score_maps import check_pair
from liger_jax.ops.fused_neighborhood_attention import check_window, fused_neighborhood_attention
from liger_jax.ops.multi_token_attention import multi_token_attention

# Liger's (torch's Conv2d) kaiming_uniform(a=√5): uniform in ±1/√fan_in, fan_in = kh · kw · in / groups.
LIGER_CONV_INIT = jax.nn.initializers.variance_scaling(1.0 / 3.0, "fan_in", "uniform")


def _conv_kernel_shape(in_channels, out_channels, kernel_size, groups) -> tuple[int, int, int, int]:
    """The HWIO kernel shape, after checking that ``groups`` divides both channel counts."""
    kernel_rows, kernel_cols = check_pair("kernel_size", kernel_size, 1)
    groups = check_int("groups", groups, 1)
    if in_channels % groups or out_channels % groups:
        raise ValueError(f"groups={groups} must divide in_channels ({in_channels}) and out_channels ({out_channels})")
    return kernel_rows, kernel_cols, in_channels // groups, out_channels


def _heads_check(hidden_size: int, num_heads: int, kernel_size: int, dilation: int) -> None:
    if hidden_size % num_heads:
        raise ValueError(f"hidden_size ({hidden_size}) must be divisible by num_heads ({num_heads})")
    check_window(kernel_size, dilation)


def _split_heads(x: jax.Array, num_heads: int) -> jax.Array:
    """``[B, S, hidden]`` → ``[B, S, heads, hidden / heads]``."""
    return x.reshape(*x.shape[:-1], num_heads, x.shape[-1] // num_heads)


class NNXMultiTokenAttention(nnx.Module):
    """:func:`liger_jax.multi_token_attention` with its convolution's params (Liger's ``LigerMultiTokenAttention``).

    Maps scores ``[B, in_channels, L, L]`` (heads as channels) to ``[B, out_channels, L', L']``. Params ``kernel``
    ``[kh, kw, in_channels / groups, out_channels]`` (flax's Conv layout; Liger's init, uniform in ±1/√fan_in) and
    ``bias`` ``[out_channels]`` (zeros) when ``use_bias``.

    Args:
        in_channels: heads of the scores.
        out_channels: heads of the output.
        kernel_size: the convolution's size over (queries, keys): an int or a pair.
        stride: an int or a pair, each ≥ 1.
        padding: an int or a pair, each ≥ 0 (``kernel_size // 2`` with stride 1 keeps L).
        dilation: an int or a pair, each ≥ 1.
        groups: channel groups, dividing both channel counts.
        use_bias: whether to add ``bias`` (Liger's ``bias``).
        sparse: sparsemax instead of softmax (float32 scores).
        param_dtype: the params' dtype.
        kernel_init: initialiser of ``kernel``.
        bias_init: initialiser of ``bias``.
        implementation: ``"triton"``, ``"interpret"``, ``"xla"`` or None for the default.
        rngs: initialises the kernel.
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int | tuple[int, int],
        stride: int | tuple[int, int] = 1,
        padding: int | tuple[int, int] = 0,
        dilation: int | tuple[int, int] = 1,
        groups: int = 1,
        *,
        use_bias: bool = True,
        sparse: bool = False,
        param_dtype=jnp.float32,
        kernel_init: Callable = LIGER_CONV_INIT,
        bias_init: Callable = jax.nn.initializers.zeros,
        implementation: runtime.Implementation | None = None,
        rngs: nnx.Rngs,
    ):
        shape = _conv_kernel_shape(in_channels, out_channels, kernel_size, groups)
        self.kernel = nnx.Param(kernel_init(rngs.params(), shape, param_dtype))
        self.bias = nnx.Param(bias_init(rngs.params(), (out_channels,), param_dtype)) if use_bias else None
        self.options = {"stride": stride, "padding": padding, "dilation": dilation, "groups": groups, "sparse": sparse}
        self.implementation = implementation

    def __call__(self, scores: jax.Array) -> jax.Array:
        """Mixes ``scores [B, in_channels, L, L]``; returns ``[B, out_channels, L', L']`` in scores' dtype."""
        bias = None if self.bias is None else self.bias[...]
        return multi_token_attention(scores, self.kernel[...], bias, implementation=self.implementation, **self.options)


class LinenMultiTokenAttention(nn.Module):
    """The linen twin of :class:`NNXMultiTokenAttention`: the same fields (but ``rngs``), params and call."""

    in_channels: int
    out_channels: int
    kernel_size: int | tuple[int, int]
    stride: int | tuple[int, int] = 1
    padding: int | tuple[int, int] = 0
    dilation: int | tuple[int, int] = 1
    groups: int = 1
    use_bias: bool = True
    sparse: bool = False
    param_dtype: jnp.dtype = jnp.float32
    kernel_init: Callable = LIGER_CONV_INIT
    bias_init: Callable = jax.nn.initializers.zeros
    implementation: runtime.Implementation | None = None

    @nn.compact
    def __call__(self, scores: jax.Array) -> jax.Array:
        """Mixes ``scores [B, in_channels, L, L]``; returns ``[B, out_channels, L', L']`` in scores' dtype."""
        shape = _conv_kernel_shape(self.in_channels, self.out_channels, self.kernel_size, self.groups)
        kernel = self.param("kernel", self.kernel_init, shape, self.param_dtype)
        bias = self.param("bias", self.bias_init, (self.out_channels,), self.param_dtype) if self.use_bias else None
        return multi_token_attention(
            scores,
            kernel,
            bias,
            stride=self.stride,
            padding=self.padding,
            dilation=self.dilation,
            groups=self.groups,
            sparse=self.sparse,
            implementation=self.implementation,
        )


class NNXFusedNeighborhoodAttention(nnx.Module):
    """Self-attention over a sequence window (Liger's ``LigerFusedNeighborhoodAttention``):
    ``out_proj(dropout(neighborhood_attention(q_proj(x), k_proj(x), v_proj(x))))``.

    Params ``q_proj``, ``k_proj``, ``v_proj`` and ``out_proj``, each an ``nnx.Linear`` ``hidden_size →
    hidden_size`` with ``kernel`` (and ``bias`` with ``use_bias``, Liger's ``bias``, on by default as in Liger).

    Args:
        hidden_size: features of the input and output; divisible by num_heads.
        num_heads: attention heads, each of ``hidden_size / num_heads`` features.
        kernel_size: the window's size, odd.
        dilation: the step between the window's positions, ≥ 1.
        use_bias: biases on the four projections.
        dropout: dropout rate on the attention output, before ``out_proj`` (as Liger).
        scale: the scores' scale; None for ``1 / sqrt(head_dim)``.
        implementation: ``"triton"``, ``"interpret"``, ``"xla"`` or None for the default.
        rngs: initialises the projections and draws the dropout masks.
        **linear_options: passed to every ``nnx.Linear``: ``dtype``, ``param_dtype``, ``kernel_init``, ...
    """

    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        kernel_size: int = 7,
        dilation: int = 1,
        *,
        use_bias: bool = True,
        dropout: float = 0.0,
        scale: float | None = None,
        implementation: runtime.Implementation | None = None,
        rngs: nnx.Rngs,
        **linear_options,
    ):
        _heads_check(hidden_size, num_heads, kernel_size, dilation)

        def linear():
            return nnx.Linear(hidden_size, hidden_size, use_bias=use_bias, rngs=rngs, **linear_options)

        self.q_proj, self.k_proj, self.v_proj, self.out_proj = linear(), linear(), linear(), linear()
        self.dropout = nnx.Dropout(dropout, rngs=rngs)
        self.num_heads = num_heads
        self.options = {"kernel_size": kernel_size, "dilation": dilation, "scale": scale}
        self.implementation = implementation

    def __call__(self, hidden_states: jax.Array, *, deterministic: bool | None = None) -> jax.Array:
        """Attends within each position's window of ``hidden_states [B, S, hidden_size]``; returns the same shape in
        the projections' dtype. ``deterministic`` overrides the dropout's own setting."""
        q, k, v = (
            _split_heads(proj(hidden_states), self.num_heads) for proj in (self.q_proj, self.k_proj, self.v_proj)
        )
        attended = fused_neighborhood_attention(q, k, v, implementation=self.implementation, **self.options)
        attended = attended.reshape(hidden_states.shape[:-1] + (-1,))
        return self.out_proj(self.dropout(attended, deterministic=deterministic))


class LinenFusedNeighborhoodAttention(nn.Module):
    """The linen twin of :class:`NNXFusedNeighborhoodAttention`: the same fields (but ``rngs`` and
    ``linear_options``), params (``nn.Dense`` submodules of the same names) and call; dropout draws from the
    ``"dropout"`` rng collection."""

    hidden_size: int
    num_heads: int
    kernel_size: int = 7
    dilation: int = 1
    use_bias: bool = True
    dropout: float = 0.0
    scale: float | None = None
    implementation: runtime.Implementation | None = None

    @nn.compact
    def __call__(self, hidden_states: jax.Array, *, deterministic: bool = True) -> jax.Array:
        """Attends within each position's window of ``hidden_states [B, S, hidden_size]``; returns the same shape.
        Dropout applies when ``deterministic`` is False."""
        _heads_check(self.hidden_size, self.num_heads, self.kernel_size, self.dilation)

        def project(name, x):
            return nn.Dense(self.hidden_size, use_bias=self.use_bias, name=name)(x)

        q, k, v = (
            _split_heads(project(name, hidden_states), self.num_heads) for name in ("q_proj", "k_proj", "v_proj")
        )
        attended = fused_neighborhood_attention(
            q,
            k,
            v,
            kernel_size=self.kernel_size,
            dilation=self.dilation,
            scale=self.scale,
            implementation=self.implementation,
        )
        attended = attended.reshape(hidden_states.shape[:-1] + (-1,))
        attended = nn.Dropout(self.dropout)(attended, deterministic=deterministic)
        return project("out_proj", attended)
