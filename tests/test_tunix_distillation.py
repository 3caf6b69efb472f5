"""liger_jax.integrations.tunix.LogitStrategy against Tunix's own LogitStrategy: loss, metrics and gradients from
the logits and, on tiny Tunix models, from the heads' inputs (no logits); inside Tunix's DistillationTrainer."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from tunix.distillation import distillation_trainer
from tunix.distillation.strategies import logit
from tunix.sft import utils as sft_utils

from liger_jax.integrations.tunix import HeadInputs, LogitStrategy, head_forward_fn, token_labels_fn
from tests import harness
from tests.test_tunix_loss import VOCAB, assert_gradients_match, batch, tiny_model, tunix_numerics  # noqa: F401

OPTIONS = {
    "tunix-defaults": dict(temperature=2.0, alpha=0.5),
    "cold-top-k": dict(temperature=0.7, alpha=0.3, distill_top_k=7),
}


def logits_forward_fn(model, input_tokens, input_mask, positions, attention_mask):
    """The forward function of Tunix's logit-distillation example: the logits of all but the last position."""
    del input_mask
    logits, _ = model(input_tokens, positions, None, attention_mask)
    return logits[:, :-1]


def one_hot_labels_fn(input_tokens, input_mask, **unused):
    """The labels function of Tunix's example: one-hot next tokens, zero rows where the mask is off."""
    del unused
    return jax.nn.one_hot(input_tokens[:, 1:], VOCAB) * input_mask[:, 1:, None]


def identity(model, **unused):
    return model


def logits_and_labels(seed: int = 0, vocab: int = VOCAB):
    """Student and teacher logits ``[2, 5, V]`` (spread so the temperature matters) and one-hot labels with two
    unlabelled positions."""
    rng = np.random.default_rng(seed)
    student, teacher = (jnp.asarray(rng.normal(0.0, 2.0, (2, 5, vocab)), jnp.float32) for _ in range(2))
    tokens = rng.integers(0, vocab, (2, 5))
    mask = np.ones((2, 5), bool)
    mask[0, 0] = mask[1, 3] = False
    labels = jnp.asarray(np.eye(vocab, dtype=np.float32)[tokens] * mask[..., None])
    return student, teacher, labels


def loss_metrics_grads(strategy, student, teacher, labels):
    """``((loss, metrics), d loss / d student logits)`` of ``strategy.compute_loss``, jitted."""
    loss = lambda s: strategy.compute_loss(s, teacher, labels)  # noqa: E731
    return jax.jit(jax.value_and_grad(loss, has_aux=True))(student)


def assert_same(ours, theirs) -> None:
    ((loss, metrics), grads), ((expected, expected_metrics), expected_grads) = ours, theirs
    np.testing.assert_allclose(loss, expected, rtol=1e-5)
    assert set(metrics) == set(expected_metrics)
    for name in expected_metrics:
        np.testing.assert_allclose(metrics[name], expected_metrics[name], rtol=1e-5, err_msg=name)
    assert_gradients_match(grads, expected_grads)


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
@pytest.mark.parametrize("case", OPTIONS)
def test_logits_match_tunix_logit_strategy(case, implementation):
    options = OPTIONS[case]
    student, teacher, labels = logits_and_labels()
    theirs = logit.LogitStrategy(identity, identity, identity, **options)
    ours = LogitStrategy(identity, identity, identity, **options, implementation=implementation)
    expected = loss_metrics_grads(theirs, student, teacher, labels)
    assert float(jnp.abs(expected[1][0, 0]).max()) > 1e-4  # Tunix's KL moves the unlabelled position (0, 0) too
    assert_same(loss_metrics_grads(ours, student, teacher, labels), expected)
    eval_loss, _ = jax.jit(ours.compute_eval_loss)(student, labels)
    np.testing.assert_allclose(eval_loss, theirs.compute_eval_loss(student, labels)[0], rtol=1e-5)


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
def test_kl_on_padding_false_leaves_unlabelled_positions_out(implementation):
    """Tunix's loss where the student already equals the teacher at the unlabelled positions (their KL and its
    gradient are 0), whatever the student's logits there."""
    student, teacher, labels = logits_and_labels(seed=1)
    unlabelled = (labels.sum(-1) == 0)[..., None]
    options = dict(temperature=1.5, alpha=0.6)
    ours = LogitStrategy(identity, identity, identity, **options, kl_on_padding=False, implementation=implementation)
    theirs = logit.LogitStrategy(identity, identity, identity, **options)
    result = loss_metrics_grads(ours, student, teacher, labels)
    assert_same(result, loss_metrics_grads(theirs, jnp.where(unlabelled, teacher, student), teacher, labels))
    assert not jnp.any(jnp.where(unlabelled, result[1], 0.0))
    tunix_loss = loss_metrics_grads(theirs, student, teacher, labels)[0][0]
    assert float(tunix_loss - result[0][0]) > 1e-3  # the unlabelled positions' KL, which Tunix counts


def train_loss_and_grads(strategy, student, teacher, inputs):
    """What DistillationTrainer differentiates: the teacher's outputs first, then the strategy's training loss."""
    teacher_output = strategy.get_teacher_outputs(teacher, inputs)
    grad = nnx.value_and_grad(strategy.get_train_loss, has_aux=True)
    return nnx.jit(grad)(student, teacher_output, inputs)


