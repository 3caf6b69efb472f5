"""Fused add + RMSNorm: every implementation against the float64 reference, both outputs and all gradients."""

import chex
import jax
import jax.numpy as jnp
import pytest
from jax.test_util import check_grads

import liger_jax
from liger_jax.ops import _tiling
from tests import harness

# (rows..., D): a single row, D not a power of two, rows not a multiple of any block, 3-D, rank 1, wide rows.
SHAPES = [(1, 64), (37, 123), (3, 7, 96), (100,), (6, 1000)]
CASTING_MODES = ["llama", "gemma", "none"]
# Every shape in Llama's casting mode, and the other modes (Gemma with its offset of 1) on one odd shape.
CASES = [(shape, "llama", 0.0) for shape in SHAPES] + [((37, 123), "gemma", 1.0), ((37, 123), "none", 0.0)]


def _inputs(seed, shape, dtype, scale_dtype=None):
    x = harness.random_normal(seed, shape, dtype)
    residual = harness.random_normal(seed + 1, shape, dtype)
    scale = harness.random_normal(seed + 2, shape[-1:], scale_dtype or dtype)
    return x, residual, scale


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
@pytest.mark.parametrize(("shape", "casting_mode", "offset"), CASES)
@pytest.mark.parametrize("dtype", harness.DTYPES)
def test_outputs_and_gradients_match_float64_reference(implementation, shape, casting_mode, offset, dtype):
    x, residual, scale = _inputs(len(shape) + 10 * CASTING_MODES.index(casting_mode), shape, dtype, jnp.float32)
    settings = {"offset": offset, "casting_mode": casting_mode}

    def op(x, residual, scale):
        return liger_jax.fused_add_rms_norm(x, residual, scale, implementation=implementation, **settings)

    def reference(x, residual, scale):
        return liger_jax.fused_add_rms_norm_reference(x, residual, scale, rounding_dtype=dtype, **settings)

    cotangents = (harness.random_normal(98, shape, dtype), harness.random_normal(99, shape, dtype))
    chex.assert_type(jax.jit(op)(x, residual, scale), [dtype, dtype])
    harness.assert_vjp_matches_reference(op, reference, (x, residual, scale), cotangents, dtype)


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
@pytest.mark.parametrize(("shape", "casting_mode", "offset"), CASES)
@pytest.mark.parametrize("dtype", harness.DTYPES)
def test_without_residual_matches_float64_reference(implementation, shape, casting_mode, offset, dtype):
    # No add: s is x, and x's gradient is the cotangent of s plus RMSNorm's backward, summed inside the kernel.
    x, _, scale = _inputs(40 + len(shape) + 10 * CASTING_MODES.index(casting_mode), shape, dtype, jnp.float32)
    settings = {"offset": offset, "casting_mode": casting_mode}

    def op(x, scale):
        return liger_jax.fused_add_rms_norm(x, None, scale, implementation=implementation, **settings)

    def reference(x, scale):
        return liger_jax.fused_add_rms_norm_reference(x, None, scale, rounding_dtype=dtype, **settings)

    cotangents = (harness.random_normal(96, shape, dtype), harness.random_normal(97, shape, dtype))
    harness.assert_vjp_matches_reference(op, reference, (x, scale), cotangents, dtype)


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
def test_without_residual_is_rms_norm_passing_its_input_on(implementation):
    # y is rms_norm's own result, s is x bit for bit; x's gradient adds s's cotangent to rms_norm's dx.
    x, _, scale = _inputs(41, (37, 123), jnp.float32)
    cotangents = (harness.random_normal(42, x.shape, jnp.float32), harness.random_normal(43, x.shape, jnp.float32))
    (normed, total), (dx, dscale) = harness.vjp_under_jit(
        lambda *a: liger_jax.fused_add_rms_norm(a[0], None, a[1], implementation=implementation), (x, scale), cotangents
    )
    expected_normed, (expected_dx, expected_dscale) = harness.vjp_under_jit(
        lambda *a: liger_jax.rms_norm(*a, implementation=implementation), (x, scale), cotangents[0]
    )
    chex.assert_trees_all_equal((normed, total), (expected_normed, x))
    harness.assert_close_trees((dx, dscale), (expected_dx + cotangents[1], expected_dscale), jnp.float32)


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
def test_per_example_gradients_without_residual_under_vmap(implementation):
    x = harness.random_normal(45, (3, 6, 40), jnp.float32)
    scales = harness.random_normal(46, (3, 40), jnp.float32)

    def loss(op):
        def per_example(scale, x):
            normed, total = op(x, None, scale)
            return jnp.sum(jnp.sin(normed) * total)

        return per_example

    def op(x, residual, scale):
        return liger_jax.fused_add_rms_norm(x, residual, scale, implementation=implementation)

    per_example = jax.jit(jax.vmap(jax.grad(loss(op), argnums=(0, 1))))(scales, x)
    expected = jax.vmap(jax.grad(loss(liger_jax.fused_add_rms_norm_reference), argnums=(0, 1)))(
        *harness.as_float64(scales, x)
    )
    harness.assert_close_trees(per_example, expected, jnp.float32)


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
def test_check_grads_without_residual_fp32(implementation):
    x, _, scale = _inputs(44, (9, 48), jnp.float32)
    check_grads(
        lambda *a: liger_jax.fused_add_rms_norm(a[0], None, a[1], implementation=implementation),
        (x, scale),
        order=1,
        modes=["rev"],
    )


