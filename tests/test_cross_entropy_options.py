"""Liger's further cross-entropy options on cross_entropy and fused_linear_cross_entropy: class weights
(``ce_weight``), token scaling, token accuracy and predicted tokens, against a float64 closed form written from the
definitions, with their edge cases and argument checks.

Small shapes as in ``test_cross_entropy_math.py``: 7 classes make every 1/V term count, 300 classes span two
interpreter blocks (the online softmax, the running argmax and the partial last block).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn
from flax import nnx
from jax.test_util import check_grads

import liger_jax
from liger_jax.flax_layers import linen as liger_linen
from liger_jax.flax_layers import nnx as liger_nnx
from tests import harness
from tests.collectives import assert_only_small_all_reduces, compiled_collectives, mesh, place

SMOOTHING, Z_LOSS, SOFTCAP = 0.4, 0.2, 1.5
OPTIONS = {
    "weight": {"weighted": True},
    "weight_smoothing": {"weighted": True, "label_smoothing": SMOOTHING},
    "weight_all": {"weighted": True, "label_smoothing": SMOOTHING, "z_loss_scale": Z_LOSS, "softcap": SOFTCAP},
    "token_scaling": {"use_token_scaling": True, "z_loss_scale": Z_LOSS},
    "everything": {
        "weighted": True,
        "use_token_scaling": True,
        "label_smoothing": SMOOTHING,
        "z_loss_scale": Z_LOSS,
        "softcap": SOFTCAP,
    },
}
SHAPES = [(6, 7), (3, 300)]


def _logits(seed, shape):
    return jnp.asarray(2.0 * np.random.default_rng(seed).standard_normal(shape), jnp.float32)


def _labels(shape, ignore_index=-100):
    """Labels that include the first and last class and one ignored row."""
    n_rows, n_classes = shape
    labels = np.random.default_rng(n_rows * n_classes).integers(0, n_classes, n_rows)
    labels[0], labels[1], labels[-1] = 0, n_classes - 1, ignore_index
    return jnp.asarray(labels, jnp.int32)


def _class_weight(n_classes, seed=7):
    return jnp.asarray(np.random.default_rng(seed).uniform(0.25, 2.0, n_classes), jnp.float32)


def closed_form(logits, labels, weight=None, label_smoothing=0.0, z_loss_scale=0.0, softcap=None, token_scaling=False):
    """Per-row ``(cross-entropy part, z-loss, d(ce)/dz, d(z)/dz)`` in float64 numpy, from the definitions.

    ce = p_y^t ((1 - α) w_y (lse - c_y) + (α / V) Σ_j w_j (lse - c_j)) and z = p_y^t λ lse² (t = 1 with token
    scaling, p_y held constant), with c = s tanh(z / s), p = softmax(c), w = 1 without weights. Ignored rows
    (label -100) give zeros.
    """
    z = np.asarray(logits, np.float64)
    labels = np.asarray(labels)
    n_classes = z.shape[-1]
    w = np.ones(n_classes) if weight is None else np.asarray(weight, np.float64)
    c = z if softcap is None else softcap * np.tanh(z / softcap)
    dc_dz = np.ones_like(z) if softcap is None else 1.0 - np.tanh(z / softcap) ** 2
    shift = c.max(axis=-1, keepdims=True)
    lse = (shift + np.log(np.exp(c - shift).sum(axis=-1, keepdims=True)))[..., 0]
    p = np.exp(c - lse[..., None])
    kept = labels != -100
    safe = np.where(kept, labels, 0)
    target = np.take_along_axis(c, safe[..., None], axis=-1)[..., 0]
    w_y = w[safe]
    alpha = label_smoothing
    ce = (1 - alpha) * w_y * (lse - target) + alpha / n_classes * (w * (lse[..., None] - c)).sum(axis=-1)
    z_loss = z_loss_scale * lse**2
    one_hot = np.arange(n_classes) == safe[..., None]
    dce = (1 - alpha) * w_y[..., None] * (p - one_hot) + alpha / n_classes * (w.sum() * p - w)
    dz = 2 * z_loss_scale * lse[..., None] * p
    scale = np.exp(target - lse) if token_scaling else np.ones_like(lse)
    rows = (scale * ce, scale * z_loss)
    grads = (scale[..., None] * dce * dc_dz, scale[..., None] * dz * dc_dz)
    return tuple(np.where(kept, r, 0.0) for r in rows) + tuple(np.where(kept[..., None], g, 0.0) for g in grads)


def _assert_close(actual, expected, rtol=2e-5):
    """fp32 results against float64 ones, relative to the largest expected magnitude for elements near zero."""
    expected = np.asarray(expected, np.float64)
    atol = rtol * max(np.abs(expected).max(), 1e-30)
    np.testing.assert_allclose(np.asarray(actual, np.float64), expected, rtol=rtol, atol=atol)


def _op_options(shape, name):
    """``(cross_entropy keywords, closed_form keywords)`` of an OPTIONS entry."""
    options = dict(OPTIONS[name])
    weight = _class_weight(shape[-1]) if options.pop("weighted", False) else None
    token_scaling = options.pop("use_token_scaling", False)
    return (
        {**options, "ce_weight": weight, "use_token_scaling": token_scaling},
        {**options, "weight": weight, "token_scaling": token_scaling},
    )


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("name", OPTIONS)
def test_per_row_losses_and_gradients_match_the_closed_form(implementation, shape, name):
    op_options, form_options = _op_options(shape, name)
    logits, labels = _logits(1, shape), _labels(shape)
    cotangent = jnp.asarray(np.random.default_rng(2).uniform(0.5, 2.0, shape[0]), jnp.float32)
    (loss, z_loss), (dlogits,) = harness.vjp_under_jit(
        lambda logits: liger_jax.cross_entropy(
            logits, labels, reduction="none", return_z_loss=True, implementation=implementation, **op_options
        ),
        (logits,),
        (cotangent, jnp.zeros_like(cotangent)),
    )
    ce, z, dce, dz = closed_form(logits, labels, **form_options)
    _assert_close(loss, ce + z)
    _assert_close(z_loss, z)
    _assert_close(dlogits, np.asarray(cotangent)[:, None] * (dce + dz))


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
@pytest.mark.parametrize("name", ["weight_all", "everything"])
def test_weighted_mean_divides_the_cross_entropy_by_the_kept_weights_and_the_z_loss_by_the_kept_rows(
    implementation, name
):
    shape = (6, 7)
    op_options, form_options = _op_options(shape, name)
    logits, labels = _logits(4, shape), _labels(shape)
    loss, (dlogits,) = harness.vjp_under_jit(
        lambda logits: liger_jax.cross_entropy(logits, labels, implementation=implementation, **op_options),
        (logits,),
        jnp.float32(1.5),
    )
    ce, z, dce, dz = closed_form(logits, labels, **form_options)
    kept = np.asarray(labels) != -100
    weight_total = np.asarray(form_options["weight"], np.float64)[np.asarray(labels)[kept]].sum()
    _assert_close(loss, ce.sum() / weight_total + z.sum() / kept.sum())
    _assert_close(dlogits, 1.5 * (dce / weight_total + dz / kept.sum()))


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
@pytest.mark.parametrize("name", ["weight", "weight_smoothing"])
def test_weighted_gradient_rows_sum_to_zero(implementation, name):
    # Σ_j [(1 - α) w_y (p_j - [j = y]) + (α / V)(W p_j - w_j)] = 0: no softcap, no z-loss.
    shape = (3, 300)
    op_options, _ = _op_options(shape, name)
    logits, labels = _logits(3, shape), _labels(shape)
    _, (grad,) = harness.vjp_under_jit(
        lambda logits: liger_jax.cross_entropy(
            logits, labels, reduction="sum", implementation=implementation, **op_options
        ),
        (logits,),
        jnp.float32(1.0),
    )
    np.testing.assert_allclose(np.sum(np.asarray(grad, np.float64), axis=-1), 0.0, atol=2e-6)


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
def test_unit_class_weights_are_the_unweighted_loss(implementation):
    shape = (6, 7)
    logits, labels = _logits(5, shape), _labels(shape)
    options = {"label_smoothing": SMOOTHING, "softcap": SOFTCAP, "implementation": implementation}
    ones = jnp.ones(shape[-1], jnp.float32)
    weighted, (weighted_grad,) = harness.vjp_under_jit(
        lambda x: liger_jax.cross_entropy(x, labels, ce_weight=ones, **options), (logits,), jnp.float32(1.0)
    )
    plain, (plain_grad,) = harness.vjp_under_jit(
        lambda x: liger_jax.cross_entropy(x, labels, **options), (logits,), jnp.float32(1.0)
    )
    _assert_close(weighted, plain)
    _assert_close(weighted_grad, plain_grad)


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
def test_a_zero_class_weight_zeroes_its_rows_and_all_zero_weights_give_a_zero_mean(implementation):
    shape = (6, 7)
    logits, labels = _logits(6, shape), _labels(shape)
    weight = _class_weight(shape[-1]).at[0].set(0.0)  # row 0's label is class 0

    def loss(logits, weight, reduction):
        return liger_jax.cross_entropy(
            logits, labels, ce_weight=weight, reduction=reduction, implementation=implementation
        )

    rows, (dlogits,) = harness.vjp_under_jit(lambda x: loss(x, weight, "none"), (logits,), jnp.ones(6, jnp.float32))
    assert rows[0] == 0.0 and rows[1] > 0.0
    np.testing.assert_array_equal(np.asarray(dlogits[0]), 0.0)
    # Every non-ignored label weighs 0 (the weight sits on the ignored row's classes only): a defined 0, no NaN.
    kept_classes = np.unique(np.asarray(labels)[np.asarray(labels) != -100])
    zero_on_kept = jnp.ones(shape[-1], jnp.float32).at[kept_classes].set(0.0)
    mean, (dmean,) = harness.vjp_under_jit(lambda x: loss(x, zero_on_kept, "mean"), (logits,), jnp.float32(1.0))
    assert mean == 0.0
    np.testing.assert_array_equal(np.asarray(dmean), 0.0)


@pytest.mark.parametrize("name", ["weight_all", "everything"])
def test_xla_gradients_by_finite_differences_in_float64(name):
    shape = (4, 7)
    op_options, _ = _op_options(shape, name)
    # Token scaling holds p_y constant in the gradient, which finite differences do not: check it at t = 1 only.
    op_options["use_token_scaling"] = False
    logits, labels = jnp.asarray(_logits(8, shape), jnp.float64), _labels(shape)
    op_options["ce_weight"] = jnp.asarray(op_options["ce_weight"], jnp.float64)

    def loss(logits):
        return liger_jax.cross_entropy(logits, labels, implementation="xla", **op_options)

    check_grads(jax.jit(loss), (logits,), order=1, modes=["rev"], atol=1e-7, rtol=1e-7, eps=1e-4)


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=lambda d: jnp.dtype(d).name)
def test_weighted_loss_in_each_dtype_matches_the_float64_reference(implementation, dtype):
    shape = (5, 300)
    logits, labels = _logits(9, shape).astype(dtype), _labels(shape)
    weight = _class_weight(shape[-1])
    options = {"ce_weight": weight, "label_smoothing": SMOOTHING, "z_loss_scale": Z_LOSS}
    actual, (grad,) = harness.vjp_under_jit(
        lambda x: liger_jax.cross_entropy(x, labels, implementation=implementation, **options),
        (logits,),
        jnp.float32(1.0),
    )
    expected, (expected_grad,) = harness.vjp_under_jit(
        lambda x: liger_jax.cross_entropy_reference(x, labels, **options), harness.as_float64(logits), jnp.float64(1.0)
    )
    harness.assert_close(actual, expected, jnp.float32)
    assert grad.dtype == dtype
    harness.assert_close(grad, expected_grad, dtype)


def _tied_logits():
    """Rows of 300 classes with ties: inside a block (3, 40), across the two blocks (10, 270), a later block's
    larger value (260 beats 5), and all-equal logits."""
    logits = np.array(_logits(10, (5, 300)))
    logits[0, [3, 40]] = 9.0
    logits[1, [10, 270]] = 9.0
    logits[2, 5], logits[2, 260] = 9.0, 9.5
    logits[3] = 0.25
    return jnp.asarray(logits)


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_predicted_tokens_are_the_first_argmax_and_accuracy_their_agreement(implementation, reduction):
    logits = _tied_logits()
    labels = jnp.asarray([3, 270, 260, 0, -100], jnp.int32)
    loss, z_loss, accuracy, predicted = liger_jax.cross_entropy(
        logits,
        labels,
        reduction=reduction,
        return_z_loss=True,
        return_token_accuracy=True,
        return_predicted_tokens=True,
        implementation=implementation,
    )
    np.testing.assert_array_equal(predicted, [3, 10, 260, 0, -1])
    assert predicted.dtype == jnp.int32
    correct = np.asarray([1.0, 0.0, 1.0, 1.0, 0.0])
    np.testing.assert_array_equal(accuracy, correct if reduction == "none" else correct.sum() / 4)
    _assert_close(loss, liger_jax.cross_entropy_reference(logits, labels, reduction=reduction))


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
def test_predicted_tokens_follow_the_softcapped_logits_and_carry_no_gradient(implementation):
    shape = (6, 7)
    logits, labels = _logits(11, shape), _labels(shape)
    softcapped = SOFTCAP * np.tanh(np.asarray(logits, np.float64) / SOFTCAP)
    expected = np.where(np.asarray(labels) == -100, -1, softcapped.argmax(axis=-1))

    def loss(logits):
        loss, predicted = liger_jax.cross_entropy(
            logits, labels, softcap=SOFTCAP, return_predicted_tokens=True, implementation=implementation
        )
        return loss, predicted

    (_, predicted), grad = jax.jit(jax.value_and_grad(loss, has_aux=True))(logits)
    np.testing.assert_array_equal(predicted, expected)
    _assert_close(grad, jax.grad(lambda x: liger_jax.cross_entropy_reference(x, labels, softcap=SOFTCAP))(logits))


def test_all_rows_ignored_give_zero_accuracy():
    logits = _logits(12, (3, 7))
    labels = jnp.full((3,), -100, jnp.int32)
    _, accuracy = liger_jax.cross_entropy(logits, labels, return_token_accuracy=True, implementation="xla")
    assert accuracy == 0.0


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
@pytest.mark.parametrize("name", ["weight_all", "everything"])
@pytest.mark.parametrize("reduction", ["mean", "none"])
@pytest.mark.usefixtures("full_precision_matmuls")
def test_fused_linear_cross_entropy_matches_cross_entropy_on_the_logits(implementation, name, reduction):
    n_rows, hidden, n_classes = 7, 12, 300
    op_options, _ = _op_options((n_rows, n_classes), name)
    rng = np.random.default_rng(13)
    x = jnp.asarray(rng.standard_normal((n_rows, hidden)), jnp.float32)
    weight = jnp.asarray(rng.standard_normal((hidden, n_classes)) / 2, jnp.float32)
    labels = jnp.asarray(np.asarray(_labels((n_rows, n_classes))), jnp.int32)
    flags = {"return_z_loss": True, "return_token_accuracy": True, "return_predicted_tokens": True}
    cotangent = jnp.float32(1.25) if reduction == "mean" else jnp.linspace(0.5, 1.5, n_rows, dtype=jnp.float32)

    def fused(x, weight):
        return liger_jax.fused_linear_cross_entropy(
            x, weight, labels, reduction=reduction, chunk_size=3, implementation=implementation, **op_options, **flags
        )

    def unfused(x, weight):
        return liger_jax.cross_entropy_reference(x @ weight, labels, reduction=reduction, **op_options, **flags)

    def first_with_grads(op):
        return harness.vjp_under_jit(lambda x, w: op(x, w)[0], (x, weight), cotangent)

    actual, expected = fused(x, weight), unfused(x, weight)
    for got, want in zip(actual[1:], expected[1:], strict=True):
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-6)
    (loss, grads), (expected_loss, expected_grads) = first_with_grads(fused), first_with_grads(unfused)
    _assert_close(loss, expected_loss, rtol=5e-5)
    for got, want in zip(grads, expected_grads, strict=True):
        _assert_close(got, want, rtol=5e-5)


@pytest.mark.parametrize(
    ("error", "match", "kwargs"),
    [
        (ValueError, r"ce_weight must have shape \(7,\)", {"ce_weight": jnp.ones(6)}),
        (TypeError, "ce_weight must have a float dtype", {"ce_weight": jnp.ones(7, jnp.int32)}),
        (
            ValueError,
            r"ce_weight must be finite and >= 0; got -1.0 at index \(2,\)",
            {"ce_weight": jnp.ones(7).at[2].set(-1)},
        ),
        (ValueError, "ce_weight must be finite", {"ce_weight": jnp.ones(7).at[4].set(jnp.nan)}),
        (TypeError, "return_token_accuracy must be True or False", {"return_token_accuracy": 1}),
        (TypeError, "return_predicted_tokens must be True or False", {"return_predicted_tokens": "yes"}),
        (TypeError, "use_token_scaling must be True or False", {"use_token_scaling": None}),
    ],
)
@pytest.mark.parametrize("op", ["cross_entropy", "fused_linear_cross_entropy"])
def test_bad_options_are_rejected_naming_the_argument(op, error, match, kwargs):
    labels = jnp.zeros((3,), jnp.int32)
    with pytest.raises(error, match=match):
        if op == "cross_entropy":
            liger_jax.cross_entropy(jnp.ones((3, 7)), labels, implementation="xla", **kwargs)
        else:
            liger_jax.fused_linear_cross_entropy(
                jnp.ones((3, 4)), jnp.ones((4, 7)), labels, implementation="xla", **kwargs
            )


def test_flax_loss_modules_take_the_options_and_the_class_weight_at_call_time():
    n_rows, hidden, n_classes = 5, 8, 7
    x = jnp.asarray(np.random.default_rng(14).standard_normal((n_rows, hidden)), jnp.float32)
    labels = _labels((n_rows, n_classes))
    weight = _class_weight(n_classes)
    options = {"use_token_scaling": True, "return_token_accuracy": True, "return_predicted_tokens": True}
    head = nnx.Linear(hidden, n_classes, rngs=nnx.Rngs(0))
    expected = liger_jax.cross_entropy_reference(head(x), labels, ce_weight=weight, **options)
    modules = [
        liger_nnx.CrossEntropyLoss(implementation="xla", **options)(head(x), labels, ce_weight=weight),
        liger_nnx.FusedLinearCrossEntropy(implementation="xla", **options)(head, x, labels, ce_weight=weight),
    ]
    dense = nn.Dense(n_classes)
    params = dense.init(jax.random.key(0), x)
    linen_logits = dense.apply(params, x)
    linen_expected = liger_jax.cross_entropy_reference(linen_logits, labels, ce_weight=weight, **options)
    linen_fused = liger_linen.FusedLinearCrossEntropy(n_classes, implementation="xla", **options)
    linen_loss = liger_linen.CrossEntropyLoss(implementation="xla", **options)
    for actual in modules:
        for got, want in zip(actual, expected, strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    for actual in (
        linen_loss.apply({}, linen_logits, labels, ce_weight=weight),
        linen_fused.apply(params, x, labels, ce_weight=weight),
    ):
        for got, want in zip(actual, linen_expected, strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("name", ["plain", "everything"])
def test_vocab_sharded_cross_entropy_keeps_the_logits_sharded(name):
    mesh_ = mesh((2, 4), ("dp", "tp"))
    shape = (4, 6, 96)
    op_options, _ = _op_options(shape, name) if name != "plain" else ({}, {})
    logits = harness.random_normal(15, shape, jnp.float32, scale=2.0)
    labels = jnp.asarray(np.random.default_rng(16).integers(0, shape[-1], shape[:-1]), jnp.int32).at[1, 2:4].set(-100)
    flags = {"return_token_accuracy": True, "return_predicted_tokens": True}

    @jax.jit
    def program(logits, labels, ce_weight):
        def loss(logits):
            options = {**op_options, "ce_weight": ce_weight, **flags}
            loss, *extras = liger_jax.cross_entropy(
                logits, labels, implementation=harness.KERNEL_IMPLEMENTATION, **options
            )
            return loss, extras

        return jax.value_and_grad(loss, has_aux=True)(logits)

    weight = op_options.get("ce_weight")
    (expected_loss, expected_extras), expected_grad = program(logits, labels, weight)
    sharded = (place(logits, mesh_, "dp", None, "tp"), place(labels, mesh_, "dp"))
    sharded += (None if weight is None else place(weight, mesh_, "tp"),)
    (loss, extras), grad = program(*sharded)
    np.testing.assert_allclose(loss, expected_loss, rtol=1e-5, atol=1e-6)
    for got, want in zip(extras, expected_extras, strict=True):
        np.testing.assert_array_equal(got, want)
    np.testing.assert_allclose(grad, expected_grad, rtol=1e-5, atol=1e-7)
    assert grad.sharding.is_equivalent_to(sharded[0].sharding, 3)
    # Only all-reduces of a few fp32 statistics per row (and the weights' sums), far below one device's block of
    # logits (1152 bytes): the logits are never gathered.
    per_device_rows = shape[0] * shape[1] // 2
    assert_only_small_all_reduces(compiled_collectives(program, *sharded), 4 * 4 * per_device_rows)


def test_vocab_parallel_fused_linear_cross_entropy_takes_every_option():
    mesh_ = mesh((2, 4), ("dp", "tp"))
    n_rows, hidden, n_classes = 16, 8, 96
    op_options, _ = _op_options((n_rows, n_classes), "everything")
    x = harness.random_normal(17, (n_rows, hidden), jnp.float32)
    weight = harness.random_normal(18, (hidden, n_classes), jnp.float32, scale=0.5)
    labels = jnp.asarray(np.random.default_rng(19).integers(0, n_classes, n_rows), jnp.int32).at[3].set(-100)
    flags = {"return_token_accuracy": True, "return_predicted_tokens": True}

    @jax.jit
    def program(x, weight, labels, ce_weight):
        def loss(x, weight):
            options = {**op_options, "ce_weight": ce_weight, **flags}
            loss, *extras = liger_jax.fused_linear_cross_entropy(
                x, weight, labels, chunk_size=4, implementation=harness.KERNEL_IMPLEMENTATION, **options
            )
            return loss, extras

        return jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)(x, weight)

    (expected_loss, expected_extras), expected_grads = program(x, weight, labels, op_options["ce_weight"])
    sharded = (place(x, mesh_, "dp"), place(weight, mesh_, None, "tp"), place(labels, mesh_, "dp"))
    (loss, extras), grads = program(*sharded, place(op_options["ce_weight"], mesh_, "tp"))
    np.testing.assert_allclose(loss, expected_loss, rtol=1e-5, atol=1e-6)
    for got, want in zip(extras, expected_extras, strict=True):
        np.testing.assert_array_equal(got, want)
    for got, want in zip(grads, expected_grads, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def _scaled_closed_form(x, weight, target, temperature):
    """Per-row (nll, entropy) of ``softmax(x Wᵀ / T)`` in float64 numpy; 0 where the target is -100."""
    z = np.asarray(x, np.float64) @ np.asarray(weight, np.float64).T / temperature
    lse = np.log(np.exp(z - z.max(-1, keepdims=True)).sum(-1)) + z.max(-1)
    p = np.exp(z - lse[:, None])
    target = np.asarray(target)
    kept = target != -100
    nll = lse - np.take_along_axis(z, np.where(kept, target, 0)[:, None], -1)[:, 0]
    entropy = lse - (p * z).sum(-1)
    return np.where(kept, nll, 0.0), np.where(kept, entropy, 0.0)


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
@pytest.mark.usefixtures("full_precision_matmuls")
def test_fused_linear_scaled_cross_entropy_is_the_temperature_scaled_nll_and_entropy(implementation):
    n_rows, hidden, n_classes, temperature = 9, 12, 300, 0.7
    x = harness.random_normal(20, (n_rows, hidden), jnp.float32)
    weight = harness.random_normal(21, (n_classes, hidden), jnp.float32, scale=0.5)  # Liger's [V, H]
    target = jnp.asarray(np.random.default_rng(22).integers(0, n_classes, n_rows), jnp.int32).at[4].set(-100)
    cotangents = (jnp.linspace(0.5, 1.5, n_rows, dtype=jnp.float32), jnp.linspace(-1.0, 1.0, n_rows, dtype=jnp.float32))

    def op(fn, **options):
        def run(x, weight):
            return fn(x, weight, target, temperature=temperature, return_entropy=True, **options)

        return harness.vjp_under_jit(run, (x, weight), cotangents)

    (nll, entropy), grads = op(liger_jax.fused_linear_scaled_cross_entropy, chunk_size=4, implementation=implementation)
    expected_nll, expected_entropy = _scaled_closed_form(x, weight, target, temperature)
    _assert_close(nll, expected_nll)
    _assert_close(entropy, expected_entropy)
    assert nll[4] == 0.0 and entropy[4] == 0.0
    (_, _), expected_grads = op(liger_jax.fused_linear_scaled_cross_entropy_reference)
    for got, want in zip(grads, expected_grads, strict=True):
        _assert_close(got, want, rtol=5e-5)
    # The ignored row has no gradient: dx of row 4 is 0.
    np.testing.assert_array_equal(np.asarray(grads[0][4]), 0.0)
