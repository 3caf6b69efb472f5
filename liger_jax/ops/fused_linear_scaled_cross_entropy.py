"""Liger's fused linear *scaled* cross-entropy: per-token NLL (and entropy) of ``x Wᵀ / T`` without the logits.

Liger 0.8.5's ``LigerFusedLinearScaledCrossEntropyFunction`` (the PPO/GRPO head of Verl) is the per-row negative
log-probability of the target under ``softmax(x @ weightᵀ / temperature)``, 0 for ignored rows, with the entropy on
request. That is :func:`liger_jax.fused_linear_logprobs` with ``ignore_index`` handling, so it is built on it (one
chunk loop, one kernel).
"""

import jax
import jax.numpy as jnp

from liger_jax import runtime
from liger_jax.ops._linear_chunks import WeightLayout
from liger_jax.ops.fused_linear_logprobs import fused_linear_logprobs, fused_linear_logprobs_reference


def fused_linear_scaled_cross_entropy(
    x: jax.Array,
    weight: jax.Array,
    target: jax.Array,
    *,
    temperature: float = 1.0,
    ignore_index: int = -100,
    return_entropy: bool = False,
    bias: jax.Array | None = None,
    weight_layout: WeightLayout = "vh",
    chunk_size: int | None = None,
    implementation: runtime.Implementation | None = None,
) -> jax.Array | tuple[jax.Array, jax.Array]:
    r"""Per-row ``-log softmax(x @ weightᵀ / T)[target]`` and optionally the entropy, chunked over rows.

    With :math:`z = (x W^\top + b) / T`: :math:`\mathrm{nll} = \log\sum_j e^{z_j} - z_y` and
    :math:`\mathrm{entropy} = -\sum_j p_j \log p_j`; both are 0 (with zero gradient) for rows whose target is
    ``ignore_index``; both are differentiable. No reduction (Liger returns per-token values). Liger's optional
    ``selected_token_ids`` log-probabilities are not provided.

    Args:
        x: ``[..., H]`` float32, bfloat16 or float16 (float64 too under ``"xla"``).
        weight: ``[V, H]`` (Liger's layout, ``weight_layout="vh"``) or ``[H, V]`` with ``"hv"``.
        target: ``[...]`` (``x.shape[:-1]``) integers in ``[0, V)`` or ``ignore_index``.
        temperature: finite > 0; the logits are divided by it.
        ignore_index: target value of rows to skip.
        return_entropy: also return each row's entropy.
        bias: optional ``[V]`` added to the logits before the temperature.
        weight_layout: ``"vh"`` or ``"hv"``.
        chunk_size: rows per chunk, or None for the default of :func:`liger_jax.fused_linear_cross_entropy`.
        implementation: ``"triton"``, ``"interpret"``, ``"xla"`` or None for the default.

    Returns:
        ``nll`` ``[...]`` in ``promote(result_type(x, weight), float32)``, or ``(nll, entropy)`` with
        ``return_entropy``.

    Raises:
        TypeError: x, weight or bias are not floating point, target is not integer, or ignore_index is not an int.
        ValueError: shapes do not fit together, temperature not a finite number > 0, or a concrete target outside
            ``[0, V)`` that is not ``ignore_index``.

    Example:
        >>> nll, entropy = liger_jax.fused_linear_scaled_cross_entropy(hidden, embedding, labels,
        ...                                                           temperature=0.7, return_entropy=True)
    """
    kept, tokens = _kept_tokens(target, ignore_index)
    logprobs, entropy = fused_linear_logprobs(
        x,
        weight,
        tokens,
        bias=bias,
        temperature=temperature,
        return_entropy=True,
        weight_layout=weight_layout,
        chunk_size=chunk_size,
        implementation=implementation,
    )
    return _finished(kept, logprobs, entropy, return_entropy)


def fused_linear_scaled_cross_entropy_reference(
    x: jax.Array,
    weight: jax.Array,
    target: jax.Array,
    *,
    temperature: float = 1.0,
    ignore_index: int = -100,
    return_entropy: bool = False,
    bias: jax.Array | None = None,
    weight_layout: WeightLayout = "vh",
) -> jax.Array | tuple[jax.Array, jax.Array]:
    """:func:`fused_linear_scaled_cross_entropy` on materialised logits (its specification and test oracle)."""
    kept, tokens = _kept_tokens(target, ignore_index)
    logprobs, entropy = fused_linear_logprobs_reference(
        x, weight, tokens, bias=bias, temperature=temperature, return_entropy=True, weight_layout=weight_layout
    )
    return _finished(kept, logprobs, entropy, return_entropy)


def _kept_tokens(target, ignore_index):
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, int):
        raise TypeError(f"ignore_index must be an int, got {ignore_index!r}")
    if not jnp.issubdtype(target.dtype, jnp.integer):
        raise TypeError(f"target must have an integer dtype, got {target.dtype}")
    kept = target != ignore_index
    return kept, jnp.where(kept, target, 0).astype(target.dtype)


def _finished(kept, logprobs, entropy, return_entropy):
    nll = jnp.where(kept, -logprobs, 0.0)
    return (nll, jnp.where(kept, entropy, 0.0)) if return_entropy else nll
