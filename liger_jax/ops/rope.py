"""Rotary position embeddings: cos/sin tables, reference, Triton launch, custom_vjp.

The rotation here serves the whole RoPE family: :func:`apply_rotary_pos_emb` (full or partial rotary, either pair
layout), :func:`liger_jax.qwen2vl_mrope` (a table plane per pair section) and :func:`liger_jax.llama4_rope`
(interleaved tables from complex frequencies) all call :func:`rotate`.
"""

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

# Qwen2-VL's mrope_section splits the pairs among this many table planes: temporal, height, width positions.
N_SECTIONS = 3


def apply_rotary_pos_emb(
    q: jax.Array,
    k: jax.Array | None,
    cos: jax.Array,
    sin: jax.Array,
    *,
    interleaved: bool = False,
    rotary_dim: int | None = None,
    implementation: runtime.Implementation | None = None,
) -> tuple[jax.Array, jax.Array | None]:
    r"""Rotates queries and keys by their positions' angles (rotary position embedding, Liger's RoPE).

    .. math::
        \mathrm{out} = x \cdot \cos + \mathrm{rotate}(x) \cdot \sin

    for ``x`` the first ``rotary_dim`` features of each head of ``q`` and of ``k``; the remaining
    ``D - rotary_dim`` features pass through unchanged (partial rotary: Phi, GPT-NeoX, Gemma 4). In the rotate-half
    (NeoX, Llama, HF transformers) layout, ``rotate(x) = concat(-x[R/2:], x[:R/2])`` with R = rotary_dim; with
    ``interleaved=True`` (GPT-J, Llama 4) the pairs are adjacent, ``rotate(x)[2i] = -x[2i+1]`` and
    ``rotate(x)[2i+1] = x[2i]``. :func:`rope_cos_sin` builds ``cos``/``sin`` in either layout; positions are already
    gathered into them, so packed sequences and arbitrary position ids work.

    Numerics: computed in fp32 (cos and sin upcast as given), rounded once to the dtype of q (of k); pass-through
    features are copied exactly. The backward pass is the same kernel applying the transposed rotation (by -θ) to
    the cotangents; nothing but cos and sin is saved. When cos or sin are themselves differentiated, q and k are
    saved too and their gradients (``Σ_heads dout · x`` and ``Σ_heads dout · rotate(x)``) are computed by XLA.

    Args:
        q: ``[B, S, Hq, D]`` queries, float32, bfloat16 or float16 (float64 too under ``"xla"``); D even.
        k: ``[B, S, Hkv, D]`` keys, same kinds of dtype; Hkv divides Hq (grouped-query attention, Hkv = 1 too). Or
            None: q alone is rotated.
        cos: ``[S, R]``, ``[1, S, R]`` or ``[B, S, R]``, any of those float dtypes; R = rotary_dim.
        sin: the same shape as ``cos``.
        interleaved: the GPT-J pair layout instead of rotate-half.
        rotary_dim: R, how many leading features of each head rotate: even, at most D; None for all of them.
        implementation: ``"triton"``, ``"interpret"``, ``"xla"`` or None for the default (see
            :mod:`liger_jax.runtime`).

    Returns:
        ``(q_rot, k_rot)`` with the shapes and dtypes of ``q`` and ``k``; ``k_rot`` is None when ``k`` is.

    Raises:
        TypeError: an argument is not floating point.
        ValueError: q or k is not rank 4, their batch, sequence or head_dim differ, D is odd, Hkv does not divide
            Hq, rotary_dim is odd, not positive or above D, or cos/sin do not have one of the shapes above.

    Example:
        >>> cos, sin = liger_jax.rope_cos_sin(jnp.arange(seq_len), head_dim)
        >>> q, k = liger_jax.apply_rotary_pos_emb(q, k, cos, sin)
    """
    tensors = (q,) if k is None else (q, k)
    implementation = _dispatch.resolve(implementation, "rope", sum(np.size(x) for x in tensors))
    check_inputs(q, k, cos, sin, rotary_dim=rotary_dim, planes=None, implementation=implementation)
    rotated = rotate(tensors, cos, sin, interleaved=bool(interleaved), sections=None, implementation=implementation)
    return (rotated[0], None) if k is None else rotated


