"""Paired preference losses fused with the LM head: DPO, ORPO, CPO and SimPO (Liger's ``chunked_loss`` semantics).

Each loss computes the per-token log-probs of the chosen and rejected completions (chunked: the ``[B, S, V]``
logits never exist, on every implementation), reduces them to one log-prob per sequence, and applies its
preference formula to the pairs. The batch holds the chosen sequences first, then the rejected ones in the same
order (Liger's convention): pair ``i`` is rows ``i`` and ``i + B/2``. Each chunk holds whole pairs, so that its
pairs' losses, and their gradient with respect to its logits, are made in the same pass as its log-probs: three
matmuls per chunk (four with a reference model), as Liger; see :func:`paired_loss`. Only ORPO with an
``nll_target`` takes a second pass (four matmuls).

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

import dataclasses
from collections.abc import Callable
from typing import Literal, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from liger_jax import runtime
from liger_jax.ops import _checks, _linear_chunks, _sequence_chunks
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
    _check_even_batch(x)
    if nll_target is not None:
        n_classes = seq.check_head("", x, weight, bias, weight_layout)
        seq.check_tokens("nll_target", nll_target, x, n_classes, _checks.check_int("ignore_index", ignore_index))
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
    n_pairs = x.shape[0] // 2
    nll_loss = jnp.zeros((), logps.dtype)
    if compute_nll_loss:
        if nll_target is None:
            nll_loss = _nll_loss(token_logps[:n_pairs], mask[:n_pairs])
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
            nll_loss = _nll_loss(nll_token_logps, nll_mask)
    return _paired_logps(x, weight, bias, weight_layout, logps, ref_logps, nll_loss)


def _nll_loss(token_logps: jax.Array, mask: jax.Array) -> jax.Array:
    """``-Σ log p / #counted tokens`` of masked per-token log-probs (0 for no counted token)."""
    return -jnp.sum(token_logps) / jnp.maximum(jnp.sum(mask), 1).astype(token_logps.dtype)


def _paired_logps(x, weight, bias, weight_layout, logps, ref_logps, nll_loss) -> PairedLogps:
    """:class:`PairedLogps` of the per-sequence log-probs ``[B]`` (and the reference's) and the NLL."""
    n_pairs, length = x.shape[0] // 2, x.shape[1]
    n_classes = weight.shape[1 if weight_layout == "hv" else 0]
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


@dataclasses.dataclass(frozen=True)
class _PairedGroupLoss:
    """The loss of whole pairs for :func:`liger_jax.ops._sequence_chunks.group_loss` (``_sequence_chunks.GroupLoss``):
    ``Σ pair_losses / n_pairs - Σ nll_weight · log p`` over groups ``[chosen tokens, rejected tokens]``."""

    pair_losses: Callable[..., jax.Array]  # (chosen, rejected, ref_chosen, ref_rejected) [P] -> [P]; hashable
    n_pairs: int
    average_log_prob: bool

    def __call__(self, token_logps, ref_token_logps, mask, nll_weight):
        length = token_logps.shape[1] // 2

        def chosen_and_rejected(token_logps):
            masked = seq.masked(token_logps, mask)
            return tuple(
                seq.sequence_logprobs(masked[:, half], mask[:, half], self.average_log_prob)
                for half in (slice(None, length), slice(length, None))
            )

        references = (None, None) if ref_token_logps is None else chosen_and_rejected(ref_token_logps)
        losses = self.pair_losses(*chosen_and_rejected(token_logps), *references)
        return jnp.sum(losses) / self.n_pairs - jnp.sum(nll_weight * seq.masked(token_logps, mask))


def _grouped_pairs(a: jax.Array) -> jax.Array:
    """``[B, S, ...]`` (chosen, then rejected) -> ``[B/2, 2S, ...]``: each pair's chosen then rejected rows."""
    n_pairs, length = a.shape[0] // 2, a.shape[1]
    pairs = jnp.swapaxes(a.reshape(2, n_pairs, *a.shape[1:]), 0, 1)
    return pairs.reshape(n_pairs, 2 * length, *a.shape[2:])


