"""Tunix's GRPO policy loss (``tunix.rl.algo_core.grpo_loss_fn``) without ``[B, S, V]`` logits: the completion
tokens' log-probs and entropy come from the final hidden states and the LM head through
:func:`liger_jax.fused_linear_logprobs`."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from liger_jax import runtime
from liger_jax.integrations.tunix.loss import _family, _final_hidden_states, lm_head_weight
from liger_jax.ops.fused_linear_logprobs import fused_linear_logprobs

# Tunix bounds the log importance ratio before exponentiating it, and GSPO-token's sequence ratio above.
LOG_RATIO_LIMIT = 20.0
GSPO_LOG_RATIO_MAX = 10.0
LOSS_ALGOS = ("grpo", "gspo-token")


def grpo_loss_fn(
    model: nnx.Module,
    train_example: Any,
    algo_config: Any,
    pad_id: int,
    eos_id: int,
    implementation: runtime.Implementation | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Tunix's GRPO policy loss (its ``"grpo"`` policy loss function), computed without the logits.

    A drop-in for ``GRPOLearner`` (and the learners built on it: DAPO, Dr. GRPO): register it as a policy loss and
    name it in the config; the learner then calls it as it calls Tunix's, under its jitted training step::

        from tunix.rl import function_registry
        from liger_jax.integrations.tunix import grpo_loss_fn

        function_registry.register_policy_loss_fn("liger_grpo")(grpo_loss_fn)
        config = GRPOConfig(policy_loss_fn="liger_grpo", ...)  # everything else as before
        learner = GRPOLearner(rl_cluster, config, reward_fns)

    (To pick an ``implementation``, register a function of the five arguments that passes it on.) It trains on
    the same loss with the same gradients and returns the same metrics as Tunix 0.1.7's ``grpo_loss_fn``: the
    per-token log-probs of the completion tokens at the rollout temperature, from the policy's final hidden states
    (:func:`liger_jax.integrations.tunix.peft_loss_fn` explains how they are taken from the model's own call) and
    its LM head through :func:`liger_jax.fused_linear_logprobs`, which also gives the tokens' entropy (Tunix's
    ``"entropy"`` metric); then Tunix's math on them (:func:`grpo_loss_from_logps`).

    Numerics: log-probs and entropy from an fp32 softmax of the logits in the head's dtype (Tunix too takes its
    log-softmax in fp32, its entropy in the logits' dtype: in fp32 the two agree to rounding).

    Args:
        model: the policy, a Tunix model :func:`liger_jax.integrations.tunix.peft_loss_fn` supports, without a
            final logit softcap (Gemma's and Gemma4's are refused).
        train_example: the learner's ``TrainExample``: ``prompt_ids`` ``[B, P]``, ``completion_ids`` and
            ``completion_mask`` ``[B, T]``, ``advantages`` ``[B]`` or ``[B, T]``, ``ref_per_token_logps`` and
            ``old_per_token_logps`` ``[B, T]`` or None, ``sampler_is_weights`` ``[B, T]`` or None. Packed examples
            (``segment_ids``) are refused.
        algo_config: the learner's ``GRPOConfig`` (``beta``, ``epsilon``, ``epsilon_high``, ``epsilon_c``,
            ``loss_algo``, ``loss_agg_mode``, ``kl_loss_mode``, ``kl_clamp_value``, ``temperature``).
        pad_id, eos_id: the tokenizer's, as the learner passes them.
        implementation: the log-probs' implementation (see :mod:`liger_jax.runtime`), None for the default.

    Returns:
        ``(loss, aux)``: the scalar fp32 loss and Tunix's metrics.

    Raises:
        TypeError: ``model`` is not a supported Tunix family.
        ValueError: a packed example, a final logit softcap, LoRA on the head, a temperature < 0, or an option
            out of Tunix's domain.
    """
    _check_loss_algo(algo_config)
    per_token_logps, token_entropy = completion_token_logps(
        model, train_example, algo_config.temperature, pad_id, eos_id, implementation
    )
    return grpo_loss_from_logps(per_token_logps, token_entropy, train_example, algo_config)