def rope_cos_sin(
    positions: jax.Array,
    head_dim: int,
    *,
    base: float = 10000.0,
    interleaved: bool = False,
    rotary_dim: int | None = None,
    dtype: jnp.dtype = jnp.float32,
) -> tuple[jax.Array, jax.Array]:
    r"""The cos and sin tables of rotary embeddings at ``positions``, as HF transformers' Llama computes them.

    .. math::
        \theta_{p,i} = p \cdot \mathrm{base}^{-2i/R}, \quad i = 0, \dots, R/2 - 1

    for R = rotary_dim (HF's ``head_dim * partial_rotary_factor``; D by default), computed in fp32; each angle fills
    both entries of its pair: ``[θ_0..θ_{R/2-1}, θ_0..θ_{R/2-1}]`` in the rotate-half layout,
    ``[θ_0, θ_0, θ_1, θ_1, ...]`` with ``interleaved=True``.

    Args:
        positions: ``[S]`` or ``[B, S]`` integer positions.
        head_dim: D, even.
        base: the wavelength base (``rope_theta``).
        interleaved: build the GPT-J layout (for ``apply_rotary_pos_emb(..., interleaved=True)``).
        rotary_dim: R, the rotated features of a head (partial rotary): even, at most D; None for D.
        dtype: dtype of the tables.

    Returns:
        ``(cos, sin)``, each ``[S, R]`` or ``[B, S, R]`` of ``dtype``.

    Raises:
        TypeError: positions is not an integer array.
        ValueError: positions is not rank 1 or 2, head_dim is not a positive even int, or rotary_dim is odd, not
            positive or above head_dim.
    """
    if not jnp.issubdtype(positions.dtype, jnp.integer):
        raise TypeError(f"positions must be an integer array, got dtype {positions.dtype}")
    if positions.ndim not in (1, 2):
        raise ValueError(f"positions must have shape (S,) or (B, S), got {positions.shape}")
    if not isinstance(head_dim, numbers.Integral) or head_dim <= 0 or head_dim % 2:
        raise ValueError(f"head_dim must be a positive even int, got {head_dim!r}")
    width = _rotary_width(rotary_dim, int(head_dim))
    inv_freq = 1.0 / (base ** (jnp.arange(0, width, 2, dtype=jnp.float32) / width))
    angles = positions.astype(jnp.float32)[..., None] * inv_freq.reshape((1,) * positions.ndim + (-1,))
    if interleaved:
        angles = jnp.repeat(angles, 2, axis=-1)
    else:
        angles = jnp.concatenate([angles, angles], axis=-1)
    return jnp.cos(angles).astype(dtype), jnp.sin(angles).astype(dtype)


def apply_rotary_pos_emb_reference(
    q: jax.Array, k: jax.Array | None, cos: jax.Array, sin: jax.Array, *, interleaved: bool = False
) -> tuple[jax.Array, jax.Array | None]:
    """RoPE in plain jax.numpy: the specification of :func:`apply_rotary_pos_emb` and its ``"xla"`` implementation.

    The first ``cos.shape[-1]`` features of each head rotate, the rest pass through. Each of q and k is computed in
    ``promote(dtype, float32)`` (float64 inputs stay float64, the oracle of the tests) and rounded to its dtype.
    Shapes and dtypes as :func:`apply_rotary_pos_emb`.
    """
    tensors = (q,) if k is None else (q, k)
    rotated = rotation_reference(tensors, cos, sin, interleaved=interleaved, sections=None)
    return (rotated[0], None) if k is None else rotated


