"""fused_linear_logprobs: every implementation against a float64 reference that materialises the logits."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

import liger_jax
from liger_jax.ops import _linear_chunks
from tests import harness
from tests.collectives import assert_only_small_all_reduces, compiled_collectives, mesh, nbytes, place

pytestmark = pytest.mark.usefixtures("full_precision_matmuls")

N, H, V = 21, 16, 259  # N is not a multiple of CHUNK; V (odd) spans two interpreter blocks, the second partial
CHUNK = 8
# (dtype, weight_layout, bias, temperature, return_entropy)
CASES = [
    (jnp.float32, "hv", True, 1.0, False),
    (jnp.float32, "vh", False, 0.7, True),
    (jnp.bfloat16, "hv", False, 0.7, False),
    (jnp.bfloat16, "vh", True, 1.0, True),
    (jnp.float16, "hv", True, 2.0, True),
]


def _case_id(case):
    dtype, layout, bias, temperature, entropy = case
    bias_id = "bias" if bias else "nobias"
    return f"{jnp.dtype(dtype).name}-{layout}-{bias_id}-T{temperature}-{'entropy' if entropy else 'logprobs'}"


def _inputs(seed, dtype, layout="hv", n_rows=N, n_classes=V):
    x = harness.random_normal(seed, (n_rows, H), dtype)
    # An initialised LM head's scale (logits of std ~1): how bf16 logits are rounded (the reference rounds them,
    # XLA on CPU may keep fp32) moves the gradients well inside the bf16 tolerance. A larger spread makes some
    # classes' probabilities large, and their gradient terms' 1% bf16 noise then exceeds a cancelling sum's
    # tolerance.
    shape = (H, n_classes) if layout == "hv" else (n_classes, H)
    weight = harness.random_normal(seed + 1, shape, dtype, scale=0.25)
    bias = harness.random_normal(seed + 2, (n_classes,), dtype, scale=0.25)
    tokens = jnp.asarray(np.random.default_rng(seed + 3).integers(0, n_classes, n_rows), jnp.int32)
    return x, weight, bias, tokens


def _cotangents(entropy, n_rows=N):
    logprob = harness.random_normal(90, (n_rows,), jnp.float32)
    return (logprob, harness.random_normal(91, (n_rows,), jnp.float32)) if entropy else logprob


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_values_and_gradients_match_float64_reference(implementation, case):
    dtype, layout, with_bias, temperature, entropy = case
    x, weight, bias, tokens = _inputs(CASES.index(case), dtype, layout)
    options = {"temperature": temperature, "return_entropy": entropy, "weight_layout": layout}

    def op(x, weight, *bias):
        return liger_jax.fused_linear_logprobs(
            x,
            weight,
            tokens,
            bias=bias[0] if bias else None,
            chunk_size=CHUNK,
            implementation=implementation,
            **options,
        )

    def reference(x, weight, *bias):
        return liger_jax.fused_linear_logprobs_reference(
            x, weight, tokens, bias=bias[0] if bias else None, logits_dtype=dtype, **options
        )

    primals = (x, weight, bias) if with_bias else (x, weight)
    chex.assert_type(jax.jit(op)(*primals), jnp.float32)
    harness.assert_vjp_matches_reference(op, reference, primals, _cotangents(entropy), dtype)


def test_float64_gradients_pass_check_grads():
    x = harness.random_normal(40, (5, 3), jnp.float64)
    weight, bias = harness.random_normal(41, (3, 37), jnp.float64), harness.random_normal(42, (37,), jnp.float64)
    tokens = jnp.array([0, 36, 5, 17, 17])

    def op(x, weight, bias):
        logprobs, entropy = liger_jax.fused_linear_logprobs(
            x, weight, tokens, bias=bias, temperature=0.6, return_entropy=True, chunk_size=2, implementation="xla"
        )
        return logprobs + 0.5 * entropy

    check_grads(jax.jit(op), (x, weight, bias), order=1, modes=["rev"])


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
def test_bias_gradient_sums_to_zero(implementation):
    # Σ_j dlogprob/dz_j = Σ_j ([j = t] - p_j) = 0 and Σ_j dentropy/dz_j = -Σ_j p_j (log p_j + entropy) = 0, so for
    # any cotangents the bias gradient (Σ over rows of the logits' gradient) sums to zero over the vocabulary.
    x, weight, bias, tokens = _inputs(41, jnp.float32)
    _, (dbias,) = harness.vjp_under_jit(
        lambda b: liger_jax.fused_linear_logprobs(
            x, weight, tokens, bias=b, return_entropy=True, chunk_size=CHUNK, implementation=implementation
        ),
        (bias,),
        _cotangents(True),
    )
    assert np.abs(np.asarray(dbias)).max() > 0.1
    np.testing.assert_allclose(np.sum(np.asarray(dbias, np.float64)), 0.0, atol=1e-5)


def test_default_chunks_and_leading_axes(monkeypatch):
    # Without the floor the dweight accumulator bounds the chunk (16·259·4 bytes: 16 rows of fp32 logits), so the
    # 2 × 17 rows run as 12 + 12 + 10.
    monkeypatch.setattr(_linear_chunks, "MIN_CHUNK_LOGITS_BYTES", 0)
    assert _linear_chunks.default_chunk_rows(34, H, V, jnp.float32, jnp.float32) == 12
    x, weight, bias, tokens = _inputs(42, jnp.float32, "vh", n_rows=34)
    x, tokens = x.reshape(2, 17, H), tokens.reshape(2, 17)

    def op(x, weight):
        return liger_jax.fused_linear_logprobs(
            x, weight, tokens, return_entropy=True, weight_layout="vh", implementation=harness.KERNEL_IMPLEMENTATION
        )

    def reference(x, weight):
        return liger_jax.fused_linear_logprobs_reference(x, weight, tokens, return_entropy=True, weight_layout="vh")

    cotangents = tuple(c.reshape(2, 17) for c in _cotangents(True, 34))
    harness.assert_vjp_matches_reference(op, reference, (x, weight), cotangents, jnp.float32)


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
def test_vmap_gives_per_example_values_and_gradients(implementation):
    x, weight, bias, tokens = _inputs(43, jnp.float32, n_rows=20)
    x, tokens = x.reshape(4, 5, H), tokens.reshape(4, 5)

    def loss(op):
        def per_example(x, weight, tokens):
            logprobs, entropy = op(x, weight, tokens, bias=bias, temperature=0.8, return_entropy=True)
            return jnp.sum(jnp.sin(logprobs) + entropy)

        return jax.jit(jax.vmap(jax.value_and_grad(per_example, argnums=(0, 1)), in_axes=(0, None, 0)))

    got = loss(lambda *a, **k: liger_jax.fused_linear_logprobs(*a, chunk_size=3, implementation=implementation, **k))
    expected = loss(liger_jax.fused_linear_logprobs_reference)(*harness.as_float64(x, weight), tokens)
    harness.assert_close_trees(got(x, weight, tokens), expected, jnp.float32)


def test_checkpoint_gives_the_same_gradients():
    x, weight, _, tokens = _inputs(47, jnp.float32, n_rows=12)
    harness.assert_checkpoint_gives_the_same_gradients(
        lambda x, w: jnp.sum(
            jnp.sin(
                liger_jax.fused_linear_logprobs(
                    x, w, tokens, chunk_size=5, implementation=harness.KERNEL_IMPLEMENTATION
                )
            )
        ),
        (x, weight),
    )


# The bias of the first vocabulary block: logits spread as an LM head's, or one peak with the rest 40 below it (their
# exponentials add nothing to 1 in fp32: a running sum of exactly 1).
FIRST_BLOCK_BIASES = {"spread": 0.0, "one_peak": -40.0}


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
@pytest.mark.parametrize("first_block", FIRST_BLOCK_BIASES)
def test_row_max_in_a_later_vocabulary_block_over_two_programs(implementation, first_block):
    # One chunk of 21 rows: the interpreter's kernel takes 16 rows of 259 classes per program, in blocks of 256. The
    # bias raises the last 3 classes above the first block: the online softmax must move its running sum and its
    # entropy's running Σ e (z - m) to the max of the second block.
    x, weight, _, tokens = _inputs(45, jnp.float32)
    bias = jnp.full((V,), FIRST_BLOCK_BIASES[first_block], jnp.float32).at[7].set(0.0).at[256:].set(2.0)

    def op(x, weight, bias):
        return liger_jax.fused_linear_logprobs(
            x,
            weight,
            tokens,
            bias=bias,
            temperature=0.8,
            return_entropy=True,
            chunk_size=N,
            implementation=implementation,
        )

    def reference(x, weight, bias):
        return liger_jax.fused_linear_logprobs_reference(
            x, weight, tokens, bias=bias, temperature=0.8, return_entropy=True
        )

    harness.assert_vjp_matches_reference(op, reference, (x, weight, bias), _cotangents(True), jnp.float32)


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
def test_traced_out_of_range_token_gives_nan_logprob_and_finite_gradients(implementation):
    x, weight, bias, tokens = _inputs(44, jnp.float32)
    tokens = tokens.at[3].set(V).at[11].set(-1)

    @jax.jit
    def run(x, weight, tokens):
        def total(x, weight):
            logprobs, entropy = liger_jax.fused_linear_logprobs(
                x, weight, tokens, return_entropy=True, chunk_size=CHUNK, implementation=implementation
            )
            return jnp.sum(jnp.where(jnp.isnan(logprobs), 0.0, logprobs)) + jnp.sum(entropy), (logprobs, entropy)

        return jax.grad(total, argnums=(0, 1), has_aux=True)(x, weight)

    (dx, dweight), (logprobs, entropy) = run(x, weight, tokens)
    assert np.isnan(logprobs[np.array([3, 11])]).all() and np.isfinite(np.delete(logprobs, [3, 11])).all()
    harness.assert_all_finite(entropy, dx, dweight)
    expected = liger_jax.fused_linear_logprobs_reference(*harness.as_float64(x, weight), tokens, return_entropy=True)
    harness.assert_close(entropy, expected[1], jnp.float32)

    # The out-of-range rows' gradients come from their entropy alone: a log-prob cotangent must not reach them.
    def reference_total(x, weight):
        logprobs, entropy = liger_jax.fused_linear_logprobs_reference(x, weight, tokens, return_entropy=True)
        return jnp.sum(jnp.where(jnp.isnan(logprobs), 0.0, logprobs)) + jnp.sum(entropy)

    expected_grads = jax.grad(reference_total, argnums=(0, 1))(*harness.as_float64(x, weight))
    harness.assert_close_trees((dx, dweight), expected_grads, jnp.float32)


def test_no_rows_gives_empty_results():
    x, weight = jnp.zeros((0, H), jnp.float32), jnp.ones((H, V), jnp.float32)
    logprobs, entropy = liger_jax.fused_linear_logprobs(
        x, weight, jnp.zeros((0,), jnp.int32), return_entropy=True, implementation=harness.KERNEL_IMPLEMENTATION
    )
    chex.assert_shape((logprobs, entropy), (0,))


def test_rows_and_vocabulary_sharded_match_one_device():
    # Rows over "dp", the vocabulary over "tp": the softmax statistics and the token's logit are combined across
    # the vocabulary shards; neither the weight nor logits are gathered.
    rows, vocab = "dp", "tp"
    mesh_ = mesh((4, 2), (rows, vocab))
    x, weight, bias, tokens = _inputs(45, jnp.float32, n_rows=32, n_classes=96)
    cotangents = _cotangents(True, 32)

    @jax.jit
    def program(x, weight, bias, tokens):
        def total(x, weight, bias):
            logprobs, entropy = liger_jax.fused_linear_logprobs(
                x, weight, tokens, bias=bias, temperature=0.9, return_entropy=True, chunk_size=CHUNK
            )
            return jnp.sum(logprobs * cotangents[0] + entropy * cotangents[1])

        return jax.value_and_grad(total, argnums=(0, 1, 2))(x, weight, bias)

    expected = program(x, weight, bias, tokens)
    sharded = (place(x, mesh_, rows), place(weight, mesh_, None, vocab), place(bias, mesh_, vocab))
    sharded += (place(tokens, mesh_, rows),)
    harness.assert_close_trees(program(*sharded), expected, jnp.float32)
    limit = max(nbytes(weight, bias) // mesh_.shape[vocab], nbytes(x) // mesh_.shape[rows]) + 64
    assert_only_small_all_reduces(compiled_collectives(program, *sharded), limit)


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
def test_compiled_temporaries_are_an_eighth_of_the_logits(implementation):
    # 100_000 rows over 50_000 classes: 20 GB of fp32 logits; the chunks keep a few 64 MiB bounds.
    n_rows, n_classes = 100_000, 50_000
    x = jax.ShapeDtypeStruct((n_rows, 64), jnp.float32)
    weight = jax.ShapeDtypeStruct((64, n_classes), jnp.float32)
    tokens = jax.ShapeDtypeStruct((n_rows,), jnp.int32)

    def loss(x, weight, tokens):
        logprobs, entropy = liger_jax.fused_linear_logprobs(
            x, weight, tokens, return_entropy=True, implementation=implementation
        )
        return jnp.sum(logprobs + entropy)

    compiled = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(x, weight, tokens).compile()
    temp = compiled.memory_analysis().temp_size_in_bytes
    assert temp <= 8 * _linear_chunks.chunk_logits_bound(n_rows, 64, n_classes, jnp.float32)
    assert temp < 4 * n_rows * n_classes / 8


@pytest.mark.parametrize(
    ("shapes", "dtypes", "kwargs", "error", "match"),
    [
        (((4, 8), (9, 10), (4,)), None, {}, ValueError, r"weight must have shape \(8, 10\)"),
        (((4, 8), (10, 9), (4,)), None, {"weight_layout": "vh"}, ValueError, r"weight must have shape \(10, 8\)"),
        (((4, 8), (8, 10), (3,)), None, {}, ValueError, r"tokens must have shape \(4,\)"),
        (((4, 8), (8, 10), (4,)), (jnp.float32, jnp.float32, jnp.float32), {}, TypeError, "tokens must have an int"),
        (((4, 8), (8, 10), (4,)), (jnp.int32, jnp.float32, jnp.int32), {}, TypeError, "x must have a float dtype"),
        (((4, 8), (8, 10), (4,)), None, {"temperature": 0.0}, ValueError, "temperature must be a finite number"),
        (((4, 8), (8, 10), (4,)), None, {"temperature": float("inf")}, ValueError, "temperature"),
        (
            ((4, 8), (8, 10), (4,)),
            None,
            {"bias": jnp.ones(9, jnp.float32)},
            ValueError,
            r"bias must have shape \(10,\)",
        ),
        (((4, 8), (8, 10), (4,)), None, {"chunk_size": 0}, ValueError, "chunk_size"),
        (((4, 8), (8, 10), (4,)), None, {"weight_layout": "hd"}, ValueError, "weight_layout"),
    ],
)
def test_bad_arguments_raise_clear_errors(shapes, dtypes, kwargs, error, match):
    harness.assert_call_raises(
        error, match, liger_jax.fused_linear_logprobs, shapes, dtypes or (jnp.float32, jnp.float32, jnp.int32), **kwargs
    )


def test_concrete_out_of_range_token_raises():
    with pytest.raises(ValueError, match=r"tokens must be in \[0, 10\); got 10 at index \(2,\)"):
        liger_jax.fused_linear_logprobs(
            jnp.ones((4, 8), jnp.float32), jnp.ones((8, 10), jnp.float32), jnp.array([0, 1, 10, 2])
        )


def test_flax_modules_compute_the_op_on_their_heads():
    from flax import linen as nn
    from flax import nnx

    from liger_jax.flax_layers import linen as liger_linen
    from liger_jax.flax_layers import nnx as liger_nnx

    x, _, _, tokens = _inputs(46, jnp.float32, n_rows=6)
    options = {"temperature": 0.8, "return_entropy": True, "implementation": "xla"}
    embed = nnx.Embed(V, H, rngs=nnx.Rngs(1))  # a tied head: its [V, H] table in place ("vh")
    got = jax.jit(lambda x: liger_nnx.FusedLinearLogProbs(**options)(embed, x, tokens))(x)
    expected = liger_jax.fused_linear_logprobs(x, embed.embedding[...], tokens, weight_layout="vh", **options)
    harness.assert_close_trees(got, expected, jnp.float32)
    # linen: nn.Dense's param tree, so a Dense LM head's checkpoint loads into it.
    module = liger_linen.FusedLinearLogProbs(V, **options)
    got, variables = module.init_with_output(jax.random.key(2), x, tokens)
    dense_params = nn.Dense(V).init(jax.random.key(2), x)["params"]
    assert jax.tree.map(jnp.shape, variables["params"]) == jax.tree.map(jnp.shape, dense_params)
    params = variables["params"]
    expected = liger_jax.fused_linear_logprobs(x, params["kernel"], tokens, bias=params["bias"], **options)
    harness.assert_close_trees(got, expected, jnp.float32)
