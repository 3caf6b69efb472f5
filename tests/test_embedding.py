"""The embedding lookup and its Flax twins: rows and gradients against float64, fp32 sums of repeated rows, no
table-sized array in the compute dtype, flax's values and param trees, the swap, bad inputs."""

import warnings

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from jax.test_util import check_grads

import liger_jax
from liger_jax.flax_layers import KINDS, apply_liger, liger_intercept
from liger_jax.flax_layers import linen as liger_linen
from liger_jax.flax_layers import nnx as liger_nnx
from tests import collectives, harness

# (table dtype, rows dtype): fp32 params with bf16 / fp16 compute (the mixed-precision case the op is for), and
# tables already in the compute dtype.
DTYPE_CASES = [
    (jnp.float32, None),
    (jnp.float32, jnp.bfloat16),
    (jnp.float32, jnp.float16),
    (jnp.bfloat16, None),
    (jnp.float16, jnp.float32),
]
N_ROWS, FEATURES = 37, 12  # V and H of no power of two
KERNEL = harness.KERNEL_IMPLEMENTATION  # the op's own formulation (no Triton kernel runs; "xla" is flax's)


def _ids(seed, shape, n_rows=N_ROWS):
    """Ids with repeats and negatives (counted from the end), in ``[-n_rows, n_rows)``."""
    return jnp.asarray(np.random.default_rng(seed).integers(-n_rows, n_rows, shape), jnp.int32)


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
@pytest.mark.parametrize(("table_dtype", "dtype"), DTYPE_CASES)
@pytest.mark.parametrize("ids_shape", [(1,), (3, 17), (2, 3, 5)])
def test_rows_and_gradient_match_float64(implementation, table_dtype, dtype, ids_shape):
    table = harness.random_normal(0, (N_ROWS, FEATURES), table_dtype)
    ids = _ids(1, ids_shape)
    rows_dtype = table_dtype if dtype is None else dtype
    cotangent = harness.random_normal(2, (*ids_shape, FEATURES), rows_dtype)
    harness.assert_vjp_matches_reference(
        lambda table: liger_jax.embedding(table, ids, dtype=dtype, implementation=implementation),
        lambda table: liger_jax.embedding_reference(table, ids),
        (table,),
        cotangent,
        harness.least_precise(table_dtype, rows_dtype),
    )
    assert liger_jax.embedding(table, ids, dtype=dtype, implementation=implementation).dtype == rows_dtype


def test_gradient_passes_check_grads_in_float64():
    table = harness.random_normal(3, (N_ROWS, FEATURES), jnp.float64)
    ids = _ids(4, (4, 9))
    check_grads(lambda table: liger_jax.embedding(table, ids, implementation=KERNEL), (table,), order=1, modes=("rev",))


@pytest.mark.parametrize("table_dtype", [jnp.bfloat16, jnp.float16])
def test_a_row_repeated_thousands_of_times_sums_in_fp32(table_dtype):
    # 4096 cotangents near 1 on one row: a sum in the table's dtype stalls where its spacing passes the terms
    # (bf16 from 256, fp16 from 2048); summed in fp32 and rounded once it is within one rounding of the exact sum.
    table = harness.random_normal(5, (N_ROWS, FEATURES), table_dtype)
    ids = jnp.full((4096,), 7, jnp.int32)
    cotangent = jnp.asarray(np.random.default_rng(6).uniform(0.5, 1.5, (4096, FEATURES)), table_dtype)
    _, pullback = jax.vjp(lambda table: liger_jax.embedding(table, ids, implementation=KERNEL), table)
    (grad,) = pullback(cotangent)
    exact = np.asarray(cotangent, np.float64).sum(axis=0)
    np.testing.assert_allclose(np.asarray(grad[7], np.float64), exact, rtol=jnp.finfo(table_dtype).eps)
    np.testing.assert_array_equal(np.asarray(np.delete(np.asarray(grad, np.float64), 7, axis=0)), 0.0)


def _table_sized_arrays(loss, table, dtype) -> list[str]:
    """The primitives of ``jax.grad(loss)(table)``'s jaxpr that make an array of the table's shape in ``dtype``."""
    jaxpr = jax.make_jaxpr(jax.grad(loss))(table).jaxpr
    return [
        eqn.primitive.name
        for eqn in jaxpr.eqns
        for var in eqn.outvars
        if var.aval.shape == table.shape and var.aval.dtype == dtype
    ]


