"""Every op under SPMD: sharded like one device, row shardings kept, no activation gathered, and inside shard_map.

On CPU the kernels run in Triton's interpreter on the 8 host devices tests/conftest.py makes; with fewer devices
(one GPU) only the one-device cases run, through the same code path.
"""

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import liger_jax
from tests import harness
from tests.collectives import assert_only_small_all_reduces, compiled_collectives, mesh, nbytes, place

IMPLEMENTATION = harness.KERNEL_IMPLEMENTATION
B, S, D, V = 8, 8, 32, 48  # leading (row) axes B × S; feature width; classes
COS, SIN = liger_jax.rope_cos_sin(jnp.arange(S), 16)


@dataclasses.dataclass(frozen=True)
class Case:
    """An op as the tests drive it: ``op(*arrays, implementation)``; the first ``n_rows`` arrays are activations
    ``[B, S, ...]`` (sharded on their leading axes), the rest weights (replicated); ints are not differentiated."""

    op: Callable
    arrays: Callable[[], tuple]
    n_rows: int


def _normal(seed, *shape):
    return harness.random_normal(seed, shape, jnp.float32)


def _labels(seed):
    labels = jax.random.randint(jax.random.key(seed), (B, S), 0, V)
    return labels.at[0, :3].set(-100)  # a few ignored rows


CASES = {
    "rms_norm": Case(
        lambda x, scale, impl: liger_jax.rms_norm(x, scale, implementation=impl),
        lambda: (_normal(0, B, S, D), _normal(1, D)),
        1,
    ),
    "layer_norm": Case(
        lambda x, scale, bias, impl: liger_jax.layer_norm(x, scale, bias, implementation=impl),
        lambda: (_normal(2, B, S, D), _normal(3, D), _normal(4, D)),
        1,
    ),
    "fused_add_rms_norm": Case(
        lambda x, residual, scale, impl: liger_jax.fused_add_rms_norm(x, residual, scale, implementation=impl),
        lambda: (_normal(5, B, S, D), _normal(6, B, S, D), _normal(7, D)),
        2,
    ),
    "rope": Case(
        lambda q, k, impl: liger_jax.apply_rotary_pos_emb(q, k, COS, SIN, implementation=impl),
        lambda: (_normal(8, B, S, 4, 16), _normal(9, B, S, 2, 16)),
        2,
    ),
    "swiglu": Case(
        lambda gate, up, impl: liger_jax.swiglu(gate, up, implementation=impl),
        lambda: (_normal(10, B, S, D), _normal(11, B, S, D)),
        2,
    ),
    "geglu": Case(
        lambda gate, up, impl: liger_jax.geglu(gate, up, implementation=impl),
        lambda: (_normal(12, B, S, D), _normal(13, B, S, D)),
        2,
    ),
    "cross_entropy": Case(
        lambda logits, labels, impl: liger_jax.cross_entropy(
            logits, labels, label_smoothing=0.1, reduction="none", implementation=impl
        ),
        lambda: (_normal(14, B, S, V), _labels(15)),
        2,
    ),
    "fused_linear_cross_entropy": Case(
        lambda x, labels, weight, impl: liger_jax.fused_linear_cross_entropy(
            x, weight, labels, reduction="none", chunk_size=16, implementation=impl
        ),
        lambda: (_normal(16, B, S, D), _labels(17), 0.3 * _normal(18, D, V)),
        2,
    ),
}

# Shardings of the leading [B, S] axes, per mesh.
MESHES = {
    (8,): ("x",),
    (4, 2): ("x", "y"),
    (2, 2, 2): ("x", "y", "z"),
}
ROW_SPECS = {
    (8,): [("x",), (None, "x")],
    (4, 2): [("x", "y"), (("y", "x"),)],
    (2, 2, 2): [(("x", "y"), "z"), ("z", ("x", "y"))],
}
ROW_CASES = [(shape, spec) for shape, specs in ROW_SPECS.items() for spec in specs]


def _is_float(array) -> bool:
    return jnp.issubdtype(array.dtype, jnp.floating)


def _vjp_program(case: Case, implementation=IMPLEMENTATION):
    """``jit((arrays, cotangent) -> (outputs, grads of the float arrays))`` of the case."""

    @jax.jit
    def run(arrays, cotangent):
        floats = [i for i, a in enumerate(arrays) if _is_float(a)]

        def of_floats(*values):
            merged = list(arrays)
            for i, value in zip(floats, values, strict=True):
                merged[i] = value
            return case.op(*merged, implementation)

        outputs, pullback = jax.vjp(of_floats, *(arrays[i] for i in floats))
        return outputs, pullback(cotangent)

    return run


def _cotangent(case: Case, arrays):
    shapes = jax.eval_shape(lambda *a: case.op(*a, "xla"), *arrays)
    return jax.tree.map(lambda s: harness.random_normal(99, s.shape, s.dtype), shapes)


