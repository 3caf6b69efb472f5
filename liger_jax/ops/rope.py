"""Rotary position embeddings: cos/sin tables, reference, Triton launch, custom_vjp."""

import functools
import numbers

import jax
import jax.numpy as jnp
import numpy as np
from jax.custom_derivatives import SymbolicZero

from liger_jax import runtime
from liger_jax.ops import _checks, _dispatch, _tiling
from liger_jax.ops._batching import vmap_over_rows
from liger_jax.ops._partitioning import partitioned

# Launch heuristics. A head tile holds at most this many (x1, x2) pairs: 16 heads of a D = 128 model per step,
# 8 fp32 values per thread for each of x1, x2, out1, out2 at 4 warps (no spills, many programs per SM). Measured on
# the H200 (B=4, S=4096, 32/8 heads, bf16) against 2048 pairs at 8 warps: the backward 10% faster, the forward 4%.
_MAX_TILE_PAIRS = 1024
_NUM_WARPS = 4


def apply_rotary_pos_emb(
    q: jax.Array,
    k: jax.Array,
    cos: jax.Array,
    sin: jax.Array,
    *,
    interleaved: bool = False,
    implementation: runtime.Implementation | None = None,
) -> tuple[jax.Array, jax.Array]:
    r"""Rotates queries and keys by their positions' angles (rotary position embedding, Liger's RoPE).

    .. math::
        \mathrm{out} = x \cdot \cos + \mathrm{rotate}(x) \cdot \sin

    for ``x`` each head of ``q`` and of ``k``. In the rotate-half (NeoX, Llama, HF transformers) layout,
    ``rotate(x) = concat(-x[D/2:], x[:D/2])``; with ``interleaved=True`` (GPT-J, Llama 4) the pairs are adjacent,
    ``rotate(x)[2i] = -x[2i+1]`` and ``rotate(x)[2i+1] = x[2i]``. :func:`rope_cos_sin` builds ``cos``/``sin`` in
    either layout; positions are already gathered into them, so packed sequences and arbitrary position ids work.

    Numerics: computed in fp32 (cos and sin upcast as given), rounded once to the dtype of q (of k). The backward
    pass is the same kernel applying the transposed rotation (by -θ) to the cotangents; nothing but cos and sin is
    saved. When cos or sin are themselves differentiated, q and k are saved too and their gradients
    (``Σ_heads dout · x`` and ``Σ_heads dout · rotate(x)``) are computed by XLA.

    Args:
        q: ``[B, S, Hq, D]`` queries, float32, bfloat16 or float16 (float64 too under ``"xla"``); D even.
        k: ``[B, S, Hkv, D]`` keys, same kinds of dtype; Hkv divides Hq (grouped-query attention, Hkv = 1 too).
        cos: ``[S, D]``, ``[1, S, D]`` or ``[B, S, D]``, any of those float dtypes.
        sin: the same shape as ``cos``.
        interleaved: the GPT-J pair layout instead of rotate-half.
        implementation: ``"triton"``, ``"interpret"``, ``"xla"`` or None for the default (see
            :mod:`liger_jax.runtime`).

    Returns:
        ``(q_rot, k_rot)`` with the shapes and dtypes of ``q`` and ``k``.

    Raises:
        TypeError: an argument is not floating point.
        ValueError: q or k is not rank 4, their batch, sequence or head_dim differ, D is odd, Hkv does not divide
            Hq, or cos/sin do not have one of the shapes above.

    Example:
        >>> cos, sin = liger_jax.rope_cos_sin(jnp.arange(seq_len), head_dim)
        >>> q, k = liger_jax.apply_rotary_pos_emb(q, k, cos, sin)
    """
    implementation = _dispatch.resolve(implementation, "rope", np.size(q) + np.size(k))
    _check_inputs(q, k, cos, sin, implementation)
    if implementation == "xla" or q.size == 0:
        return apply_rotary_pos_emb_reference(q, k, cos, sin, interleaved=interleaved)
    return _rope(q, k, cos, sin, bool(interleaved), implementation)


