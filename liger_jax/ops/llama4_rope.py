"""Llama 4's rotary position embedding: complex frequencies on interleaved pairs, by the RoPE kernel."""

import jax
import jax.numpy as jnp
import numpy as np

from liger_jax import runtime
from liger_jax.ops import _dispatch
from liger_jax.ops.rope import check_inputs, rotate, rotation_reference


def llama4_rope(
    q: jax.Array,
    k: jax.Array | None,
    freqs_cis: jax.Array,
    *,
    implementation: runtime.Implementation | None = None,
) -> tuple[jax.Array, jax.Array | None]:
    r"""Rotates queries and keys as Llama 4 does (HF transformers' ``apply_rotary_emb``, Liger's
    ``liger_llama4_text_rotary_pos_emb``; its vision RoPE too).

    .. math::
        (\mathrm{out}_{2i} + j\,\mathrm{out}_{2i+1}) = (x_{2i} + j\,x_{2i+1}) \cdot \mathrm{freqs\_cis}_i

    for each head of ``q`` and ``k``: adjacent features are the real and imaginary parts of a complex number,
    multiplied by the token's complex frequency. That is :func:`liger_jax.apply_rotary_pos_emb` with
    ``interleaved=True`` and the tables ``cos = Re(freqs_cis)``, ``sin = Im(freqs_cis)`` repeated on both entries of
    each pair, which is how it runs (the tables are built by XLA, in fp32).

    Numerics: computed in fp32 and rounded once to the dtype of q (of k), as HF's ``.float()`` then ``type_as``.
    The backward pass rotates the cotangents by the conjugate frequencies in the same kernel.

    Args:
        q: ``[B, S, Hq, D]`` queries, float32, bfloat16 or float16 (float64 too under ``"xla"``); D even.
        k: ``[B, S, Hkv, D]`` keys, Hkv dividing Hq; or None (q alone is rotated).
        freqs_cis: ``[S, D/2]``, ``[1, S, D/2]`` or ``[B, S, D/2]`` complex64 (complex128 too under ``"xla"``):
            ``exp(j · position · θ_i)`` as ``Llama4TextRotaryEmbedding`` returns it.
        implementation: ``"triton"``, ``"interpret"``, ``"xla"`` or None for the default.

    Returns:
        ``(q_rot, k_rot)`` with the shapes and dtypes of ``q`` and ``k``; ``k_rot`` is None when ``k`` is.

    Raises:
        TypeError: q or k is not floating point, or freqs_cis is not complex.
        ValueError: as :func:`liger_jax.apply_rotary_pos_emb`, or freqs_cis has none of the shapes above.

    Example:
        >>> freqs_cis = jnp.exp(1j * positions[:, None] * inv_freq[None, :])  # [S, D/2]
        >>> q, k = liger_jax.llama4_rope(q, k, freqs_cis)
    """
    tensors = (q,) if k is None else (q, k)
    implementation = _dispatch.resolve(implementation, "rope", sum(np.size(x) for x in tensors))
    _check_frequencies(q, freqs_cis, implementation)
    cos, sin = _interleaved_tables(freqs_cis)
    check_inputs(q, k, cos, sin, rotary_dim=None, planes=None, implementation=implementation)
    rotated = rotate(tensors, cos, sin, interleaved=True, sections=None, implementation=implementation)
    return (rotated[0], None) if k is None else rotated


def llama4_rope_reference(
    q: jax.Array, k: jax.Array | None, freqs_cis: jax.Array
) -> tuple[jax.Array, jax.Array | None]:
    """Llama 4's RoPE in plain jax.numpy: the specification of :func:`llama4_rope` and its ``"xla"`` implementation.

    Shapes and dtypes as :func:`llama4_rope`; computed in ``promote(dtype, float32)``.
    """
    tensors = (q,) if k is None else (q, k)
    rotated = rotation_reference(tensors, *_interleaved_tables(freqs_cis), interleaved=True, sections=None)
    return (rotated[0], None) if k is None else rotated


def _interleaved_tables(freqs_cis: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``[..., D/2]`` complex -> ``(cos, sin)`` ``[..., D]``: ``[Re_0, Re_0, Re_1, Re_1, ...]`` and the same of Im."""
    return tuple(jnp.repeat(part, 2, axis=-1) for part in (jnp.real(freqs_cis), jnp.imag(freqs_cis)))


def _check_frequencies(q: jax.Array, freqs_cis: jax.Array, implementation: str) -> None:
    allowed = (jnp.complex64, jnp.complex128) if implementation == "xla" else (jnp.complex64,)
    if freqs_cis.dtype not in allowed:
        names = ", ".join(jnp.dtype(d).name for d in allowed)
        raise TypeError(f"freqs_cis must have a complex dtype ({names}), got {freqs_cis.dtype}")
    if q.ndim == 4:
        batch, seq, _, head_dim = q.shape
        shapes = tuple(leading + (head_dim // 2,) for leading in ((seq,), (1, seq), (batch, seq)))
        if freqs_cis.shape not in shapes:
            raise ValueError(
                f"freqs_cis must have shape (S, D/2), (1, S, D/2) or (B, S, D/2) = {shapes}, got {freqs_cis.shape}"
            )