@pytest.mark.parametrize("tiling", harness.NORM_BACKWARD_TILINGS)
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("casting_mode", CASTING_MODES)
def test_forced_tilings_match_float64_reference(tiling, dtype, casting_mode):
    shape = harness.FORCED_TILING_SHAPE
    x, residual, scale = _inputs(30 + CASTING_MODES.index(casting_mode), shape, dtype, jnp.float32)
    settings = {"offset": 1.0 if casting_mode == "gemma" else 0.0, "casting_mode": casting_mode}

    def op(x, residual, scale):
        implementation = harness.KERNEL_IMPLEMENTATION
        return liger_jax.fused_add_rms_norm(x, residual, scale, implementation=implementation, **settings)

    def reference(x, residual, scale):
        return liger_jax.fused_add_rms_norm_reference(x, residual, scale, rounding_dtype=dtype, **settings)

    cotangents = (harness.random_normal(38, shape, dtype), harness.random_normal(39, shape, dtype))
    with _tiling.overridden(harness.NORM_BACKWARD_TILINGS[tiling]):
        harness.assert_vjp_matches_reference(op, reference, (x, residual, scale), cotangents, dtype)


@pytest.mark.parametrize("dtype", harness.DTYPES)
def test_kernel_outputs_are_rms_norm_of_the_rounded_sum(dtype):
    # The contract, bit for bit: s is x's native sum and y is the rms_norm kernel's result at s. (XLA fuses its
    # reference's add and norm into one reduction, so the "xla" path matches only to rounding.)
    x, residual, scale = _inputs(20, (37, 123), dtype)
    implementation = harness.KERNEL_IMPLEMENTATION
    normed, total = jax.jit(lambda *a: liger_jax.fused_add_rms_norm(*a, implementation=implementation))(
        x, residual, scale
    )
    chex.assert_trees_all_equal(total, x + residual)
    chex.assert_trees_all_equal(normed, liger_jax.rms_norm(x + residual, scale, implementation=implementation))


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
def test_sum_cotangent_reaches_both_inputs(implementation):
    # With the normed output unused, x and residual get exactly the cotangent of the sum (and dscale is 0).
    x, residual, scale = _inputs(21, (9, 40), jnp.bfloat16)
    cotangent = harness.random_normal(22, (9, 40), jnp.bfloat16)
    _, (dx, dresidual, dscale) = harness.vjp_under_jit(
        lambda *a: liger_jax.fused_add_rms_norm(*a, implementation=implementation)[1], (x, residual, scale), cotangent
    )
    chex.assert_trees_all_equal((dx, dresidual, dscale), (cotangent, cotangent, jnp.zeros_like(scale)))


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
def test_check_grads_fp32(implementation):
    check_grads(
        lambda *a: liger_jax.fused_add_rms_norm(*a, implementation=implementation),
        _inputs(5, (9, 48), jnp.float32),
        order=1,
        modes=["rev"],
    )