def test_an_fp32_table_is_never_cast_whole_nor_summed_in_the_compute_dtype():
    table = harness.random_normal(7, (N_ROWS, FEATURES), jnp.float32)
    ids = _ids(8, (4, 6))

    def loss(table):
        embedded = liger_jax.embedding(table, ids, dtype=jnp.bfloat16, implementation=KERNEL)
        return jnp.sum(embedded.astype(jnp.float32) ** 2)

    def flax_loss(table):
        return jnp.sum(liger_jax.embedding_reference(table, ids, dtype=jnp.bfloat16).astype(jnp.float32) ** 2)

    assert _table_sized_arrays(loss, table, jnp.bfloat16) == []
    assert _table_sized_arrays(flax_loss, table, jnp.bfloat16), "the check sees flax's casts"


def test_a_bf16_table_gradient_is_summed_without_a_table_sized_fp32_buffer():
    ids = _ids(20, (4, 6))

    def loss(table):
        return jnp.sum(liger_jax.embedding(table, ids, implementation=KERNEL).astype(jnp.float32) ** 2)

    bf16_table, fp32_table = (harness.random_normal(21, (N_ROWS, FEATURES), d) for d in (jnp.bfloat16, jnp.float32))
    assert _table_sized_arrays(loss, bf16_table, jnp.float32) == []
    assert _table_sized_arrays(loss, fp32_table, jnp.float32), "the check sees fp32 sums"


@pytest.mark.parametrize("table_dtype", [jnp.float32, jnp.bfloat16])
def test_jit_vmap_and_checkpoint(table_dtype):
    table = harness.random_normal(9, (N_ROWS, FEATURES), table_dtype)
    ids = _ids(10, (3, 5))
    batched = jax.jit(jax.vmap(lambda ids: liger_jax.embedding(table, ids, dtype=jnp.bfloat16, implementation=KERNEL)))(
        ids
    )
    np.testing.assert_array_equal(batched, liger_jax.embedding_reference(table, ids, dtype=jnp.bfloat16))

    def loss(table):
        return jnp.sum(jnp.sin(liger_jax.embedding(table, ids, implementation=KERNEL)))

    harness.assert_checkpoint_gives_the_same_gradients(loss, (table,))


@pytest.mark.parametrize("table_dtype", [jnp.float32, jnp.bfloat16])
def test_the_ids_at_either_end_of_the_range_are_rows(table_dtype):
    table = harness.random_normal(14, (N_ROWS, FEATURES), table_dtype)
    rows, pullback = jax.vjp(
        lambda table: liger_jax.embedding(table, jnp.array([-N_ROWS, N_ROWS - 1, -1]), implementation=KERNEL), table
    )
    np.testing.assert_array_equal(rows, table[jnp.array([0, N_ROWS - 1, N_ROWS - 1])])
    (grad,) = pullback(jnp.ones_like(rows))
    expected = (np.eye(N_ROWS)[0] + 2 * np.eye(N_ROWS)[-1]) * FEATURES
    np.testing.assert_array_equal(np.asarray(grad, np.float32).sum(axis=1), expected)


@pytest.mark.parametrize("table_dtype", [jnp.float32, jnp.bfloat16])
def test_the_gradient_of_each_single_id_is_its_row_alone(table_dtype):
    table = harness.random_normal(19, (N_ROWS, FEATURES), table_dtype)

    def gradient(one_id):
        rows, pullback = jax.vjp(lambda table: liger_jax.embedding(table, one_id, implementation=KERNEL), table)
        return pullback(jnp.ones_like(rows))[0]

    ids = np.arange(-N_ROWS, N_ROWS, dtype=np.int32)
    expected = np.repeat(np.eye(N_ROWS)[ids % N_ROWS][..., None], FEATURES, axis=-1)
    np.testing.assert_array_equal(np.asarray(jax.vmap(gradient)(ids), np.float32), expected)