def _ungrouped_pairs(a: jax.Array) -> jax.Array:
    """The inverse of :func:`_grouped_pairs`."""
    n_pairs, length = a.shape[0], a.shape[1] // 2
    return jnp.swapaxes(a.reshape(n_pairs, 2, length, *a.shape[2:]), 0, 1).reshape(2 * n_pairs, length, *a.shape[2:])


def paired_loss(
    x: jax.Array,
    weight: jax.Array,
    labels: jax.Array,
    pair_losses: Callable[..., jax.Array],
    *,
    alpha: float,
    bias: jax.Array | None = None,
    ref_x: jax.Array | None = None,
    ref_weight: jax.Array | None = None,
    ref_bias: jax.Array | None = None,
    ignore_index: int = -100,
    average_log_prob: bool = False,
    compute_nll_loss: bool = False,
    nll_target: jax.Array | None = None,
    weight_layout: WeightLayout = "hv",
    chunk_size: int | None = None,
    implementation: runtime.Implementation | None = None,
) -> tuple[jax.Array, PairedLogps]:
    """``alpha · nll_loss + mean over pairs of pair_losses(chosen, rejected, ref_chosen, ref_rejected)`` and the
    :class:`PairedLogps` it comes from, its gradient made in one chunked pass over whole pairs
    (:mod:`liger_jax.ops._sequence_chunks`): the batch is regrouped so that each pair's chosen and rejected rows
    are contiguous, and each chunk holds ``chunk_size`` whole pairs (None: as many as the default chunk rows hold,
    at least one: ``2S × V`` logits, and as many for a reference model's). Every DPO loss type, ORPO, CPO and SimPO
    is such a sum of per-pair terms, plus an NLL whose normaliser (the counted chosen tokens) comes from the labels.

    With an ``nll_target`` (ORPO's NLL on other labels) a row has two target tokens: the log-probs are computed
    first (:func:`paired_logps`) and differentiated in a second pass, four matmuls per chunk instead of three.

    Args:
        pair_losses: ``(chosen [P], rejected [P], ref_chosen [P] or None, ref_rejected) -> [P]``, hashable (a
            frozen dataclass).
        alpha: the weight of the NLL term.
        chunk_size: whole pairs per chunk, or None.
        Others: as :func:`paired_logps`.
    """
    _linear_chunks.check_chunk_size(chunk_size)
    if nll_target is not None:
        logps = paired_logps(
            x, weight, labels, bias=bias, ref_x=ref_x, ref_weight=ref_weight, ref_bias=ref_bias,
            ignore_index=ignore_index, average_log_prob=average_log_prob, compute_nll_loss=compute_nll_loss,
            nll_target=nll_target, weight_layout=weight_layout, implementation=implementation,
        )  # fmt: skip
        losses = pair_losses(logps.chosen, logps.rejected, logps.ref_chosen, logps.ref_rejected)
        return alpha * logps.nll_loss + jnp.mean(losses), logps
    _check_even_batch(x)
    ignore_index, has_reference = seq.check_labelled_inputs(
        x, weight, labels, bias, ref_x, ref_weight, ref_bias, ignore_index, weight_layout
    )
    reference = (ref_x, ref_weight, ref_bias) if has_reference else None
    implementation = seq.fused_implementation(implementation, x, weight, bias, labels, weight_layout, reference)
    mask = labels != ignore_index
    n_pairs = x.shape[0] // 2
    dtype = jnp.promote_types(jnp.result_type(x.dtype, weight.dtype), jnp.float32)
    chosen_mask = mask.at[n_pairs:].set(False).astype(dtype)
    nll_weight = jnp.zeros_like(chosen_mask)
    if compute_nll_loss:  # the NLL's gradient: alpha / #counted chosen tokens on each of them
        nll_weight = chosen_mask * (alpha / jnp.maximum(jnp.sum(chosen_mask), 1))
    loss, token_logps, ref_token_logps = _sequence_chunks.group_loss(
        _grouped_pairs(x),
        weight,
        bias,
        _grouped_pairs(jnp.where(mask, labels, 0)),
        (_grouped_pairs(mask.astype(dtype)), _grouped_pairs(nll_weight)),
        _PairedGroupLoss(pair_losses, n_pairs, average_log_prob),
        reference=None if reference is None else (_grouped_pairs(ref_x), ref_weight, ref_bias),
        temperature=1.0,
        weight_layout=weight_layout,
        implementation=implementation,
        groups_per_chunk=chunk_size,
    )
    token_logps = seq.masked(_ungrouped_pairs(token_logps), mask)
    logps = seq.sequence_logprobs(token_logps, mask, average_log_prob)
    ref_logps = None
    if ref_token_logps is not None:
        ref_token_logps = seq.masked(_ungrouped_pairs(ref_token_logps), mask)
        ref_logps = seq.sequence_logprobs(ref_token_logps, mask, average_log_prob)
    nll_loss = _nll_loss(token_logps[:n_pairs], mask[:n_pairs]) if compute_nll_loss else jnp.zeros((), logps.dtype)
    return loss, _paired_logps(x, weight, bias, weight_layout, logps, ref_logps, nll_loss)


