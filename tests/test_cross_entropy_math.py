"""cross_entropy's math, term by term: a float64 closed form of loss and gradient written independently of the
reference, gradient-row identities, finite differences, and the options at their edges.

Small vocabularies make every 1/V term count (the test of ``test_cross_entropy.py`` at V = 300 cannot tell α/V from
α/(V+1)); 300 classes span two of the interpreter's 256-class blocks, so the online softmax is in play. These are
the tests ``tools/mutation.py`` runs first against the cross-entropy kernels and backward rule.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

import liger_jax
from tests import harness

# A softcap below 1: the kernels test softcap > 0, which the options of test_cross_entropy.py (4, 8) cannot tell from
# softcap > 1.
SMOOTHING, Z_LOSS, SOFTCAP = 0.6, 0.3, 0.75
# Options that change the math, alone and together (the last moves ignore_index inside [0, V)).
OPTIONS = {
    "plain": {},
    "smoothing": {"label_smoothing": SMOOTHING},
    "z_loss": {"z_loss_scale": Z_LOSS},
    "softcap": {"softcap": SOFTCAP},
    "all": {"label_smoothing": SMOOTHING, "z_loss_scale": Z_LOSS, "softcap": SOFTCAP, "ignore_index": 2},
}
# (rows, V): a few rows of 7 classes; 300 classes in two interpreter blocks, the second partial.
SHAPES = [(6, 7), (3, 300)]


def _logits(seed, shape):
    return jnp.asarray(2.0 * np.random.default_rng(seed).standard_normal(shape), jnp.float32)


def _labels(shape, ignore_index=-100):
    """Labels that include the first and last class and one ignored row."""
    n_rows, n_classes = shape
    labels = np.random.default_rng(n_rows * n_classes).integers(0, n_classes, n_rows)
    labels[0], labels[1], labels[-1] = 0, n_classes - 1, ignore_index
    return jnp.asarray(labels, jnp.int32)


def closed_form(logits, labels, label_smoothing=0.0, z_loss_scale=0.0, softcap=None, ignore_index=-100):
    """Per-row ``(loss, dloss/dlogits)`` in float64 numpy, from the formulas of the kernels' docstring.

    loss = lse - (1 - α) c_y - (α / V) Σ_j c_j + λ lse² and dloss/dz_j = (p_j (1 + 2 λ lse) - α / V - (1 - α) [j = y])
    · dc_j/dz_j, with c = s tanh(z / s) and p = softmax(c). Ignored rows give 0 and 0.
    """
    z = np.asarray(logits, np.float64)
    labels = np.asarray(labels)
    n_classes = z.shape[-1]
    c = z if softcap is None else softcap * np.tanh(z / softcap)
    dc_dz = np.ones_like(z) if softcap is None else 1.0 - np.tanh(z / softcap) ** 2
    shift = c.max(axis=-1, keepdims=True)
    lse = (shift + np.log(np.exp(c - shift).sum(axis=-1, keepdims=True)))[..., 0]
    p = np.exp(c - lse[..., None])
    kept = labels != ignore_index
    target = np.take_along_axis(c, np.where(kept, labels, 0)[..., None], axis=-1)[..., 0]
    loss = lse - (1 - label_smoothing) * target + z_loss_scale * lse**2
    if label_smoothing:  # without smoothing, logits masked to -inf enter no sum
        loss = loss - label_smoothing * c.mean(axis=-1)
    one_hot = np.arange(n_classes) == np.where(kept, labels, -1)[..., None]
    grad = p * (1 + 2 * z_loss_scale * lse[..., None]) - label_smoothing / n_classes - (1 - label_smoothing) * one_hot
    grad = grad * dc_dz
    return np.where(kept, loss, 0.0), np.where(kept[..., None], grad, 0.0)


def _assert_close(actual, expected, rtol=2e-5):
    """fp32 results against float64 ones, relative to the largest expected magnitude for elements near zero."""
    expected = np.asarray(expected, np.float64)
    np.testing.assert_allclose(np.asarray(actual, np.float64), expected, rtol=rtol, atol=rtol * np.abs(expected).max())


def _losses_and_grads(implementation, logits, labels, cotangent, **options):
    return harness.vjp_under_jit(
        lambda logits: liger_jax.cross_entropy(
            logits, labels, reduction="none", implementation=implementation, **options
        ),
        (logits,),
        cotangent,
    )


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("name", OPTIONS)
def test_losses_and_gradients_match_the_closed_form(implementation, shape, name):
    options = OPTIONS[name]
    logits, labels = _logits(1, shape), _labels(shape, options.get("ignore_index", -100))
    cotangent = jnp.asarray(np.random.default_rng(2).uniform(0.5, 2.0, shape[0]), jnp.float32)
    loss, (dlogits,) = _losses_and_grads(implementation, logits, labels, cotangent, **options)
    expected_loss, expected_grad = closed_form(logits, labels, **options)
    _assert_close(loss, expected_loss)
    _assert_close(dlogits, np.asarray(cotangent)[:, None] * expected_grad)


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("name", ["plain", "smoothing", "z_loss"])
def test_gradient_rows_sum_to_twice_the_z_loss_scale_times_lse(implementation, shape, name):
    # Σ_j dloss/dz_j = (1 + 2λ lse) Σ p - α - (1 - α) = 2λ lse without softcap: 0 without z-loss, whatever α is.
    options = OPTIONS[name]
    logits, labels = _logits(3, shape), _labels(shape)
    loss, (dlogits,) = _losses_and_grads(implementation, logits, labels, jnp.ones(shape[0], jnp.float32), **options)
    lse = jax.nn.logsumexp(jnp.asarray(logits, jnp.float64), axis=-1)
    expected = np.where(np.asarray(labels) == -100, 0.0, 2 * options.get("z_loss_scale", 0.0) * np.asarray(lse))
    np.testing.assert_allclose(np.sum(np.asarray(dlogits, np.float64), axis=-1), expected, atol=1e-5)
    assert np.isfinite(np.asarray(loss)).all()


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_reductions_are_the_mean_over_kept_rows_and_the_sum(implementation, reduction):
    shape = (6, 7)
    options = OPTIONS["all"]
    logits, labels = _logits(4, shape), _labels(shape, options["ignore_index"])
    loss, (dlogits,) = harness.vjp_under_jit(
        lambda logits: liger_jax.cross_entropy(
            logits, labels, reduction=reduction, implementation=implementation, **options
        ),
        (logits,),
        jnp.float32(1.5),
    )
    row_loss, row_grad = closed_form(logits, labels, **options)
    kept = np.sum(np.asarray(labels) != options["ignore_index"])
    scale = 1.0 / kept if reduction == "mean" else 1.0
    _assert_close(loss, scale * row_loss.sum())
    _assert_close(dlogits, 1.5 * scale * row_grad)


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
def test_finite_differences_in_float64(implementation):
    # The kernels compute in fp32: through them, float64 finite differences need steps and tolerances that fp32
    # rounding allows (a loss of ~8 rounds by ~1e-6, so a 1e-4 step would leave ~1% noise in each difference: the
    # step is 1e-2); the XLA path runs in float64 at tight ones.
    shape = (4, 7)
    logits, labels = _logits(5, shape), _labels(shape, OPTIONS["all"]["ignore_index"])
    dtype = jnp.float64 if implementation == "xla" else jnp.float32

    def loss(logits):
        return liger_jax.cross_entropy(
            logits.astype(dtype), labels, reduction="sum", implementation=implementation, **OPTIONS["all"]
        ).astype(jnp.float64)

    if implementation == "xla":
        tolerance = {"atol": 1e-7, "rtol": 1e-7, "eps": 1e-4}
    else:
        tolerance = {"atol": 2e-3, "rtol": 2e-3, "eps": 1e-2}
    check_grads(jax.jit(loss), (jnp.asarray(logits, jnp.float64),), order=1, modes=["rev"], **tolerance)


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
@pytest.mark.parametrize("name", ["plain", "z_loss"])
def test_a_masked_first_block_keeps_losses_and_gradients_finite(implementation, name):
    # Row 0 has its first interpreter block (256 classes) at -inf and its label after it; the softmax shift must
    # not become -inf, and without smoothing no -inf logit enters a sum.
    shape = (3, 300)
    logits, labels = _logits(6, shape), _labels(shape)
    logits = logits.at[0, :256].set(-jnp.inf)
    labels = labels.at[0].set(280)
    loss, (dlogits,) = _losses_and_grads(implementation, logits, labels, jnp.ones(3, jnp.float32), **OPTIONS[name])
    expected_loss, expected_grad = closed_form(logits, labels, **OPTIONS[name])
    _assert_close(loss, expected_loss)
    np.testing.assert_array_equal(np.asarray(dlogits)[0, :256], 0.0)
    _assert_close(dlogits, expected_grad)


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
def test_ignore_index_inside_the_classes_zeroes_exactly_those_rows(implementation):
    shape = (6, 7)
    logits = _logits(7, shape)
    labels = jnp.asarray([3, 0, 3, 6, 3, 1], jnp.int32)
    loss, (dlogits,) = _losses_and_grads(implementation, logits, labels, jnp.ones(6, jnp.float32), ignore_index=3)
    ignored = np.asarray(labels) == 3
    np.testing.assert_array_equal(np.asarray(loss)[ignored], 0.0)
    np.testing.assert_array_equal(np.asarray(dlogits)[ignored], 0.0)
    expected_loss, expected_grad = closed_form(logits, labels, ignore_index=3)
    _assert_close(loss, expected_loss)
    _assert_close(dlogits, expected_grad)


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
def test_fused_linear_cross_entropy_gradients_match_the_closed_form(implementation):
    # fused_linear_cross_entropy takes the loss-and-gradient kernel (one pass) where cross_entropy takes two.
    x = _logits(8, (5, 3))
    weight = _logits(9, (3, 7))
    options = OPTIONS["all"]
    labels = _labels((5, 7), options["ignore_index"])
    cotangent = jnp.asarray(np.random.default_rng(10).uniform(0.5, 2.0, 5), jnp.float32)
    with jax.default_matmul_precision("highest"):
        loss, (dx, dweight) = harness.vjp_under_jit(
            lambda x, weight: liger_jax.fused_linear_cross_entropy(
                x, weight, labels, reduction="none", implementation=implementation, **options
            ),
            (x, weight),
            cotangent,
        )
    logits = np.asarray(x, np.float64) @ np.asarray(weight, np.float64)
    expected_loss, expected_grad = closed_form(logits, labels, **options)
    dlogits = np.asarray(cotangent, np.float64)[:, None] * expected_grad
    _assert_close(loss, expected_loss)
    _assert_close(dx, dlogits @ np.asarray(weight, np.float64).T)
    _assert_close(dweight, np.asarray(x, np.float64).T @ dlogits)


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
@pytest.mark.parametrize("op", ["cross_entropy", "fused_linear_cross_entropy"])
def test_mean_over_a_single_kept_row_is_that_row(implementation, op):
    # The mean divides by max(kept rows, 1): with one kept row, by exactly 1.
    x, weight = _logits(11, (4, 3)), _logits(12, (3, 7))
    labels = jnp.asarray([-100, 5, -100, -100], jnp.int32)
    logits = np.asarray(x, np.float64) @ np.asarray(weight, np.float64)
    if op == "cross_entropy":
        primals, loss_fn = (jnp.asarray(logits, jnp.float32),), liger_jax.cross_entropy
    else:
        primals, loss_fn = (x, weight), liger_jax.fused_linear_cross_entropy
    with jax.default_matmul_precision("highest"):
        loss, grads = harness.vjp_under_jit(
            lambda *primals: loss_fn(*primals, labels, implementation=implementation, **OPTIONS["smoothing"]),
            primals,
            jnp.float32(1.0),
        )
    expected_loss, expected_grad = closed_form(logits, labels, **OPTIONS["smoothing"])
    _assert_close(loss, expected_loss[1])
    expected_grads = (expected_grad,) if op == "cross_entropy" else (expected_grad @ np.asarray(weight).T,)
    _assert_close(grads[0], expected_grads[0])


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
def test_fused_linear_cross_entropy_under_vmap_is_per_example(implementation):
    x, weight = _logits(13, (2, 5, 3)), _logits(14, (3, 7))
    labels = _labels((5, 7), OPTIONS["all"]["ignore_index"])
    labels = jnp.stack([labels, labels[::-1]])
    with jax.default_matmul_precision("highest"):
        losses, dx = jax.jit(
            jax.vmap(
                jax.value_and_grad(
                    lambda x, labels: liger_jax.fused_linear_cross_entropy(
                        x, weight, labels, reduction="sum", implementation=implementation, **OPTIONS["all"]
                    )
                )
            )
        )(x, labels)
    for example in range(2):
        logits = np.asarray(x[example], np.float64) @ np.asarray(weight, np.float64)
        expected_loss, expected_grad = closed_form(logits, labels[example], **OPTIONS["all"])
        _assert_close(losses[example], expected_loss.sum())
        _assert_close(dx[example], expected_grad @ np.asarray(weight, np.float64).T)


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
@pytest.mark.parametrize("reduction", ["none", "sum"])
def test_vmap_over_logits_with_shared_labels(implementation, reduction):
    # Only the logits carry the batch axis: the labels (and, for "sum", the cotangent) are shared by the examples.
    logits, labels = _logits(15, (2, 6, 7)), _labels((6, 7))

    def loss(logits):
        return jnp.sum(liger_jax.cross_entropy(logits, labels, reduction=reduction, implementation=implementation))

    losses, dlogits = jax.jit(jax.vmap(jax.value_and_grad(loss)))(logits)
    for example in range(2):
        expected_loss, expected_grad = closed_form(logits[example], labels)
        _assert_close(losses[example], expected_loss.sum())
        _assert_close(dlogits[example], expected_grad)


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
def test_jacobian_of_per_row_losses(implementation):
    # jax.jacrev maps the backward pass over cotangents alone: the saved logits, labels and lse are shared.
    shape = (4, 7)
    logits, labels = _logits(16, shape), _labels(shape)

    def losses(logits):
        return liger_jax.cross_entropy(logits, labels, reduction="none", implementation=implementation)

    jacobian = jax.jit(jax.jacrev(losses))(logits)
    _, expected_grad = closed_form(logits, labels)
    _assert_close(jacobian, np.eye(shape[0])[:, :, None] * expected_grad[None])
