"""Flax CrossEntropyLoss / FusedLinearCrossEntropy: the fused loss of a Linear/Dense or tied Embed head equals the
plain loss of that head's logits, values and parameter gradients."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import linen as nn
from flax import nnx

import liger_jax
from liger_jax.flax_layers import linen as liger_linen
from liger_jax.flax_layers import nnx as liger_nnx
from tests import harness
from tests.test_cross_entropy import _labels, _normal

H, V = 24, 130
OPTIONS = {"label_smoothing": 0.1, "z_loss_scale": 1e-3, "ignore_index": 3}
# (param dtype, head dtype): fp32 throughout, and bf16 compute over fp32 params (the head casts its kernel).
DTYPES = [(jnp.float32, None), (jnp.float32, jnp.bfloat16)]


def _head(kind, param_dtype, dtype):
    rngs = nnx.Rngs(0)
    if kind == "linear":
        return nnx.Linear(H, V, use_bias=True, param_dtype=param_dtype, dtype=dtype, rngs=rngs)
    return nnx.Embed(V, H, param_dtype=param_dtype, dtype=dtype, rngs=rngs)


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
@pytest.mark.parametrize("kind", ["linear", "embed"])
@pytest.mark.parametrize(("param_dtype", "dtype"), DTYPES)
def test_nnx_fused_loss_equals_the_loss_of_the_head_logits(implementation, kind, param_dtype, dtype):
    head = _head(kind, param_dtype, dtype)
    hidden = _normal(1, (2, 9, H), jnp.float32)
    labels = _labels(2, (2, 9), V, ignore_index=3)
    fused = liger_nnx.FusedLinearCrossEntropy(chunk_size=8, implementation=implementation, **OPTIONS)
    plain = liger_nnx.CrossEntropyLoss(implementation=implementation, **OPTIONS)

    @nnx.jit
    def losses_and_grads(head, hidden, labels):
        def logits(head, hidden):
            return head(hidden) if kind == "linear" else head.attend(hidden)

        return (
            nnx.value_and_grad(lambda head: fused(head, hidden, labels))(head),
            nnx.value_and_grad(lambda head: plain(logits(head, hidden), labels))(head),
        )

    (loss, grads), (expected_loss, expected_grads) = losses_and_grads(head, hidden, labels)
    tolerance_dtype = dtype or jnp.float32
    harness.assert_close(loss, expected_loss, tolerance_dtype)
    harness.assert_close_trees(nnx.state(grads), nnx.state(expected_grads), tolerance_dtype)


def test_nnx_fused_loss_rejects_other_heads():
    with pytest.raises(TypeError, match="head must be an nnx.Linear or nnx.Embed"):
        liger_nnx.FusedLinearCrossEntropy()(nnx.LayerNorm(H, rngs=nnx.Rngs(0)), jnp.ones((2, H)), jnp.zeros(2, int))


def test_nnx_cross_entropy_loss_passes_its_options():
    logits = _normal(3, (7, V), jnp.float32)
    labels = _labels(4, (7,), V, ignore_index=3)
    loss, z_loss = liger_nnx.CrossEntropyLoss(return_z_loss=True, reduction="none", **OPTIONS)(logits, labels)
    expected = liger_jax.cross_entropy_reference(logits, labels, return_z_loss=True, reduction="none", **OPTIONS)
    harness.assert_close_trees((loss, z_loss), expected, jnp.float32)


class _DenseHeadModel(nn.Module):
    """A linen LM head, plain (logits → optax) or fused; ``tied`` uses the embedding table as the head."""

    fused: bool
    tied: bool
    implementation: str

    @nn.compact
    def __call__(self, tokens, labels):
        embed = nn.Embed(V, H, name="embed")
        hidden = embed(tokens)
        if self.fused:
            head = liger_linen.FusedLinearCrossEntropy(
                V, use_bias=not self.tied, chunk_size=8, implementation=self.implementation, name="lm_head"
            )
            return head(hidden, labels, embedding=embed.embedding if self.tied else None)
        logits = embed.attend(hidden) if self.tied else nn.Dense(V, name="lm_head")(hidden)
        return liger_linen.CrossEntropyLoss(implementation=self.implementation)(logits, labels)


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
@pytest.mark.parametrize("tied", [False, True])
def test_linen_fused_head_is_a_drop_in_for_dense(implementation, tied):
    tokens = jnp.asarray(np.random.default_rng(5).integers(0, V, (3, 7)))
    labels = _labels(6, (3, 7), V)
    fused = _DenseHeadModel(fused=True, tied=tied, implementation=implementation)
    plain = _DenseHeadModel(fused=False, tied=tied, implementation=implementation)
    params = plain.init(jax.random.key(0), tokens, labels)
    # Same param tree, same initial values: checkpoints of the Dense head load into the fused one.
    jax.tree.map(np.testing.assert_array_equal, fused.init(jax.random.key(0), tokens, labels), params)
    got = jax.jit(jax.value_and_grad(lambda p: fused.apply(p, tokens, labels)))(params)
    expected = jax.jit(jax.value_and_grad(lambda p: plain.apply(p, tokens, labels)))(params)
    harness.assert_close_trees(got, expected, jnp.float32)
    harness.assert_close(got[0], jax.jit(_optax_loss, static_argnums=3)(params, tokens, labels, tied), jnp.float32)


def _optax_loss(params, tokens, labels, tied):
    """The same head's mean loss over non-ignored labels through optax."""
    embedding = params["params"]["embed"]["embedding"]
    hidden = embedding[tokens]
    if tied:
        logits = hidden @ embedding.T
    else:
        logits = hidden @ params["params"]["lm_head"]["kernel"] + params["params"]["lm_head"]["bias"][None, None, :]
    valid = labels != -100
    losses = optax.softmax_cross_entropy_with_integer_labels(logits, jnp.where(valid, labels, 0))
    return jnp.sum(jnp.where(valid, losses, 0.0)) / jnp.sum(valid)


def test_linen_fused_head_checks_the_embedding_shape():
    head = liger_linen.FusedLinearCrossEntropy(V)
    with pytest.raises(ValueError, match=r"embedding must have shape \(130, 24\)"):
        head.init(jax.random.key(0), jnp.ones((2, H)), jnp.zeros(2, int), embedding=jnp.ones((V, H + 1)))
