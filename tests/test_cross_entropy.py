"""cross_entropy: every implementation against the float64 reference (values and gradients), and the reference
against optax."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.test_util import check_grads

import liger_jax
from tests import harness

REDUCTIONS = ["mean", "sum", "none"]
# The options that change the math, alone and together; the last also moves ignore_index inside [0, V).
OPTIONS = [
    {},
    {"label_smoothing": 0.1},
    {"z_loss_scale": 1e-2, "softcap": 4.0},
    {"label_smoothing": 0.2, "z_loss_scale": 1e-3, "softcap": 8.0, "ignore_index": 5},
]
# Every option set with every reduction in bf16; fp32 and fp16 with every option set, reductions in turn.
CASES = (
    [(jnp.bfloat16, options, reduction) for options in OPTIONS for reduction in REDUCTIONS]
    + [(jnp.float32, options, REDUCTIONS[i % 3]) for i, options in enumerate(OPTIONS)]
    + [(jnp.float16, options, REDUCTIONS[(i + 1) % 3]) for i, options in enumerate(OPTIONS)]
)
# (rows..., V): one row, V not a multiple of the interpreter's 256-class block, 3-D, a single class, rank 1.
SHAPES = [(1, 64), (37, 300), (2, 9, 520), (4, 1), (50,)]


def _case_id(value):
    if isinstance(value, dict):
        return "-".join(value) or "plain"
    return jnp.dtype(value).name if not isinstance(value, str) else value


def _normal(seed, shape, dtype, scale=1.0):
    """Standard-normal draws times ``scale``, rounded to ``dtype`` (numpy: no XLA compile per shape)."""
    return jnp.asarray((scale * np.random.default_rng(seed).standard_normal(shape)).astype(dtype))


def _labels(seed, shape, n_classes, ignore_index=-100, ignored_fraction=0.25):
    """Random labels in [0, V) with about ``ignored_fraction`` of them set to ``ignore_index``."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, n_classes, shape)
    return jnp.asarray(np.where(rng.random(shape) < ignored_fraction, ignore_index, labels), jnp.int32)


def _inputs(seed, shape, dtype, ignore_index=-100):
    return _normal(seed, shape, dtype, scale=3.0), _labels(seed + 1, shape[:-1], shape[-1], ignore_index)


def _cotangent(seed, reduction, labels):
    """A cotangent ≠ 1: per-row for "none"; for "mean" scaled by the row count so gradients are O(1)."""
    if reduction == "none":
        return _normal(seed, labels.shape, jnp.float32)
    return jnp.float32(1.7 * (labels.size if reduction == "mean" else 1))


def _assert_vjp_matches(op, reference, logits, cotangent, dtype):
    """Losses at fp32 tolerance (the kernels compute them in fp32), gradients at ``dtype``'s."""
    loss, (dlogits,) = harness.vjp_under_jit(op, (logits,), cotangent)
    expected_loss, (expected_dlogits,) = harness.vjp_under_jit(
        reference, (jnp.asarray(logits, jnp.float64),), jnp.asarray(cotangent, jnp.float64)
    )
    chex.assert_type([loss, dlogits], [jnp.float32, dtype])
    harness.assert_all_finite(loss, dlogits)
    harness.assert_close(loss, expected_loss, jnp.float32)
    harness.assert_close(dlogits, expected_dlogits, dtype)


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
@pytest.mark.parametrize(("dtype", "options", "reduction"), CASES, ids=_case_id)
def test_losses_and_gradients_match_float64_reference(implementation, dtype, options, reduction):
    logits, labels = _inputs(OPTIONS.index(options), (37, 300), dtype, options.get("ignore_index", -100))
    kwargs = options | {"reduction": reduction}
    _assert_vjp_matches(
        lambda logits: liger_jax.cross_entropy(logits, labels, implementation=implementation, **kwargs),
        lambda logits: liger_jax.cross_entropy_reference(logits, labels, **kwargs),
        logits,
        _cotangent(7, reduction, labels),
        dtype,
    )


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
@pytest.mark.parametrize("shape", SHAPES)
def test_shapes(implementation, shape):
    logits, labels = _inputs(len(shape), shape, jnp.float32)
    _assert_vjp_matches(
        lambda logits: liger_jax.cross_entropy(logits, labels, reduction="none", implementation=implementation),
        lambda logits: liger_jax.cross_entropy_reference(logits, labels, reduction="none"),
        logits,
        _normal(3, shape[:-1], jnp.float32),
        jnp.float32,
    )


