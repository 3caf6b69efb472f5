"""The size rule: implementation=None picks XLA for small operands where the default is the Triton kernel."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import liger_jax
from liger_jax import runtime
from liger_jax.ops import _dispatch
from tests import harness


@pytest.fixture
def gpu_default(monkeypatch):
    """The defaults of a GPU with jax-triton: ``implementation=None`` resolves to ``"triton"``."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.delenv(runtime.ENV_VAR, raising=False)
    monkeypatch.setattr(runtime, "_on_gpu", lambda: True)
    monkeypatch.setattr(runtime, "_jax_triton_error", lambda: None)
    assert runtime.default_implementation() == "triton"


@pytest.mark.parametrize("op", sorted(_dispatch.MIN_KERNEL_ELEMENTS))
def test_default_runs_xla_below_the_threshold_and_the_kernel_from_it(gpu_default, op):
    threshold = _dispatch.MIN_KERNEL_ELEMENTS[op]
    assert _dispatch.resolve(None, op, threshold - 1) == "xla"
    assert _dispatch.resolve(None, op, threshold) == "triton"


@pytest.mark.parametrize("op", sorted(_dispatch.MAX_KERNEL_COLS))
def test_default_runs_xla_for_rows_past_the_width_limit(gpu_default, op):
    widest, large = _dispatch.MAX_KERNEL_COLS[op], 2**30
    assert _dispatch.resolve(None, op, large, widest) == "triton"
    assert _dispatch.resolve(None, op, large, widest + 1) == "xla"
    assert _dispatch.resolve("triton", op, large, widest + 1) == "triton"


@pytest.mark.parametrize("op", sorted(_dispatch.MIN_KERNEL_COLS))
def test_default_runs_xla_for_rows_under_the_narrow_limit(gpu_default, op):
    narrowest, large = _dispatch.MIN_KERNEL_COLS[op], 2**30
    assert _dispatch.resolve(None, op, large, narrowest) == "triton"
    assert _dispatch.resolve(None, op, large, narrowest - 1) == "xla"
    assert _dispatch.resolve("triton", op, large, narrowest - 1) == "triton"


def test_narrow_dyt_rows_on_a_gpu_default_run_the_xla_path(gpu_default, monkeypatch):
    # With its element threshold at one element, only their width sends these rows to XLA.
    monkeypatch.setitem(_dispatch.MIN_KERNEL_ELEMENTS, "dyt", 1)
    x = harness.random_normal(0, (3, _dispatch.MIN_KERNEL_COLS["dyt"] - 1), jnp.float32)
    alpha = jnp.asarray(0.7, jnp.float32)
    gamma, beta = (harness.random_normal(seed, x.shape[-1:], jnp.float32) for seed in (1, 2))
    expected = liger_jax.dyt(x, alpha, gamma, beta, implementation="xla")
    np.testing.assert_array_equal(np.asarray(liger_jax.dyt(x, alpha, gamma, beta)), np.asarray(expected))


def test_a_wide_norm_on_a_gpu_default_runs_the_xla_path(gpu_default, monkeypatch):
    monkeypatch.setitem(_dispatch.MIN_KERNEL_ELEMENTS, "rms_norm", 1)
    x = harness.random_normal(0, (2, _dispatch.MAX_KERNEL_COLS["rms_norm"] + 1), jnp.float32)
    scale = harness.random_normal(1, x.shape[-1:], jnp.float32)
    expected = liger_jax.rms_norm(x, scale, implementation="xla")
    np.testing.assert_array_equal(np.asarray(liger_jax.rms_norm(x, scale)), np.asarray(expected))


def test_tvd_without_reduction_runs_the_xla_path_at_any_size(gpu_default, monkeypatch):
    # Its own entry, not TVD's: with TVD's threshold at 1 element, reduction="none" still runs XLA.
    monkeypatch.setitem(_dispatch.MIN_KERNEL_ELEMENTS, "tvd", 1)
    p, q = (jax.nn.softmax(harness.random_normal(seed, (3, 40), jnp.float32)) for seed in (0, 1))
    expected = liger_jax.tvd(p, q, reduction="none", implementation="xla")
    np.testing.assert_array_equal(np.asarray(liger_jax.tvd(p, q, reduction="none")), np.asarray(expected))


def test_an_explicit_triton_still_runs_the_kernel(gpu_default):
    assert _dispatch.resolve("triton", "rms_norm", 1) == "triton"


def test_the_environment_variable_still_decides(gpu_default, monkeypatch):
    monkeypatch.setenv(runtime.ENV_VAR, "triton")
    assert _dispatch.resolve(None, "rms_norm", 1) == "triton"
    monkeypatch.setenv(runtime.ENV_VAR, "xla")
    assert _dispatch.resolve(None, "rms_norm", 2**40) == "xla"


