"""kl_div, jsd and tvd: every implementation against the float64 references (values and gradients, every option),
ignored and masked rows, shapes, composition with jit/vmap/remat/sharding, the per-row API, modules and bad inputs.

The references are checked against closed forms written from the definitions in test_divergences_math.py.
"""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import liger_jax
from liger_jax import runtime
from liger_jax.flax_layers import linen as liger_linen
from liger_jax.flax_layers import nnx as liger_nnx
from liger_jax.ops.jsd import jsd_row_losses, jsd_rows
from liger_jax.ops.kl_div import kl_div_rows
from liger_jax.ops.tvd import tvd_rows
from tests import harness
from tests.collectives import assert_only_small_all_reduces, compiled_collectives, mesh, place

REDUCTIONS = ["batchmean", "sum", "mean", "none"]
# 37 rows: two programs of the interpreter's 32-row tiles, the second partial; 300 classes: three 128-class
# blocks, the last partial.
SHAPE = (37, 300)


def _log_probs(seed, shape, dtype, scale=2.0):
    """Log-softmax of normal draws, computed in float64, rounded to ``dtype``."""
    draws = scale * np.random.default_rng(seed).standard_normal(shape)
    return jnp.asarray(jax.nn.log_softmax(jnp.asarray(draws, jnp.float64)), dtype)


def _probs(seed, shape, dtype, zeros=True):
    """Probabilities, a few of them exactly 0 (0 · log 0 terms) when ``zeros``."""
    probs = np.exp(np.asarray(_log_probs(seed, shape, jnp.float64)))
    if zeros:
        probs[np.random.default_rng(seed + 1).random(shape) < 0.05] = 0.0
    return jnp.asarray(probs, dtype)


def _labels(seed, shape, ignore_index=-100):
    """Labels with about a quarter of the rows ``ignore_index``, the first row among them."""
    rng = np.random.default_rng(seed)
    labels = np.where(rng.random(shape) < 0.25, ignore_index, rng.integers(0, 10, shape))
    labels.reshape(-1)[0] = ignore_index
    return jnp.asarray(labels, jnp.int32)


def _kl(options, dtype, shape=SHAPE):
    """(op, reference, input, target) for kl_div with ``options``."""
    target = _log_probs(1, shape, dtype) if options.get("log_target") else _probs(1, shape, dtype)
    return liger_jax.kl_div, liger_jax.kl_div_reference, _log_probs(0, shape, dtype), target


def _jsd(options, dtype, shape=SHAPE):
    return liger_jax.jsd, liger_jax.jsd_reference, _log_probs(2, shape, dtype), _log_probs(3, shape, dtype)


def _tvd(options, dtype, shape=SHAPE):
    return liger_jax.tvd, liger_jax.tvd_reference, _probs(4, shape, dtype), _probs(5, shape, dtype)


OPS = {"kl_div": _kl, "jsd": _jsd, "tvd": _tvd}
# Every option value of each op at least once (reductions, log_target, beta at 0, 1 and between, labels or none,
# ignore_index inside the label range); bf16 and fp32 in turn, fp16 once.
CASES = [
    ("kl_div", {"reduction": "batchmean"}),
    ("kl_div", {"reduction": "sum", "log_target": True}),
    ("kl_div", {"reduction": "mean"}),
    ("kl_div", {"reduction": "none", "log_target": True}),
    ("jsd", {"beta": 0.0, "labels": True}),
    ("jsd", {"beta": 0.3, "labels": True}),
    ("jsd", {"beta": 0.5}),
    ("jsd", {"beta": 1.0, "labels": True}),
    ("jsd", {"beta": 0.7, "ignore_index": 3, "labels": True}),
    ("tvd", {"reduction": "batchmean", "labels": True}),
    ("tvd", {"reduction": "sum"}),
    ("tvd", {"reduction": "mean", "labels": True}),
    ("tvd", {"reduction": "none", "labels": True}),
]
CASE_DTYPES = [jnp.float16 if i == 6 else (jnp.bfloat16, jnp.float32)[i % 2] for i in range(len(CASES))]


