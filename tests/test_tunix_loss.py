"""liger_jax.integrations.tunix.peft_loss_fn on Tunix's own models: PeftTrainer's default loss and its gradients,
on the models as Tunix builds them and as apply_liger swaps them, without the [B, S, V] logits, inside PeftTrainer."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from tunix.models.gemma import model as gemma
from tunix.models.gemma3 import model as gemma3
from tunix.models.gemma4 import model as gemma4
from tunix.models.llama3 import model as llama3
from tunix.models.qwen2 import model as qwen2
from tunix.models.qwen3 import model as qwen3
from tunix.sft import peft_trainer
from tunix.sft import utils as sft_utils

from liger_jax.flax_layers import apply_liger
from liger_jax.integrations.tunix import peft_loss_fn
from tests import harness

IMPLEMENTATION = harness.KERNEL_IMPLEMENTATION
# Small and odd where Tunix allows it: D=35, F=49, V=131 (prime); GQA with 4 query heads over 2 key-value heads of
# 10 (RoPE needs an even head size).
SIZES = dict(num_layers=2, embed_dim=35, hidden_dim=49, num_heads=4, head_dim=10, num_kv_heads=2)
VOCAB = 131
# Every family with each head it has: Llama3 and Qwen tie their head or not, the Gemmas always tie it.
HEADS = [
    ("llama3", False),
    ("llama3", True),
    ("qwen2", False),
    ("qwen2", True),
    ("qwen3", False),
    ("qwen3", True),
    ("gemma", True),
    ("gemma3", True),
    ("gemma4", True),
]


@pytest.fixture(autouse=True)
def tunix_numerics(full_precision_matmuls):
    """Tunix's models as they run: 32-bit default dtypes (conftest's x64 would make their defaults float64) and
    implicit rank promotion (``w * x`` in Llama3's RMSNorm, an error under conftest's setting)."""
    with jax.enable_x64(False), jax.numpy_rank_promotion("allow"):
        yield


def tiny_model(family: str, tied: bool, vocab: int = VOCAB, seed: int = 0) -> nnx.Module:
    """A two-layer Tunix model of ``family`` with random fp32 parameters: norm weights ``1 + 0.1·N(0, 1)``, the
    others ``0.2·N(0, 1)`` (never Tunix's zeros: Llama3 starts its MLPs at zero, Gemma its norm scales). Built
    abstractly and filled from numpy: Tunix's initializers would compile a program per parameter shape."""
    match family:
        case "llama3":
            config = llama3.ModelConfig(vocab_size=vocab, rope_theta=10_000, norm_eps=1e-5, weight_tying=tied, **SIZES)
            build = functools.partial(llama3.Llama3, config)
        case "qwen2":
            config = qwen2.ModelConfig(
                vocab_size=vocab, rope_theta=10_000, norm_eps=1e-6, use_tied_embedding=tied, **SIZES
            )
            build = functools.partial(qwen2.Qwen2, config)
        case "qwen3":
            config = qwen3.ModelConfig(
                vocab_size=vocab, rope_theta=10_000, norm_eps=1e-6, use_tied_embedding=tied, **SIZES
            )
            build = functools.partial(qwen3.Qwen3, config)
        case "gemma":
            assert tied
            config = gemma.ModelConfig(
                num_embed=vocab,
                final_logit_softcap=2.0,  # small, so that the cap bends the logits of this small model
                use_post_attn_norm=True,
                use_post_ffw_norm=True,
                attention_types=(gemma.AttentionType.GLOBAL, gemma.AttentionType.LOCAL_SLIDING),
                sliding_window_size=4,
                **SIZES,
            )
            build = functools.partial(gemma.Gemma, config)
        case "gemma3":
            assert tied
            config = gemma3.ModelConfig(num_embed=vocab, sliding_window_size=4, param_dtype=jnp.float32, **SIZES)
            build = functools.partial(gemma3.Gemma3, config)
        case "gemma4":
            assert tied
            config = gemma4.ModelConfig(
                num_embed=vocab,
                final_logit_softcap=2.0,
                sliding_window_size=4,
                attention_pattern=(gemma4.AttentionType.LOCAL_SLIDING, gemma4.AttentionType.GLOBAL),
                num_global_kv_heads=1,
                global_key_size=16,
                **SIZES,
            )
            build = functools.partial(gemma4.Gemma4, config)
    model = nnx.eval_shape(lambda: build(rngs=nnx.Rngs(seed)))
    leaves, treedef = jax.tree.flatten(nnx.state(model))
    values = [random_parameter(leaf.shape, seed + i) for i, leaf in enumerate(leaves)]
    nnx.update(model, jax.tree.unflatten(treedef, values))
    return model


def random_parameter(shape: tuple[int, ...], seed: int) -> jax.Array:
    """fp32 draws: ``1 + 0.1·N(0, 1)`` for a vector (a norm's weight), ``0.2·N(0, 1)`` for a matrix or tensor.
    (numpy, not harness.random_normal: its float64 detour warns with x64 off.)"""
    draws = np.random.default_rng(seed).standard_normal(shape)
    return jnp.asarray(1 + 0.1 * draws if len(shape) == 1 else 0.2 * draws, jnp.float32)


def batch(batch_size: int = 2, seq_len: int = 9, vocab: int = VOCAB, seed: int = 0) -> dict[str, jax.Array]:
    """The loss function's keyword arguments as PeftTrainer passes them: random tokens, a loss mask with a masked
    prompt token and a padded tail, Tunix's positions and causal attention mask from the padding."""
    rng = np.random.default_rng(seed)
    tokens = jnp.asarray(rng.integers(0, vocab, (batch_size, seq_len)), jnp.int32)
    not_padding = np.ones((batch_size, seq_len), bool)
    not_padding[-1, -3:] = False
    loss_mask = not_padding.copy()
    loss_mask[0, 1] = False
    return {
        "input_tokens": tokens,
        "input_mask": jnp.asarray(loss_mask),
        "positions": sft_utils.build_positions_from_mask(jnp.asarray(not_padding)),
        "attention_mask": sft_utils.make_causal_attn_mask(jnp.asarray(not_padding)),
    }


def tunix_default_loss(model: nnx.Module):
    """The loss PeftTrainer trains with when given none (its ``loss_fn`` before ``with_loss_fn``)."""
    config = peft_trainer.TrainingConfig(eval_every_n_steps=1)
    return peft_trainer.PeftTrainer(model, optax.sgd(1e-3), config).loss_fn


def kernel_loss(model, input_tokens, input_mask, positions, attention_mask):
    """peft_loss_fn on this machine's kernels (Triton's interpreter on CPU)."""
    return peft_loss_fn(model, input_tokens, input_mask, positions, attention_mask, implementation=IMPLEMENTATION)


def xla_loss(model, input_tokens, input_mask, positions, attention_mask):
    """peft_loss_fn on the fused linear cross-entropy's chunked pure-JAX path."""
    return peft_loss_fn(model, input_tokens, input_mask, positions, attention_mask, implementation="xla")


def assert_gradients_match(grads, expected) -> None:
    """Each gradient leaf within 1e-5 of its largest entry, relative; except a leaf whose exact gradient is zero,
    whose computed values are rounding noise (Gemma4's last ``skip_scale`` scales what the final RMSNorm then
    divides out): both must be zero within 1e-6 of the model's largest gradient entry."""
    assert jax.tree.structure(grads) == jax.tree.structure(expected)
    paths_and_leaves = jax.tree_util.tree_flatten_with_path(expected)[0]
    zero = 1e-6 * max(float(jnp.max(jnp.abs(leaf))) for _, leaf in paths_and_leaves)
    for (path, want), got in zip(paths_and_leaves, jax.tree.leaves(grads), strict=True):
        scale = float(jnp.max(jnp.abs(want)))
        if scale <= zero:
            assert float(jnp.max(jnp.abs(got))) <= zero, f"{jax.tree_util.keystr(path)} should be zero: {got}"
        else:
            error = float(jnp.max(jnp.abs(got - want)))
            assert error <= 1e-5 * scale, f"{jax.tree_util.keystr(path)}: max error {error:.3g}, largest {scale:.3g}"


@pytest.mark.parametrize("family, tied", HEADS)
def test_matches_the_tunix_default_loss_and_gradients(family, tied):
    model = tiny_model(family, tied)
    swapped = nnx.clone(model)
    counts = apply_liger(swapped, implementation=IMPLEMENTATION)
    assert counts["rms_norm"] > 0 and counts["rope"] > 0  # the second model really runs liger's kernels
    reference = tunix_default_loss(model)
    inputs = batch()

    @nnx.jit
    def both_losses(model, inputs):
        return nnx.value_and_grad(reference)(model, **inputs), nnx.value_and_grad(kernel_loss)(model, **inputs)

    for which in (model, swapped):
        graphdef, norm_call = nnx.graphdef(which), type(which.final_norm).__call__
        (expected, expected_grads), (loss, grads) = both_losses(which, inputs)
        # The model is left as it was: nothing sown stays on it, the norm's class has its own __call__ back.
        assert nnx.graphdef(which) == graphdef and type(which.final_norm).__call__ is norm_call
        np.testing.assert_allclose(loss, expected, rtol=1e-5)
        assert_gradients_match(grads, expected_grads)


@pytest.mark.parametrize("family, tied", [("llama3", True), ("qwen3", False)])
def test_compiled_temporaries_stay_below_a_quarter_of_the_logits(family, tied):
    """At a vocabulary where the logits dominate a step, a training step's temporaries with the chunked "xla" path
    stay below a quarter of the fp32 logits, while the default loss holds them several times over: its head's output
    is computed by the model and dropped unread, and XLA removes it. Llama3 (its final_norm's output recorded) and
    Qwen3 (the hidden states it sows; its head's cast to the model dtype) take the two routes to the hidden states."""
    vocab, batch_size, seq_len = 65_537, 256, 64
    model = tiny_model(family, tied, vocab=vocab)
    inputs = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), batch(batch_size, seq_len, vocab=vocab))
    graphdef, state = nnx.split(model)

    def temporaries(loss):
        step = jax.jit(lambda state, inputs: nnx.value_and_grad(loss)(nnx.merge(graphdef, state), **inputs))
        return step.lower(state, inputs).compile().memory_analysis().temp_size_in_bytes

    logits_bytes = batch_size * seq_len * vocab * 4
    assert temporaries(tunix_default_loss(model)) > logits_bytes
    assert temporaries(xla_loss) < logits_bytes / 4