def rope_cos_sin(
    positions: jax.Array,
    head_dim: int,
    *,
    base: float = 10000.0,
    interleaved: bool = False,
    dtype: jnp.dtype = jnp.float32,
) -> tuple[jax.Array, jax.Array]:
    r"""The cos and sin tables of rotary embeddings at ``positions``, as HF transformers' Llama computes them.

    .. math::
        \theta_{p,i} = p \cdot \mathrm{base}^{-2i/D}, \quad i = 0, \dots, D/2 - 1

    computed in fp32; each angle fills both entries of its pair: ``[θ_0..θ_{D/2-1}, θ_0..θ_{D/2-1}]`` in the
    rotate-half layout, ``[θ_0, θ_0, θ_1, θ_1, ...]`` with ``interleaved=True``.

    Args:
        positions: ``[S]`` or ``[B, S]`` integer positions.
        head_dim: D, even.
        base: the wavelength base (``rope_theta``).
        interleaved: build the GPT-J layout (for ``apply_rotary_pos_emb(..., interleaved=True)``).
        dtype: dtype of the tables.

    Returns:
        ``(cos, sin)``, each ``[S, D]`` or ``[B, S, D]`` of ``dtype``.

    Raises:
        TypeError: positions is not an integer array.
        ValueError: positions is not rank 1 or 2, or head_dim is not a positive even int.
    """
    if not jnp.issubdtype(positions.dtype, jnp.integer):
        raise TypeError(f"positions must be an integer array, got dtype {positions.dtype}")
    if positions.ndim not in (1, 2):
        raise ValueError(f"positions must have shape (S,) or (B, S), got {positions.shape}")
    if not isinstance(head_dim, numbers.Integral) or head_dim <= 0 or head_dim % 2:
        raise ValueError(f"head_dim must be a positive even int, got {head_dim!r}")
    inv_freq = 1.0 / (base ** (jnp.arange(0, int(head_dim), 2, dtype=jnp.float32) / int(head_dim)))
    angles = positions.astype(jnp.float32)[..., None] * inv_freq.reshape((1,) * positions.ndim + (-1,))
    if interleaved:
        angles = jnp.repeat(angles, 2, axis=-1)
    else:
        angles = jnp.concatenate([angles, angles], axis=-1)
    return jnp.cos(angles).astype(dtype), jnp.sin(angles).astype(dtype)


def apply_rotary_pos_emb_reference(
    q: jax.Array, k: jax.Array, cos: jax.Array, sin: jax.Array, *, interleaved: bool = False
) -> tuple[jax.Array, jax.Array]:
    """RoPE in plain jax.numpy: the specification of :func:`apply_rotary_pos_emb` and its ``"xla"`` implementation.

    Each of q and k is computed in ``promote(dtype, float32)`` (float64 inputs stay float64, the oracle of the
    tests) and rounded to its dtype. Shapes and dtypes as :func:`apply_rotary_pos_emb`.
    """
    # Upcast the tables once, so their gradients from q and from k add up before the one rounding to their dtype.
    cos, sin = (table.astype(jnp.promote_types(table.dtype, jnp.float32)) for table in (cos, sin))
    return _rotate(q, cos, sin, interleaved), _rotate(k, cos, sin, interleaved)


def _rotate(x, cos, sin, interleaved):
    compute = jnp.promote_types(x.dtype, jnp.float32)
    # [S, D] or [B|1, S, D] -> [B|1, S, 1, D], explicitly: no rank promotion.
    table_shape = (1,) * (3 - cos.ndim) + cos.shape[:-1] + (1, cos.shape[-1])
    cos = cos.reshape(table_shape).astype(compute)
    sin = sin.reshape(table_shape).astype(compute)
    x_c = x.astype(compute)
    if interleaved:
        pairs = x_c.reshape(*x.shape[:-1], -1, 2)
        rotated = jnp.stack([-pairs[..., 1], pairs[..., 0]], axis=-1).reshape(x.shape)
    else:
        half = x.shape[-1] // 2
        rotated = jnp.concatenate([-x_c[..., half:], x_c[..., :half]], axis=-1)
    return (x_c * cos + rotated * sin).astype(x.dtype)


def _check_inputs(q, k, cos, sin, implementation):
    for name, array in (("q", q), ("k", k), ("cos", cos), ("sin", sin)):
        _checks.check_floating(name, array, implementation)
    for name, array in (("q", q), ("k", k)):
        if array.ndim != 4:
            raise ValueError(f"{name} must have shape (batch, seq, heads, head_dim), got {array.shape}")
    batch, seq, q_heads, head_dim = q.shape
    if head_dim % 2:
        raise ValueError(f"q's head_dim (last axis) must be even to form rotation pairs, got shape {q.shape}")
    k_heads = k.shape[2]
    _checks.check_shape("k", k, (batch, seq, k_heads, head_dim), "q's batch, seq and head_dim")
    if k_heads == 0 or q_heads % k_heads:
        raise ValueError(f"k's heads ({k_heads}) must divide q's heads ({q_heads}), got k shape {k.shape}")
    table_shapes = ((seq, head_dim), (1, seq, head_dim), (batch, seq, head_dim))
    if cos.shape not in table_shapes:
        raise ValueError(f"cos must have shape (S, D), (1, S, D) or (B, S, D) = {table_shapes}, got {cos.shape}")
    _checks.check_shape("sin", sin, cos.shape, "cos's shape")


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def _rope(q, k, cos, sin, interleaved, implementation):
    return _launcher(interleaved, False, implementation)(q, k, cos, sin)