def completion_token_logps(
    model: nnx.Module,
    train_example: Any,
    temperature: float,
    pad_id: int,
    eos_id: int,
    implementation: runtime.Implementation | None = None,
) -> tuple[jax.Array, jax.Array]:
    """``(log-probs, entropy)``, each ``[B, T]`` fp32: of the completion tokens of a Tunix RL ``TrainExample`` and
    of the policy at their positions, at ``temperature`` (0 and 1 leave the logits as they are, as Tunix's
    ``compute_per_token_logps``), the model fed as Tunix feeds it (``tunix.rl.common.process_ids``).

    Raises:
        TypeError, ValueError: as :func:`grpo_loss_fn`.
    """
    from tunix.rl import common  # the integration imports Tunix only when used

    if getattr(train_example, "segment_ids", None) is not None:
        raise ValueError("train_example is packed (segment_ids); liger_jax's GRPO loss takes unpacked examples")
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature!r}")
    family = _family(model)
    if family.softcap(model) is not None:
        raise ValueError(f"{type(model).__name__} caps its final logits; liger_jax's fused log-probs have no softcap")
    weight, layout, head_dtype = lm_head_weight(model, family)
    completion_ids = train_example.completion_ids
    input_ids, positions, attention_mask, _ = common.process_ids(
        train_example.prompt_ids, completion_ids, pad_id, eos_id
    )
    hidden = _final_hidden_states(model, family, input_ids, positions, attention_mask, None)
    if head_dtype is not None:
        hidden, weight = hidden.astype(head_dtype), weight.astype(head_dtype)
    keep = completion_ids.shape[1]
    # Position t's logits predict token t + 1: the completion's tokens are predicted by the positions before them.
    logps, entropy = fused_linear_logprobs(
        hidden[:, -keep - 1 : -1],
        weight,
        completion_ids,
        temperature=1.0 if temperature == 0.0 else temperature,
        return_entropy=True,
        weight_layout=layout,
        implementation=implementation,
    )
    return logps.astype(jnp.float32), entropy.astype(jnp.float32)


