"""apply_liger on Tunix's own models (``google-tunix``, its real model files): every family's RMSNorms, gated MLPs
and RoPE are swapped in place, the state stays, logits and gradients equal Tunix's, and the swapped model trains."""

import dataclasses
import subprocess
import sys
from collections.abc import Callable

import chex
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

from liger_jax.flax_layers import KINDS, apply_liger
from tests import harness, model_checks

IMPLEMENTATION = harness.KERNEL_IMPLEMENTATION
BATCH, SEQ, VOCAB = 2, 10, 61
# Two layers, grouped-query attention (4 query heads, 2 KV heads), sizes that are not powers of two where Tunix
# allows it (head_dim must be even for RoPE).
SIZES = {"num_layers": 2, "embed_dim": 50, "hidden_dim": 37, "num_heads": 4, "head_dim": 12, "num_kv_heads": 2}


@dataclasses.dataclass(frozen=True)
class Family:
    build: Callable[[], nnx.Module]  # a fresh model from the same seed on every call
    counts: dict[str, int]
    module: object  # the Tunix module defining the family's classes
    norm: type
    mlp: type


def _counts(rms_norm, mlp_kind):
    return {**dict.fromkeys(KINDS, 0), "rms_norm": rms_norm, mlp_kind: 2, "rope": 2, "embedding": 1}


def _qwen3(dtype=jnp.float32):
    config = qwen3.ModelConfig(
        vocab_size=VOCAB, rope_theta=10_000, norm_eps=1e-6, use_tied_embedding=True, dtype=dtype, **SIZES
    )
    return qwen3.Qwen3(config, rngs=nnx.Rngs(0))


def _gemma3(param_dtype=jnp.float32):
    config = gemma3.ModelConfig(
        num_embed=VOCAB,
        sliding_window_size=4,
        local_base_frequency=1000,  # both layers are local ones; their base and scale reach the tables
        local_scale_factor=2.0,
        param_dtype=param_dtype,
        **SIZES,
    )
    return gemma3.Gemma3(config, rngs=nnx.Rngs(0))


FAMILIES = {
    "llama3": Family(
        lambda: llama3.Llama3(
            llama3.ModelConfig(
                vocab_size=VOCAB,
                rope_theta=10_000,
                norm_eps=1e-5,
                weight_tying=True,
                remat_config=llama3.RematConfig.BLOCK,  # Tunix's nnx.remat of the swapped attention and MLP
                **SIZES,
            ),
            rngs=nnx.Rngs(0),
        ),
        _counts(2 * 2 + 1, "swiglu"),
        llama3,
        llama3.RMSNorm,
        llama3.MLP,
    ),
    "qwen2": Family(
        lambda: qwen2.Qwen2(
            qwen2.ModelConfig(
                vocab_size=VOCAB,
                rope_theta=10_000,
                norm_eps=1e-6,
                remat_config=qwen2.RematConfig.DECODER,  # Tunix's nnx.remat of a decoder layer
                **SIZES,
            ),
            rngs=nnx.Rngs(0),
        ),
        _counts(2 * 2 + 1, "swiglu"),
        qwen2,
        qwen2.RMSNorm,
        qwen2.MLP,
    ),
    "qwen3": Family(
        _qwen3,
        _counts(2 * 4 + 1, "swiglu"),  # q_norm and k_norm too
        qwen3,
        qwen3.RMSNorm,
        qwen3.MLP,
    ),
    "gemma": Family(
        lambda: gemma.Gemma(
            gemma.ModelConfig(
                num_embed=VOCAB,
                final_logit_softcap=None,
                use_post_attn_norm=True,
                use_post_ffw_norm=True,
                attention_types=(gemma.AttentionType.GLOBAL, gemma.AttentionType.LOCAL_SLIDING),
                attn_logits_soft_cap=50.0,
                sliding_window_size=4,
                **SIZES,
            ),
            rngs=nnx.Rngs(0),
        ),
        _counts(2 * 4 + 1, "geglu"),
        gemma,
        gemma.RMSNorm,
        gemma.FeedForward,
    ),
    "gemma3": Family(
        _gemma3,
        _counts(2 * 6 + 1, "geglu"),  # query and key norms too
        gemma3,
        gemma3.RMSNorm,
        gemma3.FeedForward,
    ),
    "gemma4": Family(
        lambda: gemma4.Gemma4(
            gemma4.ModelConfig(
                num_embed=VOCAB,
                sliding_window_size=4,
                attention_pattern=(gemma4.AttentionType.LOCAL_SLIDING, gemma4.AttentionType.GLOBAL),
                num_global_kv_heads=1,
                global_key_size=16,
                global_rope_proportion=0.25,  # the global layer rotates 2 of its 8 pairs
                **SIZES,
            ),
            rngs=nnx.Rngs(0),
        ),
        _counts(2 * 6 + 1, "geglu"),
        gemma4,
        gemma4.RMSNorm,
        gemma4.FeedForward,
    ),
}


