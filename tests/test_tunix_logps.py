"""liger_jax.integrations.tunix.compute_per_token_logps against Tunix's own on tiny Tunix models: log-probs and
their gradients, at the rollout temperature."""

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from tunix.rl import common as rl_common

from liger_jax.integrations.tunix import compute_per_token_logps
from tests import harness
from tests.test_tunix_grpo import EOS, PAD, train_example
from tests.test_tunix_loss import assert_gradients_match, tiny_model, tunix_numerics  # noqa: F401

CASES = {"llama3-tied-hot": ("llama3", True, 0.7), "qwen3-untied": ("qwen3", False, 1.0)}


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
@pytest.mark.parametrize("case", CASES)
def test_matches_tunix_per_token_logps_and_gradients(case, implementation):
    family, tied, temperature = CASES[case]
    model = tiny_model(family, tied)
    example = train_example(model)  # left-padded prompts, completions padded after EOS
    graphdef, state = nnx.split(model)
    weights = jnp.asarray(np.random.default_rng(0).normal(size=example.completion_ids.shape), jnp.float32)

    def weighted_sum(logps_fn, state, **options):
        logps = logps_fn(
            graphdef, state, example.prompt_ids, example.completion_ids, PAD, EOS, stop_gradient=False,
            temperature=temperature, **options,
        )  # fmt: skip
        return jnp.sum(logps * weights), logps

    @jax.jit
    def both(state):
        grad = lambda fn, **options: jax.value_and_grad(weighted_sum, 1, has_aux=True)(fn, state, **options)  # noqa: E731
        return grad(rl_common.compute_per_token_logps), grad(compute_per_token_logps, implementation=implementation)

    ((_, expected), expected_grads), ((_, logps), grads) = both(state)
    assert logps.shape == example.completion_ids.shape and logps.dtype == jnp.float32
    np.testing.assert_allclose(logps, expected, rtol=1e-5, atol=1e-5)
    assert_gradients_match(grads, expected_grads)


def test_takes_tunix_arguments_in_order_with_their_defaults():
    theirs = inspect.signature(rl_common.compute_per_token_logps).parameters
    ours = inspect.signature(compute_per_token_logps).parameters
    assert list(ours)[: len(theirs)] == list(theirs) and list(ours)[len(theirs) :] == ["implementation"]
    assert all(ours[name].default == parameter.default for name, parameter in theirs.items())


def test_rejects_what_it_cannot_compute():
    model = tiny_model("qwen3", False)
    example = train_example(model, with_old=False)
    graphdef, state = nnx.split(model)
    args = (graphdef, state, example.prompt_ids, example.completion_ids, PAD, EOS)
    segments = jnp.ones(example.completion_ids.shape, jnp.int32)
    for message, options in [
        ("return_logits", dict(return_logits=True)),
        ("images", dict(images=jnp.ones((4, 8, 8, 3)))),
        ("packed", dict(segment_ids=segments, segment_positions=segments)),
        ("temperature must be >= 0", dict(temperature=-1.0)),
    ]:
        with pytest.raises(ValueError, match=message):
            jax.eval_shape(lambda s, o=options: compute_per_token_logps(*args[:1], s, *args[2:], **o), state)