def grpo_loss_from_logps(
    per_token_logps: jax.Array, token_entropy: jax.Array, train_example: Any, algo_config: Any
) -> tuple[jax.Array, dict[str, jax.Array]]:
    r"""Tunix 0.1.7's GRPO policy loss and metrics from the policy's per-token log-probs and entropy.

    With :math:`\ell` the log-probs, :math:`\ell_{old}` the sampler's (``old_per_token_logps``, else
    ``stop_gradient(ℓ)``) and :math:`A` the advantages: the log ratio :math:`\rho = \text{clip}(\ell - \ell_{old},
    \pm 20)` (``"gspo-token"``: :math:`\ell - \text{sg}(\ell) + \text{sg}(\text{masked mean}_t \rho)`, capped at
    10), :math:`r = e^\rho`, the per-token loss :math:`\max(-A r, -A\,\text{clip}(r, 1-ε, 1+ε_{high}))`, with
    ``epsilon_c`` for :math:`A < 0` at most :math:`-ε_c A` (dual-clip PPO), times ``sampler_is_weights``;
    aggregated by ``loss_agg_mode`` (``tunix.rl.common.aggregate_loss``), plus ``beta`` times the KL estimate
    ``kl_loss_mode`` (``tunix.rl.common.compute_kl_divergence``) aggregated alike when reference log-probs are
    given. Where this differs from :func:`liger_jax.ops.grpo.grpo_loss_from_logps` (Liger's and TRL's math),
    whose per-token loss is the same clipped surrogate: the ±20 bound on the log ratio; GSPO-token's cap;
    dual-clip; the KL estimator (Tunix's default ``"kl"`` is :math:`\ell - \ell_{ref}`, Liger's the k3
    :math:`e^{\ell_{ref}-\ell} - (\ell_{ref}-\ell) - 1`, Tunix's ``"low_var_kl"``) and its clamp; and the
    normalisers, which count non-empty sequences rather than the batch. So the math is Tunix's, written here.

    Args:
        per_token_logps: ``[B, T]`` float, differentiable.
        token_entropy: ``[B, T]`` the policy's entropy at each completion position (a metric only).
        train_example, algo_config: as :func:`grpo_loss_fn`.

    Returns:
        ``(loss, aux)`` as Tunix's ``grpo_loss_fn``.

    Raises:
        ValueError: ``loss_algo`` not ``"grpo"`` or ``"gspo-token"``; an unknown ``loss_agg_mode`` or
            ``kl_loss_mode`` (from Tunix).
    """
    from tunix.rl import algo_core, common

    _check_loss_algo(algo_config)
    epsilon = algo_config.epsilon
    epsilon_high = getattr(algo_config, "epsilon_high", epsilon)
    epsilon_c = getattr(algo_config, "epsilon_c", None)
    mode = algo_config.loss_agg_mode
    mask = train_example.completion_mask
    aggregate = lambda values: common.aggregate_loss(values, mask, mode)  # noqa: E731
    mean = lambda values: algo_core.masked_mean(values, mask)  # noqa: E731

    per_token_logps = per_token_logps.astype(jnp.float32)
    old = train_example.old_per_token_logps
    old = jax.lax.stop_gradient(per_token_logps) if old is None else old.astype(jnp.float32)
    log_ratio = per_token_logps - old
    ppo_kl = mean(-log_ratio)
    log_ratio = jnp.clip(log_ratio, -LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)
    if algo_config.loss_algo == "gspo-token":
        sequence_log_ratio = jnp.sum(log_ratio * mask, axis=-1) / jnp.clip(mask.sum(-1), min=1)
        log_ratio = per_token_logps - jax.lax.stop_gradient(per_token_logps)
        log_ratio = log_ratio + jax.lax.stop_gradient(sequence_log_ratio)[:, None]
        log_ratio = jnp.clip(log_ratio, max=GSPO_LOG_RATIO_MAX)
    ratio = jnp.exp(log_ratio)

    advantages = train_example.advantages.astype(jnp.float32)
    advantages = advantages if advantages.ndim == 2 else advantages[:, None]
    unclipped = -advantages * ratio
    clipped = -advantages * jnp.clip(ratio, 1 - epsilon, 1 + epsilon_high)
    per_token_loss = jnp.maximum(unclipped, clipped)
    dual_clip = per_token_loss if epsilon_c is None else -epsilon_c * advantages
    negative = advantages < 0.0
    pg_clipfrac_lower = aggregate(((per_token_loss > dual_clip) & negative).astype(jnp.float32))
    per_token_loss = jnp.where(negative, jnp.minimum(dual_clip, per_token_loss), per_token_loss)
    sampler_is_weights = getattr(train_example, "sampler_is_weights", None)
    if sampler_is_weights is not None:
        per_token_loss = per_token_loss * sampler_is_weights.astype(jnp.float32)
    loss = aggregate(per_token_loss)

    real = mask > 0
    advantages = jnp.broadcast_to(advantages, mask.shape)
    aux = {
        "kl": 0.0,
        "kl_loss": 0.0,
        "pg_loss": loss,
        "pg_clipfrac": mean(clipped > unclipped),
        "ppo_kl": ppo_kl,
        "pg_clipfrac_lower": pg_clipfrac_lower,
        "is_ratio/mean": mean(ratio),
        "is_ratio/max": jnp.max(jnp.where(real, ratio, 0.0)),
        "is_ratio/min": jnp.min(jnp.where(real, ratio, jnp.inf)),
        "log_ratio/abs_mean": mean(jnp.abs(log_ratio)),
        "pg_loss/unclipped_mean": mean(unclipped),
        "pg_loss/clipped_mean": mean(clipped),
        "advantage/abs_mean": mean(jnp.abs(advantages)),
        "advantage/max": jnp.max(jnp.where(real, advantages, -jnp.inf)),
        "advantage/min": jnp.min(jnp.where(real, advantages, jnp.inf)),
        "advantage/nonzero_frac": mean((jnp.abs(advantages) > 1e-8).astype(jnp.float32)),
    }
    if sampler_is_weights is None:
        aux["sampler_is/weight_mean"] = aux["sampler_is/weight_min"] = jnp.float32(1.0)
    else:
        weights = sampler_is_weights.astype(jnp.float32)
        aux["sampler_is/weight_mean"] = mean(weights)
        aux["sampler_is/weight_min"] = jnp.min(jnp.where(real, weights, jnp.inf))
    if train_example.ref_per_token_logps is not None:
        kl = common.compute_kl_divergence(
            per_token_logps,
            train_example.ref_per_token_logps,
            algo_config.kl_loss_mode,
            clamp_value=algo_config.kl_clamp_value,
        )
        aux["kl"] = (kl * mask).sum() / jnp.clip(mask.sum(), min=1)
        aux["kl_loss"] = aggregate(kl)
        if algo_config.beta is not None and algo_config.beta != 0.0:
            loss = loss + algo_config.beta * aux["kl_loss"]
    aux["entropy"] = aggregate(token_entropy)
    return loss, aux


def _check_loss_algo(algo_config: Any) -> None:
    if algo_config.loss_algo not in LOSS_ALGOS:
        raise ValueError(f"algo_config.loss_algo must be one of {LOSS_ALGOS}, got {algo_config.loss_algo!r}")
