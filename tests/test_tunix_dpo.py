"""liger_jax.integrations.tunix.dpo_loss_fn against Tunix's own DPO/ORPO loss on tiny Tunix models: loss, metrics
and gradients."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from tunix.sft import utils as sft_utils
from tunix.sft.dpo import dpo_trainer

from liger_jax.integrations.tunix.dpo import dpo_loss_fn
from tests import harness
from tests.test_tunix_loss import VOCAB, assert_gradients_match, tiny_model, tunix_numerics  # noqa: F401

PROMPT, COMPLETION = 4, 5


def train_example(seed: int = 0, pairs: int = 2, with_reference: bool = True) -> dpo_trainer.TrainExample:
    """Chosen then rejected sequences of a padded prompt and a completion, as DPOTrainer prepares them."""
    rng = np.random.default_rng(seed)
    batch, length = 2 * pairs, PROMPT + COMPLETION
    not_padding = np.ones((batch, length), bool)
    not_padding[0, 0] = False  # a left-padded prompt
    completion_mask = np.ones((batch, COMPLETION), np.float32)
    completion_mask[-1, -2:] = 0.0  # a short completion
    not_padding[-1, -2:] = False
    references = rng.normal(-20.0, 1.0, (2, pairs)).astype(np.float32) if with_reference else (None, None)
    return dpo_trainer.TrainExample(
        input_ids=jnp.asarray(rng.integers(0, VOCAB, (batch, length)), jnp.int32),
        positions=sft_utils.build_positions_from_mask(jnp.asarray(not_padding)),
        attention_mask=sft_utils.make_causal_attn_mask(jnp.asarray(not_padding)),
        ref_chosen_logps=None if references[0] is None else jnp.asarray(references[0]),
        ref_rejected_logps=None if references[1] is None else jnp.asarray(references[1]),
        completion_mask=jnp.asarray(completion_mask),
        logits_to_keep=COMPLETION,
    )


CASES = [
    ("llama3", False, dict(algorithm="dpo", beta=0.3, label_smoothing=0.1), True),
    ("qwen3", True, dict(algorithm="dpo", beta=0.1), False),
    ("qwen2", False, dict(algorithm="orpo", lambda_orpo=0.2, label_smoothing=0.05), False),
]


@pytest.mark.parametrize(
    "family, tied, options, with_reference", CASES, ids=[f"{c[0]}-{c[2]['algorithm']}" for c in CASES]
)
def test_matches_tunix_dpo_loss_metrics_and_gradients(family, tied, options, with_reference):
    model = tiny_model(family, tied)
    example = train_example(with_reference=with_reference)

    def ours(model, example):
        return dpo_loss_fn(model, example, implementation=harness.KERNEL_IMPLEMENTATION, **options)

    def theirs(model, example):
        return dpo_trainer.dpo_loss_fn(model, example, **options)

    @nnx.jit
    def both(model, example):
        grad = lambda loss: nnx.value_and_grad(loss, has_aux=True)(model, example)  # noqa: E731
        return grad(theirs), grad(ours)

    ((expected, expected_aux), expected_grads), ((loss, aux), grads) = both(model, example)
    np.testing.assert_allclose(loss, expected, rtol=1e-5)
    assert set(aux) == set(expected_aux)
    jax.tree.map(lambda a, e: np.testing.assert_allclose(a, e, rtol=1e-5, atol=1e-5), aux, expected_aux)
    assert_gradients_match(grads, expected_grads)


def test_models_with_a_logit_softcap_are_refused():
    model = tiny_model("gemma", True)
    with pytest.raises(ValueError, match="softcap"):
        dpo_loss_fn(model, train_example())