def rotation_reference(
    tensors: tuple[jax.Array, ...],
    cos: jax.Array,
    sin: jax.Array,
    *,
    interleaved: bool,
    sections: tuple[int, int, int] | None,
) -> tuple[jax.Array, ...]:
    """The rotation of :func:`rotate` in plain jax.numpy; with ``sections`` the tables have a leading plane axis and
    pair p takes its entries from the plane of the section p falls in."""
    # Upcast the tables once, so their gradients from q and from k add up before the one rounding to their dtype.
    cos, sin = (table.astype(jnp.promote_types(table.dtype, jnp.float32)) for table in (cos, sin))
    if sections is not None:
        cos, sin = (_merged_planes(table, sections, interleaved) for table in (cos, sin))
    return tuple(_rotate(x, cos, sin, interleaved) for x in tensors)


def _merged_planes(table, sections, interleaved):
    """``[planes, ..., R] -> [..., R]``: each feature from the plane of its pair's section."""
    width = table.shape[-1]
    pair = np.arange(width) // 2 if interleaved else np.arange(width) % (width // 2)
    plane = np.searchsorted(np.cumsum(sections), pair, side="right").reshape((1,) * (table.ndim - 2) + (width,))
    return jnp.select([plane == i for i in range(len(sections) - 1)], list(table[:-1]), table[-1])


def _rotate(x, cos, sin, interleaved):
    compute = jnp.promote_types(x.dtype, jnp.float32)
    width = cos.shape[-1]
    # [S, R] or [B|1, S, R] -> [B|1, S, 1, R], explicitly: no rank promotion.
    table_shape = (1,) * (3 - cos.ndim) + cos.shape[:-1] + (1, width)
    cos = cos.reshape(table_shape).astype(compute)
    sin = sin.reshape(table_shape).astype(compute)
    x_c = x[..., :width].astype(compute)
    if interleaved:
        pairs = x_c.reshape(*x_c.shape[:-1], -1, 2)
        rotated = jnp.stack([-pairs[..., 1], pairs[..., 0]], axis=-1).reshape(x_c.shape)
    else:
        half = width // 2
        rotated = jnp.concatenate([-x_c[..., half:], x_c[..., :half]], axis=-1)
    return jnp.concatenate([(x_c * cos + rotated * sin).astype(x.dtype), x[..., width:]], axis=-1)


def _rotary_width(rotary_dim, head_dim: int) -> int:
    """``rotary_dim`` checked against ``head_dim``; ``head_dim`` for None."""
    if rotary_dim is None:
        return head_dim
    if not isinstance(rotary_dim, numbers.Integral) or rotary_dim <= 0 or rotary_dim % 2 or rotary_dim > head_dim:
        raise ValueError(f"rotary_dim must be a positive even int at most head_dim = {head_dim}, got {rotary_dim!r}")
    return int(rotary_dim)


def check_inputs(q, k, cos, sin, *, rotary_dim, planes, implementation) -> None:
    """Checks q ``[B, S, Hq, D]``, k ``[B, S, Hkv, D]`` (or None) and the tables ``[planes?, S|1 S|B S, R]``.

    Raises:
        TypeError: an argument is not floating point.
        ValueError: as :func:`apply_rotary_pos_emb` says.
    """
    named = (("q", q), ("cos", cos), ("sin", sin)) + ((("k", k),) if k is not None else ())
    for name, array in named:
        _checks.check_floating(name, array, implementation)
    for name, array in (("q", q), ("k", k)):
        if array is not None and array.ndim != 4:
            raise ValueError(f"{name} must have shape (batch, seq, heads, head_dim), got {array.shape}")
    batch, seq, q_heads, head_dim = q.shape
    if head_dim % 2:
        raise ValueError(f"q's head_dim (last axis) must be even to form rotation pairs, got shape {q.shape}")
    if k is not None:
        k_heads = k.shape[2]
        _checks.check_shape("k", k, (batch, seq, k_heads, head_dim), "q's batch, seq and head_dim")
        if k_heads == 0 or q_heads % k_heads:
            raise ValueError(f"k's heads ({k_heads}) must divide q's heads ({q_heads}), got k shape {k.shape}")
    width = _rotary_width(rotary_dim, head_dim)
    leading = () if planes is None else (planes,)
    table_shapes = tuple(leading + shape for shape in ((seq, width), (1, seq, width), (batch, seq, width)))
    if cos.shape not in table_shapes:
        names = "(S, R), (1, S, R) or (B, S, R)" if planes is None else f"({planes}, S|1 S|B S, R)"
        raise ValueError(f"cos must have shape {names} = {table_shapes} (R = rotary_dim), got {cos.shape}")
    _checks.check_shape("sin", sin, cos.shape, "cos's shape")


