"""Softmax's own math: gradient rows sum to zero, masked logits, shift invariance, finite differences. Values and
gradients against the float64 oracle, axes, dtypes, tilings and the rest are in tests/test_activations.py."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

import liger_jax
from tests import activation_oracles, harness


def _softmax(implementation):
    return lambda x: liger_jax.softmax(x, implementation=implementation)


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
def test_gradient_rows_sum_to_zero(implementation):
    # Σ_j dx_j = Σ_j y_j (dy_j - Σ_k dy_k y_k) = 0: softmax is unchanged by adding a constant to a row.
    x = harness.random_normal(1, (9, 77), jnp.float32, scale=3.0)
    dy = harness.random_normal(2, x.shape, jnp.float32, scale=10.0)
    _, (dx,) = harness.vjp_under_jit(_softmax(implementation), (x,), dy)
    assert np.abs(np.asarray(dx)).max() > 0.1
    np.testing.assert_allclose(np.asarray(dx, np.float64).sum(axis=-1), 0.0, atol=1e-5)


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
def test_masked_logits_get_zero_probability_and_zero_gradient(implementation):
    x = np.array(harness.random_normal(3, (5, 40), jnp.float32))
    x[:, ::3] = -np.inf
    x[2] = -np.inf
    x[2, 4] = 0.5  # one finite logit left: probability 1
    dy = harness.random_normal(4, x.shape, jnp.float32)
    y, (dx,) = harness.vjp_under_jit(_softmax(implementation), (jnp.asarray(x),), dy)
    harness.assert_close(y, activation_oracles.softmax(x), jnp.float32)
    harness.assert_close(dx, activation_oracles.softmax_pullback(x, dy), jnp.float32)
    masked = np.isneginf(x)
    assert (np.asarray(y)[masked] == 0).all() and (np.asarray(dx)[masked] == 0).all()
    np.testing.assert_array_equal(np.asarray(y)[2], np.eye(40)[4])


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
def test_large_logits_do_not_overflow(implementation):
    # exp(1e4) overflows fp32: only x - max(x) may reach the exponential. fp32 keeps x + 1e4 to about 1e-3.
    x = harness.random_normal(5, (4, 33), jnp.float32, scale=4.0)
    y = liger_jax.softmax(x + 1e4, implementation=implementation)
    np.testing.assert_allclose(np.asarray(y), activation_oracles.softmax(np.asarray(x + 1e4)), atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
def test_finite_differences(implementation):
    # The XLA path in float64 to finite-difference precision, second order too; the kernels through fp32.
    x = harness.random_normal(6, (5, 13), jnp.float32, scale=2.0)
    if implementation == "xla":
        check_grads(jax.jit(_softmax("xla")), (jnp.asarray(x, jnp.float64),), order=2, modes=["rev"])
    else:
        check_grads(jax.jit(_softmax(implementation)), (x,), order=1, modes=["rev"], atol=2e-3, rtol=2e-3)
