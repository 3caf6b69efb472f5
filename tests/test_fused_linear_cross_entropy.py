"""fused_linear_cross_entropy: every implementation against the float64 reference that materialises the logits."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import liger_jax
from liger_jax.ops import _linear_chunks
from liger_jax.ops import fused_linear_cross_entropy as flce_op
from tests import harness
from tests.test_cross_entropy import _labels, _normal

pytestmark = pytest.mark.usefixtures("full_precision_matmuls")


N, H, V = 45, 32, 300  # N is not a multiple of CHUNK; V spans two interpreter blocks and a partial third
CHUNK = 16
ALL_OPTIONS = {"label_smoothing": 0.1, "z_loss_scale": 1e-3, "softcap": 8.0, "ignore_index": 5}
# (dtype, weight_layout, bias, options, reduction): both layouts with and without bias, every reduction, in turn.
CASES = [
    (jnp.float32, "hv", True, {}, "mean"),
    (jnp.float32, "vh", False, ALL_OPTIONS, "none"),
    (jnp.float32, "hv", False, {"label_smoothing": 0.2}, "sum"),
    (jnp.bfloat16, "hv", True, ALL_OPTIONS, "mean"),
    (jnp.bfloat16, "vh", True, ALL_OPTIONS, "none"),
    (jnp.bfloat16, "vh", False, {}, "sum"),
    (jnp.bfloat16, "hv", False, {"z_loss_scale": 1e-2, "softcap": 2.0}, "none"),
    (jnp.float16, "hv", True, ALL_OPTIONS, "mean"),
]


def _case_id(case):
    dtype, layout, bias, options, reduction = case
    return f"{jnp.dtype(dtype).name}-{layout}-{'bias' if bias else 'nobias'}-{'-'.join(options) or 'plain'}-{reduction}"


def _inputs(seed, dtype, layout="hv", n_rows=N, ignore_index=-100):
    x = _normal(seed, (n_rows, H), dtype)
    # Scaled like an initialised LM head (logits of std ~1.4): then whether the bf16 logits of XLA's CPU matmul are
    # rounded (the reference rounds them, XLA may keep fp32) moves the softmax by well under the bf16 tolerance.
    weight = _normal(seed + 1, (H, V) if layout == "hv" else (V, H), dtype, scale=0.25)
    bias = _normal(seed + 2, (V,), dtype)
    return x, weight, bias, _labels(seed + 3, (n_rows,), V, ignore_index)


def _cotangent(reduction, n_rows=N):
    """≠ 1: per-row for "none"; "mean" scaled by the row count so gradients are O(1)."""
    if reduction == "none":
        return _normal(9, (n_rows,), jnp.float32)
    return jnp.float32(1.3 * (n_rows if reduction == "mean" else 1))


def _assert_matches_reference(op, primals, labels, dtype, cotangent, logits_dtype="same", **kwargs):
    """``op(*primals)`` against the float64 reference, values and gradients, at ``dtype``'s tolerance; the
    reference rounds the logits to ``logits_dtype`` (by default ``dtype``, None for no rounding)."""
    layout = kwargs.get("weight_layout", "hv")
    options = {k: v for k, v in kwargs.items() if k != "weight_layout"}
    logits_dtype = dtype if logits_dtype == "same" else logits_dtype

    def reference(x, weight, *bias):
        return liger_jax.fused_linear_cross_entropy_reference(
            x,
            weight,
            labels,
            bias=bias[0] if bias else None,
            weight_layout=layout,
            logits_dtype=logits_dtype,
            **options,
        )

    harness.assert_vjp_matches_reference(op, reference, primals, cotangent, dtype)


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_losses_and_gradients_match_float64_reference(implementation, case):
    dtype, layout, with_bias, options, reduction = case
    x, weight, bias, labels = _inputs(CASES.index(case), dtype, layout, ignore_index=options.get("ignore_index", -100))
    kwargs = options | {"reduction": reduction, "weight_layout": layout}

    def op(x, weight, *bias):
        return liger_jax.fused_linear_cross_entropy(
            x, weight, labels, bias=bias[0] if bias else None, chunk_size=CHUNK, implementation=implementation, **kwargs
        )

    primals = (x, weight, bias) if with_bias else (x, weight)
    chex.assert_type(jax.jit(op)(*primals), jnp.float32)
    _assert_matches_reference(op, primals, labels, dtype, _cotangent(reduction), **kwargs)


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
@pytest.mark.parametrize("chunk_size", [None, 1, 7, N, 64])
def test_every_chunk_size_gives_the_same_result(implementation, chunk_size):
    x, weight, bias, labels = _inputs(20, jnp.float32)

    def op(x, weight, bias):
        return liger_jax.fused_linear_cross_entropy(
            x, weight, labels, bias=bias, chunk_size=chunk_size, implementation=implementation
        )

    _assert_matches_reference(op, (x, weight, bias), labels, jnp.float32, _cotangent("mean"))


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_all_rows_ignored_gives_zero_loss_and_gradients(implementation, reduction):
    x, weight, bias, _ = _inputs(21, jnp.float32)
    labels = jnp.full((N,), -100)
    loss, grads = harness.vjp_under_jit(
        lambda x, w, b: liger_jax.fused_linear_cross_entropy(
            x, w, labels, bias=b, reduction=reduction, chunk_size=CHUNK, implementation=implementation
        ),
        (x, weight, bias),
        jnp.ones((N,) if reduction == "none" else (), jnp.float32),
    )
    np.testing.assert_array_equal(loss, 0.0)
    for grad in grads:
        np.testing.assert_array_equal(grad, 0.0)


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
def test_default_chunks_split_the_rows_and_match_the_reference(implementation, monkeypatch):
    # Without the floor the dweight accumulator bounds the chunk: 32·300·4 bytes = 32 rows of fp32 logits, so the
    # default splits 50 rows into two even chunks of 25.
    monkeypatch.setattr(_linear_chunks, "MIN_CHUNK_LOGITS_BYTES", 0)
    n_rows = 50
    assert flce_op.default_chunk_rows(n_rows, H, V, jnp.float32, jnp.float32) == 25
    x, weight, bias, labels = _inputs(32, jnp.float32, "vh", n_rows=n_rows)  # V is the weight's first axis

    def op(x, weight, bias):
        return liger_jax.fused_linear_cross_entropy(
            x, weight, labels, bias=bias, weight_layout="vh", implementation=implementation
        )

    _assert_matches_reference(
        op, (x, weight, bias), labels, jnp.float32, _cotangent("mean", n_rows), weight_layout="vh"
    )


@pytest.mark.parametrize(
    ("n_rows", "hidden", "n_classes", "dtype", "expected"),
    [
        (8192, 4096, 128256, jnp.bfloat16, 2048),  # Llama-3-8B's head: the row cap (its 2 GiB dweight allows 8192)
        (16384, 2048, 128256, jnp.bfloat16, 2048),  # Llama-3.2-1B's: the cap (its 1002 MiB dweight allows 4096)
        (2048, 768, 32000, jnp.bfloat16, 1024),  # 768 · 32000 · 4 bytes of dweight hold 1536 rows: 2 even chunks
        (4096, 256, 32768, jnp.float32, 512),  # a small head: the 64 MiB floor
        (400_000, 128, 32768, jnp.bfloat16, 1536),  # many rows: x's 97.7 MiB, rounded down to 12 · 128 rows
        (4096, 64, 2**22, jnp.float32, 64),  # a 1 GiB dweight over 4M classes: 64 rows, fewer than a tile
        (5, 32, 300, jnp.float32, 5),  # fewer rows than a chunk
    ],
)
def test_default_chunk_rows(n_rows, hidden, n_classes, dtype, expected):
    rows = flce_op.default_chunk_rows(n_rows, hidden, n_classes, dtype, dtype)
    assert rows == expected
    bound = flce_op.chunk_logits_bound(n_rows, hidden, n_classes, dtype)
    assert rows * n_classes * jnp.dtype(dtype).itemsize <= bound


def compiled_temp_bytes(implementation, x, weight, labels, **kwargs) -> int:
    """Temporary bytes of ``jit(value_and_grad)`` of FLCE's mean loss in x and weight, compiled (never run) for
    these ``jax.ShapeDtypeStruct`` operands."""

    def loss(x, weight, labels):
        return liger_jax.fused_linear_cross_entropy(x, weight, labels, implementation=implementation, **kwargs)

    compiled = jax.jit(jax.value_and_grad(loss, argnums=(0, 1))).lower(x, weight, labels).compile()
    return compiled.memory_analysis().temp_size_in_bytes


def assert_temporaries_bounded(temp_bytes, n_rows, n_classes, bound, past_64_bounds) -> None:
    """FLCE's memory contract: temporaries a few times the chunk bound, and below a quarter of the fp32 logits
    (``N · V · 4`` bytes) when those are at least 64 bounds (``past_64_bounds`` says the shape is there)."""
    fp32_logits = 4 * n_rows * n_classes
    assert (fp32_logits >= 64 * bound) == past_64_bounds
    # 8: on CPU the bf16 matmuls also keep fp32 copies of their operands (measured up to 7.5 bounds).
    assert temp_bytes <= 8 * bound
    if past_64_bounds:
        assert temp_bytes < fp32_logits / 4


# (N, H, V, dtype, weight_layout, whether the fp32 logits are ≥ 64 chunk bounds). N is never a multiple of the chunk.
MEMORY_SHAPES = [
    (100_000, 64, 50_000, jnp.float32, "hv", True),  # small H, large V: the 64 MiB floor bounds 256-row chunks
    (400_000, 128, 32768, jnp.bfloat16, "hv", True),  # many rows: x bounds 1536-row chunks
    (70_000, 1024, 65_536, jnp.bfloat16, "vh", True),  # larger H: the 256 MiB dweight bounds 2048-row chunks
    (20_000, 4096, 8192, jnp.bfloat16, "hv", False),  # large H, small V: logits smaller than x, 2048-row chunks
    (4100, 256, 32768, jnp.float32, "vh", False),  # few rows, small H: 512-row chunks (2048 kept the logits' size)
]


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
@pytest.mark.parametrize(
    ("n_rows", "hidden", "n_classes", "dtype", "layout", "past_64_bounds"),
    MEMORY_SHAPES,
    ids=[f"{n}x{h}x{v}-{jnp.dtype(d).name}-{layout}" for n, h, v, d, layout, _ in MEMORY_SHAPES],
)
def test_compiled_temporaries_are_bounded_by_the_chunk(
    implementation, n_rows, hidden, n_classes, dtype, layout, past_64_bounds
):
    rows = flce_op.default_chunk_rows(n_rows, hidden, n_classes, dtype, dtype)
    assert n_rows % rows
    x = jax.ShapeDtypeStruct((n_rows, hidden), dtype)
    weight = jax.ShapeDtypeStruct((hidden, n_classes) if layout == "hv" else (n_classes, hidden), dtype)
    labels = jax.ShapeDtypeStruct((n_rows,), jnp.int32)
    temp = compiled_temp_bytes(implementation, x, weight, labels, weight_layout=layout)
    bound = flce_op.chunk_logits_bound(n_rows, hidden, n_classes, dtype)
    assert_temporaries_bounded(temp, n_rows, n_classes, bound, past_64_bounds)


def test_compiled_program_does_not_grow_with_the_rows():
    def program(n_rows):
        x, weight, bias, labels = _inputs(22, jnp.float32, n_rows=n_rows)
        grad = jax.grad(
            lambda x, w: liger_jax.fused_linear_cross_entropy(
                x, w, labels, bias=bias, chunk_size=8, implementation=harness.KERNEL_IMPLEMENTATION
            ),
            argnums=(0, 1),
        )
        return jax.make_jaxpr(grad)(x, weight)

    small, large = program(40), program(4000)
    primitives = _primitive_names(small.jaxpr)
    assert {"scan", "while"} & set(primitives), primitives
    assert primitives == _primitive_names(large.jaxpr)


def _primitive_names(jaxpr) -> list[str]:
    """The primitives of ``jaxpr`` and of the jaxprs inside it (the chunk loop sits in a custom_partitioning op)."""
    names = []
    for eqn in jaxpr.eqns:
        names.append(eqn.primitive.name)
        for param in eqn.params.values():
            for inner in param if isinstance(param, (tuple, list)) else (param,):
                inner = getattr(inner, "jaxpr", inner)
                if hasattr(inner, "eqns"):
                    names.extend(_primitive_names(inner))
    return names


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
def test_vmap_gives_per_example_losses_and_gradients(implementation):
    x = _normal(23, (3, 20, H), jnp.float32)
    labels = _labels(24, (3, 20), V)
    _, weight, bias, _ = _inputs(25, jnp.float32)

    def grads(op):
        return jax.jit(jax.vmap(jax.value_and_grad(op, argnums=(0, 1, 2)), in_axes=(0, None, None, 0)))

    got = grads(
        lambda x, w, b, y: liger_jax.fused_linear_cross_entropy(
            x, w, y, bias=b, chunk_size=CHUNK, implementation=implementation
        )
    )(x, weight, bias, labels)
    expected = grads(lambda x, w, b, y: liger_jax.fused_linear_cross_entropy_reference(x, w, y, bias=b))(
        *harness.as_float64(x, weight, bias), labels
    )
    harness.assert_close_trees(got, expected, jnp.float32)


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
def test_leading_axes_and_return_z_loss(implementation):
    x = _normal(26, (2, 11, H), jnp.float32)
    labels = _labels(27, (2, 11), V)
    _, weight, _, _ = _inputs(28, jnp.float32, "vh")
    kwargs = {"z_loss_scale": 1e-2, "reduction": "none", "return_z_loss": True, "weight_layout": "vh"}
    got = jax.jit(
        lambda x, w, y: liger_jax.fused_linear_cross_entropy(
            x, w, y, chunk_size=CHUNK, implementation=implementation, **kwargs
        )
    )(x, weight, labels)
    expected = liger_jax.fused_linear_cross_entropy_reference(*harness.as_float64(x, weight), labels, **kwargs)
    chex.assert_shape(got, [(2, 11), (2, 11)])
    harness.assert_close_trees(got, expected, jnp.float32)


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
def test_bfloat16_accumulator_and_mixed_dtypes(implementation):
    x, weight, bias, labels = _inputs(29, jnp.bfloat16)
    weight = weight.astype(jnp.float32)  # an fp32 weight with bf16 activations: logits and dlogits in fp32

    def op(x, weight, bias):
        return liger_jax.fused_linear_cross_entropy(
            x, weight, labels, bias=bias, accum_dtype=jnp.bfloat16, chunk_size=CHUNK, implementation=implementation
        )

    _assert_matches_reference(op, (x, weight, bias), labels, jnp.bfloat16, _cotangent("mean"), logits_dtype=None)


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
def test_traced_out_of_range_labels_give_nan_loss_and_finite_gradients(implementation):
    x, weight, bias, labels = _inputs(30, jnp.float32)
    labels = labels.at[2].set(V).at[30].set(-7)

    @jax.jit
    def loss_and_grads(x, weight, labels):
        return jax.value_and_grad(
            lambda x, w: liger_jax.fused_linear_cross_entropy(
                x, w, labels, reduction="sum", chunk_size=CHUNK, implementation=implementation
            ),
            argnums=(0, 1),
        )(x, weight)

    loss, (dx, dweight) = loss_and_grads(x, weight, labels)
    assert np.isnan(loss)
    harness.assert_all_finite(dx, dweight)
    np.testing.assert_array_equal(dx[np.array([2, 30])], 0.0)


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
def test_checkpoint_gives_the_same_gradients(implementation):
    x, weight, bias, labels = _inputs(31, jnp.float32)
    harness.assert_checkpoint_gives_the_same_gradients(
        lambda x, w: jnp.sin(
            liger_jax.fused_linear_cross_entropy(x, w, labels, chunk_size=CHUNK, implementation=implementation)
        ),
        (x, weight),
    )


def test_empty_input_gives_zero_loss():
    x = jnp.zeros((0, H), jnp.float32)
    weight = jnp.ones((H, V), jnp.float32)
    labels = jnp.zeros((0,), jnp.int32)
    assert liger_jax.fused_linear_cross_entropy(x, weight, labels, implementation=harness.KERNEL_IMPLEMENTATION) == 0


@pytest.mark.parametrize(
    ("x", "weight", "labels", "kwargs", "error", "match"),
    [
        ((4, 8), (9, 10), (4,), {}, ValueError, r"weight must have shape \(8, 10\)"),
        ((4, 8), (10, 9), (4,), {"weight_layout": "vh"}, ValueError, r"weight must have shape \(10, 8\)"),
        ((4, 8), (8, 10), (4,), {"weight_layout": "hd"}, ValueError, "weight_layout"),
        ((4, 8), (8, 10, 1), (4,), {}, ValueError, "weight must have 2 axes"),
        ((4, 8), (8, 10), (4,), {"bias": jnp.ones(9, jnp.float32)}, ValueError, r"bias must have shape \(10,\)"),
        ((4, 8), (8, 10), (4,), {"bias": jnp.ones(10, jnp.int32)}, TypeError, "bias must have a float dtype"),
        ((4, 8), (8, 10), (3,), {}, ValueError, r"labels must have shape \(4,\)"),
        ((4, 8), (8, 10), [0, 10, 1, 1], {}, ValueError, r"labels must be in \[0, 10\)"),
        ((4, 8), (8, 10), (4,), {"chunk_size": 0}, ValueError, "chunk_size"),
        ((4, 8), (8, 10), (4,), {"accum_dtype": jnp.int32}, TypeError, "accum_dtype"),
        ((4, 8), (8, 10), (4,), {"reduction": "mean_over_tokens"}, ValueError, "reduction"),
    ],
)
def test_bad_arguments_raise_clear_errors(x, weight, labels, kwargs, error, match):
    labels = jnp.asarray(labels) if isinstance(labels, list) else jnp.zeros(labels, jnp.int32)
    with pytest.raises(error, match=match):
        liger_jax.fused_linear_cross_entropy(
            jnp.ones(x, jnp.float32),
            jnp.ones(weight, jnp.float32),
            labels,
            implementation=harness.KERNEL_IMPLEMENTATION,
            **kwargs,
        )