def rotate(
    tensors: tuple[jax.Array, ...],
    cos: jax.Array,
    sin: jax.Array,
    *,
    interleaved: bool,
    sections: tuple[int, int, int] | None,
    implementation: runtime.Implementation,
) -> tuple[jax.Array, ...]:
    """Rotates each of ``tensors`` (one or two, checked by :func:`check_inputs`) by the tables, in one launch.

    The first ``cos.shape[-1]`` features of each head rotate; ``sections`` (summing to ``cos.shape[-1] / 2``) give
    the tables a leading plane axis, one plane per section of pairs (Qwen2-VL's multimodal RoPE).
    """
    if implementation == "xla" or tensors[0].size == 0:
        return rotation_reference(tensors, cos, sin, interleaved=interleaved, sections=sections)
    return _rope(tuple(tensors), cos, sin, interleaved, sections, implementation)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5))
def _rope(tensors, cos, sin, interleaved, sections, implementation):
    return _launcher(len(tensors), interleaved, sections, False, implementation)(*tensors, cos, sin)


def _rope_fwd(tensors, cos, sin, interleaved, sections, implementation):
    # symbolic_zeros: each array arrives as CustomVJPPrimal(value, perturbed).
    values = tuple(x.value for x in tensors)
    out = _launcher(len(values), interleaved, sections, False, implementation)(*values, cos.value, sin.value)
    saved_inputs = values if cos.perturbed or sin.perturbed else None
    return out, (saved_inputs, cos.value, sin.value)


def _rope_bwd(interleaved, sections, implementation, residuals, cotangents):
    saved_inputs, cos, sin = residuals
    douts = tuple(jnp.zeros(ct.shape, ct.dtype) if isinstance(ct, SymbolicZero) else ct for ct in cotangents)
    # The cotangents are dead after the launch unless the tables' gradients need them too.
    dead = saved_inputs is None
    transposed = _launcher(len(douts), interleaved, sections, True, implementation, alias_cotangents=dead)
    if dead:
        return transposed(*douts, cos, sin), None, None
    _, pullback = jax.vjp(
        lambda cos, sin: rotation_reference(saved_inputs, cos, sin, interleaved=interleaved, sections=sections),
        cos,
        sin,
    )
    dcos, dsin = pullback(douts)
    return transposed(*douts, cos, sin), dcos, dsin


_rope.defvjp(_rope_fwd, _rope_bwd, symbolic_zeros=True)