@pytest.mark.skipif(harness.KERNEL_IMPLEMENTATION != "interpret", reason="the interpreter's default only")
@pytest.mark.parametrize("op", sorted(_dispatch.MIN_KERNEL_ELEMENTS))
def test_the_interpreter_default_keeps_the_kernels_at_every_size(op):
    assert _dispatch.resolve(None, op, 1) == "interpret"


def test_flce_counts_the_logits_it_never_builds():
    labels = jnp.zeros((3, 5), jnp.int32)
    assert _dispatch.logits_elements(labels, jnp.zeros((4, 7)), "hv") == 3 * 5 * 7
    assert _dispatch.logits_elements(labels, jnp.zeros((7, 4)), "vh") == 3 * 5 * 7
    assert _dispatch.logits_elements(labels, jnp.zeros(7), "hv") == 0  # rejected by the op's own checks


def _small_calls():
    """``name -> (op, args)`` for every op on small random operands (below every threshold)."""
    x = harness.random_normal(0, (3, 5, 24), jnp.float32)
    residual = harness.random_normal(1, (3, 5, 24), jnp.float32)
    scale = harness.random_normal(2, (24,), jnp.float32)
    bias = harness.random_normal(3, (24,), jnp.float32)
    q = harness.random_normal(4, (2, 6, 4, 8), jnp.float32)
    k = harness.random_normal(5, (2, 6, 2, 8), jnp.float32)
    cos, sin = liger_jax.rope_cos_sin(jnp.arange(6), 8)
    labels = jnp.asarray(np.random.default_rng(6).integers(0, 11, (3, 5)), jnp.int32)
    logits = harness.random_normal(7, (3, 5, 11), jnp.float32)
    weight = harness.random_normal(8, (24, 11), jnp.float32)
    return {
        "rms_norm": (liger_jax.rms_norm, (x, scale)),
        "layer_norm": (liger_jax.layer_norm, (x, scale, bias)),
        "fused_add_rms_norm": (liger_jax.fused_add_rms_norm, (x, residual, scale)),
        "swiglu": (liger_jax.swiglu, (x, residual)),
        "geglu": (liger_jax.geglu, (x, residual)),
        "rope": (liger_jax.apply_rotary_pos_emb, (q, k, cos, sin)),
        "cross_entropy": (liger_jax.cross_entropy, (logits, labels)),
        "fused_linear_cross_entropy": (liger_jax.fused_linear_cross_entropy, (x, weight, labels)),
        "fused_linear_logprobs": (liger_jax.fused_linear_logprobs, (x, weight, labels)),
        "fused_linear_jsd": (liger_jax.fused_linear_jsd, (x, weight, residual, weight, labels)),
        "fused_linear_distillation": (liger_jax.fused_linear_distillation, (x, weight, residual, weight, labels)),
        "softmax": (liger_jax.softmax, (x,)),
        "sparsemax": (liger_jax.sparsemax, (x,)),
        "relu_squared": (liger_jax.relu_squared, (x,)),
        "kl_div": (liger_jax.kl_div, (x, residual)),
        "jsd": (liger_jax.jsd, (x, residual)),
        "tvd": (liger_jax.tvd, (x, residual)),
        "tvd_elementwise": (lambda *args, **kw: liger_jax.tvd(*args, reduction="none", **kw), (x, residual)),
        "group_norm": (lambda *args, **kw: liger_jax.group_norm(*args, num_groups=4, **kw), (x, scale, bias)),
        "dyt": (liger_jax.dyt, (x, scale[:1], scale, bias)),
        "poly_norm": (liger_jax.poly_norm, (x, scale[:3], bias[0])),
        "modulated_rms_norm": (liger_jax.modulated_rms_norm, (x, scale, residual[:, 0], residual[:, 1])),
        "multi_token_attention": (liger_jax.multi_token_attention, (x[:1, None, :, :5], q[0, :3, :3, :1, None])),
        "fused_neighborhood_attention": (liger_jax.fused_neighborhood_attention, (q, q, q)),
    }


def test_every_op_is_covered_by_the_rule():
    assert set(_small_calls()) == set(_dispatch.MIN_KERNEL_ELEMENTS)


@pytest.mark.parametrize("name", sorted(_dispatch.MIN_KERNEL_ELEMENTS))
def test_a_small_call_on_a_gpu_default_runs_the_xla_path(gpu_default, name):
    # Were the kernel chosen, the launch would need jax-triton, which this machine lacks, and fail.
    op, args = _small_calls()[name]
    chosen, xla = op(*args), op(*args, implementation="xla")
    for actual, expected in zip(jax.tree.leaves(chosen), jax.tree.leaves(xla), strict=True):
        np.testing.assert_array_equal(np.asarray(actual), np.asarray(expected))