HEAD_OPTIONS = dict(temperature=1.7, alpha=0.4)
HEAD_CASES = {
    # A Qwen3 student with its own head ("hv") from a tied Llama3 teacher ("vh"), one-hot labels.
    "qwen3-from-tied-llama3": (("qwen3", False), ("llama3", True), one_hot_labels_fn, True),
    # A tied Qwen3 from a Qwen2 with its own head, integer labels, the KL over labelled positions only.
    "tied-qwen3-from-qwen2-labelled-kl": (("qwen3", True), ("qwen2", False), token_labels_fn, False),
}


def head_case_models(case: str):
    (student_family, student_tied), (teacher_family, teacher_tied), _, _ = HEAD_CASES[case]
    return tiny_model(student_family, student_tied), tiny_model(teacher_family, teacher_tied, seed=1), batch()


@functools.cache
def expected_from_logits(case: str):
    """``((loss, metrics), gradients)`` of Tunix's strategy on the logits, once per case for both implementations;
    for ``kl_on_padding=False``, of liger's logit path on "xla", which the tests above check against Tunix."""
    *_, kl_on_padding = HEAD_CASES[case]
    if kl_on_padding:
        strategy = logit.LogitStrategy(logits_forward_fn, logits_forward_fn, one_hot_labels_fn, **HEAD_OPTIONS)
    else:
        strategy = LogitStrategy(
            logits_forward_fn, logits_forward_fn, one_hot_labels_fn, **HEAD_OPTIONS, kl_on_padding=False,
            implementation="xla",
        )  # fmt: skip
    return train_loss_and_grads(strategy, *head_case_models(case))


# The second case's oracle is liger's own logit path: its kernels alone are compared with it (to save time).
@pytest.mark.parametrize(
    "case, implementation",
    [("qwen3-from-tied-llama3", implementation) for implementation in harness.IMPLEMENTATIONS]
    + [("tied-qwen3-from-qwen2-labelled-kl", harness.KERNEL_IMPLEMENTATION)],
)
def test_head_inputs_match_tunix_logit_strategy(case, implementation):
    *_, labels_fn, kl_on_padding = HEAD_CASES[case]
    ours = LogitStrategy(
        head_forward_fn, head_forward_fn, labels_fn, **HEAD_OPTIONS, kl_on_padding=kl_on_padding,
        implementation=implementation,
    )  # fmt: skip
    student, teacher, inputs = head_case_models(case)
    result = train_loss_and_grads(ours, student, teacher, inputs)
    assert_same(result, expected_from_logits(case))
    # The eval loss is the cross-entropy of one model's outputs: the teacher's is a metric Tunix's strategy reports.
    teacher_output, labels = ours.get_teacher_outputs(teacher, inputs), labels_fn(**inputs)
    assert isinstance(teacher_output, HeadInputs)
    eval_loss, _ = ours.compute_eval_loss(teacher_output, labels)
    np.testing.assert_allclose(eval_loss, expected_from_logits(case)[0][1]["distill/teacher_loss"], rtol=1e-5)


def model_inputs(example: distillation_trainer.TrainingInput) -> dict[str, jax.Array]:
    """The gen_model_input_fn of Tunix's example: positions and the causal attention mask from the padding."""
    return {
        "input_tokens": example.input_tokens,
        "input_mask": example.input_mask,
        "positions": sft_utils.build_positions_from_mask(example.input_mask),
        "attention_mask": sft_utils.make_causal_attn_mask(example.input_mask),
    }


def test_trains_in_distillation_trainer():
    """Tunix's own loop (its jitted step, teacher outputs, metrics) with liger's strategy on the heads' inputs."""
    student, teacher = tiny_model("qwen3", False), tiny_model("llama3", True, seed=1)
    inputs = batch(batch_size=4, seq_len=12, seed=1)
    strategy = LogitStrategy(head_forward_fn, head_forward_fn, token_labels_fn, implementation="xla")
    config = distillation_trainer.TrainingConfig(eval_every_n_steps=100, max_steps=3, checkpoint_root_directory=None)
    trainer = distillation_trainer.DistillationTrainer(student, teacher, strategy, optax.adam(3e-2), config)
    trainer = trainer.with_gen_model_input_fn(model_inputs)
    example = distillation_trainer.TrainingInput(input_tokens=inputs["input_tokens"], input_mask=inputs["input_mask"])
    trainer.train([example] * 3)
    losses = trainer.metrics_logger.get_metric_history("", "loss", "train")
    assert len(losses) == 3 and np.isfinite(losses).all()
    assert np.all(np.diff(losses) < 0), losses  # one batch over and over: each step lowers its loss


def test_rejects_what_it_cannot_compute():
    student, teacher, labels = logits_and_labels()
    heads = HeadInputs(jnp.ones((2, 5, 3)), jnp.ones((3, VOCAB)), "hv")
    make = functools.partial(LogitStrategy, identity, identity, identity)
    strategy, top_k = make(), make(distill_top_k=3)
    inputs = batch()
    for message, error, call in [
        ("must both be logits or both HeadInputs", TypeError, lambda: strategy.compute_loss(heads, teacher, labels)),
        ("distill_top_k needs the teacher's logits", ValueError, lambda: top_k.compute_loss(heads, heads, labels)),
        ("one-hot rows", ValueError, lambda: strategy.compute_loss(student, teacher, labels * 0.9)),
        ("softcap", ValueError, lambda: head_forward_fn(tiny_model("gemma", True), **inputs)),
        ("distill_top_k must be at least 0", ValueError, lambda: make(distill_top_k=-1)),
        ("kl_on_padding must be a bool", TypeError, lambda: make(kl_on_padding=1)),
        ("Temperature must be a positive", ValueError, lambda: make(temperature=0.0)),
    ]:  # fmt: skip
        with pytest.raises(error, match=message):
            call()