def _assert_trees_close(actual, expected):
    for a, e in zip(jax.tree.leaves(actual), jax.tree.leaves(expected), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(e), rtol=1e-5, atol=1e-5)


def _sharded(case: Case, arrays, mesh_, spec):
    return tuple(place(a, mesh_, *spec) if i < case.n_rows else place(a, mesh_) for i, a in enumerate(arrays))


def _sharded_like_rows(tree, mesh_, spec):
    """The [B, S, ...] leaves of ``tree`` (outputs, cotangents) sharded as the activations are."""
    return jax.tree.map(lambda a: place(a, mesh_, *spec) if a.shape[:2] == (B, S) else place(a, mesh_), tree)


def _assert_rows_sharded_like(outputs, reference: jax.Array):
    """Every output with the reference's leading [B, S] axes keeps their sharding."""
    for output in jax.tree.leaves(outputs):
        if output.shape[:2] == (B, S):
            assert _leading_specs_match(output, reference), (output.sharding, reference.sharding)


def _leading_specs_match(output, reference) -> bool:
    def leading(array):
        entries = (tuple(array.sharding.spec) + (None, None))[:2]
        return tuple((e,) if isinstance(e, str) else tuple(e or ()) for e in entries)

    return leading(output) == leading(reference)


def _assert_partitioned(case, arrays, program, sharded, cotangent, expected):
    """``program`` on the sharded operands gives ``expected``, with rows sharded like the first operand's."""
    outputs, grads = program(sharded, cotangent)
    _assert_trees_close((outputs, grads), expected)
    _assert_rows_sharded_like((outputs, grads), sharded[0])
    # Only the weights' gradient partials (and scalars) cross devices; no activation is gathered.
    weights = [a for a in arrays[case.n_rows :] if _is_float(a)]
    assert_only_small_all_reduces(compiled_collectives(program, sharded, cotangent), nbytes(*weights) + 64)


@pytest.mark.parametrize("mesh_shape,spec", ROW_CASES, ids=[f"{m}-{s}" for m, s in ROW_CASES])
@pytest.mark.parametrize("name", CASES)
def test_op_partitions_under_jit(name, mesh_shape, spec):
    case = CASES[name]
    mesh_ = mesh(mesh_shape, MESHES[mesh_shape])
    arrays = case.arrays()
    cotangent = _cotangent(case, arrays)
    program = _vjp_program(case)
    expected = program(arrays, cotangent)
    sharded, cotangent = _sharded(case, arrays, mesh_, spec), _sharded_like_rows(cotangent, mesh_, spec)
    _assert_partitioned(case, arrays, program, sharded, cotangent, expected)


@pytest.mark.parametrize("name", CASES)
def test_op_partitions_on_explicit_axes(name):
    case = CASES[name]
    mesh_ = mesh((4, 2), ("x", "y"), AxisType.Explicit)
    arrays = case.arrays()
    cotangent = _cotangent(case, arrays)
    expected = _vjp_program(case)(arrays, cotangent)
    sharded, cotangent = _sharded(case, arrays, mesh_, ("x", "y")), _sharded_like_rows(cotangent, mesh_, ("x", "y"))
    with jax.set_mesh(mesh_):
        _assert_partitioned(case, arrays, _vjp_program(case), sharded, cotangent, expected)


@pytest.mark.parametrize("name", CASES)
def test_op_inside_shard_map(name):
    """Per-device grads of the psum-ed loss equal the global grads: a replicated weight gets the summed partials."""
    case = CASES[name]
    mesh_ = mesh((8,), ("x",))
    arrays = case.arrays()
    cotangent = _cotangent(case, arrays)
    floats = [i for i, a in enumerate(arrays) if _is_float(a)]
    specs = tuple(P("x") if i < case.n_rows else P() for i in range(len(arrays)))

    def loss(arrays, cotangent):
        products = jax.tree.map(lambda o, c: jnp.sum(o * c), case.op(*arrays, IMPLEMENTATION), cotangent)
        return sum(jax.tree.leaves(products))

    def grads(arrays, cotangent, reduce):
        def of_floats(*values):
            merged = list(arrays)
            for i, value in zip(floats, values, strict=True):
                merged[i] = value
            return reduce(loss(merged, cotangent))

        return jax.grad(of_floats, argnums=tuple(range(len(floats))))(*(arrays[i] for i in floats))

    expected = jax.jit(lambda a, c: grads(a, c, lambda v: v))(arrays, cotangent)
    per_device = jax.shard_map(
        lambda a, c: grads(a, c, lambda v: jax.lax.psum(v, "x")),
        mesh=mesh_,
        in_specs=(specs, jax.tree.map(lambda _: P("x"), cotangent)),
        out_specs=tuple(specs[i] for i in floats),
    )
    _assert_trees_close(jax.jit(per_device)(_sharded(case, arrays, mesh_, ("x",)), cotangent), expected)


