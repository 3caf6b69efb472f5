"""Tunix's DPO/ORPO loss without ``[B, S, V]`` logits: the completion log-probs come from the final hidden states
and the LM head through :func:`liger_jax.fused_linear_logprobs`."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from liger_jax import runtime
from liger_jax.integrations.tunix.loss import _family, _final_hidden_states, lm_head_weight
from liger_jax.ops.fused_linear_logprobs import fused_linear_logprobs
from liger_jax.ops.preference import orpo_log_odds, smoothed_sigmoid_pair_losses


def completion_logps(
    model: nnx.Module, train_example: Any, implementation: runtime.Implementation | None = None
) -> tuple[jax.Array, jax.Array]:
    """``(chosen [B/2], rejected [B/2])`` summed completion log-probs of a Tunix ``TrainExample`` (chosen
    sequences first), as Tunix's ``compute_logps`` computes them, without the logits.

    Raises:
        TypeError: ``model`` is not a supported Tunix family.
        ValueError: the model caps its final logits (Gemma, Gemma4 with a softcap), which the fused log-probs do not
            do, or its head has LoRA parameters.
    """
    family = _family(model)
    if family.softcap(model) is not None:
        raise ValueError(f"{type(model).__name__} caps its final logits; liger_jax's fused log-probs have no softcap")
    weight, layout, head_dtype = lm_head_weight(model, family)
    hidden = _final_hidden_states(
        model,
        family,
        train_example.input_ids,
        train_example.positions,
        train_example.attention_mask,
        train_example.images,
    )
    if head_dtype is not None:
        hidden, weight = hidden.astype(head_dtype), weight.astype(head_dtype)
    keep = train_example.logits_to_keep
    # Position t's logits predict token t + 1: the completion's tokens are predicted by the positions before them.
    token_logps = fused_linear_logprobs(
        hidden[:, -keep - 1 : -1],
        weight,
        train_example.input_ids[:, -keep:],
        weight_layout=layout,
        implementation=implementation,
    )
    logps = jnp.sum(token_logps * train_example.completion_mask, axis=-1)
    half = logps.shape[0] // 2
    return logps[:half], logps[half:]


def dpo_loss_fn(
    model: nnx.Module,
    train_example: Any,
    algorithm: str = "dpo",
    beta: float = 0.1,
    lambda_orpo: float = 0.1,
    label_smoothing: float = 0.0,
    implementation: runtime.Implementation | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Tunix's ``DPOTrainer`` loss (``tunix.sft.dpo.dpo_trainer.dpo_loss_fn``), computed without the logits.

    A drop-in: ``DPOTrainer(...).with_loss_fn(dpo_loss_fn, has_aux=True)`` trains on the same loss, gradients and
    metrics. The per-token log-probs of the completions come from :func:`completion_logps` (fp32 softmax, as
    :func:`liger_jax.fused_linear_logprobs`); the reference log-probs are Tunix's, precomputed in the
    ``TrainExample``. ``"dpo"``: ``mean(-(1-ε) log σ(βδ) - ε log σ(-βδ))`` with δ the chosen minus rejected
    log-ratio; ``"orpo"``: ``mean(-log p_w / |y_w| + λ · (smoothed) -log σ(log odds ratio))`` on summed log-probs,
    as Tunix defines them.

    Args:
        model: the policy, a Tunix model :func:`liger_jax.integrations.tunix.peft_loss_fn` supports (without a
            final logit softcap).
        train_example: Tunix's ``TrainExample``.
        algorithm, beta, lambda_orpo, label_smoothing: as Tunix's loss.
        implementation: the log-probs' implementation (see :mod:`liger_jax.runtime`), None for the default.

    Returns:
        ``(loss, aux)`` with Tunix's metrics.
    """
    chosen_logps, rejected_logps = completion_logps(model, train_example, implementation)
    if algorithm == "orpo":
        chosen_lengths = jnp.maximum(train_example.completion_mask[: chosen_logps.shape[0]].sum(axis=-1), 1.0)
        sft_loss = -chosen_logps / chosen_lengths
        log_odds = orpo_log_odds(chosen_logps, rejected_logps)
        or_loss = smoothed_sigmoid_pair_losses(
            log_odds, jnp.zeros_like(log_odds), beta=1.0, gamma=0.0, label_smoothing=label_smoothing
        )
        chosen_rewards, rejected_rewards = lambda_orpo * chosen_logps, lambda_orpo * rejected_logps
        extra = {
            "odds_ratio": jnp.exp(log_odds).mean(),
            "sft_loss": sft_loss.mean(),
            "or_loss": or_loss.mean(),
        }
        losses = sft_loss + lambda_orpo * or_loss
    else:
        chosen_ratio, rejected_ratio = chosen_logps, rejected_logps
        if train_example.ref_chosen_logps is not None:
            chosen_ratio = chosen_ratio - train_example.ref_chosen_logps
        if train_example.ref_rejected_logps is not None:
            rejected_ratio = rejected_ratio - train_example.ref_rejected_logps
        losses = smoothed_sigmoid_pair_losses(
            chosen_ratio, rejected_ratio, beta=beta, gamma=0.0, label_smoothing=label_smoothing
        )
        chosen_rewards, rejected_rewards = beta * chosen_ratio, beta * rejected_ratio
        extra = {}
    aux = {
        "rewards/chosen": chosen_rewards.mean(),
        "rewards/rejected": rejected_rewards.mean(),
        "rewards/margin": (chosen_rewards - rejected_rewards).mean(),
        "rewards/accuracy": (chosen_rewards > rejected_rewards).mean(),
        "log_probs/chosen": chosen_logps.mean(),
        "log_probs/rejected": rejected_logps.mean(),
        **extra,
    }
    return losses.mean(), aux
