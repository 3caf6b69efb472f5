"""Qwen2-VL's multimodal rotary position embedding (M-RoPE): the RoPE kernel with a table plane per pair section."""

import numbers
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from liger_jax import runtime
from liger_jax.ops import _dispatch
from liger_jax.ops.rope import N_SECTIONS, check_inputs, rope_cos_sin, rotate, rotation_reference


def qwen2vl_mrope(
    q: jax.Array,
    k: jax.Array | None,
    cos: jax.Array,
    sin: jax.Array,
    mrope_section: Sequence[int],
    *,
    implementation: runtime.Implementation | None = None,
) -> tuple[jax.Array, jax.Array | None]:
    r"""Rotates queries and keys by temporal, height and width positions (Qwen2-VL's M-RoPE, Liger's
    ``liger_multimodal_rotary_pos_emb``).

    Rotate-half RoPE (:func:`liger_jax.apply_rotary_pos_emb`) whose D/2 frequency pairs are split into
    ``mrope_section = (t, h, w)`` consecutive sections: pairs ``[0, t)`` take their cos/sin from plane 0 of the
    tables (the temporal position ids), ``[t, t + h)`` from plane 1 (height), the rest from plane 2 (width). That is
    HF transformers' ``apply_multimodal_rotary_pos_emb``, which splits the tables by ``mrope_section * 2`` and takes
    chunk i from plane ``i % 3``.

    Numerics as :func:`liger_jax.apply_rotary_pos_emb`: fp32, rounded once to the dtype of q (of k); the backward
    pass is the kernel's transposed rotation, saving only the tables.

    Args:
        q: ``[B, S, Hq, D]`` queries, float32, bfloat16 or float16 (float64 too under ``"xla"``); D even.
        k: ``[B, S, Hkv, D]`` keys, Hkv dividing Hq; or None (q alone is rotated).
        cos: ``[3, B, S, D]`` (HF's layout), ``[3, 1, S, D]`` or ``[3, S, D]``: the rotate-half cos tables of the
            temporal, height and width position ids.
        sin: the same shape as ``cos``.
        mrope_section: three non-negative ints summing to D/2 (Qwen2-VL 7B: ``(16, 24, 24)`` at D = 128).
        implementation: ``"triton"``, ``"interpret"``, ``"xla"`` or None for the default.

    Returns:
        ``(q_rot, k_rot)`` with the shapes and dtypes of ``q`` and ``k``; ``k_rot`` is None when ``k`` is.

    Raises:
        TypeError: an argument is not floating point.
        ValueError: as :func:`liger_jax.apply_rotary_pos_emb`, or cos/sin lack the plane axis of 3, or
            mrope_section is not three non-negative ints summing to D/2.
    """
    tensors = (q,) if k is None else (q, k)
    implementation = _dispatch.resolve(implementation, "rope", sum(np.size(x) for x in tensors))
    check_inputs(q, k, cos, sin, rotary_dim=None, planes=N_SECTIONS, implementation=implementation)
    sections = _checked_sections(mrope_section, q.shape[-1])
    rotated = rotate(tensors, cos, sin, interleaved=False, sections=sections, implementation=implementation)
    return (rotated[0], None) if k is None else rotated


def qwen2vl_mrope_reference(
    q: jax.Array, k: jax.Array | None, cos: jax.Array, sin: jax.Array, mrope_section: Sequence[int]
) -> tuple[jax.Array, jax.Array | None]:
    """M-RoPE in plain jax.numpy: the specification of :func:`qwen2vl_mrope` and its ``"xla"`` implementation.

    Shapes and dtypes as :func:`qwen2vl_mrope`; computed in ``promote(dtype, float32)``.
    """
    tensors = (q,) if k is None else (q, k)
    sections = _checked_sections(mrope_section, q.shape[-1])
    rotated = rotation_reference(tensors, cos, sin, interleaved=False, sections=sections)
    return (rotated[0], None) if k is None else rotated


def mrope_cos_sin(
    position_ids: jax.Array, head_dim: int, *, base: float = 10000.0, dtype: jnp.dtype = jnp.float32
) -> tuple[jax.Array, jax.Array]:
    """The ``[3, B, S, D]`` tables of :func:`qwen2vl_mrope`: :func:`liger_jax.rope_cos_sin` of each plane's positions
    (HF's ``Qwen2VLRotaryEmbedding``).

    Args:
        position_ids: ``[3, B, S]`` integer temporal, height and width positions (HF's ``get_rope_index``).
        head_dim: D, even.
        base: the wavelength base (``rope_theta``).
        dtype: dtype of the tables.

    Returns:
        ``(cos, sin)``, each ``[3, B, S, D]`` of ``dtype``.

    Raises:
        TypeError: position_ids is not an integer array.
        ValueError: position_ids is not ``[3, B, S]``, or head_dim is not a positive even int.
    """
    if not jnp.issubdtype(position_ids.dtype, jnp.integer):
        raise TypeError(f"position_ids must be an integer array, got dtype {position_ids.dtype}")
    if position_ids.ndim != 3 or position_ids.shape[0] != N_SECTIONS:
        raise ValueError(f"position_ids must have shape ({N_SECTIONS}, B, S), got {position_ids.shape}")
    planes, batch, seq = position_ids.shape
    cos, sin = rope_cos_sin(position_ids.reshape(planes * batch, seq), head_dim, base=base, dtype=dtype)
    return cos.reshape(planes, batch, seq, -1), sin.reshape(planes, batch, seq, -1)


def _checked_sections(mrope_section, head_dim: int) -> tuple[int, int, int]:
    sections = tuple(mrope_section) if isinstance(mrope_section, Sequence) else ()
    if (
        len(sections) != N_SECTIONS
        or not all(isinstance(n, numbers.Integral) and n >= 0 for n in sections)
        or sum(sections) != head_dim // 2
    ):
        raise ValueError(
            f"mrope_section must be {N_SECTIONS} non-negative ints summing to head_dim / 2 = {head_dim // 2}, "
            f"got {mrope_section!r}"
        )
    return tuple(int(n) for n in sections)