@pytest.mark.parametrize("options", [{}, OPTIONS[-1]], ids=["plain", "all-options"])
def test_vocabulary_of_several_gpu_blocks(options):
    # 40000 classes span two of the GPU kernel's 32768-class blocks (and 157 of the interpreter's).
    logits, labels = _inputs(11, (3, 40000), jnp.bfloat16, options.get("ignore_index", -100))
    # Row 0 has its whole first block masked to -inf (as a model masks disallowed tokens) and its label after it.
    logits = logits.at[0, :32768].set(-jnp.inf)
    labels = labels.at[0].set(39999)
    _assert_vjp_matches(
        lambda logits: liger_jax.cross_entropy(logits, labels, implementation=harness.KERNEL_IMPLEMENTATION, **options),
        lambda logits: liger_jax.cross_entropy_reference(logits, labels, **options),
        logits,
        jnp.float32(3.0),
        jnp.bfloat16,
    )


def test_reference_matches_optax():
    logits, labels = _inputs(12, (23, 50), jnp.float64, ignore_index=-1)
    labels = jnp.abs(labels)  # optax has no ignore_index
    plain = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
    np.testing.assert_allclose(liger_jax.cross_entropy_reference(logits, labels, reduction="none"), plain, rtol=1e-12)
    smoothed = optax.softmax_cross_entropy(logits, optax.smooth_labels(jax.nn.one_hot(labels, 50), 0.3))
    np.testing.assert_allclose(
        liger_jax.cross_entropy_reference(logits, labels, label_smoothing=0.3, reduction="none"), smoothed, rtol=1e-12
    )


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_all_rows_ignored_gives_zero_loss_and_gradient(implementation, reduction):
    logits = _normal(13, (6, 40), jnp.float32)
    labels = jnp.full((6,), -100)
    loss, (dlogits,) = harness.vjp_under_jit(
        lambda logits: liger_jax.cross_entropy(logits, labels, reduction=reduction, implementation=implementation),
        (logits,),
        jnp.ones((6,) if reduction == "none" else (), jnp.float32),
    )
    np.testing.assert_array_equal(loss, 0.0)
    np.testing.assert_array_equal(dlogits, 0.0)


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_return_z_loss_is_the_reduced_z_loss_without_its_own_gradient(implementation, reduction):
    logits, labels = _inputs(14, (19, 70), jnp.float32)
    kwargs = {"z_loss_scale": 1e-2, "reduction": reduction, "return_z_loss": True}

    @jax.jit
    def losses_and_z_loss_grad(logits):
        def z_loss(logits):
            return jnp.sum(liger_jax.cross_entropy(logits, labels, implementation=implementation, **kwargs)[1])

        return liger_jax.cross_entropy(logits, labels, implementation=implementation, **kwargs), jax.grad(z_loss)(
            logits
        )

    (loss, z_loss), z_loss_grad = losses_and_z_loss_grad(logits)
    expected = jax.jit(lambda logits: liger_jax.cross_entropy_reference(logits, labels, **kwargs))(
        jnp.asarray(logits, jnp.float64)
    )
    harness.assert_close_trees((loss, z_loss), expected, jnp.float32)
    np.testing.assert_array_equal(z_loss_grad, 0.0)


# Every option whose math reads the label (its weight, its logit for token scaling, the z-loss's gradient scale):
# an out-of-range label must leave all of them out of its row's gradient.
_LABEL_OPTIONS = {
    "plain": {},
    "weighted": {
        "ce_weight": 0.5 + jnp.abs(harness.random_normal(17, (30,), jnp.float32)),
        "label_smoothing": 0.1,
        "z_loss_scale": 0.05,
        "use_token_scaling": True,
        "return_z_loss": True,
    },
}


@pytest.mark.parametrize("options", list(_LABEL_OPTIONS))
@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
def test_traced_out_of_range_labels_give_nan_loss_and_zero_gradient(implementation, options):
    kwargs = _LABEL_OPTIONS[options]
    logits, labels = _inputs(15, (8, 30), jnp.float32)
    labels = labels.at[1].set(30).at[2].set(-3).at[3].set(2**20)

    def losses(logits, labels, implementation=implementation):  # labels traced: a concrete one out of range raises
        out = liger_jax.cross_entropy(logits, labels, reduction="none", implementation=implementation, **kwargs)
        return out if isinstance(out, tuple) else (out,)

    @jax.jit
    def losses_and_grads(logits, labels):
        out, pullback = jax.vjp(lambda logits: losses(logits, labels), logits)
        return out, pullback((jnp.ones_like(out[0]), *(jnp.zeros_like(extra) for extra in out[1:])))[0]

    out, dlogits = losses_and_grads(logits, labels)
    for per_row in out:  # the loss, and the z-loss when asked
        assert np.isnan(per_row[1:4]).all()
    np.testing.assert_array_equal(dlogits[1:4], 0.0)
    good = np.r_[0, 4:8]

    @jax.jit
    def reference(logits, labels):
        out = losses(logits, labels, "xla")
        return out, jax.grad(lambda logits: losses(logits, labels, "xla")[0][good].sum())(logits)

    expected, expected_grads = reference(jnp.asarray(logits, jnp.float64), labels)
    harness.assert_close_trees([o[good] for o in out], [e[good] for e in expected], jnp.float32)
    harness.assert_close(dlogits[good], expected_grads[good], jnp.float32)


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
def test_check_grads_fp32(implementation):
    logits, labels = _inputs(16, (5, 24), jnp.float32)
    check_grads(
        jax.jit(
            lambda logits: liger_jax.cross_entropy(logits, labels, label_smoothing=0.1, implementation=implementation)
        ),
        (logits,),
        order=1,
        modes=["rev"],
    )


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
def test_vmap_gives_per_example_losses_and_gradients(implementation):
    logits, labels = _inputs(17, (3, 11, 60), jnp.float32)

    def loss(op):
        return lambda logits, labels: op(logits, labels, label_smoothing=0.1)

    op = jax.jit(
        jax.vmap(
            jax.value_and_grad(loss(lambda *a, **k: liger_jax.cross_entropy(*a, **k, implementation=implementation)))
        )
    )
    expected = jax.jit(jax.vmap(jax.value_and_grad(loss(liger_jax.cross_entropy_reference))))(
        jnp.asarray(logits, jnp.float64), labels
    )
    harness.assert_close_trees(op(logits, labels), expected, jnp.float32)


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
def test_checkpoint_gives_the_same_gradients(implementation):
    logits, labels = _inputs(18, (9, 45), jnp.float32)
    harness.assert_checkpoint_gives_the_same_gradients(
        lambda logits: jnp.sin(liger_jax.cross_entropy(logits, labels, implementation=implementation)), (logits,)
    )