def _case_id(value):
    if isinstance(value, tuple):
        name, options = value
        return name + "-" + "-".join(f"{k}={v}" for k, v in options.items())
    return jnp.dtype(value).name


def _call_args(name, options, dtype, shape=SHAPE):
    """(op, reference, input, target, labels or None, keyword options)."""
    op, reference, input, target = OPS[name](options, dtype, shape)
    kwargs = {k: v for k, v in options.items() if k != "labels"}
    labels = _labels(6, shape[:-1], kwargs.get("ignore_index", -100)) if options.get("labels") else None
    return op, reference, input, target, labels, kwargs


def _cotangent(seed, out_shape):
    """Per-element normal draws for "none"; a scalar ≠ 1 otherwise."""
    if out_shape:
        return harness.random_normal(seed, out_shape, jnp.float32)
    return jnp.float32(1.7)


def _positional(name, input, target, labels):
    return (input, target) if name == "kl_div" else (input, target, labels)


def _assert_vjp_matches(name, op, reference, input, target, labels, kwargs, implementation, dtype):
    """Loss at fp32 tolerance (computed in fp32), input gradient at ``dtype``'s, target gradient exactly 0."""
    out_shape = input.shape if kwargs.get("reduction") == "none" else ()
    cotangent = _cotangent(7, out_shape)

    def of_operands(input, target):
        return op(*_positional(name, input, target, labels), **kwargs, implementation=implementation)

    loss, (dinput, dtarget) = harness.vjp_under_jit(of_operands, (input, target), cotangent)
    expected, (expected_dinput,) = harness.vjp_under_jit(
        lambda input: reference(*_positional(name, input, jnp.asarray(target, jnp.float64), labels), **kwargs),
        (jnp.asarray(input, jnp.float64),),
        jnp.asarray(cotangent, jnp.float64),
    )
    chex.assert_type([loss, dinput, dtarget], [jnp.float32, dtype, dtype])
    chex.assert_shape(loss, out_shape)
    harness.assert_all_finite(loss, dinput)
    harness.assert_close(loss, expected, jnp.float32)
    harness.assert_close(dinput, expected_dinput, dtype)
    np.testing.assert_array_equal(dtarget, 0.0)


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
@pytest.mark.parametrize(("case", "dtype"), list(zip(CASES, CASE_DTYPES, strict=True)), ids=_case_id)
def test_losses_and_gradients_match_float64_reference(implementation, case, dtype):
    name, options = case
    op, reference, input, target, labels, kwargs = _call_args(name, options, dtype)
    _assert_vjp_matches(name, op, reference, input, target, labels, kwargs, implementation, dtype)


# (rows..., V) with an op each: one row; 3-D with V over five blocks (and "mean" over its elements: V, not the
# middle axis, divides); a single class; three classes, under one byte of TVD's sign codes; rank 1.
SHAPE_CASES = [
    ("jsd", {"beta": 0.5, "labels": True}, (1, 64)),
    ("tvd", {"reduction": "none", "labels": True}, (2, 9, 520)),
    ("kl_div", {"reduction": "none"}, (2, 9, 520)),
    ("kl_div", {"reduction": "mean"}, (2, 9, 520)),
    ("kl_div", {}, (4, 1)),
    ("tvd", {"reduction": "sum"}, (5, 3)),
    ("jsd", {"beta": 0.2}, (50,)),
]


@pytest.mark.parametrize(("name", "options", "shape"), SHAPE_CASES)
def test_shapes(name, options, shape):
    op, reference, input, target, labels, kwargs = _call_args(name, options, jnp.float32, shape)
    _assert_vjp_matches(name, op, reference, input, target, labels, kwargs, harness.KERNEL_IMPLEMENTATION, jnp.float32)


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
@pytest.mark.parametrize(
    "case", [("jsd", {"beta": 0.5}), ("tvd", {"reduction": "mean"}), ("tvd", {"reduction": "none"})], ids=_case_id
)
def test_all_rows_ignored_gives_zero_loss_and_gradient(implementation, case):
    name, options = case
    op, _, input, target, _, kwargs = _call_args(name, options, jnp.float32, (6, 40))
    labels = jnp.full((6,), -100, jnp.int32)
    loss, (dinput,) = harness.vjp_under_jit(
        lambda input: op(input, target, labels, **kwargs, implementation=implementation),
        (input,),
        jnp.ones((6, 40) if kwargs.get("reduction") == "none" else (), jnp.float32),
    )
    np.testing.assert_array_equal(loss, 0.0)
    np.testing.assert_array_equal(dinput, 0.0)


