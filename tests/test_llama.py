"""The bundled Llama: presets, shapes, causality, RoPE, the loss, and the liger swap of its own classes."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import liger_jax
from liger_jax.flax_layers import KINDS, apply_liger
from liger_jax.flax_layers import nnx as liger_nnx
from liger_jax.models import LlamaForCausalLM, llama_config, llama_liger
from liger_jax.models import llama as llama_lib
from tests import harness, model_checks

IMPLEMENTATION = harness.KERNEL_IMPLEMENTATION
SMALL = {"hidden_size": 64, "intermediate_size": 128, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2}


pytestmark = pytest.mark.usefixtures("full_precision_matmuls")


def _model(seed=0, **overrides):
    return LlamaForCausalLM(llama_config("tiny", **(SMALL | overrides)), rngs=nnx.Rngs(seed))


def _tokens(seed, shape=(2, 17), vocab=256):
    return jax.random.randint(jax.random.key(seed), shape, 0, vocab, dtype=jnp.int32)


def _param_count(model) -> int:
    return sum(int(np.prod(leaf.shape)) for leaf in jax.tree.leaves(nnx.state(model, nnx.Param)))


def test_preset_sizes():
    assert _param_count(LlamaForCausalLM(llama_config("tiny"), rngs=nnx.Rngs(0))) == llama_config("tiny").num_params
    one_b = nnx.eval_shape(lambda: LlamaForCausalLM(llama_config("1b"), rngs=nnx.Rngs(0)))
    assert _param_count(one_b) == llama_config("1b").num_params == 1_235_814_400  # Llama-3.2-1B
    assert 120e6 < llama_config("small").num_params < 130e6
    mini = llama_config("mini")
    assert (mini.hidden_size, mini.num_layers, mini.vocab_size) == (1024, 4, 32000)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"hidden_size": 60, "num_heads": 8}, "not a multiple of num_heads"),
        ({"num_kv_heads": 4}, "must divide num_heads"),
        ({"head_dim": 7}, "positive even int"),
        ({"num_layers": 0}, "num_layers must be a positive int"),
        ({"dtype": "int8"}, "dtype must be"),
        ({"attention": "flash"}, "attention must be"),
    ],
)
def test_bad_configs(overrides, message):
    with pytest.raises(ValueError, match=message):
        llama_config("tiny", **overrides)


def test_unknown_preset_and_bad_inputs():
    with pytest.raises(ValueError, match="unknown Llama preset"):
        llama_config("7b")
    model = _model()
    with pytest.raises(ValueError, match=r"shape \[batch, seq\]"):
        model(_tokens(0, (17,)))
    with pytest.raises(ValueError, match="labels must have the shape"):
        model.loss(_tokens(0), _tokens(1, (2, 16)))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_logits_shape_dtype_and_causality(dtype):
    model = _model(dtype=dtype)
    tokens = _tokens(0)
    logits = model(tokens)
    chex.assert_shape(logits, (2, 17, 256))
    chex.assert_type(logits, jnp.dtype(dtype))
    changed = tokens.at[:, 9].set((tokens[:, 9] + 1) % 256)
    harness.assert_close(model(changed)[:, :9], logits[:, :9], jnp.dtype(dtype))  # the past never sees the future
    assert not np.allclose(model(changed)[:, 9], logits[:, 9], atol=0.1)


def test_loss_is_mean_cross_entropy_over_kept_labels():
    model = _model()
    tokens, labels = _tokens(0), _tokens(1)
    labels = labels.at[0, :5].set(llama_lib.IGNORE_INDEX)
    log_probs = jax.nn.log_softmax(model(tokens).astype(jnp.float64), axis=-1)
    keep = labels != llama_lib.IGNORE_INDEX
    picked = jnp.take_along_axis(log_probs, jnp.where(keep, labels, 0)[..., None], axis=-1)[..., 0]
    expected = -jnp.sum(jnp.where(keep, picked, 0.0)) / jnp.sum(keep)
    harness.assert_close(model.loss(tokens, labels), expected, jnp.float32)


def test_rope_tables_are_liger_tables():
    positions = jnp.arange(13, dtype=jnp.int32)[None, :] + jnp.array([[0], [5]], jnp.int32)
    for table, liger_table in zip(
        llama_lib.rope_frequencies(positions, 16, 10_000.0),
        liger_jax.rope_cos_sin(positions, 16, base=10_000.0),
        strict=True,
    ):
        np.testing.assert_array_equal(table, liger_table)


@pytest.mark.parametrize("positions_shape", ["shared", "per_example"])
def test_rotary_embedding_matches_liger_reference(positions_shape):
    q, k = harness.random_normal(1, (2, 13, 4, 16), jnp.float32), harness.random_normal(2, (2, 13, 2, 16), jnp.float32)
    positions = jnp.arange(13, dtype=jnp.int32) + 3
    if positions_shape == "per_example":
        positions = jnp.stack([positions, positions + 7])
    cos, sin = liger_jax.rope_cos_sin(positions, 16, base=500_000.0)
    expected = liger_jax.apply_rotary_pos_emb_reference(*harness.as_float64(q, k, cos, sin))
    actual = llama_lib.RotaryEmbedding(16, 500_000.0)(q, k, positions)
    jax.tree.map(lambda a, e: harness.assert_close(a, e, jnp.float32), actual, expected)


def test_tied_head_reuses_the_embedding_and_untied_owns_a_kernel():
    tied, untied = _model(tie_embeddings=True), _model(tie_embeddings=False)
    assert tied.lm_head.embed is tied.embed_tokens and tied.lm_head.linear is None
    assert "lm_head" not in nnx.state(tied, nnx.Param)
    chex.assert_shape(untied.lm_head.linear.kernel[...], (64, 256))


def test_grouped_query_heads():
    for kv_heads in (1, 4):  # multi-query and plain multi-head attention
        chex.assert_shape(_model(num_kv_heads=kv_heads)(_tokens(0)), (2, 17, 256))


def _loss_and_grads(model, tokens, labels, positions=None):
    return nnx.jit(nnx.value_and_grad(lambda m: m.loss(tokens, labels, positions)))(model)


def _swapped(**overrides):
    model = _model(**overrides)
    counts = apply_liger(model, implementation=IMPLEMENTATION)
    return model, counts


def test_swap_counts_and_state():
    plain, model = _model(), _model()
    gate_proj = model.layers[0].mlp.gate_proj
    counts = apply_liger(model, implementation=IMPLEMENTATION)
    assert counts == {
        **dict.fromkeys(KINDS, 0),
        "rms_norm": 2 * SMALL["num_layers"] + 1,
        "fused_add_rms_norm": SMALL["num_layers"],
        "swiglu": SMALL["num_layers"],
        "rope": SMALL["num_layers"],
        "fused_linear_cross_entropy": 1,
        "embedding": 1,
    }
    chex.assert_trees_all_equal(nnx.state(model), nnx.state(plain))
    layer = model.layers[0]
    assert type(layer) is llama_liger.LigerLlamaDecoderLayer
    assert type(layer.post_attention_layernorm) is liger_nnx.RMSNorm
    assert type(layer.mlp) is liger_nnx.SwiGLUMLP and layer.mlp.gate_proj is gate_proj
    assert type(layer.self_attn.rotary) is liger_nnx.RotaryEmbedding
    assert type(model.lm_head) is llama_liger.LigerLMHead and model.lm_head.embed is model.embed_tokens
    assert type(model.embed_tokens) is liger_nnx.Embed


def test_layer_fusion_follows_its_own_switch():
    tokens, labels = _tokens(0), _tokens(1)
    expected = _loss_and_grads(_model(), tokens, labels)
    unfused, fused_only = _model(), _model()
    apply_liger(unfused, fused_add_rms_norm=False, implementation=IMPLEMENTATION)
    apply_liger(fused_only, rms_norm=False, implementation=IMPLEMENTATION)
    assert type(unfused.layers[0]) is llama_lib.LlamaDecoderLayer
    layer = fused_only.layers[0]
    assert type(layer) is llama_liger.LigerLlamaDecoderLayer
    # The norms it fuses, each the kernel's twin; the model's last norm stays flax's.
    assert type(layer.input_layernorm) is type(layer.post_attention_layernorm) is liger_nnx.RMSNorm
    assert type(fused_only.norm) is nnx.RMSNorm
    for model in (unfused, fused_only):
        actual = _loss_and_grads(model, tokens, labels)
        jax.tree.map(lambda a, e: harness.assert_close(a, e, jnp.float32), actual, expected)


@pytest.mark.parametrize("tie_embeddings", [True, False])
def test_swapped_llama_matches_flax_in_float32(tie_embeddings):
    tokens, labels = _tokens(0), _tokens(1)
    labels = labels.at[1, 3:6].set(llama_lib.IGNORE_INDEX)
    positions = jnp.stack([jnp.arange(17, dtype=jnp.int32), jnp.arange(17, dtype=jnp.int32) + 4])
    plain = _model(tie_embeddings=tie_embeddings)
    model, _ = _swapped(tie_embeddings=tie_embeddings)
    expected = _loss_and_grads(plain, tokens, labels, positions)
    actual = _loss_and_grads(model, tokens, labels, positions)
    harness.assert_close(model(tokens, positions), plain(tokens, positions), jnp.float32)
    jax.tree.map(lambda a, e: harness.assert_close(a, e, jnp.float32), actual, expected)


def test_swapped_llama_in_bfloat16_is_as_accurate_as_flax():
    tokens, labels = _tokens(0), _tokens(1)
    truth = _loss_and_grads(_model(), tokens, labels)
    flax_bf16 = _loss_and_grads(_model(dtype="bfloat16"), tokens, labels)
    liger_bf16 = _loss_and_grads(_swapped(dtype="bfloat16")[0], tokens, labels)
    model_checks.assert_as_accurate_as_flax(liger_bf16, flax_bf16, truth)


def test_remat_changes_nothing_but_memory():
    tokens, labels = _tokens(0), _tokens(1)
    expected = _loss_and_grads(_model(), tokens, labels)
    actual = _loss_and_grads(_model(remat=True), tokens, labels)
    jax.tree.map(lambda a, e: harness.assert_close(a, e, jnp.float32), actual, expected)
