"""Tunix's per-token log-probs (``tunix.rl.common.compute_per_token_logps``) without ``[B, T, V]`` logits: from the
final hidden states and the LM head through :func:`liger_jax.fused_linear_logprobs`."""

from __future__ import annotations

import types

import jax
from flax import nnx

from liger_jax import runtime
from liger_jax.integrations.tunix.grpo import completion_token_logps


def compute_per_token_logps(
    graphdef: nnx.GraphDef,
    state: nnx.State,
    prompt_tokens: jax.Array,
    completion_tokens: jax.Array,
    pad_id: int,
    eos_id: int,
    images: jax.Array | None = None,
    stop_gradient: bool = True,
    return_logits: bool = False,
    segment_ids: jax.Array | None = None,
    segment_positions: jax.Array | None = None,
    temperature: float = 1.0,
    implementation: runtime.Implementation | None = None,
) -> jax.Array:
    """Tunix's ``compute_per_token_logps`` (same arguments, same result), computed without the logits.

    The log-probs of the completion tokens, the model fed the prompt and completion as Tunix feeds it
    (``tunix.rl.common.process_ids``: positions and causal mask from the padding), at ``temperature`` (0 and 1
    leave the logits as they are, as Tunix). What Tunix computes with it: the reference model's log-probs
    (``InferenceWorker``), the rollout policy's (``BaseRollout.get_per_token_logps``, which a rollout engine of
    your own, given to ``ClusterConfig(rollout_engine=...)`` as a class, implements) and the actor's. Tunix calls
    its own function by name there and has no registry for it: call this one where you compute them. The policy
    loss's log-probs are :func:`liger_jax.integrations.tunix.grpo_loss_fn`'s, which computes them alike.

    Numerics: log-softmax in fp32 of the logits in the head's dtype, as Tunix.

    Args:
        graphdef, state: the model, split by ``nnx.split``: a Tunix model
            :func:`liger_jax.integrations.tunix.peft_loss_fn` supports, without a final logit softcap.
        prompt_tokens: ``[B, P]`` integer tokens, left-padded with ``pad_id``.
        completion_tokens: ``[B, T]`` integer tokens, padded with ``pad_id``.
        pad_id, eos_id: the tokenizer's.
        images: must be None (the fused path feeds no vision encoder).
        stop_gradient: whether the result carries no gradient (Tunix's default).
        return_logits: must be False: the logits are what this avoids.
        segment_ids, segment_positions: must be None (packed sequences are not supported).
        temperature: ≥ 0, as the rollout sampled.
        implementation: the log-probs' implementation (see :mod:`liger_jax.runtime`), None for the default.

    Returns:
        ``[B, T]`` fp32 log-probs of the completion tokens (padding included, as Tunix; mask them).

    Raises:
        TypeError: the model is not a supported Tunix family.
        ValueError: ``return_logits``, images, packed sequences, a temperature < 0, a final logit softcap, or LoRA
            on the head.
    """
    if return_logits:
        raise ValueError("return_logits=True is not supported: liger_jax computes the log-probs without the logits")
    if images is not None:
        raise ValueError("images are not supported: liger_jax's log-probs feed the model no vision encoder")
    del segment_positions  # only read with segment_ids, which completion_token_logps refuses
    model = nnx.merge(graphdef, state)
    # completion_token_logps reads these three fields of an RL TrainExample.
    example = types.SimpleNamespace(prompt_ids=prompt_tokens, completion_ids=completion_tokens, segment_ids=segment_ids)
    logps, _ = completion_token_logps(model, example, temperature, pad_id, eos_id, implementation)
    return jax.lax.stop_gradient(logps) if stop_gradient else logps