@pytest.mark.parametrize("name", ["kl_div", "jsd", "tvd"])
def test_empty_batch_gives_zero_loss(name):
    op = getattr(liger_jax, name)
    operands = (jnp.zeros((0, 16), jnp.float32),) * 2
    value, grad = jax.value_and_grad(lambda x: op(x, operands[1], implementation=harness.KERNEL_IMPLEMENTATION))(
        operands[0]
    )
    assert value == 0.0 and grad.shape == (0, 16)


@pytest.mark.parametrize(
    "case",
    [("jsd", {"beta": 0.0}), ("jsd", {"beta": 0.4}), ("jsd", {"beta": 1.0}), ("kl_div", {"log_target": True})],
    ids=_case_id,
)
def test_classes_masked_to_minus_infinity_give_finite_losses(case):
    # A padded vocabulary: the last classes are -inf in both operands (probability 0), so every term on them is 0.
    name, options = case
    op, reference, input, target, labels, kwargs = _call_args(name, options, jnp.float32, (5, 200))
    masked = jnp.arange(200) >= 180
    input, target = jnp.where(masked, -jnp.inf, input), jnp.where(masked, -jnp.inf, target)
    _assert_vjp_matches(name, op, reference, input, target, labels, kwargs, harness.KERNEL_IMPLEMENTATION, jnp.float32)


def test_kernel_computes_the_gradient_in_the_forward_pass_only(monkeypatch):
    # Liger's scheme: one launch reads both operands for loss and gradient; the backward only scales the gradient.
    launched = []

    def recording_launch(kernel, *args, **kwargs):
        launched.append((kernel.__name__, kwargs["WITH_GRAD"]))
        return launch(kernel, *args, **kwargs)

    launch = runtime.launch
    monkeypatch.setattr(runtime, "launch", recording_launch)
    input, target = _log_probs(8, (4, 51), jnp.float32), _log_probs(9, (4, 51), jnp.float32)
    jax.jit(jax.grad(lambda x: liger_jax.jsd(x, target, implementation=harness.KERNEL_IMPLEMENTATION))).lower(input)
    assert launched == [("divergence", True)]


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
def test_vmap_gives_per_example_losses_and_gradients(implementation):
    input, target = _log_probs(10, (3, 11, 60), jnp.float32), _log_probs(11, (3, 11, 60), jnp.float32)
    labels = _labels(12, (3, 11))

    def loss(op):
        return lambda input, labels: op(input, target[0], labels, beta=0.3)

    op = jax.jit(
        jax.vmap(jax.value_and_grad(loss(lambda *a, **k: liger_jax.jsd(*a, **k, implementation=implementation))))
    )
    expected = jax.jit(jax.vmap(jax.value_and_grad(loss(liger_jax.jsd_reference))))(
        jnp.asarray(input, jnp.float64), labels
    )
    harness.assert_close_trees(op(input, labels), expected, jnp.float32)


def test_checkpoint_gives_the_same_gradients():
    probs, target = _probs(13, (9, 45), jnp.float32), _probs(14, (9, 45), jnp.float32)
    harness.assert_checkpoint_gives_the_same_gradients(
        lambda p: jnp.sin(liger_jax.tvd(p, target, implementation=harness.KERNEL_IMPLEMENTATION)), (probs,)
    )