def test_backward_is_bitwise_deterministic():
    def loss(x, residual, scale):
        normed, total = liger_jax.fused_add_rms_norm(x, residual, scale)
        return jnp.sum(jnp.sin(normed) * total)

    harness.assert_bitwise_deterministic(jax.grad(loss, argnums=(0, 1, 2)), *_inputs(6, (67, 80), jnp.float32))


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
def test_vmap_folds_batch_into_rows(implementation):
    # Only x is batched: the shared residual is broadcast into the folded rows.
    x, _, scale = _inputs(7, (4, 5, 72), jnp.float32)
    residual = harness.random_normal(8, (5, 72), jnp.float32)
    batched = jax.vmap(lambda x: liger_jax.fused_add_rms_norm(x, residual, scale, implementation=implementation))(x)
    expected = jax.vmap(lambda x: liger_jax.fused_add_rms_norm_reference(x, *harness.as_float64(residual, scale)))(
        *harness.as_float64(x)
    )
    harness.assert_close_trees(batched, expected, jnp.float32)


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
def test_per_example_gradients_under_vmap(implementation):
    x, residual, _ = _inputs(9, (3, 6, 40), jnp.float32)
    scales = harness.random_normal(10, (3, 40), jnp.float32)

    def loss(op):
        def per_example(scale, x, residual):
            normed, total = op(x, residual, scale)
            return jnp.sum(jnp.sin(normed) * total)

        return per_example

    def op(x, residual, scale):
        return liger_jax.fused_add_rms_norm(x, residual, scale, implementation=implementation)

    per_example = jax.jit(jax.vmap(jax.grad(loss(op), argnums=(0, 1, 2))))(scales, x, residual)
    expected = jax.vmap(jax.grad(loss(liger_jax.fused_add_rms_norm_reference), argnums=(0, 1, 2)))(
        *harness.as_float64(scales, x, residual)
    )
    harness.assert_close_trees(per_example, expected, jnp.float32)


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
def test_checkpoint_gives_the_same_gradients(implementation):
    def loss(x, residual, scale):
        normed, total = liger_jax.fused_add_rms_norm(x, residual, scale, implementation=implementation)
        return jnp.sum(jnp.sin(normed) * total)

    harness.assert_checkpoint_gives_the_same_gradients(loss, _inputs(11, (11, 56), jnp.float32))


def test_kernel_writes_every_element():
    # Rows and D chosen to leave partial tiles on both axes.
    outputs, vjp = jax.vjp(liger_jax.fused_add_rms_norm, *_inputs(12, (37, 77), jnp.float32))
    harness.assert_all_finite(outputs, vjp(jax.tree.map(jnp.ones_like, outputs)))


def test_empty_input_gives_empty_outputs():
    x = jnp.zeros((0, 16), jnp.float32)
    normed, total = liger_jax.fused_add_rms_norm(x, x, jnp.ones(16, jnp.float32))
    assert normed.shape == total.shape == (0, 16)


@pytest.mark.parametrize(
    ("x", "residual", "scale", "kwargs", "match"),
    [
        ((), (), (), {}, "x must have at least 1 axes"),
        ((2, 8), (1, 8), (8,), {}, r"residual must have shape \(2, 8\)"),
        ((2, 8), (2, 8), (7,), {}, r"scale must have shape \(8,\)"),
        ((2, 8), (2, 8), (8,), {"casting_mode": "mistral"}, "casting_mode"),
        ((2, 8), (2, 8), (8,), {"implementation": "cuda"}, "implementation"),
    ],
)
def test_bad_shapes_and_settings_raise_value_errors(x, residual, scale, kwargs, match):
    harness.assert_call_raises(ValueError, match, liger_jax.fused_add_rms_norm, (x, residual, scale), **kwargs)


@pytest.mark.parametrize(
    ("x_dtype", "residual_dtype", "scale_dtype", "match"),
    [
        (jnp.int32, jnp.int32, jnp.float32, "x must have a float dtype"),
        (jnp.float32, jnp.bfloat16, jnp.float32, "residual must have dtype float32"),
        (jnp.float32, jnp.int32, jnp.float32, "residual must have a float dtype"),
        (jnp.float32, jnp.float32, jnp.int8, "scale must have a float dtype"),
        (jnp.float64, jnp.float64, jnp.float32, "x must have a float dtype"),
    ],
)
def test_bad_dtypes_raise_type_errors(x_dtype, residual_dtype, scale_dtype, match):
    dtypes = (x_dtype, residual_dtype, scale_dtype)
    harness.assert_call_raises(TypeError, match, liger_jax.fused_add_rms_norm, ((2, 8), (2, 8), 8), dtypes)
