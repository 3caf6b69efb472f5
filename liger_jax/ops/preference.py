"""Paired preference losses fused with the LM head: DPO, ORPO, CPO and SimPO (Liger's ``chunked_loss`` semantics).

Each loss reads the per-token log-probs of the chosen and rejected completions through
:func:`liger_jax.fused_linear_logprobs` (chunked: the ``[B, S, V]`` logits never exist, on every implementation),
reduces them to one log-prob per sequence, and applies its preference formula to the pairs. The batch holds the
chosen sequences first, then the rejected ones in the same order (Liger's convention): pair ``i`` is rows ``i`` and
``i + B/2``.

Every function returns ``(loss, aux)``: the scalar loss (float32, float64 for float64 inputs; its gradient reaches
``x``, ``weight`` and ``bias``, never a reference model's inputs) and a dict of Liger's metrics, which carry no
gradient:

* ``chosen_logps``, ``rejected_logps``: ``[B/2]`` per-sequence log-probs (sums, or means with ``average_log_prob``).
* ``chosen_logits_mean``, ``rejected_logits_mean``: the mean of every logit of the chosen (rejected) sequences,
  over all positions and classes, ignored positions included, as Liger counts them.
* ``nll_loss``: the chosen sequences' token-mean negative log-likelihood (0 without ``compute_nll_loss``).
* ``chosen_rewards``, ``rejected_rewards``: ``[B/2]`` implicit rewards (``beta ×`` log-ratio or log-prob).
* ORPO adds ``log_odds_ratio`` and ``log_odds_chosen``.

Where Liger divides by a count of zero (a sequence or a batch with every label ignored) these losses divide by one:
such a sequence has log-prob 0 and such a batch an NLL of 0, never NaN.
"""

from typing import Literal, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from liger_jax import runtime
from liger_jax.ops import _checks
from liger_jax.ops import _sequence_logprobs as seq
from liger_jax.ops.fused_linear_cross_entropy import WeightLayout

DPOLossType = Literal[
    "sigmoid", "hinge", "exo_pair", "nca_pair", "robust", "bco_pair", "sppo_hard", "apo_zero", "apo_down", "discopop"
]
DPO_LOSS_TYPES = (
    "sigmoid",
    "hinge",
    "exo_pair",
    "nca_pair",
    "robust",
    "bco_pair",
    "sppo_hard",
    "apo_zero",
    "apo_down",
    "discopop",
)


class PairedLogps(NamedTuple):
    """Per-sequence log-probs of a paired batch and the metrics every paired loss reports."""

    chosen: jax.Array  # [B/2]
    rejected: jax.Array  # [B/2]
    ref_chosen: jax.Array | None  # [B/2], no gradient; None without a reference model
    ref_rejected: jax.Array | None
    nll_loss: jax.Array  # scalar
    chosen_logits_mean: jax.Array  # scalar, no gradient
    rejected_logits_mean: jax.Array


