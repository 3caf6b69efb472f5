"""ReLU²'s own math: edge values, any rank, the diagonal Jacobian, finite differences. Values and gradients against
the float64 oracle in every dtype, vmap, sharding and the rest are in tests/test_activations.py."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

import liger_jax
from tests import activation_oracles, harness

# Both signs far out and near zero, zero itself (gradient 0), and squares that are exact in every dtype.
EDGES = [-1e4, -3.0, -1e-3, 0.0, 1e-3, 0.5, 3.0, 100.0]


def _relu_squared(implementation):
    return lambda x: liger_jax.relu_squared(x, implementation=implementation)


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
@pytest.mark.parametrize("dtype", harness.DTYPES)
def test_edge_values_and_gradients(implementation, dtype):
    x = jnp.asarray(EDGES, dtype)
    dy = jnp.linspace(-2.0, 2.0, x.size).astype(dtype)
    y, (dx,) = harness.vjp_under_jit(_relu_squared(implementation), (x,), dy)
    x64, dy64 = np.asarray(x, np.float64), np.asarray(dy, np.float64)
    harness.assert_close(y, activation_oracles.relu_squared(x64), dtype)
    harness.assert_close(dx, activation_oracles.relu_squared_pullback(x64, dy64), dtype)
    assert (np.asarray(y)[:4] == 0).all() and (np.asarray(dx)[:4] == 0).all()


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
@pytest.mark.parametrize("shape", [(), (5,), (2, 3, 4, 5)])
def test_any_rank(implementation, shape):
    x = harness.random_normal(1, shape, jnp.float32)
    dy = harness.random_normal(2, shape, jnp.float32)
    y, (dx,) = harness.vjp_under_jit(_relu_squared(implementation), (x,), dy)
    x64 = np.asarray(x, np.float64)
    harness.assert_close(y, activation_oracles.relu_squared(x64), jnp.float32)
    harness.assert_close(dx, activation_oracles.relu_squared_pullback(x64, np.asarray(dy, np.float64)), jnp.float32)


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
def test_jacobian_is_diagonal(implementation):
    x = harness.random_normal(3, (9,), jnp.float32)
    jacobian = jax.jit(jax.jacrev(_relu_squared(implementation)))(x)
    expected = np.diag(activation_oracles.relu_squared_pullback(np.asarray(x, np.float64), np.ones(9)))
    np.testing.assert_allclose(np.asarray(jacobian, np.float64), expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
def test_finite_differences(implementation):
    # Inputs away from 0, where the second derivative jumps.
    x = harness.random_normal(4, (4, 11), jnp.float32)
    x = x + jnp.where(x >= 0, 0.1, -0.1).astype(x.dtype)
    if implementation == "xla":
        check_grads(jax.jit(_relu_squared("xla")), (jnp.asarray(x, jnp.float64),), order=2, modes=["rev"])
    else:
        check_grads(jax.jit(_relu_squared(implementation)), (x,), order=1, modes=["rev"], atol=2e-3, rtol=2e-3)