def _check_even_batch(x: jax.Array) -> None:
    if x.ndim == 3 and x.shape[0] % 2:
        raise ValueError(f"x must hold chosen then rejected sequences: an even batch, got B={x.shape[0]}")


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
    chunk_size: int | None = None,
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
        chunk_size: whole pairs per chunk, or None for the default (see :func:`paired_loss`).
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
    loss, logps = paired_loss(
        x,
        weight,
        labels,
        _DPOPairLosses(beta, loss_type, label_smoothing, discopop_tau),
        alpha=alpha,
        bias=bias,
        ref_x=ref_x,
        ref_weight=ref_weight,
        ref_bias=ref_bias,
        ignore_index=ignore_index,
        average_log_prob=average_log_prob,
        compute_nll_loss=compute_nll_loss,
        weight_layout=weight_layout,
        chunk_size=chunk_size,
        implementation=implementation,
    )
    chosen_logratios, rejected_logratios = _logratios(
        logps.chosen, logps.rejected, logps.ref_chosen, logps.ref_rejected
    )
    return _paired_loss(logps, loss, beta * chosen_logratios, beta * rejected_logratios)


def _logratios(chosen, rejected, ref_chosen, ref_rejected):
    """The pairs' policy/reference log-ratios ``(a, b)`` (the log-probs themselves without a reference model)."""
    if ref_chosen is None:
        return chosen, rejected
    return chosen - ref_chosen, rejected - ref_rejected


@dataclasses.dataclass(frozen=True)
class _DPOPairLosses:
    """:func:`dpo_pair_losses` of the pairs' log-probs (a :func:`paired_loss` ``pair_losses``)."""

    beta: float
    loss_type: str
    label_smoothing: float
    discopop_tau: float

    def __call__(self, chosen, rejected, ref_chosen, ref_rejected):
        return dpo_pair_losses(
            *_logratios(chosen, rejected, ref_chosen, ref_rejected),
            beta=self.beta,
            loss_type=self.loss_type,
            label_smoothing=self.label_smoothing,
            discopop_tau=self.discopop_tau,
        )


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
    chunk_size: int | None = None,
    implementation: runtime.Implementation | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    r"""Odds Ratio Preference Optimization fused with the LM head (Liger's ``LigerFusedLinearORPOLoss``).

    With mean per-token log-probs :math:`\log p_w`, :math:`\log p_l` and :func:`orpo_log_odds` :math:`o`:
    ``loss = alpha · nll_loss - beta · mean(log σ(o))``. Rewards are ``beta · log p``; ``aux`` adds
    ``log_odds_ratio = mean(log σ(o))`` and ``log_odds_chosen = mean(o)``. A sequence whose mean log-prob is 0 (every
    label ignored) has infinite odds and makes the loss NaN, as in Liger. With an ``nll_target`` a row has two
    target tokens, and this loss keeps the two-pass path (log-probs, then their gradient: four matmuls per chunk);
    without one, its gradient is made in the forward pass (three; see :func:`paired_loss`).

    Args:
        x, weight, labels, bias, ignore_index, compute_nll_loss, nll_target, weight_layout, implementation: as
            :func:`paired_logps` (log-probs are always means, as ORPO defines them).
        beta: the weight of the odds-ratio term, > 0.
        alpha: the weight of the NLL term.
        chunk_size: whole pairs per chunk, or None for the default (see :func:`paired_loss`); unused with an
            ``nll_target``.

    Returns:
        ``(loss, aux)``.
    """
    seq.check_positive("beta", beta)
    _check_alpha(alpha)
    loss, logps = paired_loss(
        x,
        weight,
        labels,
        _ORPOPairLosses(beta),
        alpha=alpha,
        bias=bias,
        ignore_index=ignore_index,
        average_log_prob=True,
        compute_nll_loss=compute_nll_loss,
        nll_target=nll_target,
        weight_layout=weight_layout,
        chunk_size=chunk_size,
        implementation=implementation,
    )
    log_odds = orpo_log_odds(logps.chosen, logps.rejected)
    ratio = jax.nn.log_sigmoid(log_odds)
    return _paired_loss(
        logps,
        loss,
        beta * logps.chosen,
        beta * logps.rejected,
        log_odds_ratio=jnp.mean(ratio),
        log_odds_chosen=jnp.mean(log_odds),
    )


