"""kl_div, jsd and tvd's math: float64 closed forms written from the definitions (KL(p ‖ q) = Σ p log(p / q), the
generalised JSD through its mixture m, TVD = ½ Σ |p − q|) against the kernels, gradient-row identities, the
identities between the ops, finite differences, and Liger's beta limits.

Small vocabularies (7 classes) make every per-class term count; 300 classes span three of the interpreter's
128-class blocks, the last partial.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

import liger_jax
from liger_jax.ops._divergence_rows import Divergence, row_losses_and_sign_codes, scaled_signs
from liger_jax.ops.jsd import jsd_rows
from liger_jax.ops.kl_div import kl_div_rows
from liger_jax.ops.tvd import tvd_rows, tvd_terms
from tests import harness

KERNEL = harness.KERNEL_IMPLEMENTATION
SHAPES = [(6, 7), (3, 300)]
BETAS = [0.0, 0.25, 0.5, 1.0]


def _log_probs(seed, shape):
    z = 2.0 * np.random.default_rng(seed).standard_normal(shape)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def _ignoring_first_row(n_rows):
    labels = np.arange(n_rows, dtype=np.int32)
    labels[0] = -100
    return labels


def _kl_rows(p, log_p, log_q):
    """KL(p ‖ q) per row, float64, 0 · log 0 = 0."""
    return np.where(p == 0.0, 0.0, p * (log_p - log_q)).sum(axis=-1)


def closed_form_jsd(log_q, log_p, beta):
    """Per-row (loss, d loss/d log_q) of the generalised JSD of student q from teacher p, Liger's beta limits."""
    p, q = np.exp(log_p), np.exp(log_q)
    if beta == 0.0:
        return _kl_rows(p, log_p, log_q), -p
    if beta == 1.0:
        return _kl_rows(q, log_q, log_p), q * (log_q - log_p) + q
    log_m = np.log(beta * p + (1.0 - beta) * q)
    loss = beta * _kl_rows(p, log_p, log_m) + (1.0 - beta) * _kl_rows(q, log_q, log_m)
    return loss, (1.0 - beta) * q * (log_q - log_m)


def _f32(array):
    return jnp.asarray(array, jnp.float32)


