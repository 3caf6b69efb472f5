"""Fused linear cross-entropy with the vocabulary sharded (Megatron's vocab-parallel LM head): the same loss and
gradients as one device, no gathered weight or logits, and ignore_index/mean counted over the whole batch."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec

import liger_jax
from liger_jax.ops import fused_linear_cross_entropy as flce_op
from tests import harness
from tests.collectives import assert_only_small_all_reduces, compiled_collectives, mesh, nbytes, place
from tests.test_fused_linear_cross_entropy import assert_temporaries_bounded, compiled_temp_bytes

B, S, H, V = 4, 8, 16, 96
OPTIONS = dict(label_smoothing=0.1, z_loss_scale=1e-3, softcap=30.0, chunk_size=8)
ROW_WEIGHTS = np.linspace(0.5, 1.5, B * S, dtype=np.float32).reshape(B, S)  # per-row cotangents for "none"


def _inputs(weight_layout):
    x = harness.random_normal(0, (B, S, H), jnp.float32)
    weight = 0.3 * harness.random_normal(1, (H, V) if weight_layout == "hv" else (V, H), jnp.float32)
    bias = 0.3 * harness.random_normal(2, (V,), jnp.float32)
    labels = jax.random.randint(jax.random.key(3), (B, S), 0, V).at[1, 2:6].set(-100)
    return x, weight, bias, labels


def _program(weight_layout, reduction):
    """``jit((x, weight, bias, labels) -> (loss, grads))`` of a weighted sum of the losses."""

    def loss(x, weight, bias, labels):
        out = liger_jax.fused_linear_cross_entropy(
            x,
            weight,
            labels,
            bias=bias,
            reduction=reduction,
            weight_layout=weight_layout,
            implementation=harness.KERNEL_IMPLEMENTATION,
            **OPTIONS,
        )
        return jnp.sum(out * ROW_WEIGHTS) if reduction == "none" else out

    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))


# (mesh shape, names, row axes, vocabulary axes)
MESHES = [
    ((4, 2), ("dp", "tp"), "dp", "tp"),
    ((2, 2, 2), ("dp", "tp", "sp"), "dp", ("tp", "sp")),
    ((8,), ("tp",), None, "tp"),
]


# Every mesh and layout with "mean"; the other reductions on the first mesh.
CASES = [(m, layout, "mean") for m in MESHES for layout in ("hv", "vh")]
CASES += [(MESHES[0], "hv", reduction) for reduction in ("sum", "none")]


@pytest.mark.parametrize("mesh_case,weight_layout,reduction", CASES, ids=[f"{c[0][0]}-{c[1]}-{c[2]}" for c in CASES])
def test_vocab_parallel_matches_one_device(mesh_case, weight_layout, reduction):
    mesh_shape, names, rows, vocab = mesh_case
    mesh_ = mesh(mesh_shape, names)
    x, weight, bias, labels = _inputs(weight_layout)
    program = _program(weight_layout, reduction)
    expected_loss, expected_grads = program(x, weight, bias, labels)
    weight_spec = (None, vocab) if weight_layout == "hv" else (vocab, None)
    sharded = (place(x, mesh_, rows), place(weight, mesh_, *weight_spec), place(bias, mesh_, vocab))
    sharded += (place(labels, mesh_, rows),)
    loss, grads = program(*sharded)
    np.testing.assert_allclose(loss, expected_loss, rtol=1e-5, atol=1e-5)
    for grad, expected in zip(grads, expected_grads, strict=True):
        np.testing.assert_allclose(grad, expected, rtol=1e-5, atol=1e-6)
    assert grads[1].sharding.is_equivalent_to(sharded[1].sharding, 2)  # dweight stays vocabulary-sharded
    # Only all-reduces: this device's dx (partial over the vocabulary), its slice of dweight and dbias (partial over
    # the rows), and per-row statistics. Never the whole weight, never logits.
    vocab_ways, row_ways = (int(np.prod([mesh_.shape[a] for a in np.atleast_1d(axes or ())])) for axes in (vocab, rows))
    limit = max(nbytes(weight, bias) // vocab_ways, nbytes(x) // row_ways) + 64
    assert_only_small_all_reduces(compiled_collectives(program, *sharded), limit)


def test_vocab_parallel_on_explicit_axes():
    mesh_ = mesh((4, 2), ("dp", "tp"), AxisType.Explicit)
    x, weight, bias, labels = _inputs("hv")
    program = _program("hv", "mean")
    expected_loss, expected_grads = program(x, weight, bias, labels)
    sharded = (place(x, mesh_, "dp"), place(weight, mesh_, None, "tp"), place(bias, mesh_, "tp"))
    with jax.set_mesh(mesh_):
        loss, grads = program(*sharded, place(labels, mesh_, "dp"))
    np.testing.assert_allclose(loss, expected_loss, rtol=1e-5, atol=1e-5)
    for grad, expected in zip(grads, expected_grads, strict=True):
        np.testing.assert_allclose(grad, expected, rtol=1e-5, atol=1e-6)


def test_vocabulary_sharded_on_the_row_axis_is_gathered():
    """FSDP-style: the weight shares the rows' mesh axis, so it is gathered (rows of different devices must not mix)."""
    mesh_ = mesh((4,), ("dp",))
    x, weight, bias, labels = _inputs("hv")
    program = _program("hv", "mean")
    expected_loss, expected_grads = program(x, weight, bias, labels)
    loss, grads = program(
        place(x, mesh_, "dp"), place(weight, mesh_, None, "dp"), place(bias, mesh_, "dp"), place(labels, mesh_, "dp")
    )
    np.testing.assert_allclose(loss, expected_loss, rtol=1e-5, atol=1e-5)
    for grad, expected in zip(grads, expected_grads, strict=True):
        np.testing.assert_allclose(grad, expected, rtol=1e-5, atol=1e-6)