pytestmark = pytest.mark.usefixtures("full_precision_matmuls")


@pytest.fixture(autouse=True)
def tunix_settings():
    """Tunix's models as they run: 32-bit default dtypes (under x64 their initialisers and RoPE tables would be
    float64) and implicit rank promotion (its code broadcasts ``[D]`` weights against ``[B, S, D]``)."""
    with jax.enable_x64(False), jax.numpy_rank_promotion("allow"):
        yield


def _randomised(model: nnx.Module) -> nnx.Module:
    """Every Param moved off its init (zero MLP kernels, unit or zero norm scales) by a seeded draw."""
    params = nnx.state(model, nnx.Param)
    leaves, treedef = jax.tree.flatten(params)
    draws = [harness.random_normal(seed, leaf.shape, leaf.dtype, scale=0.2) for seed, leaf in enumerate(leaves)]
    nnx.update(model, jax.tree.unflatten(treedef, [leaf + draw for leaf, draw in zip(leaves, draws, strict=True)]))
    return model


def _batch():
    tokens = jnp.asarray(np.random.default_rng(1).integers(0, VOCAB, (BATCH, SEQ)), jnp.int32)
    positions = jnp.arange(SEQ, dtype=jnp.int32)[None, :] + jnp.array([[0], [3]], jnp.int32)  # a shifted row too
    causal = jnp.broadcast_to(jnp.tril(jnp.ones((SEQ, SEQ), bool)), (BATCH, SEQ, SEQ))
    return tokens, positions, causal


def _train_step(model: nnx.Module, optimizer: optax.GradientTransformation):
    """A jitted ``(state, opt_state) -> (state, opt_state, loss, logits, grads)`` step of ``model``'s next-token NLL."""
    graphdef = nnx.graphdef(model)
    tokens, positions, causal = _batch()

    def loss_fn(state):
        logits, _ = nnx.merge(graphdef, state)(tokens, positions, None, causal)
        log_probs = jax.nn.log_softmax(logits[:, :-1].astype(jnp.float32))
        nll = -jnp.take_along_axis(log_probs, tokens[:, 1:, None], axis=-1)
        return jnp.mean(nll), logits

    @jax.jit
    def step(state, opt_state):
        (loss, logits), grads = jax.value_and_grad(loss_fn, has_aux=True)(state)
        updates, opt_state = optimizer.update(grads, opt_state, state)
        return optax.apply_updates(state, updates), opt_state, loss, logits, grads

    return step


def _swapped(family: Family, **switches) -> tuple[nnx.Module, dict[str, int]]:
    model = _randomised(family.build())
    return model, apply_liger(model, implementation=IMPLEMENTATION, **switches)


@pytest.mark.parametrize("name", FAMILIES)
def test_swap_counts_classes_and_state(name):
    family = FAMILIES[name]
    plain = _randomised(family.build())
    model = _randomised(family.build())
    variables_before = {path: node for path, node in nnx.iter_graph(model) if isinstance(node, nnx.Variable)}
    counts = apply_liger(model, implementation=IMPLEMENTATION)

    assert counts == family.counts
    chex.assert_trees_all_equal(nnx.state(model), nnx.state(plain))  # same tree, same values
    variables_after = {path: node for path, node in nnx.iter_graph(model) if isinstance(node, nnx.Variable)}
    assert variables_after.keys() == variables_before.keys()
    assert all(variables_after[path] is variables_before[path] for path in variables_before)
    layer = model.layers[0]
    assert isinstance(layer.mlp, family.mlp) and type(layer.mlp) is not family.mlp
    assert isinstance(layer.attn, family.module.Attention) and type(layer.attn) is not family.module.Attention
    assert isinstance(model.final_norm, family.norm) and type(model.final_norm) is not family.norm
    embedder = family.module.Embedder
    assert isinstance(model.embedder, embedder) and type(model.embedder) is not embedder
    assert apply_liger(model, implementation=IMPLEMENTATION) == dict.fromkeys(KINDS, 0)  # already swapped


@pytest.mark.parametrize("name", ["qwen3", "gemma3"])
def test_swap_switches(name):
    family = FAMILIES[name]
    mlp_kind = "swiglu" if family.counts["swiglu"] else "geglu"
    model, counts = _swapped(family, rms_norm=False, rope=False, embedding=False)
    assert counts == {**dict.fromkeys(KINDS, 0), mlp_kind: 2}
    assert type(model.embedder) is family.module.Embedder
    assert type(model.final_norm) is family.norm and type(model.layers[0].attn) is family.module.Attention
    _, counts = _swapped(family, swiglu=False, geglu=False)
    assert counts == {**family.counts, mlp_kind: 0}


