"""Neighborhood attention over a sequence (Liger's LigerFusedNeighborhoodAttention, https://arxiv.org/abs/2504.16922):
each query attends only to the keys within a (dilated) window centred on it."""

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from liger_jax import runtime
from liger_jax.ops import _checks, _dispatch
from liger_jax.ops._batching import vmap_over_rows
from liger_jax.ops._checks import check_int
from liger_jax.ops._partitioning import partitioned
from liger_jax.ops._score_maps import masked_softmax


def fused_neighborhood_attention(
    query: jax.Array,
    key: jax.Array,
    value: jax.Array,
    *,
    kernel_size: int = 7,
    dilation: int = 1,
    scale: float | None = None,
    implementation: runtime.Implementation | None = None,
) -> jax.Array:
    r"""1D neighborhood attention (Liger's ``LigerFusedNeighborhoodAttentionFunction``).

    .. math::
        O_i = \sum_{j \in N(i)} \mathrm{softmax}_{j \in N(i)}(s\, q_i \cdot k_j)\, v_j, \qquad
        N(i) = \{ j : |j - i| \le \lfloor \mathrm{kernel\_size} / 2 \rfloor \cdot \mathrm{dilation},\
        (j - i) \bmod \mathrm{dilation} = 0 \}

    per batch element and head, with ``s = scale`` (default ``1 / sqrt(head_dim)``). As Liger's, the window is
    clipped at the sequence's ends rather than shifted inwards (a query near an end sees fewer keys), and there is
    no causal mask: the window reaches ``kernel_size // 2`` dilated steps both ways.

    Layout: ``[B, S, H, D]`` (batch, sequence, heads, head_dim) for query, key, value and the output, the layout of
    ``jax.nn.dot_product_attention`` and of this package's RoPE ops (Liger's function takes ``[B, H, S, D]``).

    Numerics: the scores ``s q kᵀ`` and the softmax are fp32 (whatever the inputs' dtype); the probabilities are
    rounded to value's dtype for ``P V``, which accumulates in fp32 and is rounded once to query's dtype. (Liger
    rounds the scores to the inputs' dtype first; this is flash attention's contract, tighter in bf16.) The kernels
    load only the band of keys within ``(kernel_size // 2) · dilation`` of each query block, never the
    ``[B, H, S, S]`` score map (Liger's kernels build it): work and memory grow with ``S · kernel_size · dilation``.
    The forward pass saves the output and each query's fp32 log-sum-exp; the backward pass recomputes the
    probabilities band by band (flash attention's). The ``"xla"`` path computes the same numbers over the whole
    score map, with the window as a mask.

    Args:
        query: ``[B, S, H, D]`` float32, bfloat16 or float16 (float64 too under ``"xla"``).
        key: ``[B, S, H, D]``, query's dtype.
        value: ``[B, S, H, D]``, query's dtype.
        kernel_size: the window's size in (dilated) positions, odd and ≥ 1.
        dilation: the step between the window's positions, ≥ 1.
        scale: the scores' scale, a positive float; None for ``1 / sqrt(D)``.
        implementation: ``"triton"``, ``"interpret"``, ``"xla"`` or None for the default (see
            :mod:`liger_jax.runtime`).

    Returns:
        ``[B, S, H, D]`` in query's dtype.

    Raises:
        TypeError: an input is not floating point or the three dtypes differ; kernel_size or dilation is not an
            int; scale is not a number.
        ValueError: shapes are not ``[B, S, H, D]`` alike; kernel_size is even or < 1; dilation < 1; scale ≤ 0.

    Example:
        >>> out = liger_jax.fused_neighborhood_attention(q, k, v, kernel_size=7)  # q, k, v: [B, S, H, D]
    """
    kernel_size, dilation, scale = _checked(query, key, value, kernel_size, dilation, scale)
    implementation = _dispatch.resolve(implementation, "fused_neighborhood_attention", np.size(query))
    for name, array in (("query", query), ("key", key), ("value", value)):
        _checks.check_floating(name, array, implementation)
    if implementation == "xla":
        return _full_map_attention(query, key, value, kernel_size, dilation, scale)
    if query.size == 0:
        return jnp.zeros_like(query)
    return _band_attention(query, key, value, _Band((kernel_size // 2) * dilation, dilation, scale, implementation))


def fused_neighborhood_attention_reference(
    query: jax.Array,
    key: jax.Array,
    value: jax.Array,
    *,
    kernel_size: int = 7,
    dilation: int = 1,
    scale: float | None = None,
) -> jax.Array:
    """Neighborhood attention in plain jax.numpy: :func:`fused_neighborhood_attention`'s ``"xla"`` implementation
    (the masked softmax by :func:`liger_jax.softmax_reference`, gradients by autodiff)."""
    return fused_neighborhood_attention(
        query, key, value, kernel_size=kernel_size, dilation=dilation, scale=scale, implementation="xla"
    )


def _full_map_attention(query, key, value, kernel_size, dilation, scale):
    """The definition over the whole [B, H, S, S] score map, in the kernels' precision (the ``"xla"`` path)."""
    compute = jnp.promote_types(query.dtype, jnp.float32)
    scores = jnp.einsum("bqhd,bkhd->bhqk", query, key, preferred_element_type=compute) * scale
    keep = neighborhood(query.shape[1], kernel_size, dilation)[None, None]
    probabilities = masked_softmax(scores, keep, "xla").astype(value.dtype)
    out = jnp.einsum("bhqk,bkhd->bqhd", probabilities, value, preferred_element_type=compute)
    return out.astype(query.dtype)


class _Band(NamedTuple):
    """The kernels' static settings: the band's radius ``(kernel_size // 2) · dilation``, its dilation, the
    scores' scale and the implementation."""

    radius: int
    dilation: int
    scale: float
    implementation: runtime.Implementation


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _band_attention(query, key, value, band):
    return _forward(band)(query, key, value)[0]


def _band_attention_fwd(query, key, value, band):
    out, lse = _forward(band)(query, key, value)
    return out, (query, key, value, out, lse)


def _band_attention_bwd(band, residuals, d_out):
    query, key, value, out, lse = residuals
    # Δ_i = Σ_j P_ij dP_ij = dO_i · O_i: the softmax backward's row sum, from the output.
    delta = jnp.sum(d_out.astype(jnp.float32) * out.astype(jnp.float32), axis=-1)
    return _backward(band)(query, key, value, d_out, lse, delta)


_band_attention.defvjp(_band_attention_fwd, _band_attention_bwd)

# Tensors [..., S, H, D] and statistics [..., S, H]: batch axes and heads shard freely, each launch needs a whole
# sequence (the band crosses any cut) and whole head dims.
_FORWARD_RULE = "... s h d, ... s h d, ... s h d -> ... s h d, ... s h"
_BACKWARD_RULE = "... s h d, ... s h d, ... s h d, ... s h d, ... s h, ... s h -> ... s h d, ... s h d, ... s h d"


@functools.cache
def _forward(band: _Band):
    """``(q, k, v) -> (out, lse)`` through the forward kernel, sharded and vmap-able."""

    def launch(query, key, value):
        from liger_jax.kernels import neighborhood_attention as kernels

        leading, (length, heads, dim) = query.shape[:-3], query.shape[-3:]
        q, k, v = (x.reshape(-1, length, heads, dim) for x in (query, key, value))
        out, lse = runtime.launch(
            kernels.neighborhood_attention_fwd,
            q,
            k,
            v,
            out_shape=(jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct(q.shape[:-1], jnp.float32)),
            **_launch_settings(band, q.shape),
        )
        return out.reshape(query.shape), lse.reshape(leading + (length, heads))

    sharded = partitioned(launch, _FORWARD_RULE, replicated=("s", "d"))
    return vmap_over_rows(sharded, row_argnums=(0, 1, 2), reduces_rows=False)


@functools.cache
def _backward(band: _Band):
    """``(q, k, v, dO, lse, Δ) -> (dq, dk, dv)`` through the two backward kernels, sharded and vmap-able."""

    def launch(query, key, value, d_out, lse, delta):
        from liger_jax.kernels import neighborhood_attention as kernels

        length, heads, dim = query.shape[-3:]
        tensors = tuple(x.reshape(-1, length, heads, dim) for x in (query, key, value, d_out))
        stats = tuple(x.reshape(-1, length, heads) for x in (lse, delta))
        settings = _launch_settings(band, tensors[0].shape)
        like = jax.ShapeDtypeStruct(tensors[0].shape, query.dtype)
        dq = runtime.launch(kernels.neighborhood_attention_bwd_dq, *tensors, *stats, out_shape=like, **settings)
        dk, dv = runtime.launch(
            kernels.neighborhood_attention_bwd_dkdv, *tensors, *stats, out_shape=(like, like), **settings
        )
        return tuple(x.reshape(query.shape) for x in (dq, dk, dv))

    sharded = partitioned(launch, _BACKWARD_RULE, replicated=("s", "d"))
    return vmap_over_rows(sharded, row_argnums=tuple(range(6)), reduces_rows=False)


# Queries (and keys) per program: 64 fills an H200's tensor cores with head dims up to 128 in registers; smaller
# sequences get the next power of two, at least 16 (tl.dot's smallest tile).
_MAX_BLOCK = 64
_NUM_WARPS = 4
_NUM_STAGES = 2  # prefetch the next key block while this one is multiplied


def _launch_settings(band: _Band, shape: tuple[int, ...]) -> dict:
    """Grid, warps and constexprs for a ``[B, S, H, D]`` launch."""
    batch, length, heads, dim = shape
    block = max(16, min(_MAX_BLOCK, _next_power_of_2(length)))
    # Key blocks covering one query block's band (or query blocks covering a key block's): at most 2R + block
    # positions from the band's clipped start, and never more than the sequence.
    band_blocks = -(-min(block + 2 * band.radius, length) // block)
    return {
        "grid": (-(-length // block), batch * heads),
        "implementation": band.implementation,
        "num_warps": _NUM_WARPS,
        "num_stages": _NUM_STAGES,
        "scale": band.scale,
        "S": length,
        "H": heads,
        "D": dim,
        "RADIUS": band.radius,
        "DILATION": band.dilation,
        "BLOCK_M": block,
        "BLOCK_N": block,
        "BLOCK_D": max(16, _next_power_of_2(dim)),
        "BAND_BLOCKS": band_blocks,
        # The interpreter's tl.dot cannot take bf16 tiles; fp32 copies give the same products.
        "UPCAST": band.implementation == "interpret",
    }


def _next_power_of_2(n: int) -> int:
    """The smallest power of two ≥ n (triton.next_power_of_2, without importing triton here)."""
    return 1 << (n - 1).bit_length()


def neighborhood(length: int, kernel_size: int, dilation: int) -> jax.Array:
    """``[length, length]`` bool: true where key j is in query i's window, ``|j - i| ≤ (kernel_size // 2) ·
    dilation`` and ``j - i`` a multiple of dilation."""
    offset = jnp.arange(length)[None, :] - jnp.arange(length)[:, None]
    return (jnp.abs(offset) <= (kernel_size // 2) * dilation) & (offset % dilation == 0)


def check_window(kernel_size: object, dilation: object) -> tuple[int, int]:
    """``(kernel_size, dilation)`` as ints; raises TypeError for non-ints, ValueError unless kernel_size is odd and
    ≥ 1 and dilation ≥ 1."""
    kernel_size = check_int("kernel_size", kernel_size, 1)
    if kernel_size % 2 == 0:
        raise ValueError(f"kernel_size must be odd (a window centred on its query), got {kernel_size}")
    return kernel_size, check_int("dilation", dilation, 1)


def _checked(query, key, value, kernel_size, dilation, scale):
    """``(kernel_size, dilation, scale)`` after every shape, dtype and option check; scale resolved."""
    if query.ndim != 4:
        raise ValueError(f"query must be [batch, seq, heads, head_dim], got shape {query.shape}")
    _checks.check_shape("key", key, query.shape, "query's shape")
    _checks.check_shape("value", value, query.shape, "query's shape")
    _checks.check_dtype("key", key, query.dtype, "query's dtype")
    _checks.check_dtype("value", value, query.dtype, "query's dtype")
    kernel_size, dilation = check_window(kernel_size, dilation)
    if scale is None:
        return kernel_size, dilation, 1.0 / math.sqrt(query.shape[-1])
    if isinstance(scale, bool) or not isinstance(scale, (int, float, np.floating, np.integer)):
        raise TypeError(f"scale must be a float or None, got {scale!r}")
    if not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"scale must be a positive finite float, got {scale}")
    return kernel_size, dilation, float(scale)
