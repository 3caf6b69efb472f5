"""The GRPO family of policy-gradient losses fused with the LM head (Liger's ``LigerFusedLinearGRPOLoss``): GRPO,
BNPO, Dr. GRPO, DAPO, CISPO, SAPO, LUSPO and VESPO, with token- or sequence-level (GSPO) importance sampling and a
k3 KL penalty against reference log-probs or a reference model."""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np

from liger_jax import runtime
from liger_jax.ops import _checks, _linear_chunks, _sequence_chunks
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
    terms = _PolicyTerms(
        loss_type, importance_sampling_level, epsilon_low, epsilon_high, beta, sapo_temperature_pos,
        sapo_temperature_neg, delta, use_bias_correction_kl, vespo_k_pos, vespo_lambda_pos, vespo_k_neg,
        vespo_lambda_neg,
    )  # fmt: skip
    _check_options(loss_type, importance_sampling_level, max_completion_length, epsilon_low, epsilon_high, beta)
    dtype = per_token_logps.dtype
    mask = attention_mask.astype(dtype)
    per_token_loss, kl, clipped_against_advantage = terms(
        per_token_logps, mask, advantages, ref_per_token_logps, old_per_token_logps, vllm_is_ratio
    )
    loss = jnp.sum(per_token_loss * token_loss_weights(mask, loss_type, max_completion_length, num_items_in_batch))
    aux = {}
    token_count = _at_least_one(jnp.sum(mask))
    if kl is not None:
        aux["kl"] = jnp.sum(kl * mask) / token_count
    aux["clip_ratio"] = jnp.sum(jnp.broadcast_to(clipped_against_advantage, mask.shape) * mask) / token_count
    return loss, jax.lax.stop_gradient(aux)


def token_loss_weights(mask: jax.Array, loss_type: str, max_completion_length, num_items_in_batch) -> jax.Array:
    """``[B, T]`` weights that reduce per-token losses to ``loss_type``'s loss, ``Σ weights · per_token_loss``:
    they depend on the mask alone, so a batch's loss is the sum of its sequences'."""
    batch, length = mask.shape
    sequence_lengths = jnp.sum(mask, -1, keepdims=True)
    match loss_type:
        case "grpo" | "sapo":
            return mask / (_at_least_one(sequence_lengths) * batch)
        case "bnpo":
            return mask / _at_least_one(jnp.sum(mask))
        case "dr_grpo":
            return mask / (batch * max_completion_length)
        case "luspo":
            return jnp.broadcast_to(sequence_lengths, mask.shape) / (batch * length)
        case _:  # dapo, cispo, vespo
            count = jnp.sum(mask) if num_items_in_batch is None else jnp.asarray(num_items_in_batch)
            return mask / _at_least_one(count).astype(mask.dtype)