@dataclasses.dataclass(frozen=True)
class _ORPOPairLosses:
    """ORPO's per-pair ``-beta · log σ(orpo_log_odds)`` (a :func:`paired_loss` ``pair_losses``)."""

    beta: float

    def __call__(self, chosen, rejected, ref_chosen, ref_rejected):
        del ref_chosen, ref_rejected  # ORPO has no reference model
        return -self.beta * jax.nn.log_sigmoid(orpo_log_odds(chosen, rejected))


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
    chunk_size: int | None = None,
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
        chunk_size: whole pairs per chunk, or None for the default (see :func:`paired_loss`).
        label_smoothing: ε in [0, 1], the assumed fraction of flipped preferences.

    Returns:
        ``(loss, aux)``.
    """
    return _smoothed_sigmoid_loss(
        x, weight, labels, bias, ignore_index, beta, alpha, 0.0, label_smoothing, compute_nll_loss, average_log_prob,
        weight_layout, chunk_size, implementation,
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
    chunk_size: int | None = None,
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
        chunk_size: whole pairs per chunk, or None for the default (see :func:`paired_loss`).
        gamma: the target reward margin.
        label_smoothing: ε in [0, 1].

    Returns:
        ``(loss, aux)``.
    """
    return _smoothed_sigmoid_loss(
        x, weight, labels, bias, ignore_index, beta, alpha, gamma, label_smoothing, compute_nll_loss, True,
        weight_layout, chunk_size, implementation,
    )  # fmt: skip


def _smoothed_sigmoid_loss(
    x, weight, labels, bias, ignore_index, beta, alpha, gamma, label_smoothing, compute_nll_loss, average_log_prob,
    weight_layout, chunk_size, implementation,
):  # fmt: skip
    seq.check_positive("beta", beta)
    _check_alpha(alpha)
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"label_smoothing must be in [0, 1], got {label_smoothing!r}")
    if not np.isfinite(gamma):
        raise ValueError(f"gamma must be a finite number, got {gamma!r}")
    loss, logps = paired_loss(
        x,
        weight,
        labels,
        _SmoothedSigmoidPairLosses(beta, gamma, label_smoothing),
        alpha=alpha,
        bias=bias,
        ignore_index=ignore_index,
        average_log_prob=average_log_prob,
        compute_nll_loss=compute_nll_loss,
        weight_layout=weight_layout,
        chunk_size=chunk_size,
        implementation=implementation,
    )
    return _paired_loss(logps, loss, beta * logps.chosen, beta * logps.rejected)


@dataclasses.dataclass(frozen=True)
class _SmoothedSigmoidPairLosses:
    """:func:`smoothed_sigmoid_pair_losses` of the pairs' log-probs (a :func:`paired_loss` ``pair_losses``)."""

    beta: float
    gamma: float
    label_smoothing: float

    def __call__(self, chosen, rejected, ref_chosen, ref_rejected):
        del ref_chosen, ref_rejected  # CPO and SimPO have no reference model
        return smoothed_sigmoid_pair_losses(
            chosen, rejected, beta=self.beta, gamma=self.gamma, label_smoothing=self.label_smoothing
        )


def _paired_loss(
    logps: PairedLogps,
    loss: jax.Array,
    chosen_rewards: jax.Array,
    rejected_rewards: jax.Array,
    **extra_metrics: jax.Array,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The loss and the metrics, which carry no gradient."""
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
