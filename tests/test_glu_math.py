"""SwiGLU and GeGLU math: values and both gradients against float64 closed forms written independently of the
reference (the activations' derivatives by hand), and float64 finite differences. The tests ``tools/mutation.py``
runs first against the GLU kernels and backward rule."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

import liger_jax
from tests import harness

OPS = {"swiglu": liger_jax.swiglu, "geglu": liger_jax.geglu}
# Two kernel programs (4096 elements each), the second partial.
SHAPE = (3, 1500)


def closed_form(name, gate, up, dout):
    """``(out, dgate, dup)`` in float64 numpy: act(g)·u, dout·u·act'(g) and dout·act(g).

    silu(g) = g σ(g), silu'(g) = σ(g) (1 + g (1 - σ(g))); gelu_tanh(g) = g (1 + tanh(t)) / 2 with
    t = √(2/π) (g + 0.044715 g³), gelu_tanh'(g) = (1 + tanh(t)) / 2 + g (1 - tanh²(t)) √(2/π) (1 + 3 · 0.044715 g²) / 2.
    """
    g, u, dout = (np.asarray(a, np.float64) for a in (gate, up, dout))
    if name == "swiglu":
        sigmoid = 1.0 / (1.0 + np.exp(-g))
        act, slope = g * sigmoid, sigmoid * (1.0 + g * (1.0 - sigmoid))
    else:
        tanh = np.tanh(np.sqrt(2.0 / np.pi) * (g + 0.044715 * g**3))
        act = 0.5 * g * (1.0 + tanh)
        slope = 0.5 * (1.0 + tanh) + 0.5 * g * (1.0 - tanh**2) * np.sqrt(2.0 / np.pi) * (1.0 + 3 * 0.044715 * g**2)
    return act * u, dout * u * slope, dout * act


def _inputs(seed):
    """Gates over [-8, 8] (both tails of the activations), up and dout of either sign."""
    rng = np.random.default_rng(seed)
    gate = rng.uniform(-8.0, 8.0, SHAPE)
    gate[0, :5] = [-8.0, -1e-3, 0.0, 1e-3, 8.0]
    return tuple(jnp.asarray(a, jnp.float32) for a in (gate, rng.standard_normal(SHAPE), rng.standard_normal(SHAPE)))


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
@pytest.mark.parametrize("name", OPS)
def test_values_and_gradients_match_the_closed_form(implementation, name):
    gate, up, dout = _inputs(1)
    out, (dgate, dup) = harness.vjp_under_jit(
        lambda gate, up: OPS[name](gate, up, implementation=implementation), (gate, up), dout
    )
    for actual, expected in zip((out, dgate, dup), closed_form(name, gate, up, dout), strict=True):
        np.testing.assert_allclose(np.asarray(actual, np.float64), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
@pytest.mark.parametrize("name", OPS)
def test_finite_differences_in_float64(implementation, name):
    # Through the fp32 kernels, float64 finite differences need tolerances that fp32 rounding allows.
    gate, up, _ = _inputs(2)
    gate, up = gate[:, :40] / 3.0, up[:, :40]
    dtype = jnp.float64 if implementation == "xla" else jnp.float32

    def glu(gate, up):
        return OPS[name](gate.astype(dtype), up.astype(dtype), implementation=implementation).astype(jnp.float64)

    tolerance = {"atol": 1e-7, "rtol": 1e-7, "eps": 1e-4} if implementation == "xla" else {"atol": 2e-3, "rtol": 2e-3}
    check_grads(jax.jit(glu), harness.as_float64(gate, up), order=1, modes=["rev"], **tolerance)


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
@pytest.mark.parametrize("name", OPS)
def test_jacobian_is_diagonal(implementation, name):
    # jax.jacrev maps the backward pass over cotangents alone: the saved gate and up are shared.
    gate, up, _ = (a[0, :9] for a in _inputs(3))
    jacobians = jax.jit(jax.jacrev(lambda gate, up: OPS[name](gate, up, implementation=implementation), (0, 1)))(
        gate, up
    )
    _, dgate, dup = closed_form(name, gate, up, np.ones(9))
    for jacobian, diagonal in zip(jacobians, (dgate, dup), strict=True):
        np.testing.assert_allclose(np.asarray(jacobian, np.float64), np.diag(diagonal), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
@pytest.mark.parametrize("name", OPS)
def test_per_example_gradients_of_a_sum(implementation, name):
    # Under vmap(grad(sum ∘ glu)) gate and up carry the batch axis while the cotangent, all ones, does not.
    gate, up, _ = (a[:, :11] for a in _inputs(4))

    def total(gate, up):
        return jnp.sum(OPS[name](gate, up, implementation=implementation))

    dgate, dup = jax.jit(jax.vmap(jax.grad(total, argnums=(0, 1))))(gate, up)
    _, expected_dgate, expected_dup = closed_form(name, gate, up, np.ones(gate.shape))
    np.testing.assert_allclose(np.asarray(dgate, np.float64), expected_dgate, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(dup, np.float64), expected_dup, rtol=1e-5, atol=1e-5)
