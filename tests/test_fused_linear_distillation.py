"""fused_linear_distillation and fused_linear_jsd: every implementation against float64 references that materialise
both models' logits, written from the losses' definitions."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import liger_jax
from liger_jax.ops import _linear_chunks
from tests import harness
from tests.collectives import assert_only_small_all_reduces, compiled_collectives, mesh, nbytes, place

pytestmark = pytest.mark.usefixtures("full_precision_matmuls")

N, HS, HT, V = 19, 16, 12, 259  # N not a multiple of CHUNK; odd V over two interpreter blocks; H_t ≠ H_s
CHUNK = 8
# (dtype, weight_layout, biases, divergence, beta, temperature, weight_hard_loss, weight_soft_loss). JSD's beta
# limits are in test_fused_linear_jsd_matches_float64_reference.
CASES = [
    (jnp.float32, "hv", True, "jsd", 0.5, 1.0, 0.5, 0.5),
    (jnp.float32, "vh", True, "kl", 0.5, 1.5, 0.5, 0.5),
    (jnp.float32, "hv", True, "cosine", 0.7, 0.8, 0.5, 0.5),
    (jnp.bfloat16, "hv", True, "jsd", 0.3, 0.7, 0.5, 0.5),
    (jnp.bfloat16, "vh", False, "kl", 0.5, 1.0, 1.0, 2.0),
    (jnp.float32, "hv", False, "tvd", 0.5, 1.3, 0.6, 0.4),
]


def _case_id(case):
    dtype, layout, biases, divergence, beta, temperature, hard, soft = case
    bias_id = "bias" if biases else "nobias"
    return f"{jnp.dtype(dtype).name}-{layout}-{bias_id}-{divergence}-b{beta}-T{temperature}-w{hard},{soft}"


def _inputs(seed, dtype, layout="hv", n_rows=N, n_classes=V, ignore_index=-100):
    def normal(offset, shape, scale=1.0):
        return harness.random_normal(seed + offset, shape, dtype, scale)

    def head(offset, hidden):  # an initialised LM head's scale, as in test_fused_linear_logprobs: logits of std ~1
        return normal(offset, (hidden, n_classes) if layout == "hv" else (n_classes, hidden), 0.25)

    labels = np.random.default_rng(seed + 6).integers(0, n_classes, n_rows)
    labels[:: max(1, n_rows // 4)] = ignore_index
    student = (normal(0, (n_rows, HS)), head(1, HS), normal(2, (n_classes,), 0.25))
    teacher = (normal(3, (n_rows, HT)), head(4, HT), normal(5, (n_classes,), 0.25))
    return student, teacher, jnp.asarray(labels, jnp.int32)


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_losses_and_gradients_match_float64_reference(implementation, case):
    dtype, layout, biases, divergence, beta, temperature, hard, soft = case
    (x, weight, bias), (teacher_x, teacher_weight, teacher_bias), labels = _inputs(CASES.index(case), dtype, layout)
    teacher_bias = teacher_bias if biases else None
    options = {
        "divergence": divergence,
        "beta": beta,
        "temperature": temperature,
        "weight_hard_loss": hard,
        "weight_soft_loss": soft,
        "return_soft_hard_loss": True,
        "weight_layout": layout,
    }

    def op(x, weight, *bias):
        return liger_jax.fused_linear_distillation(
            x,
            weight,
            teacher_x,
            teacher_weight,
            labels,
            student_bias=bias[0] if bias else None,
            teacher_bias=teacher_bias,
            chunk_size=CHUNK,
            implementation=implementation,
            **options,
        )

    def reference(x, weight, *bias):
        teacher = harness.as_float64(teacher_x, teacher_weight)
        return liger_jax.fused_linear_distillation_reference(
            x,
            weight,
            *teacher,
            labels,
            student_bias=bias[0] if bias else None,
            teacher_bias=None if teacher_bias is None else harness.as_float64(teacher_bias)[0],
            logits_dtype=dtype,
            **options,
        )

    primals = (x, weight, bias) if biases else (x, weight)
    # The soft and hard losses are for logging (no gradient): only the loss gets a cotangent.
    cotangent = (jnp.float32(1.7), jnp.float32(0.0), jnp.float32(0.0))
    harness.assert_vjp_matches_reference(op, reference, primals, cotangent, dtype)


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
@pytest.mark.parametrize(("beta", "with_labels"), [(0.0, False), (1.0, True)])
def test_fused_linear_jsd_matches_float64_reference(implementation, beta, with_labels):
    (x, weight, _), (teacher_x, teacher_weight, _), labels = _inputs(30, jnp.float32, "vh")
    labels = labels if with_labels else None
    options = {"beta": beta, "temperature": 1.3, "weight_layout": "vh"}

    def op(x, weight):
        return liger_jax.fused_linear_jsd(
            x, weight, teacher_x, teacher_weight, labels, chunk_size=CHUNK, implementation=implementation, **options
        )

    def reference(x, weight):
        teacher = harness.as_float64(teacher_x, teacher_weight)
        return liger_jax.fused_linear_jsd_reference(x, weight, *teacher, labels, **options)

    harness.assert_vjp_matches_reference(op, reference, (x, weight), jnp.float32(2.0), jnp.float32)


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
def test_a_chunk_of_more_rows_than_a_program_takes_matches_float64_reference(implementation):
    # One chunk of 70 rows: the interpreter's kernel takes 32 rows of these 259 classes per program, so the chunk's
    # rows span three programs, the last one partial.
    (x, weight, _), (teacher_x, teacher_weight, _), labels = _inputs(32, jnp.float32, n_rows=70)
    options = {"divergence": "jsd", "beta": 0.4, "temperature": 1.2}

    def op(x, weight):
        return liger_jax.fused_linear_distillation(
            x, weight, teacher_x, teacher_weight, labels, chunk_size=70, implementation=implementation, **options
        )

    def reference(x, weight):
        teacher = harness.as_float64(teacher_x, teacher_weight)
        return liger_jax.fused_linear_distillation_reference(x, weight, *teacher, labels, **options)

    harness.assert_vjp_matches_reference(op, reference, (x, weight), jnp.float32(1.3), jnp.float32)


@pytest.mark.parametrize("n_classes", [129, 256])
@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
def test_vocabularies_at_and_one_past_whole_blocks_match_float64_reference(implementation, n_classes):
    # 129 classes: the interpreter's blocks of 128 and one class alone in a second block; 256: two whole blocks. The
    # last class is made the student's likeliest, which every pass (the softmax statistics, the losses' sums, walked
    # back from the last block, the gradient) must visit once. KL at T != 1 with a hard loss: the raw logits' softmax
    # statistics are summed apart.
    (x, weight, bias), (teacher_x, teacher_weight, _), labels = _inputs(34, jnp.float32, n_classes=n_classes)
    bias = bias.at[-1].set(3.0)
    options = {"divergence": "kl", "temperature": 1.5, "weight_hard_loss": 0.5, "return_soft_hard_loss": True}

    def op(x, weight, bias):
        return liger_jax.fused_linear_distillation(
            x,
            weight,
            teacher_x,
            teacher_weight,
            labels,
            student_bias=bias,
            chunk_size=CHUNK,
            implementation=implementation,
            **options,
        )

    def reference(x, weight, bias):
        teacher = harness.as_float64(teacher_x, teacher_weight)
        return liger_jax.fused_linear_distillation_reference(x, weight, *teacher, labels, student_bias=bias, **options)

    cotangent = (jnp.float32(1.7), jnp.float32(0.0), jnp.float32(0.0))
    harness.assert_vjp_matches_reference(op, reference, (x, weight, bias), cotangent, jnp.float32)


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
def test_a_label_out_of_range_gives_a_nan_hard_loss_and_no_hard_gradient(implementation):
    # A traced label (no concrete range check) outside [0, V), as the cross-entropy kernels treat it: the hard loss
    # is NaN and the row's gradient is its soft loss's alone, the same as with no hard loss at all.
    (x, weight, _), (teacher_x, teacher_weight, _), labels = _inputs(33, jnp.float32)
    labels = labels.at[5].set(V)

    @functools.partial(jax.jit, static_argnums=1)
    def grads(labels, weight_hard_loss):
        def loss(x):
            return liger_jax.fused_linear_distillation(
                x,
                weight,
                teacher_x,
                teacher_weight,
                labels,
                weight_hard_loss=weight_hard_loss,
                return_soft_hard_loss=True,
                chunk_size=CHUNK,
                implementation=implementation,
            )

        (_, soft, hard), pullback = jax.vjp(loss, x)
        return soft, hard, pullback((jnp.float32(1.0), jnp.float32(0.0), jnp.float32(0.0)))[0]

    soft, hard, dx = grads(labels, 0.5)
    assert np.isnan(hard) and np.isfinite(soft)
    # Without a hard loss the cross-entropy is not computed at all.
    dx_soft_only = jax.jit(
        jax.grad(
            lambda x, labels: liger_jax.fused_linear_distillation(
                x,
                weight,
                teacher_x,
                teacher_weight,
                labels,
                weight_hard_loss=0.0,
                chunk_size=CHUNK,
                implementation=implementation,
            )
        )
    )(x, labels)
    np.testing.assert_allclose(dx[5], dx_soft_only[5], rtol=1e-5, atol=1e-7)
    assert not np.allclose(dx[6], dx_soft_only[6])  # a row with a label in range has a hard part


def _distillation_op(teacher_x, teacher_weight, labels, **options):
    def op(x, weight, bias):
        return liger_jax.fused_linear_distillation(
            x, weight, teacher_x, teacher_weight, labels, student_bias=bias, chunk_size=CHUNK, **options
        )

    return op


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
def test_bf16_accumulation_matches_float64_reference(implementation, monkeypatch):
    # dweight and dbias summed over the three chunks in bf16, no H × V fp32 accumulator.
    (x, weight, bias), (teacher_x, teacher_weight, _), labels = _inputs(37, jnp.bfloat16)
    options = {"divergence": "jsd", "beta": 0.4, "temperature": 1.2, "weight_hard_loss": 0.7}
    bf16_op = _distillation_op(
        teacher_x, teacher_weight, labels, implementation=implementation, accum_dtype=jnp.bfloat16, **options
    )

    def reference(x, weight, bias):
        teacher = harness.as_float64(teacher_x, teacher_weight)
        return liger_jax.fused_linear_distillation_reference(
            x, weight, *teacher, labels, student_bias=bias, logits_dtype=jnp.bfloat16, **options
        )

    harness.assert_vjp_matches_reference(bf16_op, reference, (x, weight, bias), jnp.float32(1.3), jnp.bfloat16)
    run_chunks, accumulators = _linear_chunks.run_chunks, []

    def recording_run_chunks(*args, **kwargs):
        results = run_chunks(*args, **kwargs)
        accumulators.append(jax.tree.map(lambda grad: grad.dtype, (results.dweight, results.dbias)))
        return results

    monkeypatch.setattr(_linear_chunks, "run_chunks", recording_run_chunks)
    jax.grad(bf16_op, argnums=(0, 1, 2))(x, weight, bias)
    jax.grad(
        lambda x, weight: liger_jax.fused_linear_jsd(
            x, weight, teacher_x, teacher_weight, accum_dtype=jnp.bfloat16, implementation=implementation
        )
    )(x, weight)
    assert accumulators == [(jnp.bfloat16, jnp.bfloat16), (jnp.bfloat16, None)]


def test_soft_and_hard_losses_take_no_gradient_under_any_cotangent():
    # As Liger's: the soft and hard losses are returned for logging, and their cotangents are dropped.
    implementation = harness.KERNEL_IMPLEMENTATION
    (x, weight, bias), (teacher_x, teacher_weight, _), labels = _inputs(38, jnp.float32, "vh")
    options = {"divergence": "kl", "temperature": 1.4, "weight_hard_loss": 0.6, "weight_layout": "vh"}
    op = _distillation_op(
        teacher_x, teacher_weight, labels, implementation=implementation, return_soft_hard_loss=True, **options
    )

    def reference(x, weight, bias):  # the loss alone carries the gradient
        teacher = harness.as_float64(teacher_x, teacher_weight)
        loss, soft, hard = liger_jax.fused_linear_distillation_reference(
            x, weight, *teacher, labels, student_bias=bias, return_soft_hard_loss=True, **options
        )
        return loss, jax.lax.stop_gradient(soft), jax.lax.stop_gradient(hard)

    cotangent = (jnp.float32(1.7), jnp.float32(-0.6), jnp.float32(2.3))
    harness.assert_vjp_matches_reference(op, reference, (x, weight, bias), cotangent, jnp.float32)
    _, loss_only = harness.vjp_under_jit(op, (x, weight, bias), (jnp.float32(1.7), jnp.float32(0), jnp.float32(0)))
    _, all_three = harness.vjp_under_jit(op, (x, weight, bias), cotangent)
    jax.tree.map(np.testing.assert_array_equal, all_three, loss_only)


@pytest.mark.parametrize("return_soft_hard_loss", [False, True])
def test_gradients_come_from_the_forward_pass_of_four_matmuls(return_soft_hard_loss):
    # Each chunk's student and teacher logits, dx and dweight, once: the backward pass only scales them. Whole
    # chunks, so the loop's step is the one traced chunk.
    (x, weight, bias), (teacher_x, teacher_weight, _), labels = _inputs(39, jnp.float32, n_rows=2 * CHUNK)
    op = _distillation_op(
        teacher_x, teacher_weight, labels, implementation="xla", return_soft_hard_loss=return_soft_hard_loss
    )
    loss = (lambda *a: op(*a)[0]) if return_soft_hard_loss else op
    program = jax.make_jaxpr(jax.value_and_grad(loss, argnums=(0, 1, 2)))(x, weight, bias)
    assert str(program).count("dot_general") == 4


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
def test_all_rows_ignored_gives_zero_loss_and_gradients(implementation):
    (x, weight, bias), (teacher_x, teacher_weight, _), labels = _inputs(31, jnp.float32)
    labels = jnp.full_like(labels, -100)
    loss, grads = harness.vjp_under_jit(
        lambda x, w, b: liger_jax.fused_linear_distillation(
            x,
            w,
            teacher_x,
            teacher_weight,
            labels,
            student_bias=b,
            chunk_size=CHUNK,
            implementation=implementation,
        ),
        (x, weight, bias),
        jnp.float32(1.0),
    )
    np.testing.assert_array_equal(loss, 0.0)
    for grad in grads:
        np.testing.assert_array_equal(grad, 0.0)


def test_no_rows_gives_zero_losses():
    empty = jnp.zeros((0, HS), jnp.float32), jnp.ones((HS, V), jnp.float32)
    teacher = jnp.zeros((0, HT), jnp.float32), jnp.ones((HT, V), jnp.float32)
    losses = liger_jax.fused_linear_distillation(
        *empty,
        *teacher,
        jnp.zeros((0,), jnp.int32),
        return_soft_hard_loss=True,
        implementation=harness.KERNEL_IMPLEMENTATION,
    )
    np.testing.assert_array_equal(losses, 0.0)


def test_teacher_gets_no_gradient():
    (x, weight, _), (teacher_x, teacher_weight, _), labels = _inputs(32, jnp.float32)
    grads = jax.jit(
        jax.grad(
            lambda tx, tw: liger_jax.fused_linear_distillation(
                x, weight, tx, tw, labels, chunk_size=CHUNK, implementation="xla"
            ),
            argnums=(0, 1),
        )
    )(teacher_x, teacher_weight)
    for grad in grads:
        np.testing.assert_array_equal(grad, 0.0)


def test_vmap_and_leading_axes():
    (x, weight, _), (teacher_x, teacher_weight, _), labels = _inputs(33, jnp.float32, n_rows=18)
    x, teacher_x, labels = x.reshape(3, 6, HS), teacher_x.reshape(3, 6, HT), labels.reshape(3, 6)

    def batched(op):
        def loss(x, weight, teacher_x, labels):
            return op(x, weight, teacher_x, teacher_weight, labels, divergence="tvd", temperature=0.9)

        return jax.jit(jax.vmap(jax.value_and_grad(loss, argnums=(0, 1)), in_axes=(0, None, 0, 0)))

    got = batched(
        lambda *a, **k: liger_jax.fused_linear_distillation(
            *a, chunk_size=4, implementation=harness.KERNEL_IMPLEMENTATION, **k
        )
    )(x, weight, teacher_x, labels)
    expected = batched(liger_jax.fused_linear_distillation_reference)(*harness.as_float64(x, weight, teacher_x), labels)
    harness.assert_close_trees(got, expected, jnp.float32)


@pytest.mark.parametrize("divergence", ["jsd", "tvd", "cosine"])
def test_rows_and_vocabulary_sharded_match_one_device(divergence):
    # Rows over "dp", both heads' vocabulary over "tp": the divergences' row sums and softmax statistics are
    # combined across the vocabulary shards (log-probs for jsd/kl, probabilities for tvd, dot products for cosine).
    rows, vocab = "dp", "tp"
    mesh_ = mesh((4, 2), (rows, vocab))
    (x, weight, bias), (teacher_x, teacher_weight, teacher_bias), labels = _inputs(
        34, jnp.float32, n_rows=32, n_classes=96
    )

    @jax.jit
    def program(x, weight, bias, teacher_x, teacher_weight, teacher_bias, labels):
        def loss(x, weight, bias):
            return liger_jax.fused_linear_distillation(
                x,
                weight,
                teacher_x,
                teacher_weight,
                labels,
                divergence=divergence,
                temperature=1.2,
                student_bias=bias,
                teacher_bias=teacher_bias,
                chunk_size=CHUNK,
            )

        return jax.value_and_grad(loss, argnums=(0, 1, 2))(x, weight, bias)

    expected = program(x, weight, bias, teacher_x, teacher_weight, teacher_bias, labels)
    sharded = (place(x, mesh_, rows), place(weight, mesh_, None, vocab), place(bias, mesh_, vocab))
    sharded += (
        place(teacher_x, mesh_, rows),
        place(teacher_weight, mesh_, None, vocab),
        place(teacher_bias, mesh_, vocab),
    )
    sharded += (place(labels, mesh_, rows),)
    harness.assert_close_trees(program(*sharded), expected, jnp.float32)
    limit = max(nbytes(weight, bias, teacher_weight) // mesh_.shape[vocab], nbytes(x, teacher_x) // mesh_.shape[rows])
    limit += 64
    assert_only_small_all_reduces(compiled_collectives(program, *sharded), limit)


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
def test_compiled_temporaries_are_an_eighth_of_one_models_logits(implementation):
    # 200_000 rows over 50_000 classes: 40 GB of fp32 logits per model; the chunks keep a few 64 MiB bounds.
    n_rows, n_classes = 200_000, 50_000
    x = jax.ShapeDtypeStruct((n_rows, 64), jnp.float32)
    weight = jax.ShapeDtypeStruct((64, n_classes), jnp.float32)
    teacher_x = jax.ShapeDtypeStruct((n_rows, 32), jnp.float32)
    teacher_weight = jax.ShapeDtypeStruct((32, n_classes), jnp.float32)
    labels = jax.ShapeDtypeStruct((n_rows,), jnp.int32)

    def loss(x, weight, teacher_x, teacher_weight, labels):
        return liger_jax.fused_linear_distillation(
            x, weight, teacher_x, teacher_weight, labels, implementation=implementation
        )

    compiled = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(x, weight, teacher_x, teacher_weight, labels).compile()
    temp = compiled.memory_analysis().temp_size_in_bytes
    assert temp <= 8 * _linear_chunks.chunk_logits_bound(n_rows, 64, n_classes, jnp.float32)
    assert temp < 4 * n_rows * n_classes / 8


# Bytes a chunk of an fp32 head keeps per logit: both models' fp32 logits and three fp32 buffers (the two models'
# log-probabilities, then the gradient).
FP32_CHUNK_BYTES_PER_LOGIT = 4 * 2 + 4 * 3


def test_compiled_temporaries_scale_with_the_chunk_size():
    # A long narrow batch: 4 GiB of fp32 logits per model against 4 MiB of dweight; the temporaries are one chunk's
    # buffers (and the dweight product, which the CPU compiler keeps apart from the accumulator).
    n_rows, hidden, n_classes = 16384, 16, 65536
    shapes = [(n_rows, hidden), (hidden, n_classes), (n_rows, 8), (8, n_classes), (n_rows,)]
    args = [jax.ShapeDtypeStruct(shape, jnp.float32) for shape in shapes[:-1]]
    args.append(jax.ShapeDtypeStruct(shapes[-1], jnp.int32))
    temps = {}
    for chunk_size in (64, 128):

        def loss(x, weight, teacher_x, teacher_weight, labels, chunk_size=chunk_size):
            return liger_jax.fused_linear_distillation(
                x, weight, teacher_x, teacher_weight, labels, chunk_size=chunk_size, implementation="xla"
            )

        compiled = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(*args).compile()
        temps[chunk_size] = compiled.memory_analysis().temp_size_in_bytes
        assert temps[chunk_size] <= chunk_size * n_classes * FP32_CHUNK_BYTES_PER_LOGIT + hidden * n_classes * 4
    assert temps[128] > 1.5 * temps[64]


def _call(**overrides):
    (x, weight, _), (teacher_x, teacher_weight, _), labels = _inputs(35, jnp.float32, n_rows=4, n_classes=10)
    arguments = {
        "student_x": x,
        "student_weight": weight,
        "teacher_x": teacher_x,
        "teacher_weight": teacher_weight,
        "labels": labels,
    }
    arguments |= {k: v for k, v in overrides.items() if k in arguments}
    options = {k: v for k, v in overrides.items() if k not in arguments}
    return liger_jax.fused_linear_distillation(**arguments, implementation=harness.KERNEL_IMPLEMENTATION, **options)


@pytest.mark.parametrize(
    ("overrides", "error", "match"),
    [
        ({"divergence": "js"}, ValueError, "divergence must be one of"),
        ({"beta": 1.5}, ValueError, r"beta must be in \[0, 1\]"),
        ({"temperature": 0.0}, ValueError, "temperature must be a finite number > 0"),
        ({"weight_soft_loss": float("nan")}, ValueError, "weight_soft_loss must be a finite number"),
        ({"teacher_weight": jnp.ones((HT, 11), jnp.float32)}, ValueError, "teacher_weight must have the student's"),
        ({"teacher_x": jnp.ones((5, HT), jnp.float32)}, ValueError, r"teacher_x must have shape \(4, 12\)"),
        ({"student_weight": jnp.ones((HS + 1, 10), jnp.float32)}, ValueError, r"student_weight must have shape"),
        ({"labels": jnp.array([0, 1, 10, -100])}, ValueError, r"labels must be in \[0, 10\)"),
        ({"labels": jnp.zeros(4, jnp.float32)}, TypeError, "labels must have an integer dtype"),
        ({"student_bias": jnp.ones(9, jnp.float32)}, ValueError, r"student_bias must have shape \(10,\)"),
        ({"teacher_x": jnp.ones((4, HT), jnp.int32)}, TypeError, "teacher_x must have a float dtype"),
        ({"ignore_index": 1.5}, TypeError, "ignore_index must be an int"),
        ({"weight_layout": "hd"}, ValueError, "weight_layout"),
        ({"accum_dtype": jnp.int32}, TypeError, "accum_dtype must be a floating dtype"),
    ],
)
def test_bad_arguments_raise_clear_errors(overrides, error, match):
    with pytest.raises(error, match=match):
        _call(**overrides)


def test_flax_modules_compute_the_ops_on_their_heads():
    from flax import nnx

    from liger_jax.flax_layers import linen as liger_linen
    from liger_jax.flax_layers import nnx as liger_nnx

    (x, _, _), (teacher_x, _, _), labels = _inputs(36, jnp.float32, n_rows=6)
    student, teacher = nnx.Linear(HS, V, rngs=nnx.Rngs(0)), nnx.Linear(HT, V, rngs=nnx.Rngs(1))
    heads = (student.kernel[...], teacher.kernel[...])
    biases = {"student_bias": student.bias[...], "teacher_bias": teacher.bias[...]}
    options = {"divergence": "kl", "temperature": 2.0, "return_soft_hard_loss": True, "implementation": "xla"}
    got = liger_nnx.FusedLinearDistillationLoss(**options)(student, x, teacher, teacher_x, labels)
    expected = liger_jax.fused_linear_distillation(x, heads[0], teacher_x, heads[1], labels, **biases, **options)
    harness.assert_close_trees(got, expected, jnp.float32)
    got = liger_nnx.FusedLinearJSD(beta=0.2, implementation="xla")(student, x, teacher, teacher_x, labels)
    expected = liger_jax.fused_linear_jsd(
        x, heads[0], teacher_x, heads[1], labels, beta=0.2, implementation="xla", **biases
    )
    harness.assert_close(got, expected, jnp.float32)
    with pytest.raises(ValueError, match="both be nnx.Linear or both nnx.Embed"):
        liger_nnx.FusedLinearJSD()(student, x, nnx.Embed(V, HT, rngs=nnx.Rngs(2)), teacher_x, labels)
    # linen: the student's head is the module's own nn.Dense-like params; the teacher's comes in at call time.
    for module, kwargs in (
        (liger_linen.FusedLinearDistillationLoss(V, use_bias=False, **options), options),
        (liger_linen.FusedLinearJSD(V, use_bias=False, beta=0.2, implementation="xla"), {"beta": 0.2}),
    ):
        got, variables = module.init_with_output(jax.random.key(3), x, teacher_x, heads[1], labels)
        op = liger_jax.fused_linear_distillation if "divergence" in kwargs else liger_jax.fused_linear_jsd
        kernel = variables["params"]["kernel"]
        expected = op(x, kernel, teacher_x, heads[1], labels, **({"implementation": "xla"} | kwargs))
        harness.assert_close_trees(got, expected, jnp.float32)