@pytest.mark.skipif(harness.KERNEL_IMPLEMENTATION != "triton", reason="only compiled GPU kernels alias buffers")
def test_gradient_takes_over_the_dead_logits_buffer_in_a_training_step():
    # 4096 × 8192 fp32 logits are 128 MiB; compiled only. The logits of an LM head are dead once the loss has its
    # residuals, so the backward writes the gradient over them: one logits-sized temporary, not two.
    n_rows, hidden, n_classes = 4096, 64, 8192
    x = jnp.zeros((n_rows, hidden), jnp.float32)
    weight = jnp.zeros((hidden, n_classes), jnp.float32)
    labels = jnp.zeros((n_rows,), jnp.int32)

    def loss(x, weight):
        return liger_jax.cross_entropy(x @ weight, labels, implementation="triton")

    compiled = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(x, weight).compile()
    logits_bytes = n_rows * n_classes * 4
    assert compiled.memory_analysis().temp_size_in_bytes < 1.5 * logits_bytes


def test_empty_input_gives_zero_loss():
    logits = jnp.zeros((0, 16), jnp.float32)
    labels = jnp.zeros((0,), jnp.int32)
    assert liger_jax.cross_entropy(logits, labels, implementation=harness.KERNEL_IMPLEMENTATION) == 0.0
    assert liger_jax.cross_entropy(logits, labels, reduction="none").shape == (0,)


@pytest.mark.parametrize(
    ("logits", "labels", "kwargs", "error", "match"),
    [
        ((), (), {}, ValueError, "logits must have at least 1 axes"),
        ((4, 8), (5,), {}, ValueError, r"labels must have shape \(4,\)"),
        ((4, 0), (4,), {}, ValueError, "at least one class"),
        ((4, 8), [0, 1, 8, 2], {}, ValueError, r"labels must be in \[0, 8\).*got 8 at index \(2,\)"),
        ((4, 8), [0, -1, 3, 2], {}, ValueError, "got -1 at index"),
        ((4, 8), [0, 1, 3, 2], {"label_smoothing": 1.5}, ValueError, "label_smoothing"),
        ((4, 8), [0, 1, 3, 2], {"z_loss_scale": -1.0}, ValueError, "z_loss_scale"),
        ((4, 8), [0, 1, 3, 2], {"softcap": 0.0}, ValueError, "softcap"),
        ((4, 8), [0, 1, 3, 2], {"reduction": "avg"}, ValueError, "reduction"),
        ((4, 8), [0, 1, 3, 2], {"ignore_index": 1.0}, TypeError, "ignore_index must be an int"),
        ((4, 8), [0.0, 1.0, 3.0, 2.0], {}, TypeError, "labels must have an integer dtype"),
    ],
)
def test_bad_arguments_raise_clear_errors(logits, labels, kwargs, error, match):
    labels = jnp.asarray(labels) if isinstance(labels, list) else jnp.zeros(labels, jnp.int32)
    with pytest.raises(error, match=match):
        liger_jax.cross_entropy(
            jnp.ones(logits, jnp.float32), labels, implementation=harness.KERNEL_IMPLEMENTATION, **kwargs
        )


def test_integer_logits_raise_type_error():
    with pytest.raises(TypeError, match="logits must have a float dtype"):
        liger_jax.cross_entropy(jnp.ones((2, 8), jnp.int32), jnp.zeros(2, jnp.int32))
