"""Kahneman-Tversky Optimization fused with the LM head (Liger's ``LigerFusedLinearKTOLoss``): an unpaired
preference loss over sequences each labelled desirable or undesirable."""

import jax
import jax.numpy as jnp

from liger_jax import runtime
from liger_jax.ops import _checks
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
    implementation: runtime.Implementation | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    r"""KTO (Ethayarajh et al. 2024) on LM-head hidden states, without the ``[B, S, V]`` logits.

    ``loss = mean over sequences of kto_losses(log π(y) - log π_ref(y), preference_labels)``, with
    ``log π_ref = 0`` without a reference model. Log-probs come from :func:`liger_jax.fused_linear_logprobs`
    (float32 softmax; float64 for float64 inputs), summed over each sequence's counted tokens (or averaged with
    ``average_log_prob``; a sequence with none has log-prob 0).

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
    if kl is not None:
        kl = jnp.asarray(kl)
        if kl.shape not in ((), x.shape[:1]):
            raise ValueError(f"kl must be a scalar or have shape {x.shape[:1]} (the batch axis of x), got {kl.shape}")
        kl = jax.lax.stop_gradient(kl)
    _, _, logps, ref_logps = seq.labelled_sequence_logprobs(
        x,
        weight,
        labels,
        bias=bias,
        ref_x=ref_x,
        ref_weight=ref_weight,
        ref_bias=ref_bias,
        ignore_index=ignore_index,
        average_log_prob=average_log_prob,
        weight_layout=weight_layout,
        implementation=implementation,
    )
    logratios = logps if ref_logps is None else logps - ref_logps
    loss = jnp.mean(kto_losses(logratios, preference_labels, beta=beta, kl=kl))
    logit_sums = seq.sequence_logit_sums(x, weight, bias, weight_layout)

    def split_sums(values):
        return jnp.sum(jnp.where(preference_labels, values, 0.0)), jnp.sum(jnp.where(preference_labels, 0.0, values))

    aux = {}
    for name, values in (("logps", logps), ("logits", logit_sums), ("rewards", beta * logratios)):
        aux[f"chosen_{name}_sum"], aux[f"rejected_{name}_sum"] = split_sums(values)
    return loss, jax.lax.stop_gradient(aux)
