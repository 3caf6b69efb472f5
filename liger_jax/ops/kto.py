"""Kahneman-Tversky Optimization fused with the LM head (Liger's ``LigerFusedLinearKTOLoss``): an unpaired
preference loss over sequences each labelled desirable or undesirable."""

import dataclasses

import jax
import jax.numpy as jnp

from liger_jax import runtime
from liger_jax.ops import _checks, _linear_chunks, _sequence_chunks
from liger_jax.ops import _sequence_logprobs as seq
from liger_jax.ops.fused_linear_cross_entropy import WeightLayout


def kto_losses(
    logratios: jax.Array, preference_labels: jax.Array, *, beta: float, kl: jax.Array | None = None
) -> jax.Array:
    r"""KTO's loss per sequence: :math:`1 - \sigma(\beta (r - z) m)` with :math:`r` the policy/reference log-ratio
    ``[B]``, :math:`z` the KL estimate (0 when None) and :math:`m = +1` for desirable, :math:`-1` for undesirable."""
    sign = jnp.where(preference_labels, 1.0, -1.0).astype(logratios.dtype)
    shifted = logratios if kl is None else logratios - kl
    return 1.0 - jax.nn.sigmoid(beta * shifted * sign)


def fused_linear_kto(
    x: jax.Array,
    weight: jax.Array,
    labels: jax.Array,
    preference_labels: jax.Array,
    *,
    bias: jax.Array | None = None,
    ref_x: jax.Array | None = None,
    ref_weight: jax.Array | None = None,
    ref_bias: jax.Array | None = None,
    kl: jax.Array | float | None = None,
    ignore_index: int = -100,
    beta: float = 0.1,
    average_log_prob: bool = False,
    weight_layout: WeightLayout = "hv",
    chunk_size: int | None = None,
    implementation: runtime.Implementation | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    r"""KTO (Ethayarajh et al. 2024) on LM-head hidden states, without the ``[B, S, V]`` logits.

    ``loss = mean over sequences of kto_losses(log π(y) - log π_ref(y), preference_labels)``, with
    ``log π_ref = 0`` without a reference model. Log-probs are :func:`liger_jax.fused_linear_logprobs`' (float32
    softmax; float64 for float64 inputs), summed over each sequence's counted tokens (or averaged with
    ``average_log_prob``; a sequence with none has log-prob 0). Each chunk of the LM head's matmul holds whole
    sequences, so their loss and its gradient are made in the same pass as their log-probs (three matmuls per
    chunk, four with a reference model; :mod:`liger_jax.ops._sequence_chunks`).

    Args:
        x: ``[B, S, H]`` hidden states.
        weight: the LM head, ``[H, V]`` (``weight_layout="hv"``) or ``[V, H]`` (``"vh"``).
        labels: ``[B, S]`` integer targets in ``[0, V)`` or ``ignore_index``.
        preference_labels: ``[B]`` bool, True for a desirable (chosen) completion.
        bias: optional ``[V]``.
        ref_x, ref_weight, ref_bias: the frozen reference model's hidden states and head, or None; no gradient.
        kl: the KL estimate between policy and reference (None for 0); no gradient. A scalar (TRL's batch
            estimate) or ``[B]``, one per sequence (Liger's chunks broadcast a ``[B]`` kl against each chunk, which
            matches this only at one chunk; its scalar case matches).
        ignore_index: the label of positions that count for nothing.
        beta: the loss's inverse temperature, > 0.
        average_log_prob: average each sequence's log-probs instead of summing them.
        weight_layout, implementation: as :func:`liger_jax.fused_linear_logprobs`.
        chunk_size: whole sequences per chunk, or None for as many as the default chunk rows hold (at least one).

    Returns:
        ``(loss, aux)``: the scalar loss and Liger's metrics (no gradient): ``chosen_logps_sum``,
        ``rejected_logps_sum`` (sequence log-probs summed over the desirable / undesirable sequences),
        ``chosen_logits_sum``, ``rejected_logits_sum`` (every logit of those sequences, all positions and classes),
        ``chosen_rewards_sum``, ``rejected_rewards_sum`` (``beta ×`` log-ratio summed likewise).

    Raises:
        TypeError, ValueError: an input of the wrong dtype or shape, a label out of range, beta not > 0.
    """
    seq.check_positive("beta", beta)
    if preference_labels.dtype != jnp.bool_:
        raise TypeError(f"preference_labels must be bool (True for desirable), got {preference_labels.dtype}")
    if x.ndim == 3:
        _checks.check_shape("preference_labels", preference_labels, x.shape[:1], "the batch axis of x")
    if kl is None:
        kl = jnp.zeros(())
    else:
        kl = jnp.asarray(kl)
        if kl.shape not in ((), x.shape[:1]):
            raise ValueError(f"kl must be a scalar or have shape {x.shape[:1]} (the batch axis of x), got {kl.shape}")
        kl = jax.lax.stop_gradient(kl)
    _linear_chunks.check_chunk_size(chunk_size)
    ignore_index, has_reference = seq.check_labelled_inputs(
        x, weight, labels, bias, ref_x, ref_weight, ref_bias, ignore_index, weight_layout
    )
    reference = (ref_x, ref_weight, ref_bias) if has_reference else None
    implementation = seq.fused_implementation(implementation, x, weight, bias, labels, weight_layout, reference)
    mask = labels != ignore_index
    dtype = jnp.promote_types(jnp.result_type(x.dtype, weight.dtype), jnp.float32)

    loss, token_logps, ref_token_logps = _sequence_chunks.group_loss(
        x,
        weight,
        bias,
        jnp.where(mask, labels, 0),
        (mask.astype(dtype),),
        _KTOGroupLoss(beta, x.shape[0], average_log_prob),
        group_operands=(preference_labels.astype(dtype), jnp.broadcast_to(kl, x.shape[:1]).astype(dtype)),
        reference=reference,
        temperature=1.0,
        weight_layout=weight_layout,
        implementation=implementation,
        groups_per_chunk=chunk_size,
    )
    logps = seq.sequence_logprobs(seq.masked(token_logps, mask), mask, average_log_prob)
    logratios = logps
    if ref_token_logps is not None:
        logratios = logps - seq.sequence_logprobs(seq.masked(ref_token_logps, mask), mask, average_log_prob)
    logit_sums = seq.sequence_logit_sums(x, weight, bias, weight_layout)

    def split_sums(values):
        return jnp.sum(jnp.where(preference_labels, values, 0.0)), jnp.sum(jnp.where(preference_labels, 0.0, values))

    aux = {}
    for name, values in (("logps", logps), ("logits", logit_sums), ("rewards", beta * logratios)):
        aux[f"chosen_{name}_sum"], aux[f"rejected_{name}_sum"] = split_sums(values)
    return loss, jax.lax.stop_gradient(aux)


@dataclasses.dataclass(frozen=True)
class _KTOGroupLoss:
    """The loss of whole sequences for :func:`liger_jax.ops._sequence_chunks.group_loss`: ``Σ kto_losses /
    n_sequences`` from per-token log-probs and masks ``[G, S]``, and preference labels and kl ``[G]``."""

    beta: float
    n_sequences: int
    average_log_prob: bool

    def __call__(self, token_logps, ref_token_logps, mask, preference_labels, kl):
        def sequence_logps(token_logps):
            return seq.sequence_logprobs(seq.masked(token_logps, mask), mask, self.average_log_prob)

        logratios = sequence_logps(token_logps)
        if ref_token_logps is not None:
            logratios = logratios - sequence_logps(ref_token_logps)
        losses = kto_losses(logratios, preference_labels != 0, beta=self.beta, kl=kl)
        return jnp.sum(losses) / self.n_sequences