# (N, H, V, dtype, weight_layout, whether each device's fp32 logits are ≥ 64 of its chunk bounds) on a (4, 2) mesh
# of rows × vocabulary: each device holds N/4 rows and V/2 classes and sizes its chunks from them.
MEMORY_SHAPES = [
    (200_000, 64, 131_072, jnp.float32, "hv", True),  # 50000 × 65536 per device: the floor, 256-row chunks
    (280_000, 1024, 131_072, jnp.bfloat16, "vh", True),  # 70000 × 65536: a 256 MiB dweight slice, 2048 rows
]


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
@pytest.mark.parametrize(
    ("n_rows", "hidden", "n_classes", "dtype", "layout", "past_64_bounds"),
    MEMORY_SHAPES,
    ids=[f"{n}x{h}x{v}-{jnp.dtype(d).name}-{layout}" for n, h, v, d, layout, _ in MEMORY_SHAPES],
)
def test_each_device_bounds_its_temporaries_by_its_chunk(
    implementation, n_rows, hidden, n_classes, dtype, layout, past_64_bounds
):
    mesh_ = mesh((4, 2), ("dp", "tp"))
    local_rows, local_classes = n_rows // 4, n_classes // 2
    assert local_rows % flce_op.default_chunk_rows(local_rows, hidden, local_classes, dtype, dtype)

    def operand(shape, dtype, *spec):
        return jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh_, PartitionSpec(*spec)))

    x = operand((n_rows, hidden), dtype, "dp")
    if layout == "hv":
        weight = operand((hidden, n_classes), dtype, None, "tp")
    else:
        weight = operand((n_classes, hidden), dtype, "tp")
    labels = operand((n_rows,), jnp.int32, "dp")
    temp = compiled_temp_bytes(implementation, x, weight, labels, weight_layout=layout)  # per device
    bound = flce_op.chunk_logits_bound(local_rows, hidden, local_classes, dtype)
    assert_temporaries_bounded(temp, local_rows, local_classes, bound, past_64_bounds)