@pytest.mark.parametrize(
    "case",
    [("jsd", {"beta": 0.3, "labels": True}), ("kl_div", {"reduction": "none"}), ("tvd", {"labels": True})],
    ids=_case_id,
)
def test_rows_sharded_under_jit_without_gathering(case):
    name, options = case
    op, _, input, target, labels, kwargs = _call_args(name, options, jnp.float32, (8, 4, 48))
    mesh_ = mesh((8,), ("x",))

    @jax.jit
    def loss_and_grad(input, target, labels):
        def loss(input):
            return jnp.sum(
                op(*_positional(name, input, target, labels), **kwargs, implementation=harness.KERNEL_IMPLEMENTATION)
            )

        return jax.value_and_grad(loss)(input)

    expected = loss_and_grad(input, target, labels)
    sharded = (
        place(input, mesh_, "x"),
        place(target, mesh_, "x"),
        None if labels is None else place(labels, mesh_, "x"),
    )
    harness.assert_close_trees(loss_and_grad(*sharded), expected, jnp.float32)
    assert loss_and_grad(*sharded)[1].sharding.spec[0] == "x"
    assert_only_small_all_reduces(compiled_collectives(loss_and_grad, *sharded), 64)


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
@pytest.mark.parametrize("name", ["jsd", "kl_div", "tvd"])
def test_row_functions_give_row_losses_and_scaled_gradients(implementation, name):
    # The per-row API the fused losses call: loss per row and grad_scale[row] · d(row loss)/d input, one pass.
    shape = (7, 130)
    _, reference, input, target, labels, _ = _call_args(name, {"labels": name != "kl_div"}, jnp.bfloat16, shape)
    grad_scale = harness.random_normal(15, shape[:-1], jnp.float32)
    match name:
        case "jsd":
            loss, dinput = jax.jit(functools.partial(jsd_rows, beta=0.3, implementation=implementation))(
                input, target, labels, grad_scale
            )
            row_loss = jax.jit(functools.partial(jsd_row_losses, beta=0.3, implementation=implementation))(
                input, target, labels
            )
            np.testing.assert_array_equal(row_loss, loss)

            def per_row(x, t):
                one_row = functools.partial(liger_jax.jsd_reference, beta=0.3)
                return jax.vmap(lambda x, t, label: one_row(x[None], t[None], label[None]))(x, t, labels)
        case "kl_div":
            loss, dinput = jax.jit(functools.partial(kl_div_rows, implementation=implementation))(
                input, target, grad_scale
            )

            def per_row(x, t):
                return jnp.sum(liger_jax.kl_div_reference(x, t, reduction="none"), axis=-1)
        case "tvd":
            loss, dinput = jax.jit(functools.partial(tvd_rows, implementation=implementation))(
                input, target, labels, grad_scale
            )

            def per_row(x, t):
                return jnp.sum(liger_jax.tvd_reference(x, t, labels, reduction="none"), axis=-1)

    expected, (expected_dinput,) = harness.vjp_under_jit(
        lambda x: per_row(x, jnp.asarray(target, jnp.float64)),
        (jnp.asarray(input, jnp.float64),),
        jnp.asarray(grad_scale, jnp.float64),
    )
    chex.assert_type([loss, dinput], [jnp.float32, jnp.bfloat16])
    harness.assert_close(loss, expected, jnp.float32)
    harness.assert_close(dinput, expected_dinput, jnp.bfloat16)
    if name != "kl_div":
        np.testing.assert_array_equal(loss[0], 0.0)  # row 0 is ignored
        np.testing.assert_array_equal(dinput[0], 0.0)


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
def test_nnx_and_linen_modules_compute_the_ops(implementation):
    input, target = _log_probs(16, (2, 5, 70), jnp.float32), _log_probs(17, (2, 5, 70), jnp.float32)
    probs, probs_target = jnp.exp(input), jnp.exp(target)
    labels = _labels(18, (2, 5), ignore_index=1)
    common = {"implementation": implementation}
    calls = [
        ("KLDivLoss", {"reduction": "sum", "log_target": True}, (input, target), liger_jax.kl_div),
        ("JSDLoss", {"beta": 0.2, "ignore_index": 1}, (input, target, labels), liger_jax.jsd),
        ("TVDLoss", {"reduction": "mean", "ignore_index": 1}, (probs, probs_target, labels), liger_jax.tvd),
    ]
    for class_name, options, operands, op in calls:
        expected = op(*operands, **options, **common)
        nnx_loss = getattr(liger_nnx, class_name)(**options, **common)(*operands)
        linen_module = getattr(liger_linen, class_name)(**options, **common)
        linen_loss = linen_module.apply({}, *operands)
        np.testing.assert_array_equal(nnx_loss, expected)
        np.testing.assert_array_equal(linen_loss, expected)
        assert not nnx.state(getattr(liger_nnx, class_name)(**options, **common), nnx.Param)