@pytest.mark.parametrize("table_dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("ids", [np.zeros((0,), np.int32), np.zeros((2, 0), np.int32), np.int32(3)])
def test_no_ids_and_a_scalar_id(table_dtype, ids):
    table = harness.random_normal(18, (N_ROWS, FEATURES), table_dtype)
    rows, pullback = jax.vjp(lambda table: liger_jax.embedding(table, ids, implementation=KERNEL), table)
    assert rows.shape == (*ids.shape, FEATURES)
    (grad,) = pullback(jnp.ones_like(rows))
    np.testing.assert_array_equal(np.asarray(grad, np.float32).sum(axis=1), np.eye(N_ROWS)[3] * FEATURES * ids.size)


@pytest.mark.parametrize("table_dtype", [jnp.float32, jnp.bfloat16])  # summed in place; summed by id first
def test_a_traced_id_past_either_end_gives_a_nan_row_and_no_gradient(table_dtype):
    table = harness.random_normal(11, (N_ROWS, FEATURES), table_dtype)
    ids = jnp.array([0, N_ROWS, 2, -N_ROWS - 1, -1, 2])
    rows, pullback = jax.vjp(
        jax.jit(lambda table, ids: liger_jax.embedding(table, ids, implementation=KERNEL)), table, ids
    )
    np.testing.assert_array_equal(np.isnan(np.asarray(rows, np.float32)).all(axis=1), [0, 1, 0, 1, 0, 0])
    (grad, _) = pullback(jnp.ones_like(rows))
    expected = (np.eye(N_ROWS)[0] + 2 * np.eye(N_ROWS)[2] + np.eye(N_ROWS)[-1]) * FEATURES
    np.testing.assert_array_equal(np.asarray(grad, np.float32).sum(axis=1), expected)


@pytest.mark.parametrize("table_dtype", [jnp.float32, jnp.bfloat16])
def test_a_table_sharded_on_the_vocabulary_and_ids_on_the_batch_give_the_same_gradient(table_dtype):
    mesh = collectives.mesh((2, 4), ("data", "vocab"))
    table = harness.random_normal(15, (40, FEATURES), table_dtype)
    ids = _ids(16, (4, 6), n_rows=40)
    cotangent = harness.random_normal(17, (4, 6, FEATURES), table_dtype)

    @jax.jit
    def gradient(table, ids):
        _, pullback = jax.vjp(lambda table: liger_jax.embedding(table, ids, implementation=KERNEL), table)
        return pullback(cotangent)[0]

    placed = (NamedSharding(mesh, P("vocab")), NamedSharding(mesh, P("data")))
    sharded = gradient(*(jax.device_put(x, where) for x, where in zip((table, ids), placed, strict=True)))
    harness.assert_close(sharded, gradient(table, ids), table_dtype)


@pytest.mark.parametrize(
    ("error", "match", "table", "ids", "options"),
    [
        (ValueError, "table must have 2 axes", jnp.ones((5,)), jnp.zeros(2, jnp.int32), {}),
        (TypeError, "table must have a float dtype", jnp.ones((5, 3), jnp.int32), jnp.zeros(2, jnp.int32), {}),
        (TypeError, "ids must have an integer dtype", jnp.ones((5, 3)), jnp.zeros(2), {}),
        (ValueError, r"ids must be in \[-5, 5\).*got 5 at index \(1,\)", jnp.ones((5, 3)), jnp.array([0, 5]), {}),
        (ValueError, r"got -6 at index \(0,\)", jnp.ones((5, 3)), jnp.array([-6, 0]), {}),
        (TypeError, "dtype must be a floating dtype", jnp.ones((5, 3)), jnp.zeros(2, jnp.int32), {"dtype": "int8"}),
        (TypeError, "accum_dtype must be a floating", jnp.ones((5, 3)), jnp.zeros(2, jnp.int32), {"accum_dtype": int}),
        (ValueError, "implementation", jnp.ones((5, 3)), jnp.zeros(2, jnp.int32), {"implementation": "cuda"}),
    ],
)
def test_bad_inputs_raise_naming_the_argument(error, match, table, ids, options):
    with pytest.raises(error, match=match):
        liger_jax.embedding(table, ids, **options)


@pytest.mark.parametrize(
    ("param_dtype", "dtype"), [(jnp.float32, None), (jnp.float32, jnp.bfloat16), (jnp.bfloat16, None)]
)
def test_nnx_embed_is_flax_with_its_params(param_dtype, dtype):
    flax_embed = nnx.Embed(N_ROWS, FEATURES, dtype=dtype, param_dtype=param_dtype, rngs=nnx.Rngs(0))
    liger_embed = liger_nnx.Embed(N_ROWS, FEATURES, dtype=dtype, param_dtype=param_dtype, rngs=nnx.Rngs(0))
    assert jax.tree.structure(nnx.state(liger_embed)) == jax.tree.structure(nnx.state(flax_embed))
    ids = jax.random.permutation(jax.random.key(1), N_ROWS)[:20].reshape(4, 5)  # no repeats: equal gradients

    def loss_and_grad(module):
        def loss(module):
            return jnp.sum(module(ids).astype(jnp.float32) * jnp.arange(FEATURES)[None, None, :])

        return nnx.value_and_grad(loss)(module)

    np.testing.assert_array_equal(liger_embed(ids), flax_embed(ids))
    assert liger_embed(ids).dtype == flax_embed(ids).dtype
    (value, grads), (flax_value, flax_grads) = loss_and_grad(liger_embed), loss_and_grad(flax_embed)
    np.testing.assert_array_equal(value, flax_value)
    jax.tree.map(np.testing.assert_array_equal, grads, flax_grads)
    query = harness.random_normal(2, (3, FEATURES), jnp.float32)
    np.testing.assert_array_equal(liger_embed.attend(query), flax_embed.attend(query))


def test_linen_embed_is_flax_with_its_params_alone_and_intercepted():
    ids = _ids(12, (2, 7))

    class Model(nn.Module):
        @nn.compact
        def __call__(self, ids):
            embed = nn.Embed(N_ROWS, FEATURES, dtype=jnp.bfloat16)
            return embed(ids), embed.attend(jnp.ones((2, FEATURES), jnp.bfloat16))

    params = Model().init(jax.random.key(0), ids)
    expected = Model().apply(params, ids)
    with liger_intercept(implementation="xla") as counts:
        intercepted_params = Model().init(jax.random.key(0), ids)
        outputs = jax.jit(Model().apply)(params, ids)
    assert counts == {**dict.fromkeys(KINDS, 0), "embedding": 2}
    jax.tree.map(np.testing.assert_array_equal, intercepted_params, params)
    jax.tree.map(np.testing.assert_array_equal, outputs, expected)
    alone = liger_linen.Embed(N_ROWS, FEATURES)
    alone_params = alone.init(jax.random.key(0), ids)
    np.testing.assert_array_equal(alone.apply(alone_params, ids), nn.Embed(N_ROWS, FEATURES).apply(alone_params, ids))


class _TiedModel(nnx.Module):
    """An embedding shared by the input and a tied head."""

    def __init__(self, promote_dtype=None):
        options = {} if promote_dtype is None else {"promote_dtype": promote_dtype}
        self.embed = nnx.Embed(N_ROWS, FEATURES, dtype=jnp.bfloat16, rngs=nnx.Rngs(0), **options)
        self.head = nnx.Dict(embed=self.embed)

    def __call__(self, ids):
        return self.head["embed"].attend(self.embed(ids))


def test_apply_liger_swaps_a_shared_embed_once_everywhere():
    model = _TiedModel()
    ids = _ids(13, (2, 5))
    before, state = model(ids), nnx.state(model)
    counts = apply_liger(model, implementation="xla")
    assert counts == {**dict.fromkeys(KINDS, 0), "embedding": 1}
    assert type(model.embed) is liger_nnx.Embed and model.head["embed"] is model.embed
    assert jax.tree.structure(nnx.state(model)) == jax.tree.structure(state)
    np.testing.assert_array_equal(model(ids), before)
    assert apply_liger(_TiedModel(), embedding=False)["embedding"] == 0


def test_an_embed_with_its_own_promotion_is_left_with_a_warning():
    model = _TiedModel(promote_dtype=lambda arrays, dtype, inexact: arrays)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        counts = apply_liger(model)
    assert counts["embedding"] == 0 and type(model.embed) is nnx.Embed
    assert any("Embed" in str(w.message) for w in caught)