def paired_logps(
    x: jax.Array,
    weight: jax.Array,
    labels: jax.Array,
    *,
    bias: jax.Array | None = None,
    ref_x: jax.Array | None = None,
    ref_weight: jax.Array | None = None,
    ref_bias: jax.Array | None = None,
    ignore_index: int = -100,
    average_log_prob: bool = False,
    compute_nll_loss: bool = False,
    nll_target: jax.Array | None = None,
    weight_layout: WeightLayout = "hv",
    implementation: runtime.Implementation | None = None,
) -> PairedLogps:
    """The shared first half of every paired loss: checks, policy (and reference) log-probs per sequence, NLL.

    Args:
        x: ``[B, S, H]`` hidden states, chosen sequences first, then rejected; B even.
        weight: the LM head, ``[H, V]`` (``weight_layout="hv"``) or ``[V, H]`` (``"vh"``).
        labels: ``[B, S]`` integer targets in ``[0, V)`` or ``ignore_index``.
        bias: optional ``[V]``.
        ref_x, ref_weight, ref_bias: the frozen reference model's hidden states ``[B, S, H_ref]`` and head (same
            layout and vocabulary), or None for none (reference log-probs of 0).
        ignore_index: the label of positions that count for nothing.
        average_log_prob: a sequence's log-prob is the mean over its counted tokens instead of their sum.
        compute_nll_loss: also compute the chosen sequences' NLL, ``-Σ log p / #counted tokens``.
        nll_target: ``[B, S]`` labels for the NLL in place of ``labels`` (only its chosen half is read).
        weight_layout, implementation: as :func:`liger_jax.fused_linear_logprobs`.

    Returns:
        :class:`PairedLogps`.

    Raises:
        TypeError, ValueError: an input of the wrong dtype or shape, an odd batch, a label out of range.
    """
    if x.ndim == 3 and x.shape[0] % 2:
        raise ValueError(f"x must hold chosen then rejected sequences: an even batch, got B={x.shape[0]}")
    if nll_target is not None:
        n_classes = seq.check_head("", x, weight, bias, weight_layout)
        seq.check_tokens("nll_target", nll_target, x, n_classes, seq.checked_ignore_index(ignore_index))
    token_logps, mask, logps, ref_logps = seq.labelled_sequence_logprobs(
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
    n_pairs, length = x.shape[0] // 2, x.shape[1]
    n_classes = weight.shape[1 if weight_layout == "hv" else 0]
    nll_loss = jnp.zeros((), logps.dtype)
    if compute_nll_loss:
        if nll_target is None:
            nll_mask, nll_token_logps = mask[:n_pairs], token_logps[:n_pairs]
        else:
            nll_mask = nll_target[:n_pairs] != ignore_index
            nll_token_logps = seq.token_logprobs(
                x[:n_pairs],
                weight,
                nll_target[:n_pairs],
                nll_mask,
                bias=bias,
                temperature=1.0,
                weight_layout=weight_layout,
                implementation=implementation,
            )
        nll_loss = -jnp.sum(nll_token_logps) / jnp.maximum(jnp.sum(nll_mask), 1).astype(logps.dtype)

    logit_sums = seq.sequence_logit_sums(x, weight, bias, weight_layout)
    logits_per_half = n_pairs * length * n_classes
    return PairedLogps(
        chosen=logps[:n_pairs],
        rejected=logps[n_pairs:],
        ref_chosen=None if ref_logps is None else ref_logps[:n_pairs],
        ref_rejected=None if ref_logps is None else ref_logps[n_pairs:],
        nll_loss=nll_loss,
        chosen_logits_mean=jnp.sum(logit_sums[:n_pairs]) / logits_per_half,
        rejected_logits_mean=jnp.sum(logit_sums[n_pairs:]) / logits_per_half,
    )


def dpo_pair_losses(
    chosen_logratios: jax.Array,
    rejected_logratios: jax.Array,
    *,
    beta: float,
    loss_type: DPOLossType,
    label_smoothing: float = 0.0,
    discopop_tau: float = 0.05,
) -> jax.Array:
    r"""DPO's per-pair loss of each ``loss_type`` from the policy/reference log-ratios ``[P]`` of each pair.

    With :math:`a`, :math:`b` the chosen and rejected log-ratios, :math:`d = \beta (a - b)`, :math:`\varepsilon`
    the label smoothing and :math:`\sigma` the sigmoid:

    * ``sigmoid`` (DPO): :math:`-\log\sigma(d)`; ``hinge`` (SLiC): :math:`\max(0, 1 - d)`.
    * ``exo_pair`` (EXO, ε in (0, 1)):
      :math:`\sigma(d)(\log\sigma(d) - \log(1-ε)) + \sigma(-d)(\log\sigma(-d) - \log ε)`.
    * ``nca_pair``: :math:`-\log\sigma(\beta a) - \tfrac12\log\sigma(-\beta a) - \tfrac12\log\sigma(-\beta b)`.
    * ``robust`` (cDPO, ε in [0, 1/2)): :math:`(-(1-ε)\log\sigma(d) + ε\log\sigma(-d)) / (1 - 2ε)`.
    * ``bco_pair``: :math:`-\log\sigma(\beta a) - \log\sigma(-\beta b)`.
    * ``sppo_hard``: :math:`(a - \tfrac{1}{2\beta})^2 + (b + \tfrac{1}{2\beta})^2`.
    * ``apo_zero``: :math:`1 - \sigma(\beta a) + \sigma(\beta b)`.
    * ``apo_down``: :math:`\sigma(\beta a) + 1 - \sigma(d)`.
    * ``discopop`` (τ): with :math:`m = \sigma(d/τ)`, :math:`-\log\sigma(d)(1 - m) + e^{-d} m`.
    """
    a, b = chosen_logratios, rejected_logratios
    d = beta * (a - b)
    log_sigmoid, sigmoid = jax.nn.log_sigmoid, jax.nn.sigmoid
    match loss_type:
        case "sigmoid":
            return -log_sigmoid(d)
        case "hinge":
            return jax.nn.relu(1.0 - d)
        case "exo_pair":
            eps = label_smoothing
            return sigmoid(d) * (log_sigmoid(d) - np.log1p(-eps)) + sigmoid(-d) * (log_sigmoid(-d) - np.log(eps))
        case "nca_pair":
            return -log_sigmoid(beta * a) - 0.5 * log_sigmoid(-beta * a) - 0.5 * log_sigmoid(-beta * b)
        case "robust":
            eps = label_smoothing
            return (-(1.0 - eps) * log_sigmoid(d) + eps * log_sigmoid(-d)) / (1.0 - 2.0 * eps)
        case "bco_pair":
            return -log_sigmoid(beta * a) - log_sigmoid(-beta * b)
        case "sppo_hard":
            return (a - 0.5 / beta) ** 2 + (b + 0.5 / beta) ** 2
        case "apo_zero":
            return 1.0 - sigmoid(beta * a) + sigmoid(beta * b)
        case "apo_down":
            return sigmoid(beta * a) + 1.0 - sigmoid(d)
        case "discopop":
            modulation = sigmoid(d / discopop_tau)
            return -log_sigmoid(d) * (1.0 - modulation) + jnp.exp(-d) * modulation
        case _:
            raise ValueError(f"loss_type must be one of {DPO_LOSS_TYPES}, got {loss_type!r}")


def smoothed_sigmoid_pair_losses(
    chosen_logps: jax.Array, rejected_logps: jax.Array, *, beta: float, gamma: float, label_smoothing: float
) -> jax.Array:
    r"""CPO's (``gamma=0``) and SimPO's per-pair loss: with :math:`z = \beta(\log p_w - \log p_l) - \gamma`,
    :math:`-(1-ε)\log\sigma(z) - ε\log\sigma(-z)`."""
    z = beta * (chosen_logps - rejected_logps) - gamma
    return -(1.0 - label_smoothing) * jax.nn.log_sigmoid(z) - label_smoothing * jax.nn.log_sigmoid(-z)


def orpo_log_odds(chosen_logps: jax.Array, rejected_logps: jax.Array) -> jax.Array:
    r"""ORPO's log odds ratio per pair, :math:`\log\frac{p_w/(1-p_w)}{p_l/(1-p_l)}` from mean log-probs ``[P]``."""
    return (chosen_logps - rejected_logps) - (jnp.log1p(-jnp.exp(chosen_logps)) - jnp.log1p(-jnp.exp(rejected_logps)))


def fused_linear_dpo(
    x: jax.Array,
    weight: jax.Array,
    labels: jax.Array,
    *,
    bias: jax.Array | None = None,
    ref_x: jax.Array | None = None,
    ref_weight: jax.Array | None = None,
    ref_bias: jax.Array | None = None,
    ignore_index: int = -100,
    beta: float = 0.1,
    alpha: float = 1.0,
    compute_nll_loss: bool = False,
    average_log_prob: bool = False,
    loss_type: DPOLossType = "sigmoid",
    label_smoothing: float = 0.0,
    discopop_tau: float = 0.05,
    weight_layout: WeightLayout = "hv",
    implementation: runtime.Implementation | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    r"""Direct Preference Optimization fused with the LM head (Liger's ``LigerFusedLinearDPOLoss``).

    ``loss = alpha · nll_loss + mean over pairs of dpo_pair_losses(a, b)`` where ``a``, ``b`` are the chosen and
    rejected log-ratios ``log π(y) - log π_ref(y)`` (``log π_ref = 0`` without a reference model). Rewards are
    ``beta · a`` and ``beta · b``. See the module docstring for the batch layout, ``aux`` and numerics.

    Args:
        x, weight, labels, bias, ref_x, ref_weight, ref_bias, ignore_index, average_log_prob, compute_nll_loss,
            weight_layout, implementation: as :func:`paired_logps`.
        beta: the inverse temperature of the implicit reward, > 0.
        alpha: the weight of the NLL term.
        loss_type: one of :data:`DPO_LOSS_TYPES` (see :func:`dpo_pair_losses`; Liger 0.8.5 has no ``ipo``).
        label_smoothing: ε of ``robust`` (in [0, 0.5)) and ``exo_pair`` (in (0, 1)); unused by the others.
        discopop_tau: τ of ``discopop``, > 0.

    Returns:
        ``(loss, aux)``.

    Example:
        >>> loss, aux = liger_jax.fused_linear_dpo(hidden, lm_head, labels, ref_x=ref_hidden, ref_weight=ref_head)
    """
    _checks.check_choice("loss_type", loss_type, DPO_LOSS_TYPES)
    seq.check_positive("beta", beta)
    _check_alpha(alpha)
    seq.check_positive("discopop_tau", discopop_tau)
    if loss_type == "robust" and not 0.0 <= label_smoothing < 0.5:
        raise ValueError(f"label_smoothing must be in [0, 0.5) for loss_type='robust', got {label_smoothing!r}")
    if loss_type == "exo_pair" and not 0.0 < label_smoothing < 1.0:
        raise ValueError(
            f"label_smoothing must be in (0, 1) for loss_type='exo_pair' (EXO uses 1e-3), got {label_smoothing!r}"
        )
    logps = paired_logps(
        x,
        weight,
        labels,
        bias=bias,
        ref_x=ref_x,
        ref_weight=ref_weight,
        ref_bias=ref_bias,
        ignore_index=ignore_index,
        average_log_prob=average_log_prob,
        compute_nll_loss=compute_nll_loss,
        weight_layout=weight_layout,
        implementation=implementation,
    )
    chosen_logratios, rejected_logratios = logps.chosen, logps.rejected
    if logps.ref_chosen is not None:
        chosen_logratios, rejected_logratios = (
            chosen_logratios - logps.ref_chosen,
            rejected_logratios - logps.ref_rejected,
        )

    losses = dpo_pair_losses(
        chosen_logratios,
        rejected_logratios,
        beta=beta,
        loss_type=loss_type,
        label_smoothing=label_smoothing,
        discopop_tau=discopop_tau,
    )
    return _paired_loss(logps, alpha, losses, beta * chosen_logratios, beta * rejected_logratios)


def fused_linear_orpo(
    x: jax.Array,
    weight: jax.Array,
    labels: jax.Array,
    *,
    bias: jax.Array | None = None,
    ignore_index: int = -100,
    beta: float = 0.1,
    alpha: float = 1.0,
    compute_nll_loss: bool = True,
    nll_target: jax.Array | None = None,
    weight_layout: WeightLayout = "hv",
    implementation: runtime.Implementation | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    r"""Odds Ratio Preference Optimization fused with the LM head (Liger's ``LigerFusedLinearORPOLoss``).

    With mean per-token log-probs :math:`\log p_w`, :math:`\log p_l` and :func:`orpo_log_odds` :math:`o`:
    ``loss = alpha · nll_loss - beta · mean(log σ(o))``. Rewards are ``beta · log p``; ``aux`` adds
    ``log_odds_ratio = mean(log σ(o))`` and ``log_odds_chosen = mean(o)``. A sequence whose mean log-prob is 0 (every
    label ignored) has infinite odds and makes the loss NaN, as in Liger.

    Args:
        x, weight, labels, bias, ignore_index, compute_nll_loss, nll_target, weight_layout, implementation: as
            :func:`paired_logps` (log-probs are always means, as ORPO defines them).
        beta: the weight of the odds-ratio term, > 0.
        alpha: the weight of the NLL term.

    Returns:
        ``(loss, aux)``.
    """
    seq.check_positive("beta", beta)
    _check_alpha(alpha)
    logps = paired_logps(
        x,
        weight,
        labels,
        bias=bias,
        ignore_index=ignore_index,
        average_log_prob=True,
        compute_nll_loss=compute_nll_loss,
        nll_target=nll_target,
        weight_layout=weight_layout,
        implementation=implementation,
    )

    log_odds = orpo_log_odds(logps.chosen, logps.rejected)
    ratio = jax.nn.log_sigmoid(log_odds)
    return _paired_loss(
        logps,
        alpha,
        -beta * ratio,
        beta * logps.chosen,
        beta * logps.rejected,
        log_odds_ratio=jnp.mean(ratio),
        log_odds_chosen=jnp.mean(log_odds),
    )


def fused_linear_cpo(
    x: jax.Array,
    weight: jax.Array,
    labels: jax.Array,
    *,
    bias: jax.Array | None = None,
    ignore_index: int = -100,
    beta: float = 0.1,
    alpha: float = 1.0,
    label_smoothing: float = 0.0,
    compute_nll_loss: bool = True,
    average_log_prob: bool = False,
    weight_layout: WeightLayout = "hv",
    implementation: runtime.Implementation | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    r"""Contrastive Preference Optimization fused with the LM head (Liger's ``LigerFusedLinearCPOLoss``).

    ``loss = alpha · nll_loss + mean(smoothed_sigmoid_pair_losses(log p_w, log p_l, gamma=0))``; rewards
    ``beta · log p``.

    Args:
        x, weight, labels, bias, ignore_index, compute_nll_loss, average_log_prob, weight_layout, implementation: as
            :func:`paired_logps`.
        beta: the inverse temperature, > 0.
        alpha: the weight of the NLL term.
        label_smoothing: ε in [0, 1], the assumed fraction of flipped preferences.

    Returns:
        ``(loss, aux)``.
    """
    return _smoothed_sigmoid_loss(
        x, weight, labels, bias, ignore_index, beta, alpha, 0.0, label_smoothing, compute_nll_loss, average_log_prob,
        weight_layout, implementation,
    )  # fmt: skip


def fused_linear_simpo(
    x: jax.Array,
    weight: jax.Array,
    labels: jax.Array,
    *,
    bias: jax.Array | None = None,
    ignore_index: int = -100,
    beta: float = 0.1,
    alpha: float = 1.0,
    gamma: float = 0.5,
    label_smoothing: float = 0.0,
    compute_nll_loss: bool = True,
    weight_layout: WeightLayout = "hv",
    implementation: runtime.Implementation | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    r"""Simple Preference Optimization fused with the LM head (Liger's ``LigerFusedLinearSimPOLoss``).

    With length-normalised (mean) log-probs, ``loss = alpha · nll_loss + mean(-(1-ε) log σ(z) - ε log σ(-z))``,
    ``z = beta (log p_w - log p_l) - gamma``; rewards ``beta · log p``.

    Args:
        x, weight, labels, bias, ignore_index, compute_nll_loss, weight_layout, implementation: as
            :func:`paired_logps` (log-probs are always means, as SimPO defines them).
        beta: the reward scale, > 0.
        alpha: the weight of the NLL term.
        gamma: the target reward margin.
        label_smoothing: ε in [0, 1].

    Returns:
        ``(loss, aux)``.
    """
    return _smoothed_sigmoid_loss(
        x, weight, labels, bias, ignore_index, beta, alpha, gamma, label_smoothing, compute_nll_loss, True,
        weight_layout, implementation,
    )  # fmt: skip


def _smoothed_sigmoid_loss(
    x, weight, labels, bias, ignore_index, beta, alpha, gamma, label_smoothing, compute_nll_loss, average_log_prob,
    weight_layout, implementation,
):  # fmt: skip
    seq.check_positive("beta", beta)
    _check_alpha(alpha)
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"label_smoothing must be in [0, 1], got {label_smoothing!r}")
    if not np.isfinite(gamma):
        raise ValueError(f"gamma must be a finite number, got {gamma!r}")
    logps = paired_logps(
        x,
        weight,
        labels,
        bias=bias,
        ignore_index=ignore_index,
        average_log_prob=average_log_prob,
        compute_nll_loss=compute_nll_loss,
        weight_layout=weight_layout,
        implementation=implementation,
    )

    losses = smoothed_sigmoid_pair_losses(
        logps.chosen, logps.rejected, beta=beta, gamma=gamma, label_smoothing=label_smoothing
    )
    return _paired_loss(logps, alpha, losses, beta * logps.chosen, beta * logps.rejected)


def _paired_loss(
    logps: PairedLogps,
    alpha: float,
    losses: jax.Array,
    chosen_rewards: jax.Array,
    rejected_rewards: jax.Array,
    **extra_metrics: jax.Array,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """``alpha · nll + mean(per-pair losses)`` and the metrics, which carry no gradient."""
    loss = alpha * logps.nll_loss + jnp.mean(losses)
    aux = {
        "chosen_logps": logps.chosen,
        "rejected_logps": logps.rejected,
        "chosen_logits_mean": logps.chosen_logits_mean,
        "rejected_logits_mean": logps.rejected_logits_mean,
        "nll_loss": logps.nll_loss,
        "chosen_rewards": chosen_rewards,
        "rejected_rewards": rejected_rewards,
        **extra_metrics,
    }
    return loss, jax.lax.stop_gradient(aux)


def _check_alpha(alpha: float) -> None:
    if not np.isfinite(alpha):
        raise ValueError(f"alpha must be a finite number, got {alpha!r}")