@pytest.mark.parametrize("beta", BETAS)
@pytest.mark.parametrize("shape", SHAPES)
def test_jsd_matches_closed_form_normalised_by_counted_rows(beta, shape):
    log_q, log_p = _log_probs(1, shape), _log_probs(2, shape)
    labels = _ignoring_first_row(shape[0])
    loss, grad = jax.jit(
        jax.value_and_grad(
            lambda x: liger_jax.jsd(x, _f32(log_p), jnp.asarray(labels), beta=beta, implementation=KERNEL)
        )
    )(_f32(log_q))
    rows, row_grads = closed_form_jsd(log_q, log_p, beta)
    counted = shape[0] - 1
    np.testing.assert_allclose(loss, rows[1:].sum() / counted, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(grad[1:], row_grads[1:] / counted, rtol=1e-5, atol=1e-7)
    np.testing.assert_array_equal(grad[0], 0.0)


@pytest.mark.parametrize("beta", BETAS)
def test_jsd_gradient_rows_satisfy_their_identities(beta):
    """Σ_j ∂/∂x_j of a row: −Σ p = −1 at β = 0; loss + Σ q = loss + 1 at β = 1; (1 − β) KL(q ‖ m) between."""
    shape = (4, 300)
    log_q, log_p = _log_probs(3, shape), _log_probs(4, shape)
    loss, grad = jsd_rows(_f32(log_q), _f32(log_p), None, jnp.ones(4), beta=beta, implementation=KERNEL)
    grad_sums = np.asarray(grad, np.float64).sum(axis=-1)
    p, q = np.exp(log_p), np.exp(log_q)
    if beta == 0.0:
        expected = -np.ones(4)
    elif beta == 1.0:
        expected = np.asarray(loss, np.float64) + 1.0
    else:
        expected = (1.0 - beta) * _kl_rows(q, log_q, np.log(beta * p + (1.0 - beta) * q))
    np.testing.assert_allclose(grad_sums, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
def test_jsd_gradient_in_the_logits_sums_to_zero_per_row(beta):
    # Through log_softmax the loss is invariant to a shift of a row's logits.
    logits, teacher = _f32(3.0 * _log_probs(5, (5, 130))), _f32(_log_probs(6, (5, 130)))
    grad = jax.jit(jax.grad(lambda z: liger_jax.jsd(jax.nn.log_softmax(z), teacher, beta=beta, implementation=KERNEL)))(
        logits
    )
    assert np.abs(grad).max() > 1e-3
    # fp32 rounding of 130 O(0.1) terms: a few 1e-7; a wrong term would be off by its size.
    np.testing.assert_allclose(np.asarray(grad, np.float64).sum(axis=-1), 0.0, atol=2e-6)


def test_jsd_at_half_is_symmetric():
    x, y = _f32(_log_probs(7, (6, 7))), _f32(_log_probs(8, (6, 7)))
    np.testing.assert_allclose(
        liger_jax.jsd(x, y, implementation=KERNEL), liger_jax.jsd(y, x, implementation=KERNEL), rtol=1e-6
    )


@pytest.mark.parametrize(("limit", "near"), [(0.0, 1e-6), (1.0, 1.0 - 1e-6)])
def test_beta_limits_are_the_slopes_of_the_formula(limit, near):
    # Liger's beta = 0 and 1 are not the formula's values there (it vanishes) but its slopes: JSD_β ≈ β KL(p ‖ q)
    # near 0 and (1 − β) KL(q ‖ p) near 1. In float64: the slope is a difference of nearly equal terms.
    x, y = jnp.asarray(_log_probs(9, (6, 7))), jnp.asarray(_log_probs(10, (6, 7)))
    at_limit = liger_jax.jsd_reference(x, y, beta=limit)
    slope = liger_jax.jsd_reference(x, y, beta=near) / abs(limit - near)
    np.testing.assert_allclose(slope, at_limit, rtol=1e-4)
    np.testing.assert_allclose(liger_jax.jsd(_f32(x), _f32(y), beta=limit, implementation=KERNEL), at_limit, rtol=1e-5)


def test_jsd_limits_are_kl_divergences():
    x, y = _f32(_log_probs(11, (6, 7))), _f32(_log_probs(12, (6, 7)))
    forward = liger_jax.kl_div(x, y, log_target=True, implementation=KERNEL)
    reverse = liger_jax.kl_div(y, x, log_target=True, implementation=KERNEL)
    np.testing.assert_allclose(liger_jax.jsd(x, y, beta=0.0, implementation=KERNEL), forward, rtol=1e-6)
    np.testing.assert_allclose(liger_jax.jsd(x, y, beta=1.0, implementation=KERNEL), reverse, rtol=1e-6)


@pytest.mark.parametrize("log_target", [False, True])
@pytest.mark.parametrize("shape", SHAPES)
def test_kl_div_matches_closed_form_for_every_reduction(log_target, shape):
    log_q = _log_probs(13, shape)
    p = np.exp(_log_probs(14, shape))
    p[:, 1] = 0.0  # 0 · log 0 = 0
    p[:, 2] = 1e-12  # below eps: without log_target its log is floored at log(eps)
    eps = 1e-6
    with np.errstate(divide="ignore"):
        target = _f32(np.log(p) if log_target else p)
        p = np.exp(np.asarray(target, np.float64)) if log_target else np.asarray(target, np.float64)
        log_p = np.log(p) if log_target else np.log(np.maximum(p, eps))
    terms = np.where(p == 0.0, 0.0, p * (log_p - np.asarray(_f32(log_q), np.float64)))
    expected = {"none": terms, "sum": terms.sum(), "batchmean": terms.sum() / shape[0], "mean": terms.mean()}
    scale = {"none": 1.0, "sum": 1.0, "batchmean": 1.0 / shape[0], "mean": 1.0 / terms.size}
    for reduction, value in expected.items():
        loss, (grad,) = harness.vjp_under_jit(
            lambda x, reduction=reduction: liger_jax.kl_div(
                x, target, reduction=reduction, log_target=log_target, eps=eps, implementation=KERNEL
            ),
            (_f32(log_q),),
            jnp.ones(value.shape, jnp.float32),
        )
        np.testing.assert_allclose(loss, value, rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(grad, -p * scale[reduction], rtol=1e-6, atol=1e-12)


def test_kl_div_gradient_rows_sum_to_minus_one_for_a_distribution():
    log_q, log_p = _log_probs(15, (4, 300)), _log_probs(16, (4, 300))
    _, grad = kl_div_rows(_f32(log_q), _f32(log_p), jnp.ones(4), log_target=True, implementation=KERNEL)
    np.testing.assert_allclose(np.asarray(grad, np.float64).sum(axis=-1), -1.0, rtol=1e-5)


@pytest.mark.parametrize("reduction", ["batchmean", "sum", "mean", "none"])
@pytest.mark.parametrize("shape", SHAPES)
def test_tvd_matches_closed_form_normalised_by_counted_rows(reduction, shape):
    p, q = np.exp(_log_probs(17, shape)), np.exp(_log_probs(18, shape))
    q[:, 3] = p[:, 3]  # equal probabilities: gradient 0 there
    p, q = _f32(p), _f32(q)
    labels = _ignoring_first_row(shape[0])
    difference = np.asarray(p, np.float64) - np.asarray(q, np.float64)
    difference[0] = 0.0  # the ignored row
    terms = 0.5 * np.abs(difference)
    counted = shape[0] - 1
    expected = {"none": terms, "sum": terms.sum(), "batchmean": terms.sum() / counted}
    expected["mean"] = terms.sum() / (counted * shape[1])
    scale = {"none": 1.0, "sum": 1.0, "batchmean": 1.0 / counted, "mean": 1.0 / (counted * shape[1])}
    loss, (grad,) = harness.vjp_under_jit(
        lambda x: liger_jax.tvd(x, q, jnp.asarray(labels), reduction=reduction, implementation=KERNEL),
        (p,),
        jnp.ones(np.shape(expected[reduction]), jnp.float32),
    )
    np.testing.assert_allclose(loss, expected[reduction], rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(grad, 0.5 * np.sign(difference) * scale[reduction], rtol=1e-6)
    np.testing.assert_array_equal(grad[:, 3], 0.0)


@pytest.mark.parametrize("n_cols", [1, 3, 7, 300])
def test_tvd_sign_codes_decode_to_the_gradients_sign_column_by_column(n_cols):
    # TVD's residual: sign(p - q) + 1 in 2 bits, four columns a byte (the last byte of a row partial unless 4 | V);
    # ignored rows hold sign 0.
    p, q = np.exp(_log_probs(23, (5, n_cols))), np.exp(_log_probs(24, (5, n_cols)))
    q[:, ::3] = p[:, ::3]
    labels = _ignoring_first_row(5)
    divergence = Divergence("tvd", tvd_terms, KERNEL, has_labels=True)
    losses, codes = row_losses_and_sign_codes(divergence)(_f32(p), _f32(q), jnp.asarray(labels))
    assert codes.shape == (5, -(-n_cols // 4)) and codes.dtype == jnp.uint8
    expected = np.sign(np.asarray(_f32(p), np.float64) - np.asarray(_f32(q), np.float64))
    expected[0] = 0.0
    scale = jnp.asarray(np.arange(1.0, 6.0), jnp.float32)
    decoded = scaled_signs(codes, scale, n_cols, jnp.float32, KERNEL)
    np.testing.assert_array_equal(decoded, expected * np.arange(1.0, 6.0)[:, None])
    # reduction="none": each element also times its own cotangent, the fp32 product rounded once
    cotangent = _f32(_log_probs(27, (5, n_cols)))
    decoded = scaled_signs(codes, scale, n_cols, jnp.float32, KERNEL, cotangent)
    np.testing.assert_array_equal(decoded, (expected * np.arange(1.0, 6.0)[:, None] * cotangent).astype(np.float32))
    np.testing.assert_allclose(losses, 0.5 * np.abs(expected * (p - q)).sum(axis=-1), rtol=1e-5, atol=1e-7)


def test_tvd_keeps_a_quarter_byte_an_element_between_forward_and_backward():
    # The residual is the sign codes (2 bits an element); the gradient is an output, not a temporary.
    p, q = _f32(np.exp(_log_probs(25, (64, 1024)))), _f32(np.exp(_log_probs(26, (64, 1024))))
    step = jax.jit(jax.grad(lambda p: liger_jax.tvd(p, q, implementation=KERNEL)))
    temp = step.lower(p).compile().memory_analysis().temp_size_in_bytes
    assert p.size // 4 <= temp < p.size // 4 + 4096


def test_tvd_row_is_its_gradient_dotted_with_the_difference():
    # TVD is homogeneous of degree 1 in p − q: Σ_j ∂/∂p_j (p_j − q_j) = the row's distance.
    p, q = _f32(np.exp(_log_probs(19, (5, 300)))), _f32(np.exp(_log_probs(20, (5, 300))))
    loss, grad = tvd_rows(p, q, None, jnp.ones(5), implementation=KERNEL)
    np.testing.assert_allclose(jnp.sum(grad * (p - q), axis=-1), loss, rtol=1e-5)


@pytest.mark.parametrize("name", ["kl_div", "jsd", "tvd"])
def test_reference_gradients_match_finite_differences_in_float64(name):
    x, y = jnp.asarray(_log_probs(21, (3, 7))), jnp.asarray(_log_probs(22, (3, 7)))
    op = {
        "kl_div": lambda x: liger_jax.kl_div_reference(x, jnp.exp(y)),
        "jsd": lambda x: liger_jax.jsd_reference(x, y, beta=0.3),
        "tvd": lambda x: liger_jax.tvd_reference(jnp.exp(x), jnp.exp(y)),
    }[name]
    check_grads(jax.jit(op), (x,), order=1, modes=["rev"])


def test_jsd_kernel_gradient_matches_finite_differences():
    x, y = _f32(_log_probs(23, (3, 7))), _f32(_log_probs(24, (3, 7)))
    check_grads(
        jax.jit(lambda x: liger_jax.jsd(x, y, beta=0.3, implementation=KERNEL)), (x,), order=1, modes=["rev"], eps=1e-2
    )


@pytest.mark.parametrize("implementation", [KERNEL, "xla"])
def test_jsd_is_finite_where_one_side_gives_a_class_zero_probability(implementation):
    # A class the student (or the teacher) rules out (log-probability -inf) still has a positive mixture m, so
    # the loss and gradient stay finite.
    log_q, log_p = _log_probs(11, (4, 7)), _log_probs(12, (4, 7))
    log_q[0, 2], log_p[1, 5] = -np.inf, -np.inf
    log_q[0] -= np.log(np.exp(log_q[0]).sum())
    log_p[1] -= np.log(np.exp(log_p[1]).sum())
    loss, grad = jax.jit(
        jax.value_and_grad(lambda x: liger_jax.jsd(x, _f32(log_p), beta=0.5, implementation=implementation))
    )(_f32(log_q))
    rows, row_grads = closed_form_jsd(log_q, log_p, 0.5)
    np.testing.assert_allclose(loss, rows.sum() / 4, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(grad, np.nan_to_num(row_grads) / 4, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
def test_jsd_is_finite_where_both_sides_give_a_class_a_subnormal_probability(implementation):
    # Log-probabilities near -100 on both sides: both probabilities and the mixture m are below the smallest normal
    # fp32 (or flush to 0), which must neither make log m -inf under a positive weight nor show in the row sums.
    log_q, log_p = _log_probs(13, (4, 7)), _log_probs(14, (4, 7))
    log_q[:, 3], log_p[:, 3] = -100.0, -101.0
    log_q[2, 6], log_p[2, 6] = -99.0, -np.inf
    log_q -= np.log(np.exp(log_q).sum(axis=1, keepdims=True))
    log_p -= np.log(np.exp(log_p).sum(axis=1, keepdims=True))
    loss, grad = jax.jit(
        jax.value_and_grad(lambda x: liger_jax.jsd(x, _f32(log_p), beta=0.3, implementation=implementation))
    )(_f32(log_q))
    rows, row_grads = closed_form_jsd(log_q, log_p, 0.3)
    np.testing.assert_allclose(loss, rows.sum() / 4, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(grad, np.nan_to_num(row_grads) / 4, rtol=1e-5, atol=1e-7)