@pytest.mark.parametrize("name", ["rms_norm", "cross_entropy"])
def test_shard_map_without_vma_checks_agrees_with_the_xla_reference(name):
    """With check_vma=False no axis is known to be varying: the op behaves as the XLA reference does there."""
    case = CASES[name]
    mesh_ = mesh((8,), ("x",))
    arrays = case.arrays()
    specs = tuple(P("x") if i < case.n_rows else P() for i in range(len(arrays)))

    def run(implementation):
        def body(*arrays):
            outputs = case.op(*arrays, implementation)
            return outputs, jax.grad(lambda x: jnp.sum(jnp.sin(case.op(x, *arrays[1:], implementation))))(arrays[0])

        program = jax.shard_map(body, mesh=mesh_, in_specs=specs, out_specs=(P("x"), P("x")), check_vma=False)
        return jax.jit(program)(*_sharded(case, arrays, mesh_, ("x",)))

    _assert_trees_close(run(IMPLEMENTATION), run("xla"))


def test_feature_axis_sharding_is_gathered_not_misread():
    case = CASES["rms_norm"]
    mesh_ = mesh((4, 2), ("x", "y"))
    arrays = case.arrays()
    cotangent = _cotangent(case, arrays)
    program = _vjp_program(case)
    sharded = (place(arrays[0], mesh_, "x", None, "y"), place(arrays[1], mesh_, "y"))
    _assert_trees_close(program(sharded, cotangent), program(arrays, cotangent))
    assert any(c.kind == "all-gather" for c in compiled_collectives(program, sharded, cotangent))


def test_vmap_over_a_sharded_batch_keeps_its_sharding():
    mesh_ = mesh((4, 2), ("x", "y"))
    x, scale = CASES["rms_norm"].arrays()
    batched = jax.jit(jax.vmap(lambda x: liger_jax.rms_norm(x, scale, implementation=IMPLEMENTATION)))
    sharded = place(x, mesh_, "x", "y")
    y = batched(sharded)
    _assert_trees_close(y, batched(x))
    assert _leading_specs_match(y, sharded)
    assert_only_small_all_reduces(compiled_collectives(batched, sharded), 0)


def test_gspmd_partitioner_uses_the_same_rules():
    case = CASES["rms_norm"]
    mesh_ = mesh((4, 2), ("x", "y"))
    arrays = case.arrays()
    cotangent = _cotangent(case, arrays)
    expected = _vjp_program(case)(arrays, cotangent)
    jax.config.update("jax_use_shardy_partitioner", False)
    try:
        program = _vjp_program(case)
        sharded = _sharded(case, arrays, mesh_, ("x", "y"))
        outputs, grads = program(sharded, _sharded_like_rows(cotangent, mesh_, ("x", "y")))
        found = compiled_collectives(program, sharded, cotangent)
    finally:
        jax.config.update("jax_use_shardy_partitioner", True)
    _assert_trees_close((outputs, grads), expected)
    _assert_rows_sharded_like((outputs, grads), sharded[0])
    assert_only_small_all_reduces(found, nbytes(arrays[1]) + 64)


@pytest.mark.parametrize("axis_type", [AxisType.Auto, AxisType.Explicit])
@pytest.mark.parametrize("name", ["rms_norm", "fused_linear_cross_entropy"])
def test_one_device_mesh_takes_the_same_path(name, axis_type):
    case = CASES[name]
    mesh_ = mesh((1,), ("x",), axis_type)
    arrays = case.arrays()
    cotangent = _cotangent(case, arrays)
    expected = _vjp_program(case)(arrays, cotangent)
    sharded = tuple(jax.device_put(a, NamedSharding(mesh_, P())) for a in arrays)
    with jax.set_mesh(mesh_):
        _assert_trees_close(_vjp_program(case)(sharded, cotangent), expected)


def test_rope_keeps_heads_sharded_as_tensor_parallelism_shards_them():
    """q's and k's head axes on the same mesh axis (column-parallel projections): nothing is gathered."""
    case = CASES["rope"]
    mesh_ = mesh((4, 2), ("x", "y"))
    arrays = case.arrays()
    cotangent = _cotangent(case, arrays)
    program = _vjp_program(case)
    expected = program(arrays, cotangent)
    sharded = tuple(place(a, mesh_, "x", None, "y") for a in arrays)
    outputs, grads = program(sharded, jax.tree.map(lambda c: place(c, mesh_, "x", None, "y"), cotangent))
    _assert_trees_close((outputs, grads), expected)
    for result, array in zip(jax.tree.leaves((outputs, grads)), sharded + sharded, strict=True):
        assert result.sharding.is_equivalent_to(array.sharding, array.ndim)
    assert_only_small_all_reduces(compiled_collectives(program, sharded, cotangent), 0)