@pytest.mark.parametrize("family, tied", [("llama3", True), ("qwen3", False)])
def test_trains_in_peft_trainer(family, tied):
    """Tunix's own loop (its jit with a cached graph, its optimizer, its metrics) on a swapped model with
    peft_loss_fn; the XLA paths keep it quick (the kernels' numerics are the test above)."""
    model = tiny_model(family, tied)
    apply_liger(model, implementation="xla")
    inputs = batch(batch_size=4, seq_len=12, seed=1)
    config = peft_trainer.TrainingConfig(eval_every_n_steps=100, max_steps=5, checkpoint_root_directory=None)
    trainer = peft_trainer.PeftTrainer(model, optax.adam(3e-2), config).with_loss_fn(xla_loss)
    trainer.train([inputs] * 5)
    losses = trainer.metrics_logger.get_metric_history("", "loss", "train")
    assert len(losses) == 5 and np.isfinite(losses).all()
    assert np.all(np.diff(losses) < 0), losses  # one batch over and over: each step lowers its loss


def test_rejects_models_it_does_not_know():
    with pytest.raises(TypeError, match="must be a Tunix Llama3, Qwen2, Qwen3, Gemma, Gemma3, Gemma4 model"):
        peft_loss_fn(nnx.Linear(3, 4, rngs=nnx.Rngs(0)), **batch())


def test_rejects_lora_on_the_lm_head():
    model = tiny_model("qwen3", tied=False)
    model.lm_head.w_lora_a = nnx.LoRAParam(jnp.ones((SIZES["embed_dim"], 2)))
    with pytest.raises(ValueError, match="LoRA on Einsum is unseen"):
        peft_loss_fn(model, **batch())
