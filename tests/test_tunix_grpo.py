"""liger_jax.integrations.tunix.grpo_loss_fn against Tunix's own GRPO policy loss on tiny Tunix models: loss,
metrics and gradients, over its loss algorithms, aggregation modes, KL estimators and options."""

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from tunix.rl import algo_core
from tunix.rl import common as rl_common
from tunix.rl.grpo import grpo_learner

from liger_jax.integrations.tunix import grpo_loss_fn
from tests import harness
from tests.test_tunix_loss import VOCAB, assert_gradients_match, tiny_model, tunix_numerics  # noqa: F401

PAD, EOS = 0, 1
BATCH, PROMPT, COMPLETION = 4, 4, 6


def grpo_config(temperature: float = 1.0, **options) -> grpo_learner.GRPOConfig:
    """A ``GRPOConfig`` as the learner hands it to the loss: the rollout temperature set on it; ``epsilon_high``
    and ``epsilon_c`` (which Tunix reads when present) set as attributes."""
    extra = {name: options.pop(name) for name in ("epsilon_high", "epsilon_c") if name in options}
    config = grpo_learner.GRPOConfig(**options)
    config.temperature = temperature
    for name, value in extra.items():
        setattr(config, name, value)
    return config


def train_example(
    model,
    seed: int = 0,
    with_old: bool = True,
    with_reference: bool = True,
    token_advantages: bool = False,
    sampler_weights: bool = False,
    empty_row: bool = False,
    far_tokens: int = 1,
) -> grpo_learner.TrainExample:
    """A batch as the learner builds it: left-padded prompts, completions padded after their EOS (masked out), the
    sampler's and reference log-probs near the policy's own (the first ``far_tokens`` old log-probs of the first
    completion 25 below, past Tunix's ±20 bound on the log ratio), advantages of both signs."""
    rng = np.random.default_rng(seed)
    prompt_ids = rng.integers(2, VOCAB, (BATCH, PROMPT))
    prompt_ids[0, :2] = PAD
    completion_ids = rng.integers(2, VOCAB, (BATCH, COMPLETION))
    completion_ids[1, 3], completion_ids[1, 4:] = EOS, PAD
    completion_ids[2, -1] = PAD
    if empty_row:
        completion_ids[3] = PAD
    prompt_ids, completion_ids = jnp.asarray(prompt_ids, jnp.int32), jnp.asarray(completion_ids, jnp.int32)
    completion_mask = (completion_ids != PAD).astype(jnp.int32)
    graphdef, state = nnx.split(model)
    logps = np.asarray(rl_common.compute_per_token_logps(graphdef, state, prompt_ids, completion_ids, PAD, EOS))
    nearby = lambda scale: jnp.asarray(logps + rng.normal(0.0, scale, logps.shape), jnp.float32)  # noqa: E731
    old = None
    if with_old:
        old = nearby(0.3).at[0, :far_tokens].add(-25.0)
    shape = (BATCH, COMPLETION) if token_advantages else (BATCH,)
    advantages = rng.normal(0.0, 1.0, shape)
    advantages[0] = np.abs(advantages[0])  # the token past the bound gains: its clipped ratio carries no gradient
    return grpo_learner.TrainExample(
        prompt_ids=prompt_ids,
        prompt_mask=(prompt_ids != PAD).astype(jnp.int32),
        completion_ids=completion_ids,
        completion_mask=completion_mask,
        advantages=jnp.asarray(advantages, jnp.float32),
        ref_per_token_logps=nearby(0.5) if with_reference else None,
        old_per_token_logps=old,
        sampler_is_weights=jnp.asarray(rng.uniform(0.5, 1.0, (BATCH, COMPLETION)), jnp.float32)
        if sampler_weights
        else None,
    )


CASES = {
    # Tunix's defaults: GRPO, per-sequence token means, the "kl" estimator.
    "llama3-defaults": ("llama3", False, dict(), dict()),
    "qwen3-tied-gspo-dual-clip": (
        "qwen3",
        True,
        dict(
            loss_algo="gspo-token", loss_agg_mode="token-mean", kl_loss_mode="low_var_kl", kl_clamp_value=0.05,
            beta=0.1, epsilon_high=0.28, epsilon_c=1.5, temperature=0.7,
        ),
        dict(sampler_weights=True, far_tokens=COMPLETION),  # GSPO's sequence log ratio past its cap of 10
    ),
    "llama3-tied-token-sum-norm": (
        "llama3",
        True,
        dict(loss_agg_mode="sequence-mean-token-sum-norm", kl_loss_mode="mse_kl", epsilon_c=2.0),
        dict(token_advantages=True, empty_row=True),
    ),
    "qwen3-on-policy-token-scale": (
        "qwen3",
        False,
        dict(loss_agg_mode="sequence-mean-token-scale", beta=0.0, temperature=0.0),
        dict(with_old=False, with_reference=False, empty_row=True),
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", CASES)
def test_matches_tunix_grpo_loss_metrics_and_gradients(case):
    family, tied, options, example_options = CASES[case]
    model = tiny_model(family, tied)
    config = grpo_config(**options)
    example = train_example(model, **example_options)

    # Called as GRPOLearner calls its policy loss function.
    def ours(model, example):
        return grpo_loss_fn(
            model, example, algo_config=config, pad_id=PAD, eos_id=EOS, implementation=harness.KERNEL_IMPLEMENTATION
        )

    def theirs(model, example):
        return algo_core.grpo_loss_fn(model, example, algo_config=config, pad_id=PAD, eos_id=EOS)

    @nnx.jit
    def both(model, example):
        grad = lambda loss: nnx.value_and_grad(loss, has_aux=True)(model, example)  # noqa: E731
        return grad(theirs), grad(ours)

    ((expected, expected_aux), expected_grads), ((loss, aux), grads) = both(model, example)
    np.testing.assert_allclose(loss, expected, rtol=1e-5)
    assert set(aux) == set(expected_aux)
    for name in expected_aux:
        np.testing.assert_allclose(aux[name], expected_aux[name], rtol=1e-5, atol=1e-6, err_msg=name)
    assert_gradients_match(grads, expected_grads)
    assert float(jnp.max(jnp.abs(grads["embedder"]["input_embedding"][...]))) > 1e-4  # a loss that moves the model


def test_rejects_what_it_cannot_compute():
    model = tiny_model("qwen3", False)
    example = train_example(model, with_old=False)
    packed = example.replace(segment_ids=jnp.ones((BATCH, PROMPT + COMPLETION), jnp.int32))
    bad_algo = grpo_config()
    bad_algo.loss_algo = "ppo"
    for message, error, call_model, call_example, config in [
        ("packed", ValueError, model, packed, grpo_config()),
        ("temperature must be >= 0", ValueError, model, example, grpo_config(temperature=-1.0)),
        ("loss_algo must be one of", ValueError, model, example, bad_algo),
        ("Unsupported loss aggregation mode", ValueError, model, example, grpo_config(loss_agg_mode="token-sum")),
        ("softcap", ValueError, tiny_model("gemma", True), example, grpo_config()),
        ("must be a Tunix", TypeError, nnx.Linear(3, 4, rngs=nnx.Rngs(0)), example, grpo_config()),
    ]:
        with pytest.raises(error, match=message):  # raised while tracing: nothing runs
            nnx.eval_shape(lambda m, e: grpo_loss_fn(m, e, config, PAD, EOS), call_model, call_example)  # noqa: B023