@functools.cache
def _launcher(n_tensors, interleaved, sections, transpose, implementation, alias_cotangents=False):
    """``(x [..., H, D] (one or two of them), cos, sin) -> rotated xs`` through the kernel, vmap-able.

    The tensors share their leading (token) axes, which end with the tables' leading axes (after the plane axis
    with ``sections``); token t uses table row ``t % cos_rows``. With ``alias_cotangents`` the outputs reuse the
    inputs' buffers (dead cotangents).
    """
    from liger_jax.kernels import rope as kernels

    def rotate_tensors(*arrays):
        *tensors, cos, sin = arrays
        head_dim, width = tensors[0].shape[-1], cos.shape[-1]
        n_tokens = tensors[0].size // (tensors[0].shape[-2] * head_dim)
        planes = 1 if sections is None else N_SECTIONS
        section_t, section_h = (width // 2, 0) if sections is None else sections[:2]
        block_pairs = _tiling.next_power_of_2(width // 2)
        flat = [x.reshape(n_tokens, x.shape[-2], head_dim) for x in tensors]
        # q alone: k is a one-element placeholder, in and out, that the kernel never touches (N_K_HEADS = 0).
        q_k = flat if n_tensors == 2 else [flat[0], jnp.zeros((1,), flat[0].dtype)]
        outputs = runtime.launch(
            kernels.rope,
            *q_k,
            cos.reshape(planes, -1, width),
            sin.reshape(planes, -1, width),
            cos.size // (planes * width),
            out_shape=tuple(jax.ShapeDtypeStruct(x.shape, x.dtype) for x in q_k),
            grid=(n_tokens,),
            implementation=implementation,
            num_warps=_NUM_WARPS,
            input_output_aliases={i: i for i in range(n_tensors)} if alias_cotangents else None,
            HEAD_DIM=head_dim,
            ROTARY_DIM=width,
            INTERLEAVED=interleaved,
            TRANSPOSE=transpose,
            SECTION_T=section_t,
            SECTION_H=section_h,
            BLOCK_PAIRS=block_pairs,
            # 1 when no feature passes through: the kernel then compiles the pass-through copy out.
            BLOCK_PASS=_tiling.next_power_of_2(max(head_dim - width, 1)),
            **_head_constexprs(flat, block_pairs),
        )
        return tuple(out.reshape(x.shape) for out, x in zip(outputs[:n_tensors], tensors, strict=True))

    sharded = partitioned(
        rotate_tensors,
        functools.partial(_sharding_rule, n_tensors, sections is not None),
        replicated=("d", "r", "plane", "b0", "b1"),
    )
    return vmap_over_rows(sharded, row_argnums=tuple(range(n_tensors)), reduces_rows=False)


def _head_constexprs(flat, block_pairs) -> dict[str, int]:
    """The kernel's head counts and head tiles; ``N_K_HEADS = 0`` (one empty tile) when q is rotated alone."""
    q_heads = flat[0].shape[1]
    k_heads = flat[1].shape[1] if len(flat) == 2 else 0
    return {
        "N_Q_HEADS": q_heads,
        "N_K_HEADS": k_heads,
        "BLOCK_Q_HEADS": _block_heads(q_heads, block_pairs),
        "BLOCK_K_HEADS": _block_heads(k_heads, block_pairs),
    }


def _sharding_rule(n_tensors, has_planes, *arrays) -> str:
    """Tokens and heads may be sharded, D stays whole; the tables share q's trailing token axes (a 1 broadcasts)
    after their plane axis, if any."""
    q, cos = arrays[0], arrays[n_tensors]
    tokens = [f"t{i}" for i in range(q.ndim - 2)]
    table_tokens = cos.shape[int(has_planes) : -1]
    offset = len(tokens) - len(table_tokens)
    table = [tokens[offset + i] if n == q.shape[offset + i] else f"b{i}" for i, n in enumerate(table_tokens)]
    operands = [" ".join([*tokens, head, "d"]) for head in ("h", "g")[:n_tensors]]
    table_axes = " ".join(["plane"] * has_planes + table + ["r"])
    return f"{', '.join(operands)}, {table_axes}, {table_axes} -> {', '.join(operands)}"


def _block_heads(n_heads: int, block_pairs: int) -> int:
    """Heads per tile: all of them when they fit in ``_MAX_TILE_PAIRS`` pairs, else the largest power of 2 that does."""
    return min(_tiling.next_power_of_2(n_heads), max(1, _MAX_TILE_PAIRS // block_pairs))
