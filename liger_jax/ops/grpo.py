"""The GRPO family of policy-gradient losses fused with the LM head (Liger's ``LigerFusedLinearGRPOLoss``): GRPO,
BNPO, Dr. GRPO, DAPO, CISPO, SAPO, LUSPO and VESPO, with token- or sequence-level (GSPO) importance sampling and a
k3 KL penalty against reference log-probs or a reference model."""

import math

import jax
import jax.numpy as jnp
import numpy as np

from liger_jax import runtime
from liger_jax.ops import _checks
from liger_jax.ops import _sequence_logprobs as seq
from liger_jax.ops.fused_linear_cross_entropy import WeightLayout

GRPO_LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo")
IMPORTANCE_SAMPLING_LEVELS = ("token", "sequence")
# Loss types whose weights are per token by construction: no sequence-level importance sampling (as Liger).
TOKEN_LEVEL_ONLY = ("cispo", "sapo", "vespo")
# VESPO's clamps (TRL's get_gamma_weights): log-ratios within ±20, sequence weights at least 1e-8.
VESPO_LOG_RATIO_LIMIT = 20.0
VESPO_MIN_LOG_WEIGHT = math.log(1e-8)
VESPO_MIN_LAMBDA = 1e-4


def grpo_loss_from_logps(
    per_token_logps: jax.Array,
    attention_mask: jax.Array,
    advantages: jax.Array,
    *,
    ref_per_token_logps: jax.Array | None = None,
    old_per_token_logps: jax.Array | None = None,
    vllm_is_ratio: jax.Array | None = None,
    beta: float = 0.04,
    epsilon_low: float = 0.2,
    epsilon_high: float = 0.2,
    loss_type: str = "dapo",
    max_completion_length: int | None = None,
    importance_sampling_level: str = "token",
    sapo_temperature_pos: float = 1.0,
    sapo_temperature_neg: float = 1.05,
    delta: float | None = None,
    use_bias_correction_kl: bool = False,
    vespo_k_pos: float = 2.0,
    vespo_lambda_pos: float = 3.0,
    vespo_k_neg: float = 3.0,
    vespo_lambda_neg: float = 2.0,
    num_items_in_batch: float | jax.Array | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    r"""The GRPO-family loss from per-token log-probs (the math of :func:`fused_linear_grpo`, also for callers that
    already hold log-probs).

    With :math:`\ell` the policy's per-token log-probs ``[B, T]``, :math:`\ell_{old}` the sampling policy's (``ℓ``
    itself, without gradient, when None), :math:`A` the advantages and :math:`w = e^{\ell - \ell_{old}}` per token
    (``"token"``) or :math:`w = e^{\text{mean}_t(\ell - \ell_{old})}` per sequence (``"sequence"``, GSPO):

    * ``grpo``, ``bnpo``, ``dr_grpo``, ``dapo``, ``luspo``: :math:`-\min(w' A, \text{clip}(w, 1-ε_{low}, 1+ε_{high})
      A)`, :math:`w' = \min(w, δ)` with ``delta`` (INTELLECT-2), else :math:`w`.
    * ``cispo``: :math:`-\text{sg}(\min(w, ε_{high})) A \ell`.
    * ``sapo``: :math:`-\frac{4}{τ}\sigma(τ(w - 1)) A`, τ the temperature of A's sign.
    * ``vespo``: :math:`-\text{sg}(φ) A \ell` with TRL's gamma weight φ of the sequence's importance weight.

    times ``vllm_is_ratio`` where given (except ``vespo``, which folds it into φ), plus ``beta`` times the k3 KL
    estimate :math:`e^{\ell_{ref} - \ell} - (\ell_{ref} - \ell) - 1` (times :math:`w` with
    ``use_bias_correction_kl``). Reduced over the masked tokens: ``grpo``/``sapo`` per-sequence means averaged over
    B; ``bnpo`` a token mean; ``dr_grpo`` a sum over ``B · max_completion_length``; ``dapo``/``cispo``/``vespo`` a sum
    over ``num_items_in_batch`` (default: the mask's count); ``luspo`` :math:`\text{mean}(loss_t · |y|)` as TRL.

    Args:
        per_token_logps: ``[B, T]`` float, differentiable.
        attention_mask: ``[B, T]`` of the completion tokens that count (bool, int or float).
        advantages: ``[B]``.
        ref_per_token_logps, old_per_token_logps: ``[B, T]`` or None; no gradient.
        vllm_is_ratio: the sampler's importance ratio, ``[B]``, ``[B, 1]`` or ``[B, T]``, or None; no gradient.
        beta: the KL weight (0 skips the KL and its metric).
        Others: as :func:`fused_linear_grpo`.

    Returns:
        ``(loss, aux)``: ``aux["kl"]`` (the masked token mean of the KL estimate, only when beta ≠ 0) and
        ``aux["clip_ratio"]`` (the fraction of masked tokens whose ratio was clipped against the sign of their
        advantage), without gradient.
    """
    _check_options(loss_type, importance_sampling_level, max_completion_length, epsilon_low, epsilon_high, beta)
    dtype = per_token_logps.dtype
    mask = attention_mask.astype(dtype)
    batch = per_token_logps.shape[0]
    advantage = advantages.astype(dtype)[:, None]
    sampled = jax.lax.stop_gradient(per_token_logps if old_per_token_logps is None else old_per_token_logps)
    log_ratio = per_token_logps - sampled.astype(dtype)
    if importance_sampling_level == "token":
        log_weights = log_ratio
    else:
        log_weights = jnp.sum(log_ratio * mask, axis=-1, keepdims=True) / _at_least_one(
            jnp.sum(mask, -1, keepdims=True)
        )
    weights = jnp.exp(log_weights)
    if vllm_is_ratio is not None:
        vllm_is_ratio = jax.lax.stop_gradient(vllm_is_ratio.astype(dtype))
        vllm_is_ratio = vllm_is_ratio[:, None] if vllm_is_ratio.ndim == 1 else vllm_is_ratio

    lower_clipped = upper_clipped = jnp.zeros_like(weights, dtype=bool)
    match loss_type:
        case "cispo":
            clipped = jax.lax.stop_gradient(jnp.minimum(weights, epsilon_high))
            upper_clipped = weights > epsilon_high
            per_token_loss = -clipped * advantage * per_token_logps
        case "sapo":
            gate = jnp.where(
                advantage > 0,
                _sapo_gate(weights, sapo_temperature_pos),
                _sapo_gate(weights, sapo_temperature_neg),
            )
            per_token_loss = -gate * advantage
        case "vespo":
            phi = _vespo_gamma_weights(
                advantages.astype(dtype), log_ratio, mask, vllm_is_ratio,
                (vespo_k_pos, vespo_lambda_pos), (vespo_k_neg, vespo_lambda_neg),
            )  # fmt: skip
            per_token_loss = -phi * advantage * per_token_logps
        case _:
            clipped = jnp.clip(weights, 1.0 - epsilon_low, 1.0 + epsilon_high)
            lower_clipped, upper_clipped = weights < 1.0 - epsilon_low, weights > 1.0 + epsilon_high
            unclipped = weights if delta is None else jnp.minimum(weights, delta)
            per_token_loss = -jnp.minimum(unclipped * advantage, clipped * advantage)
    if vllm_is_ratio is not None and loss_type != "vespo":
        per_token_loss = per_token_loss * vllm_is_ratio

    aux = {}
    token_count = _at_least_one(jnp.sum(mask))
    if beta != 0.0:
        reference = per_token_logps if ref_per_token_logps is None else ref_per_token_logps
        reference = jax.lax.stop_gradient(reference)
        log_ref_ratio = reference.astype(dtype) - per_token_logps
        kl = jnp.exp(log_ref_ratio) - log_ref_ratio - 1.0
        if use_bias_correction_kl:
            kl = kl * weights
        per_token_loss = per_token_loss + beta * kl
        aux["kl"] = jnp.sum(kl * mask) / token_count

    masked_loss = per_token_loss * mask
    match loss_type:
        case "grpo" | "sapo":
            loss = jnp.sum(jnp.sum(masked_loss, -1) / _at_least_one(jnp.sum(mask, -1))) / batch
        case "bnpo":
            loss = jnp.sum(masked_loss) / token_count
        case "dr_grpo":
            loss = jnp.sum(masked_loss) / (batch * max_completion_length)
        case "luspo":
            weighted = per_token_loss * jnp.sum(mask, -1, keepdims=True)
            loss = jnp.sum(weighted) / (batch * weighted.shape[1])
        case _:  # dapo, cispo, vespo
            normalizer = token_count if num_items_in_batch is None else _at_least_one(jnp.asarray(num_items_in_batch))
            loss = jnp.sum(masked_loss) / normalizer.astype(dtype)

    clipped_against_advantage = (lower_clipped & (advantage < 0)) | (upper_clipped & (advantage > 0))
    aux["clip_ratio"] = jnp.sum(jnp.broadcast_to(clipped_against_advantage, mask.shape) * mask) / token_count
    return loss, jax.lax.stop_gradient(aux)


def fused_linear_grpo(
    x: jax.Array,
    weight: jax.Array,
    selected_token_ids: jax.Array,
    attention_mask: jax.Array,
    advantages: jax.Array,
    *,
    bias: jax.Array | None = None,
    ref_per_token_logps: jax.Array | None = None,
    old_per_token_logps: jax.Array | None = None,
    ref_x: jax.Array | None = None,
    ref_weight: jax.Array | None = None,
    ref_bias: jax.Array | None = None,
    beta: float = 0.04,
    epsilon_low: float = 0.2,
    epsilon_high: float = 0.2,
    loss_type: str = "dapo",
    max_completion_length: int | None = None,
    temperature: float = 1.0,
    importance_sampling_level: str = "token",
    sapo_temperature_pos: float = 1.0,
    sapo_temperature_neg: float = 1.05,
    vllm_is_ratio: jax.Array | None = None,
    delta: float | None = None,
    use_bias_correction_kl: bool = False,
    vespo_k_pos: float = 2.0,
    vespo_lambda_pos: float = 3.0,
    vespo_k_neg: float = 3.0,
    vespo_lambda_neg: float = 2.0,
    num_items_in_batch: float | jax.Array | None = None,
    weight_layout: WeightLayout = "hv",
    implementation: runtime.Implementation | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    r"""GRPO-family policy loss on LM-head hidden states, without the ``[B, T, V]`` logits.

    The policy's per-token log-probs :math:`\log\text{softmax}((x W + b) / T)[\text{token}]` come from
    :func:`liger_jax.fused_linear_logprobs` (chunked, float32 softmax; float64 for float64 inputs) at every position
    (the mask weights them afterwards); the reference model's, when ``ref_x``/``ref_weight`` are given, the same way
    without gradient. :func:`grpo_loss_from_logps` turns them into the loss.

    Args:
        x: ``[B, T, H]`` hidden states of the completions.
        weight: the LM head, ``[H, V]`` (``weight_layout="hv"``) or ``[V, H]`` (``"vh"``).
        selected_token_ids: ``[B, T]`` sampled token ids in ``[0, V)`` (every position, padding included).
        attention_mask: ``[B, T]`` completion mask (bool, int or float).
        advantages: ``[B]`` float.
        bias: optional ``[V]``.
        ref_per_token_logps: ``[B, T]`` reference log-probs, or None; no gradient.
        old_per_token_logps: ``[B, T]`` log-probs of the sampling policy, or None for on-policy; no gradient.
        ref_x, ref_weight, ref_bias: a reference model's hidden states and head in place of
            ``ref_per_token_logps``; no gradient. With neither, the KL term is 0.
        beta: the KL weight.
        epsilon_low, epsilon_high: the clip range ``[1 - ε_low, 1 + ε_high]`` (``cispo``: the cap ``ε_high``), ≥ 0.
        loss_type: one of :data:`GRPO_LOSS_TYPES`.
        max_completion_length: the ``dr_grpo`` normaliser (a positive int; required there).
        temperature: the sampling temperature dividing the logits, > 0.
        importance_sampling_level: ``"token"`` or ``"sequence"`` (GSPO; not with cispo, sapo or vespo).
        sapo_temperature_pos, sapo_temperature_neg: SAPO's gate temperatures for positive / other advantages, > 0.
        vllm_is_ratio: the sampler's importance ratio, ``[B]``, ``[B, 1]`` or ``[B, T]``, or None.
        delta: the upper cap of the unclipped ratio (two-sided clipping), or None.
        use_bias_correction_kl: multiply the KL estimate by the importance weight (DeepSeek-V3.2).
        vespo_k_pos, vespo_lambda_pos, vespo_k_neg, vespo_lambda_neg: VESPO's gamma shapes and rates.
        num_items_in_batch: the ``dapo``/``cispo``/``vespo`` normaliser (all completion tokens of the generation
            batch), or None for this batch's mask count.
        weight_layout, implementation: as :func:`liger_jax.fused_linear_logprobs`.

    Returns:
        ``(loss, aux)`` as :func:`grpo_loss_from_logps`.

    Raises:
        TypeError, ValueError: an input of the wrong dtype or shape, a token out of range, an option out of its
            domain or a missing one (``max_completion_length`` for ``dr_grpo``), both reference forms given.
    """
    _check_options(loss_type, importance_sampling_level, max_completion_length, epsilon_low, epsilon_high, beta)
    for name, value in (
        ("temperature", temperature),
        ("sapo_temperature_pos", sapo_temperature_pos),
        ("sapo_temperature_neg", sapo_temperature_neg),
    ):
        seq.check_positive(name, value)
    if delta is not None:
        seq.check_positive("delta", delta)
    n_classes = seq.check_head("", x, weight, bias, weight_layout)
    seq.check_tokens("selected_token_ids", selected_token_ids, x, n_classes, None)
    _checks.check_shape("attention_mask", attention_mask, x.shape[:2], "the batch and sequence axes of x")
    _checks.check_shape("advantages", advantages, x.shape[:1], "the batch axis of x")
    if not jnp.issubdtype(advantages.dtype, jnp.floating):
        raise TypeError(f"advantages must have a floating dtype, got {advantages.dtype}")
    for name, logps in (("ref_per_token_logps", ref_per_token_logps), ("old_per_token_logps", old_per_token_logps)):
        if logps is not None:
            _checks.check_shape(name, logps, x.shape[:2], "the batch and sequence axes of x")
    if vllm_is_ratio is not None and vllm_is_ratio.shape not in (x.shape[:1], (x.shape[0], 1), x.shape[:2]):
        raise ValueError(
            f"vllm_is_ratio must have shape {x.shape[:1]}, {(x.shape[0], 1)} or {x.shape[:2]}, "
            f"got {vllm_is_ratio.shape}"
        )
    has_reference_model = seq.check_reference_head(x, weight, ref_x, ref_weight, ref_bias, weight_layout)
    if has_reference_model and ref_per_token_logps is not None:
        raise ValueError("give either ref_per_token_logps or a reference model (ref_x, ref_weight), not both")

    options = dict(temperature=temperature, weight_layout=weight_layout, implementation=implementation)
    per_token_logps = seq.token_logprobs(x, weight, selected_token_ids, None, bias=bias, **options)
    if has_reference_model and beta != 0.0:
        ref_per_token_logps = seq.reference_token_logprobs(
            ref_x, ref_weight, selected_token_ids, None, bias=ref_bias, **options
        )
    return grpo_loss_from_logps(
        per_token_logps,
        attention_mask,
        advantages,
        ref_per_token_logps=ref_per_token_logps,
        old_per_token_logps=old_per_token_logps,
        vllm_is_ratio=vllm_is_ratio,
        beta=beta,
        epsilon_low=epsilon_low,
        epsilon_high=epsilon_high,
        loss_type=loss_type,
        max_completion_length=max_completion_length,
        importance_sampling_level=importance_sampling_level,
        sapo_temperature_pos=sapo_temperature_pos,
        sapo_temperature_neg=sapo_temperature_neg,
        delta=delta,
        use_bias_correction_kl=use_bias_correction_kl,
        vespo_k_pos=vespo_k_pos,
        vespo_lambda_pos=vespo_lambda_pos,
        vespo_k_neg=vespo_k_neg,
        vespo_lambda_neg=vespo_lambda_neg,
        num_items_in_batch=num_items_in_batch,
    )


def _check_options(loss_type, importance_sampling_level, max_completion_length, epsilon_low, epsilon_high, beta):
    _checks.check_choice("loss_type", loss_type, GRPO_LOSS_TYPES)
    _checks.check_choice("importance_sampling_level", importance_sampling_level, IMPORTANCE_SAMPLING_LEVELS)
    if importance_sampling_level == "sequence" and loss_type in TOKEN_LEVEL_ONLY:
        raise ValueError(f"importance_sampling_level='sequence' does not apply to loss_type={loss_type!r}; use 'token'")
    if loss_type == "dr_grpo" and (
        isinstance(max_completion_length, bool)
        or not isinstance(max_completion_length, (int, np.integer))
        or max_completion_length < 1
    ):
        raise ValueError(
            f"loss_type='dr_grpo' needs max_completion_length, a positive int; got {max_completion_length!r}"
        )
    for name, value in (("epsilon_low", epsilon_low), ("epsilon_high", epsilon_high)):
        if not (np.isfinite(value) and value >= 0):
            raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    if not np.isfinite(beta):
        raise ValueError(f"beta must be a finite number, got {beta!r}")


def _at_least_one(count: jax.Array) -> jax.Array:
    return jnp.maximum(count, 1.0)


def _sapo_gate(weights: jax.Array, temperature: float) -> jax.Array:
    """SAPO's soft gate ``4/τ · σ(τ (w - 1))``, which replaces clipping."""
    return jax.nn.sigmoid(temperature * (weights - 1.0)) * 4.0 / temperature


def _vespo_gamma_weights(advantages, log_ratio, mask, vllm_is_ratio, positive, negative) -> jax.Array:
    """VESPO's ``[B, 1]`` gradient scale ``φ(w) = e^λ w^k e^{-λ w}`` of each sequence's importance weight ``w``
    (``(k, λ)`` from ``positive`` for advantages ≥ 0, else ``negative``), in log space, without gradient."""
    log_ratio, mask = jax.lax.stop_gradient((log_ratio, mask))
    clamped = jnp.clip(log_ratio, -VESPO_LOG_RATIO_LIMIT, VESPO_LOG_RATIO_LIMIT)
    sequence_log_ratio = jnp.sum(clamped * mask, axis=-1, keepdims=True)
    if vllm_is_ratio is not None:
        log_is_ratio = jnp.clip(jnp.log(vllm_is_ratio), VESPO_MIN_LOG_WEIGHT, VESPO_LOG_RATIO_LIMIT)
        sequence_log_ratio = sequence_log_ratio + jnp.sum(log_is_ratio, axis=-1, keepdims=True)
    log_weight = jnp.clip(sequence_log_ratio, VESPO_MIN_LOG_WEIGHT, VESPO_LOG_RATIO_LIMIT)
    non_negative = (advantages >= 0)[:, None]
    k = jnp.where(non_negative, positive[0], negative[0])
    rate = jnp.maximum(jnp.where(non_negative, positive[1], negative[1]), VESPO_MIN_LAMBDA)
    phi = jnp.exp(rate + k * log_weight - rate * jnp.exp(log_weight))
    return jax.lax.stop_gradient(jnp.nan_to_num(phi, nan=0.0, posinf=0.0, neginf=0.0)).astype(log_ratio.dtype)
