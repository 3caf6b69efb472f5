"""GroupNorm (channels last): every implementation against the float64 reference, values and gradients; the Flax
twins against flax's GroupNorm; sharding over the batch."""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import triton
import triton.language as tl
from flax import linen as nn
from flax import nnx
from jax.test_util import check_grads

import liger_jax
from liger_jax import runtime
from liger_jax.flax_layers import apply_liger, liger_intercept
from liger_jax.flax_layers import linen as liger_linen
from liger_jax.flax_layers import nnx as liger_nnx
from liger_jax.kernels import group_norm as group_norm_kernels
from liger_jax.ops import _tiling
from liger_jax.ops import group_norm as group_norm_op
from tests import harness
from tests.collectives import assert_only_small_all_reduces, compiled_collectives, mesh, nbytes, place

# (x shape, num_groups): an image [B, H, W, C] with 3 groups of 4 channels (one block, its tail masked); no positions
# (rank 2); groups of 3 channels in two blocks of 32 groups, the second partial; one example, two blocks of 4 groups
# of 16; and 52 tokens more than one chunk of 16 channels holds (the last chunk partial): two passes over the data.
SHAPES = [
    ((2, 5, 7, 12), 3),
    ((3, 24), 4),
    ((2, 11, 120), 40),
    ((1, 9, 96), 6),
    ((2, group_norm_op.CHUNK_ELEMENTS // 16 + 52, 16), 2),
]
SHAPE_IDS = ["image", "rank2", "group3", "two_blocks", "chunks"]


def _inputs(seed, shape, dtype, weight_dtype=None):
    # An offset mean: the statistics must not rely on x being centred.
    x = harness.random_normal(seed, shape, jnp.float32) * 2.0 + 1.5
    scale = harness.random_normal(seed + 1, shape[-1:], weight_dtype or dtype)
    bias = harness.random_normal(seed + 2, shape[-1:], weight_dtype or dtype)
    return x.astype(dtype), scale, bias


def _op(implementation, num_groups, **kwargs):
    return functools.partial(liger_jax.group_norm, num_groups=num_groups, implementation=implementation, **kwargs)


def _reference(num_groups, **kwargs):
    return functools.partial(liger_jax.group_norm_reference, num_groups=num_groups, **kwargs)


def _assert_vjp_matches_reference(op, reference, primals, cotangent, dtype):
    """Values and gradients; dscale and dbias sum over every example and position."""
    terms = primals[0].size // primals[0].shape[-1]
    harness.assert_vjp_matches_reference_over_sums(op, reference, primals, cotangent, dtype, {1: terms, 2: terms})


# Every dtype on one shape, one dtype on each other shape (the chunked path is the same code in every dtype).
CASES = [
    pytest.param(*SHAPES[SHAPE_IDS.index(name)], dtype, id=f"{name}-{jnp.dtype(dtype).name}")
    for name, dtypes in [
        ("image", harness.DTYPES),
        ("group3", (jnp.bfloat16,)),
        ("rank2", (jnp.float32,)),
        ("two_blocks", (jnp.float16,)),
        ("chunks", (jnp.float32,)),
    ]
    for dtype in dtypes
]


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
@pytest.mark.parametrize(("shape", "num_groups", "dtype"), CASES)
def test_values_and_gradients_match_float64_reference(implementation, shape, num_groups, dtype):
    primals = _inputs(len(shape) + num_groups, shape, dtype)
    cotangent = harness.random_normal(7, shape, dtype)
    _assert_vjp_matches_reference(_op(implementation, num_groups), _reference(num_groups), primals, cotangent, dtype)


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
def test_mixed_weight_dtypes_and_missing_weights(implementation):
    x, scale, bias = _inputs(3, (2, 6, 32), jnp.bfloat16, weight_dtype=jnp.float32)
    cotangent = harness.random_normal(4, x.shape, jnp.bfloat16)
    harness.assert_vjp_matches_reference(
        _op(implementation, 8), _reference(8), (x, scale, bias), cotangent, jnp.bfloat16
    )
    x64 = jnp.asarray(x, jnp.float64)
    for s, b in ((scale, None), (None, None)):
        harness.assert_close(_op(implementation, 8)(x, s, b), _reference(8)(x64, s, b), jnp.bfloat16)


def test_check_grads_fp32_kernel_and_float64_reference():
    x, scale, bias = _inputs(5, (2, 3, 16), jnp.float32)
    check_grads(_op(harness.KERNEL_IMPLEMENTATION, 4), (x, scale, bias), order=1, modes=["rev"])
    check_grads(_reference(4), harness.as_float64(x, scale, bias), order=1, modes=["rev"])


@pytest.mark.parametrize(
    ("shape", "num_groups", "override"),
    [
        # In one launch a pass: chunks of 8 tokens (the last of 37 partial) over three blocks of two 8-channel groups.
        ((2, 37, 48), 6, _tiling.TilingOverride(block_d=16, block_rows=8, token_splits=1)),
        # One-token chunks, groups of 3 channels in blocks of 4 groups (16 channels, the tail of each masked).
        ((1, 5, 24), 8, _tiling.TilingOverride(block_d=8, block_rows=1, token_splits=1)),
        # Token splits (two launches a pass): runs of two 8-token chunks, the last run 5 tokens (its second chunk
        # empty); runs of one 4-token chunk, the last of 37 tokens alone; one-token runs of groups of 3 channels.
        ((2, 37, 48), 6, _tiling.TilingOverride(block_d=16, block_rows=8, token_splits=3)),
        ((2, 37, 48), 6, _tiling.TilingOverride(block_d=16, block_rows=4, token_splits=10)),
        ((1, 5, 24), 8, _tiling.TilingOverride(block_d=8, block_rows=1, token_splits=5)),
        # Two splits of a second block of 32 groups of which 8 exist.
        ((2, 11, 120), 40, _tiling.TilingOverride(token_splits=2)),
        # Both passes in one ordered launch: the least lag (the splits: the unit's last statistics item just before
        # its first output item), a lag past the splits, every statistics item first, a partial block.
        ((2, 37, 48), 6, _tiling.TilingOverride(block_d=16, block_rows=8, token_splits=3, split_lag=1)),
        ((2, 37, 48), 6, _tiling.TilingOverride(block_d=16, block_rows=4, token_splits=10, split_lag=13)),
        ((1, 5, 24), 8, _tiling.TilingOverride(block_d=8, block_rows=1, token_splits=5, split_lag=1 << 20)),
        ((2, 11, 120), 40, _tiling.TilingOverride(token_splits=2, split_lag=3)),
        ((2, 11, 60), 5, _tiling.TilingOverride(block_d=16, token_splits=2, split_lag=2)),
    ],
    ids=[
        "chunks",
        "one_token_chunks",
        "split_runs",
        "split_chunks",
        "split_tokens",
        "split_partial_block",
        "ordered_least_lag",
        "ordered_lag",
        "ordered_statistics_first",
        "ordered_partial_block",
        "ordered_last_block_one_group",
    ],
)
def test_forced_chunks_and_blocks_match_float64_reference(shape, num_groups, override):
    primals = _inputs(11, shape, jnp.float32)
    cotangent = harness.random_normal(12, shape, jnp.float32)
    with _tiling.overridden(override):
        tiling = group_norm_op.group_tiling(shape[1], shape[2], num_groups, override)
        assert tiling.block_s < shape[1] and tiling.grid(shape[0], num_groups)[1] > 1
        assert tiling.token_splits == (override.token_splits or 1)
        assert tiling.split_lag == (max(override.split_lag, tiling.token_splits) if override.split_lag else None)
        _assert_vjp_matches_reference(
            _op(harness.KERNEL_IMPLEMENTATION, num_groups), _reference(num_groups), primals, cotangent, jnp.float32
        )


@pytest.mark.parametrize(
    "shape", [(2, 6, 24), (2, group_norm_op.CHUNK_ELEMENTS // 16 + 3, 16)], ids=["one_pass", "chunks"]
)
def test_epsilon_reaches_the_statistics(shape):
    # An epsilon of the order of the groups' variance: leaving it out, or adding it twice, moves y by ~30%.
    primals = _inputs(13, shape, jnp.float32)
    cotangent = harness.random_normal(14, shape, jnp.float32)
    op, reference = _op(harness.KERNEL_IMPLEMENTATION, 4, epsilon=2.0), _reference(4, epsilon=2.0)
    _assert_vjp_matches_reference(op, reference, primals, cotangent, jnp.float32)


def test_gradient_identities():
    # dbias sums dy over examples and positions; dx sums to zero over each (example, group), as x - mean does.
    x, scale, bias = _inputs(6, (3, 10, 24), jnp.float32)
    dy = harness.random_normal(8, x.shape, jnp.float32)
    _, (dx, _, dbias) = harness.vjp_under_jit(_op(harness.KERNEL_IMPLEMENTATION, 6), (x, scale, bias), dy)
    np.testing.assert_allclose(dbias, dy.sum(axis=(0, 1)), rtol=1e-5, atol=1e-5)
    group_sums = np.asarray(dx).reshape(3, 10, 6, 4).sum(axis=(1, 3))
    np.testing.assert_allclose(group_sums, 0.0, atol=1e-5)


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
def test_vmap_folds_into_the_batch_and_maps_batched_weights(implementation):
    x, scale, bias = _inputs(9, (2, 3, 5, 16), jnp.float32)
    op, reference = _op(implementation, 4), _reference(4)
    folded = jax.jit(jax.vmap(lambda x: op(x, scale, bias)))(x)
    expected = jax.vmap(lambda x: reference(x, *harness.as_float64(scale, bias)))(jnp.asarray(x, jnp.float64))
    harness.assert_close(folded, expected, jnp.float32)
    scales = harness.random_normal(10, (2, 16), jnp.float32)

    def loss(fn):
        return lambda scale, x: jnp.sum(fn(x, scale, None) ** 2)

    per_example = jax.jit(jax.vmap(jax.grad(loss(op), argnums=(0, 1))))(scales, x)
    want = jax.vmap(jax.grad(loss(reference), argnums=(0, 1)))(*harness.as_float64(scales, x))
    harness.assert_close_trees(per_example, want, jnp.float32)


def test_checkpoint_gives_the_same_gradients():
    x, scale, bias = _inputs(11, (2, 7, 8), jnp.float32)
    op = _op(harness.KERNEL_IMPLEMENTATION, 2)
    harness.assert_checkpoint_gives_the_same_gradients(lambda *a: jnp.sum(jnp.sin(op(*a))), (x, scale, bias))


def test_backward_is_bitwise_deterministic():
    x, scale, bias = _inputs(12, (2, 9, 24), jnp.float32)
    op = _op(harness.KERNEL_IMPLEMENTATION, 3)
    harness.assert_bitwise_deterministic(jax.grad(lambda *a: jnp.sum(op(*a) ** 2), argnums=(0, 1, 2)), x, scale, bias)


def test_sharded_batch_stays_sharded_and_matches_one_device():
    mesh_ = mesh((4,), ("data",))
    x, scale, bias = _inputs(13, (8, 6, 32), jnp.float32)
    dy = harness.random_normal(14, x.shape, jnp.float32)
    op = _op(harness.KERNEL_IMPLEMENTATION, 4)

    @jax.jit
    def program(x, scale, bias, dy):
        y, pullback = jax.vjp(op, x, scale, bias)
        return y, pullback(dy)

    expected = program(x, scale, bias, dy)
    sharded = (place(x, mesh_, "data"), place(scale, mesh_), place(bias, mesh_), place(dy, mesh_, "data"))
    y, grads = program(*sharded)
    chex.assert_trees_all_close((y, grads), expected, atol=1e-5, rtol=1e-5)
    assert y.sharding.spec[0] == "data" and grads[0].sharding.spec[0] == "data"
    assert_only_small_all_reduces(compiled_collectives(program, *sharded), nbytes(scale, bias) + 64)


def test_tiling_covers_whole_groups_in_cache_lines():
    for n_tokens, channels, groups in [(4096, 512, 32), (1, 24, 4), (11, 120, 40), (300, 4096, 32), (7, 8192, 1)]:
        tiling = group_norm_op.group_tiling(n_tokens, channels, groups)
        group_size = channels // groups
        for block in (tiling.groups_per_block, tiling.block_c, tiling.block_s):
            assert block & (block - 1) == 0, "tl.arange needs powers of two"
        assert tiling.groups_per_block * group_size <= tiling.block_c < 2 * tiling.groups_per_block * group_size
        # A block spans at least MIN_BLOCK_CHANNELS channels, or all groups.
        assert (
            tiling.groups_per_block * group_size >= group_norm_op.MIN_BLOCK_CHANNELS
            or tiling.groups_per_block >= groups
        )
        assert tiling.block_s * tiling.block_c <= max(group_norm_op.CHUNK_ELEMENTS, tiling.block_c)
        assert 4 <= tiling.num_warps <= group_norm_op.MAX_WARPS
    target = group_norm_op.group_tiling(4096, 512, 32, n_batch=16)
    assert target.grid(16, 32) == (16, 8, 16) and (target.block_c, target.block_s, target.num_warps) == (64, 128, 4)
    unsplit = group_norm_op.group_tiling(4096, 512, 32, n_batch=64)
    assert unsplit.grid(64, 32) == (64, 8, 1) and (unsplit.block_c, unsplit.block_s, unsplit.num_warps) == (64, 512, 16)


@pytest.mark.parametrize(
    ("n_batch", "n_tokens", "channels", "splits"),
    [
        (16, 4096, 512, 16),  # 128 programs, runs of 2 chunks of 128 tokens
        (16, 16384, 512, 16),
        (16, 4096, 1024, 16),  # 256 programs: at most twice the multiprocessors
        (17, 4096, 1024, 1),  # 272 programs
        (1, 4095, 512, 1),  # runs of under two 128-token chunks
        (1, 4096, 512, 16),
        (300, 4096, 64, 1),
    ],
)
def test_rule_splits_tokens_only_where_blocks_leave_multiprocessors_idle(n_batch, n_tokens, channels, splits):
    tiling = group_norm_op.group_tiling(n_tokens, channels, 32, n_batch=n_batch)
    assert tiling.token_splits == splits
    # Split passes run as one ordered launch, the statistics a wave of programs ahead, in chunks of 128 tokens at 4
    # warps; unsplit passes in chunks of 512 at 16.
    assert tiling.split_lag == (132 if splits > 1 else None)
    assert (tiling.block_s, tiling.num_warps) == ((128, 4) if splits > 1 else (512, 16))
    assert _tiling.multiprocessor_count() == 132  # no GPU here: an H100's or H200's count


@pytest.mark.parametrize(("n_tokens", "splits"), [(4096, 4), (37, 3), (37, 10), (5, 5), (10, 4), (1, 2)])
def test_token_splits_share_out_whole_chunks_and_leave_no_run_empty(n_tokens, splits):
    tiling = group_norm_op.group_tiling(n_tokens, 512, 32, _tiling.TilingOverride(token_splits=splits))
    assert tiling.tokens_per_split % tiling.block_s == 0
    assert (
        (tiling.token_splits - 1) * tiling.tokens_per_split < n_tokens <= tiling.token_splits * tiling.tokens_per_split
    )
    assert tiling.token_splits <= splits and tiling.grid(2, 32)[2] == tiling.token_splits


@triton.jit
def _record_ordered_items(work_ptr, SPLITS: tl.constexpr, LAG: tl.constexpr):
    # Program i stands for the program that draws ticket i.
    is_statistics, unit, split = group_norm_kernels._ordered_item(tl.program_id(0), SPLITS, LAG)
    row = work_ptr + tl.program_id(0) * 3
    tl.store(row, is_statistics.to(tl.int32))
    tl.store(row + 1, unit)
    tl.store(row + 2, split)


@pytest.mark.parametrize(
    ("units", "splits", "lag"), [(1, 1, 1), (3, 2, 2), (5, 3, 3), (4, 4, 1000), (7, 2, 5), (6, 3, 4), (2, 5, 9)]
)
def test_ordered_launch_takes_each_item_once_after_its_units_statistics(units, splits, lag):
    n_items = units * splits
    work = runtime.launch(
        _record_ordered_items,
        out_shape=jax.ShapeDtypeStruct((2 * n_items, 3), jnp.int32),
        grid=(2 * n_items,),
        implementation=harness.KERNEL_IMPLEMENTATION,
        SPLITS=splits,
        LAG=lag,
    )
    work = [tuple(int(v) for v in row) for row in np.asarray(work)]
    assert sorted(work) == sorted((phase, u, s) for phase in (0, 1) for u in range(units) for s in range(splits))
    for ticket, (is_statistics, unit, split) in enumerate(work):
        if not is_statistics:
            before = work[:ticket]
            assert all((1, unit, s) in before for s in range(splits))
            # Statistics item i + lag comes before output item i (i = unit · splits + split), none after it.
            statistics_before = sum(item[0] for item in before)
            assert statistics_before == min(n_items, unit * splits + split + min(lag, n_items) + 1)


def test_ordered_launches_draw_every_ticket_once_and_count_every_arrival(monkeypatch):
    # A program that counted twice, or a wait that counted itself, would let output items start early on a GPU (the
    # interpreter runs items in ticket order, so the values would not show it): check the counters themselves.
    counters = []
    launch = runtime.launch

    def spy(kernel, *args, **settings):
        outputs = launch(kernel, *args, **settings)
        if kernel.__name__.startswith("group_norm_ordered_"):
            expected = (settings["grid"][0], settings["SPLITS"])
            jax.debug.callback(lambda *c: counters.append((expected, *map(np.asarray, c))), *outputs[-2:])
        return outputs

    monkeypatch.setattr(runtime, "launch", spy)
    primals = _inputs(21, (3, 23, 48), jnp.float32)
    override = _tiling.TilingOverride(block_d=16, block_rows=4, token_splits=3, split_lag=5)
    with _tiling.overridden(override):
        _, vjp = jax.vjp(_op(harness.KERNEL_IMPLEMENTATION, 6), *primals)
        jax.block_until_ready(vjp(harness.random_normal(22, (3, 23, 48), jnp.float32)))
    assert len(counters) == 2  # the forward's launch and the backward's
    for (programs, splits), tickets, arrivals in counters:
        assert tickets.tolist() == [programs]
        assert arrivals.tolist() == [splits] * (programs // (2 * splits))


@pytest.mark.parametrize(("splits", "lag", "expected"), [(2, None, None), (2, 1, 2), (4, 132, 132), (1, 132, None)])
def test_split_lag_is_at_least_the_splits_and_needs_them(splits, lag, expected):
    override = _tiling.TilingOverride(token_splits=splits, split_lag=lag)
    assert group_norm_op.group_tiling(4096, 512, 32, override).split_lag == expected


class _Model(nnx.Module):
    def __init__(self, rngs):
        self.norm = nnx.GroupNorm(32, num_groups=8, rngs=rngs)
        self.other = nnx.GroupNorm(32, num_groups=4, reduction_axes=(2, 3), rngs=rngs)

    def __call__(self, x):
        return self.other(self.norm(x))


@pytest.mark.parametrize(("x_dtype", "param_dtype", "dtype"), harness.FLAX_DTYPE_CASES[::2])
def test_nnx_twin_matches_flax_and_keeps_its_params(x_dtype, param_dtype, dtype):
    options = {"num_groups": None, "group_size": 4, "epsilon": 1e-5, "dtype": dtype, "param_dtype": param_dtype}
    flax_norm = nnx.GroupNorm(16, **options, rngs=nnx.Rngs(0))
    liger_norm = liger_nnx.GroupNorm(16, **options, implementation=harness.KERNEL_IMPLEMENTATION, rngs=nnx.Rngs(0))
    liger_norm.scale[...] = flax_norm.scale[...] = harness.random_normal(1, (16,), param_dtype)
    liger_norm.bias[...] = flax_norm.bias[...] = harness.random_normal(2, (16,), param_dtype)
    x = harness.random_normal(3, (2, 3, 5, 16), x_dtype)
    expected, got = flax_norm(x), liger_norm(x)
    chex.assert_trees_all_equal_structs(nnx.state(flax_norm, nnx.Param), nnx.state(liger_norm, nnx.Param))
    assert got.dtype == expected.dtype
    harness.assert_close(got, expected, harness.least_precise(x_dtype, param_dtype, dtype))


def test_linen_twin_matches_flax_and_has_its_param_tree():
    x = harness.random_normal(4, (2, 6, 24), jnp.bfloat16)
    flax_norm = nn.GroupNorm(num_groups=6, use_bias=False)
    liger_norm = liger_linen.GroupNorm(num_groups=6, use_bias=False, implementation=harness.KERNEL_IMPLEMENTATION)
    params = flax_norm.init(jax.random.key(0), x)
    params = jax.tree.map(lambda p: p + harness.random_normal(5, p.shape, p.dtype), params)
    chex.assert_trees_all_equal_structs(params, liger_norm.init(jax.random.key(0), x))
    harness.assert_close(liger_norm.apply(params, x), flax_norm.apply(params, x), jnp.bfloat16)
    by_size = liger_linen.GroupNorm(
        num_groups=None, group_size=8, use_bias=False, implementation=harness.KERNEL_IMPLEMENTATION
    )
    expected = nn.GroupNorm(num_groups=3, use_bias=False).apply(params, x)
    harness.assert_close(by_size.apply(params, x), expected, jnp.bfloat16)


def test_apply_liger_swaps_nnx_group_norm_with_default_axes_only():
    model = _Model(nnx.Rngs(0))
    x = harness.random_normal(6, (2, 3, 4, 32), jnp.float32)
    expected = model(x)
    state = nnx.state(model)
    with pytest.warns(UserWarning, match="other"):
        counts = apply_liger(model, implementation=harness.KERNEL_IMPLEMENTATION)
    assert counts["group_norm"] == 1
    assert isinstance(model.norm, liger_nnx.GroupNorm) and type(model.other) is nnx.GroupNorm
    chex.assert_trees_all_equal(nnx.state(model), state)
    harness.assert_close(model(x), expected, jnp.float32)


def test_liger_intercept_routes_linen_group_norm():
    x = harness.random_normal(7, (2, 5, 16), jnp.float32)
    flax_norm = nn.GroupNorm(num_groups=4)
    params = flax_norm.init(jax.random.key(1), x)
    with liger_intercept(implementation=harness.KERNEL_IMPLEMENTATION) as counts:
        got = flax_norm.apply(params, x)
    assert counts["group_norm"] == 1
    harness.assert_close(got, flax_norm.apply(params, x), jnp.float32)


def test_twin_rejects_options_the_kernels_do_not_compute():
    norm = liger_nnx.GroupNorm(8, num_groups=2, reduction_axes=(1, -1), rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="reduction_axes"):
        norm(jnp.ones((2, 3, 4, 8)))
    with pytest.raises(ValueError, match="mask"):
        liger_nnx.GroupNorm(8, num_groups=2, rngs=nnx.Rngs(0))(jnp.ones((2, 8)), mask=jnp.ones((2, 8), bool))
    with pytest.raises(ValueError, match="exactly one of num_groups and group_size"):
        liger_linen.GroupNorm(num_groups=2, group_size=4).init(jax.random.key(0), jnp.ones((2, 8)))


def test_empty_input_gives_empty_output():
    x = jnp.zeros((0, 4, 8), jnp.float32)
    assert liger_jax.group_norm(x, None, None, num_groups=2).shape == (0, 4, 8)


@pytest.mark.parametrize(
    ("x", "scale", "kwargs", "error", "match"),
    [
        ((8,), (8,), {"num_groups": 2}, ValueError, "x must have at least 2 axes"),
        ((2, 8), (8,), {"num_groups": 3}, ValueError, "num_groups must be a positive divisor"),
        ((2, 8), (8,), {"num_groups": 0}, ValueError, "num_groups must be a positive divisor"),
        ((2, 8), (8,), {"num_groups": 2.0}, TypeError, "num_groups must be an int"),
        ((2, 8), (4,), {"num_groups": 2}, ValueError, r"scale must have shape \(8,\)"),
        ((2, 8), (8,), {"num_groups": 2, "implementation": "cuda"}, ValueError, "implementation"),
        ((1, 16385), None, {"num_groups": 1}, ValueError, "implementation='xla'"),
    ],
)
def test_bad_shapes_and_settings_raise_clear_errors(x, scale, kwargs, error, match):
    harness.assert_call_raises(error, match, liger_jax.group_norm, (x, scale, None), **kwargs)


@pytest.mark.parametrize(
    ("dtypes", "match"),
    [
        ((jnp.int32, jnp.float32, jnp.float32), "x must have a float dtype"),
        ((jnp.float32, jnp.int8, jnp.float32), "scale must have a float dtype"),
        ((jnp.float32, jnp.float32, jnp.int8), "bias must have a float dtype"),
        ((jnp.float64, jnp.float32, jnp.float32), "x must have a float dtype"),
    ],
)
def test_bad_dtypes_raise_type_errors(dtypes, match):
    harness.assert_call_raises(TypeError, match, liger_jax.group_norm, ((2, 8), (8,), (8,)), dtypes, num_groups=2)