@pytest.mark.parametrize("name", FAMILIES)
def test_swapped_model_matches_tunix_and_trains(name):
    family = FAMILIES[name]
    plain = _randomised(family.build())
    model, _ = _swapped(family)
    rope_name = model.layers[0].attn.liger_options.function
    tunix_rope = getattr(family.module, rope_name)
    optimizer = optax.adam(1e-2)

    state, opt_state = nnx.state(plain), optimizer.init(nnx.state(plain))
    _, _, _, expected_logits, expected_grads = _train_step(plain, optimizer)(state, opt_state)

    step = _train_step(model, optimizer)
    state, opt_state = nnx.state(model), optimizer.init(nnx.state(model))
    state, opt_state, loss, logits, grads = step(state, opt_state)
    assert model_checks.relative_error(logits, expected_logits) <= 1e-5
    harness.assert_close(logits, expected_logits, jnp.float32)
    harness.assert_close_trees(grads, expected_grads, jnp.float32)
    assert getattr(family.module, rope_name) is tunix_rope  # the patch ends with the call

    losses = [loss]
    for _ in range(3):
        state, opt_state, loss, _, _ = step(state, opt_state)
        losses.append(loss)
    assert np.isfinite(losses).all() and (np.diff(losses) < 0).all(), losses


# Tunix's two bfloat16 set-ups: bf16 activations over fp32 params (Qwen's `dtype`), bf16 params and activations
# (Gemma3's default `param_dtype`); each with its float32 twin.
BFLOAT16_MODELS = {"qwen3": _qwen3, "gemma3": _gemma3}


@pytest.mark.parametrize("name", BFLOAT16_MODELS)
def test_swapped_model_in_bfloat16_is_as_accurate_as_tunix(name):
    build = BFLOAT16_MODELS[name]
    tunix_bf16 = _randomised(build(jnp.bfloat16))
    liger_bf16 = _randomised(build(jnp.bfloat16))
    apply_liger(liger_bf16, implementation=IMPLEMENTATION)
    truth = build(jnp.float32)  # the same (bf16-representable) params in float32
    nnx.update(truth, jax.tree.map(lambda p: p.astype(jnp.float32), nnx.state(tunix_bf16, nnx.Param)))
    optimizer = optax.sgd(0.0)

    def loss_logits_grads(model):
        state = nnx.state(model)
        return _train_step(model, optimizer)(state, optimizer.init(state))[2:]

    liger, tunix = loss_logits_grads(liger_bf16), loss_logits_grads(tunix_bf16)
    assert jax.tree.map(lambda x: x.dtype, liger) == jax.tree.map(lambda x: x.dtype, tunix)
    model_checks.assert_as_accurate_as_flax(liger, tunix, loss_logits_grads(truth))


def test_a_swapped_embedder_sums_a_row_shared_by_thousands_of_tokens_in_fp32():
    # With bf16 params (Tunix's checkpoints) Tunix's encode scatter-adds its gradient in bf16, which stalls once the
    # sum's spacing passes the terms (from 256 here); the swapped encode sums in fp32 and rounds once.
    class Holder(nnx.Module):
        def __init__(self):
            self.embedder = llama3.Embedder(VOCAB, 8, rngs=nnx.Rngs(0))
            table = self.embedder.input_embedding
            table.set_value(table[...].astype(jnp.bfloat16))

    ids = jnp.full((4, 1024), 7, jnp.int32)
    cotangent = np.random.default_rng(6).uniform(0.5, 1.5, (4, 1024, 8)).astype(jnp.bfloat16).astype(np.float32)
    exact = np.asarray(cotangent, np.float64).sum(axis=(0, 1))

    def loss(holder):
        return jnp.sum(holder.embedder.encode(ids).astype(jnp.float32) * cotangent)

    def row_gradient(holder):
        grads = nnx.grad(loss)(holder)
        return np.asarray(grads["embedder"]["input_embedding"][...][7], np.float64)

    swapped = Holder()
    assert apply_liger(swapped, implementation=IMPLEMENTATION)["embedding"] == 1
    eps = float(jnp.finfo(jnp.bfloat16).eps)
    np.testing.assert_allclose(row_gradient(swapped), exact, rtol=eps)
    assert np.max(np.abs(row_gradient(Holder()) / exact - 1)) > 10 * eps  # Tunix's own sum misses by far more


def test_importing_liger_jax_does_not_import_tunix():
    script = (
        "import sys\n"
        "from flax import nnx\n"
        "import liger_jax, liger_jax.flax_layers, liger_jax.models, liger_jax.integrations\n"
        "class Holder(nnx.Module):\n"
        "    def __init__(self):\n"
        "        self.norm = nnx.RMSNorm(4, rngs=nnx.Rngs(0))\n"
        "liger_jax.flax_layers.apply_liger(Holder(), implementation='xla')\n"
        "assert not [name for name in sys.modules if name.split('.')[0] == 'tunix'], 'tunix was imported'\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