@dataclasses.dataclass(frozen=True)
class _PolicyTerms:
    """The per-token terms of :func:`grpo_loss_from_logps` (its options as fields; hashable): each sequence's terms
    depend on that sequence alone."""

    loss_type: str
    importance_sampling_level: str
    epsilon_low: float
    epsilon_high: float
    beta: float
    sapo_temperature_pos: float
    sapo_temperature_neg: float
    delta: float | None
    use_bias_correction_kl: bool
    vespo_k_pos: float
    vespo_lambda_pos: float
    vespo_k_neg: float
    vespo_lambda_neg: float

    def __call__(self, per_token_logps, mask, advantages, ref_per_token_logps, old_per_token_logps, vllm_is_ratio):
        """``(per_token_loss [B, T], kl [B, T] or None without beta, clipped against the advantage [B, T] or
        [B, 1])`` from the log-probs ``[B, T]``, the mask in their dtype and the advantages ``[B]``."""
        dtype = per_token_logps.dtype
        advantage = advantages.astype(dtype)[:, None]
        sampled = jax.lax.stop_gradient(per_token_logps if old_per_token_logps is None else old_per_token_logps)
        log_ratio = per_token_logps - sampled.astype(dtype)
        if self.importance_sampling_level == "token":
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
        match self.loss_type:
            case "cispo":
                clipped = jax.lax.stop_gradient(jnp.minimum(weights, self.epsilon_high))
                upper_clipped = weights > self.epsilon_high
                per_token_loss = -clipped * advantage * per_token_logps
            case "sapo":
                gate = jnp.where(
                    advantage > 0,
                    _sapo_gate(weights, self.sapo_temperature_pos),
                    _sapo_gate(weights, self.sapo_temperature_neg),
                )
                per_token_loss = -gate * advantage
            case "vespo":
                phi = _vespo_gamma_weights(
                    advantages.astype(dtype), log_ratio, mask, vllm_is_ratio,
                    (self.vespo_k_pos, self.vespo_lambda_pos), (self.vespo_k_neg, self.vespo_lambda_neg),
                )  # fmt: skip
                per_token_loss = -phi * advantage * per_token_logps
            case _:
                clipped = jnp.clip(weights, 1.0 - self.epsilon_low, 1.0 + self.epsilon_high)
                lower_clipped, upper_clipped = weights < 1.0 - self.epsilon_low, weights > 1.0 + self.epsilon_high
                unclipped = weights if self.delta is None else jnp.minimum(weights, self.delta)
                per_token_loss = -jnp.minimum(unclipped * advantage, clipped * advantage)
        if vllm_is_ratio is not None and self.loss_type != "vespo":
            per_token_loss = per_token_loss * vllm_is_ratio
        kl = None
        if self.beta != 0.0:
            reference = per_token_logps if ref_per_token_logps is None else ref_per_token_logps
            reference = jax.lax.stop_gradient(reference)
            log_ref_ratio = reference.astype(dtype) - per_token_logps
            kl = jnp.exp(log_ref_ratio) - log_ref_ratio - 1.0
            if self.use_bias_correction_kl:
                kl = kl * weights
            per_token_loss = per_token_loss + self.beta * kl
        clipped_against_advantage = (lower_clipped & (advantage < 0)) | (upper_clipped & (advantage > 0))
        return per_token_loss, kl, clipped_against_advantage


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
    chunk_size: int | None = None,
    implementation: runtime.Implementation | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    r"""GRPO-family policy loss on LM-head hidden states, without the ``[B, T, V]`` logits.

    The policy's per-token log-probs :math:`\log\text{softmax}((x W + b) / T)[\text{token}]` are
    :func:`liger_jax.fused_linear_logprobs`' (chunked, float32 softmax; float64 for float64 inputs) at every position
    (the mask weights them afterwards); the reference model's, when ``ref_x``/``ref_weight`` are given, the same way
    without gradient. :func:`grpo_loss_from_logps`' math turns them into the loss. Every loss type and both
    importance-sampling levels are sums of per-completion terms with normalisers from the mask alone
    (:func:`token_loss_weights`), so each chunk of the LM head's matmul holds whole completions and makes their
    loss's gradient in the same pass as their log-probs: three matmuls per chunk (four with a reference model), as
    Liger (:mod:`liger_jax.ops._sequence_chunks`). A chunk holds at least one completion (``T × V`` logits).

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
        chunk_size: whole completions per chunk, or None for as many as the default chunk rows hold (at least one).

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

    reference = (ref_x, ref_weight, ref_bias) if has_reference_model and beta != 0.0 else None
    implementation = seq.fused_implementation(
        implementation, x, weight, bias, selected_token_ids, weight_layout, reference
    )
    _linear_chunks.check_chunk_size(chunk_size)
    terms = _PolicyTerms(
        loss_type, importance_sampling_level, epsilon_low, epsilon_high, beta, sapo_temperature_pos,
        sapo_temperature_neg, delta, use_bias_correction_kl, vespo_k_pos, vespo_lambda_pos, vespo_k_neg,
        vespo_lambda_neg,
    )  # fmt: skip
    dtype = jnp.promote_types(jnp.result_type(x.dtype, weight.dtype), jnp.float32)
    mask = attention_mask.astype(dtype)

    given = (ref_per_token_logps, old_per_token_logps)
    row_operands = (mask, token_loss_weights(mask, loss_type, max_completion_length, num_items_in_batch))
    row_operands += tuple(logps.astype(dtype) for logps in given if logps is not None)
    sequence_operands = (advantages.astype(dtype),)
    vllm_level = None
    if vllm_is_ratio is not None:
        vllm_level = "token" if vllm_is_ratio.shape == x.shape[:2] else "sequence"
        if vllm_level == "token":
            row_operands += (vllm_is_ratio.astype(dtype),)
        else:
            sequence_operands += (vllm_is_ratio.astype(dtype).reshape(-1),)
    loss, per_token_logps, model_ref_logps = _sequence_chunks.group_loss(
        x,
        weight,
        bias,
        selected_token_ids,
        row_operands,
        _CompletionsLoss(terms, *(logps is not None for logps in given), vllm_level),
        group_operands=sequence_operands,
        reference=reference,
        temperature=temperature,
        weight_layout=weight_layout,
        implementation=implementation,
        groups_per_chunk=chunk_size,
    )
    if model_ref_logps is not None:
        ref_per_token_logps = model_ref_logps
    _, aux = grpo_loss_from_logps(
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
    return loss, aux


@dataclasses.dataclass(frozen=True)
class _CompletionsLoss:
    """The loss of whole completions for :func:`liger_jax.ops._sequence_chunks.group_loss`: ``Σ weights ·
    per_token_loss`` from the per-token log-probs, the mask and the reduction's weights, then
    ``ref_per_token_logps``, ``old_per_token_logps`` and a per-token ``vllm_is_ratio`` where given (each ``[G, T]``),
    then the advantages and a per-sequence ``vllm_is_ratio`` where given (each ``[G]``)."""

    terms: _PolicyTerms
    has_ref_logps: bool
    has_old_logps: bool
    vllm_level: str | None  # None, "token" ([B, T]) or "sequence" ([B] or [B, 1])

    def __call__(self, token_logps, model_ref_logps, mask, weights, *given):
        given = list(given)
        ref_logps = given.pop(0) if self.has_ref_logps else model_ref_logps
        old_logps = given.pop(0) if self.has_old_logps else None
        vllm_is_ratio = given.pop(0) if self.vllm_level == "token" else None
        advantages = given.pop(0)
        vllm_is_ratio = given.pop(0) if self.vllm_level == "sequence" else vllm_is_ratio
        per_token_loss, _, _ = self.terms(token_logps, mask, advantages, ref_logps, old_logps, vllm_is_ratio)
        return jnp.sum(per_token_loss * weights)


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