def _rope_fwd(q, k, cos, sin, interleaved, implementation):
    # symbolic_zeros: each array arrives as CustomVJPPrimal(value, perturbed).
    out = _launcher(interleaved, False, implementation)(q.value, k.value, cos.value, sin.value)
    saved_inputs = (q.value, k.value) if cos.perturbed or sin.perturbed else None
    return out, (saved_inputs, cos.value, sin.value)


def _rope_bwd(interleaved, implementation, residuals, cotangents):
    saved_inputs, cos, sin = residuals
    dq_rot, dk_rot = (jnp.zeros(ct.shape, ct.dtype) if isinstance(ct, SymbolicZero) else ct for ct in cotangents)
    if saved_inputs is None:
        dq, dk = _launcher(interleaved, True, implementation, alias_cotangents=True)(dq_rot, dk_rot, cos, sin)
        return dq, dk, None, None
    dq, dk = _launcher(interleaved, True, implementation)(dq_rot, dk_rot, cos, sin)
    _, pullback = jax.vjp(
        lambda cos, sin: apply_rotary_pos_emb_reference(*saved_inputs, cos, sin, interleaved=interleaved), cos, sin
    )
    dcos, dsin = pullback((dq_rot, dk_rot))
    return dq, dk, dcos, dsin


_rope.defvjp(_rope_fwd, _rope_bwd, symbolic_zeros=True)


@functools.cache
def _launcher(interleaved, transpose, implementation, alias_cotangents=False):
    """``(q [..., Hq, D], k [..., Hkv, D], cos, sin) -> (q_out, k_out)`` through the kernel, vmap-able.

    q and k share their leading (token) axes, which end with cos's leading axes; token t uses table row
    ``t % cos_rows``. With ``alias_cotangents`` the outputs reuse q's and k's buffers (dead cotangents).
    """
    from liger_jax.kernels import rope as kernels

    def rotate(q, k, cos, sin):
        *_, q_heads, head_dim = q.shape
        k_heads = k.shape[-2]
        n_tokens = q.size // (q_heads * head_dim)
        block_pairs = _tiling.next_power_of_2(head_dim // 2)
        q_out, k_out = runtime.launch(
            kernels.rope,
            q.reshape(n_tokens, q_heads, head_dim),
            k.reshape(n_tokens, k_heads, head_dim),
            cos.reshape(-1, head_dim),
            sin.reshape(-1, head_dim),
            cos.size // head_dim,
            out_shape=(
                jax.ShapeDtypeStruct((n_tokens, q_heads, head_dim), q.dtype),
                jax.ShapeDtypeStruct((n_tokens, k_heads, head_dim), k.dtype),
            ),
            grid=(n_tokens,),
            implementation=implementation,
            num_warps=_NUM_WARPS,
            input_output_aliases={0: 0, 1: 1} if alias_cotangents else None,
            N_Q_HEADS=q_heads,
            N_K_HEADS=k_heads,
            HEAD_DIM=head_dim,
            INTERLEAVED=interleaved,
            TRANSPOSE=transpose,
            BLOCK_PAIRS=block_pairs,
            BLOCK_Q_HEADS=_block_heads(q_heads, block_pairs),
            BLOCK_K_HEADS=_block_heads(k_heads, block_pairs),
        )
        return q_out.reshape(q.shape), k_out.reshape(k.shape)

    sharded = partitioned(rotate, _sharding_rule, replicated=("d", "broadcast0", "broadcast1"))
    return vmap_over_rows(sharded, row_argnums=(0, 1), reduces_rows=False)


def _sharding_rule(q, k, cos, sin) -> str:
    """Tokens and heads may be sharded, D stays whole; the tables share q's trailing token axes (a 1 broadcasts)."""
    tokens = [f"t{i}" for i in range(q.ndim - 2)]
    offset = len(tokens) - (cos.ndim - 1)
    table = [tokens[offset + i] if n == q.shape[offset + i] else f"broadcast{i}" for i, n in enumerate(cos.shape[:-1])]
    q_axes, k_axes, table_axes = " ".join([*tokens, "h", "d"]), " ".join([*tokens, "g", "d"]), " ".join([*table, "d"])
    return f"{q_axes}, {k_axes}, {table_axes}, {table_axes} -> {q_axes}, {k_axes}"


def _block_heads(n_heads: int, block_pairs: int) -> int:
    """Heads per tile: all of them when they fit in ``_MAX_TILE_PAIRS`` pairs, else the largest power of 2 that does."""
    return min(_tiling.next_power_of_2(n_heads), max(1, _MAX_TILE_PAIRS // block_pairs))