@pytest.mark.parametrize(
    ("name", "shapes", "dtypes", "kwargs", "error", "match"),
    [
        ("jsd", [(), ()], jnp.float32, {}, ValueError, "input must have at least 1 axes"),
        ("jsd", [(4, 8), (4, 9)], jnp.float32, {}, ValueError, r"target must have shape \(4, 8\)"),
        ("jsd", [(4, 0), (4, 0)], jnp.float32, {}, ValueError, "at least one class"),
        (
            "jsd",
            [(4, 8), (4, 8), (5,)],
            (jnp.float32, jnp.float32, jnp.int32),
            {},
            ValueError,
            r"labels must have shape \(4,\)",
        ),
        (
            "jsd",
            [(4, 8), (4, 8), (4,)],
            (jnp.float32, jnp.float32, jnp.float32),
            {},
            TypeError,
            "labels must have an integer",
        ),
        ("jsd", [(4, 8), (4, 8)], (jnp.int32, jnp.float32), {}, TypeError, "input must have a float dtype"),
        ("jsd", [(4, 8), (4, 8)], (jnp.float32, jnp.float64), {}, TypeError, "target must have a float dtype"),
        ("jsd", [(4, 8), (4, 8)], jnp.float32, {"beta": 1.5}, ValueError, r"beta must be in \[0, 1\]"),
        ("jsd", [(4, 8), (4, 8)], jnp.float32, {"beta": -0.1}, ValueError, "beta"),
        ("jsd", [(4, 8), (4, 8)], jnp.float32, {"ignore_index": 1.0}, TypeError, "ignore_index must be an int"),
        ("tvd", [(4, 8), (4, 8)], jnp.float32, {"reduction": "avg"}, ValueError, "reduction must be one of"),
        (
            "tvd",
            [(4, 8), (4, 8), (3,)],
            (jnp.float32, jnp.float32, jnp.int32),
            {},
            ValueError,
            "labels must have shape",
        ),
        ("kl_div", [(4, 8), (8, 4)], jnp.float32, {}, ValueError, "target must have shape"),
        ("kl_div", [(4, 8), (4, 8)], jnp.float32, {"reduction": "elementwise"}, ValueError, "reduction"),
        ("kl_div", [(4, 8), (4, 8)], jnp.float32, {"eps": 0.0}, ValueError, "eps must be a finite number > 0"),
        ("kl_div", [(4, 8), (4, 8)], jnp.float32, {"eps": float("nan")}, ValueError, "eps"),
    ],
)
def test_bad_arguments_raise_clear_errors(name, shapes, dtypes, kwargs, error, match):
    op = getattr(liger_jax, name)
    harness.assert_call_raises(error, match, op, shapes, dtypes, **kwargs)


@pytest.mark.parametrize("name", ["kl_div", "jsd", "tvd"])
def test_benchmark_case_baselines_compute_what_the_ops_compute(name):
    from benchmarks.cases import OPS as BENCHMARK_OPS
    from benchmarks.cases import build_case
    from benchmarks.providers import LIGER_JAX, XLA

    params, dtype = BENCHMARK_OPS[name].smoke[0]
    case = build_case(name, params, dtype)
    args = case.make_inputs(jax.random.key(0))
    results = [
        jax.jit(jax.value_and_grad(lambda x, fn=case.providers[provider]: fn(x, *args[1:])))(args[0])
        for provider in (LIGER_JAX, XLA)
    ]
    harness.assert_close_trees(results[0], results[1], jnp.float32)
