"""RMSNorm, LayerNorm and the fused add + RMSNorm, term by term: values and every gradient against float64 closed
forms written independently of the references, with a large epsilon and an offset so that each term shows, the
gradient identities of LayerNorm, and float64 finite differences. In fp32 the casting modes differ only by
roundings that are exact, so one closed form serves them all. The tests ``tools/mutation.py`` runs first against
the norm kernels and backward rules."""

from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import triton
import triton.language as tl
from jax.test_util import check_grads

import liger_jax
from liger_jax import runtime
from liger_jax.kernels._rows import (
    add_to_block,
    arrived_split_sum,
    partial_blocks,
    reversed_block,
    split_blocks,
    store_blocks,
)
from liger_jax.ops import _tiling
from tests import harness

EPSILON = 0.5
# (rows, D): one row; many rows of an odd D (row tiles and column sums with a partial last tile).
SHAPES = [(1, 37), (45, 37), (7, 300)]
CASTING_MODES = ["llama", "gemma", "none"]


def rms_norm_closed_form(x, scale, dy, epsilon, offset):
    """``(y, dx, dscale)`` in float64: y = x r w with r = (mean(x²) + ε)^-1/2 and w = offset + scale;
    dx = r g - x r³ mean(g x) with g = w dy; dscale = Σ_rows dy x r."""
    x, scale, dy = (np.asarray(a, np.float64) for a in (x, scale, dy))
    r = 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + epsilon)
    g = (offset + scale) * dy
    dx = r * g - x * r**3 * np.mean(g * x, axis=-1, keepdims=True)
    return x * r * (offset + scale), dx, np.sum(dy * x * r, axis=0)


def layer_norm_closed_form(x, scale, bias, dy, epsilon):
    """``(y, dx, dscale, dbias)`` in float64: y = x̂ s + b with x̂ = (x - mean) r, r = (var + ε)^-1/2;
    dx = r (g - mean(g) - x̂ mean(g x̂)) with g = s dy; dscale = Σ_rows dy x̂; dbias = Σ_rows dy."""
    x, scale, bias, dy = (np.asarray(a, np.float64) for a in (x, scale, bias, dy))
    centred = x - x.mean(axis=-1, keepdims=True)
    r = 1.0 / np.sqrt(np.mean(centred * centred, axis=-1, keepdims=True) + epsilon)
    normed = centred * r
    g = scale * dy
    dx = r * (g - g.mean(axis=-1, keepdims=True) - normed * np.mean(g * normed, axis=-1, keepdims=True))
    return normed * scale + bias, dx, np.sum(dy * normed, axis=0), np.sum(dy, axis=0)


def _normal(seed, shape, loc=0.0):
    return jnp.asarray(loc + np.random.default_rng(seed).standard_normal(shape), jnp.float32)


def _assert_close(actual, expected, rtol=2e-5):
    expected = np.asarray(expected, np.float64)
    np.testing.assert_allclose(np.asarray(actual, np.float64), expected, rtol=rtol, atol=rtol * np.abs(expected).max())


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("casting_mode", CASTING_MODES)
def test_rms_norm_matches_the_closed_form(implementation, shape, casting_mode):
    x, scale, dy = _normal(1, shape), _normal(2, shape[-1:]), _normal(3, shape)
    y, (dx, dscale) = harness.vjp_under_jit(
        lambda x, scale: liger_jax.rms_norm(
            x, scale, epsilon=EPSILON, offset=1.0, casting_mode=casting_mode, implementation=implementation
        ),
        (x, scale),
        dy,
    )
    for actual, expected in zip((y, dx, dscale), rms_norm_closed_form(x, scale, dy, EPSILON, 1.0), strict=True):
        _assert_close(actual, expected)


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("casting_mode", CASTING_MODES)
def test_fused_add_rms_norm_matches_the_closed_form(implementation, shape, casting_mode):
    x, residual, scale = _normal(4, shape), _normal(5, shape), _normal(6, shape[-1:])
    dy, dsum = _normal(7, shape), _normal(8, shape)
    (y, total), (dx, dresidual, dscale) = harness.vjp_under_jit(
        lambda x, residual, scale: liger_jax.fused_add_rms_norm(
            x, residual, scale, epsilon=EPSILON, offset=1.0, casting_mode=casting_mode, implementation=implementation
        ),
        (x, residual, scale),
        (dy, dsum),
    )
    summed = np.asarray(x, np.float64) + np.asarray(residual, np.float64)
    expected_y, expected_dx, expected_dscale = rms_norm_closed_form(summed, scale, dy, EPSILON, 1.0)
    _assert_close(total, summed)
    _assert_close(y, expected_y)
    _assert_close(dx, expected_dx + np.asarray(dsum, np.float64))
    _assert_close(dresidual, expected_dx + np.asarray(dsum, np.float64))
    _assert_close(dscale, expected_dscale)


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_layer_norm_matches_the_closed_form(implementation, shape):
    # x off-centre, so a dropped mean shows.
    x, scale, bias, dy = (
        _normal(9, shape, loc=3.0),
        _normal(10, shape[-1:]),
        _normal(11, shape[-1:]),
        _normal(12, shape),
    )
    y, (dx, dscale, dbias) = harness.vjp_under_jit(
        lambda x, scale, bias: liger_jax.layer_norm(x, scale, bias, epsilon=EPSILON, implementation=implementation),
        (x, scale, bias),
        dy,
    )
    expected = layer_norm_closed_form(x, scale, bias, dy, EPSILON)
    for actual, value in zip((y, dx, dscale, dbias), expected, strict=True):
        _assert_close(actual, value)
    # Rows of dx sum to zero: the normalisation is invariant to adding a constant to a row.
    np.testing.assert_allclose(np.sum(np.asarray(dx, np.float64), axis=-1), 0.0, atol=1e-5)


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
def test_finite_differences_in_float64(implementation):
    # Through the fp32 kernels, float64 finite differences need tolerances that fp32 rounding allows.
    shape = (5, 9)
    x, residual, scale, bias = _normal(13, shape), _normal(14, shape), _normal(15, (9,)), _normal(16, (9,))
    dtype = jnp.float64 if implementation == "xla" else jnp.float32

    def norms(x, residual, scale, bias):
        x, residual, scale, bias = (a.astype(dtype) for a in (x, residual, scale, bias))
        kwargs = {"epsilon": EPSILON, "implementation": implementation}
        outputs = (
            liger_jax.rms_norm(x, scale, offset=1.0, **kwargs),
            *liger_jax.fused_add_rms_norm(x, residual, scale, offset=1.0, **kwargs),
            liger_jax.layer_norm(x, scale, bias, **kwargs),
        )
        return tuple(output.astype(jnp.float64) for output in outputs)

    tolerance = {"atol": 1e-7, "rtol": 1e-7, "eps": 1e-4} if implementation == "xla" else {"atol": 2e-3, "rtol": 2e-3}
    check_grads(jax.jit(norms), harness.as_float64(x, residual, scale, bias), order=1, modes=["rev"], **tolerance)


@pytest.mark.parametrize("implementation", harness.IMPLEMENTATIONS)
@pytest.mark.parametrize("casting_mode", CASTING_MODES)
@pytest.mark.parametrize("fused_add", [False, True], ids=["rms_norm", "fused_add_rms_norm"])
def test_each_casting_mode_rounds_as_its_own_oracle(implementation, casting_mode, fused_add):
    # The modes differ by an ulp or two of bf16, inside any tolerance: a kernel running another mode's roundings
    # shows only as results that match the other mode's float64 oracle bit for bit more often than its own.
    x, scale = _normal(17, (64, 37)), _normal(18, (37,))
    x, scale = x.astype(jnp.bfloat16), scale.astype(jnp.bfloat16)
    kwargs = {"epsilon": EPSILON, "casting_mode": casting_mode, "implementation": implementation}
    if fused_add:  # a zero residual: the sum is x exactly
        y, _ = liger_jax.fused_add_rms_norm(x, jnp.zeros_like(x), scale, **kwargs)
    else:
        y = liger_jax.rms_norm(x, scale, **kwargs)

    def oracle(mode):
        return liger_jax.rms_norm_reference(
            *harness.as_float64(x, scale), epsilon=EPSILON, casting_mode=mode, rounding_dtype=jnp.bfloat16
        ).astype(jnp.bfloat16)

    matches = {mode: np.mean(np.asarray(y == oracle(mode))) for mode in CASTING_MODES}
    # Measured: 100% against its own oracle, at most 82% against another mode's.
    assert matches[casting_mode] > 0.99, matches
    assert all(matches[casting_mode] > matches[mode] + 0.1 for mode in CASTING_MODES if mode != casting_mode), matches


@pytest.mark.parametrize("n_cols", [192, 193, 200], ids=["whole_blocks", "one_column_block", "partial_block"])
def test_column_blocks_match_the_closed_forms(n_cols):
    # Rows walked in 64-column blocks (forced): a whole number of blocks, where a loop bound one block too long shows;
    # a last block of one column, where a bound one block too short shows; and a partial last block.
    shape = (5, n_cols)
    x, residual, scale, bias, dy = (
        _normal(20 + i, s) for i, s in enumerate([shape, shape, (n_cols,), (n_cols,), shape])
    )
    kwargs = {"epsilon": EPSILON, "implementation": harness.KERNEL_IMPLEMENTATION}
    with _tiling.overridden(harness.FORCED_TILINGS["column_blocks"]):
        y, (dx, dscale) = harness.vjp_under_jit(
            lambda x, scale: liger_jax.rms_norm(x, scale, offset=1.0, **kwargs), (x, scale), dy
        )
        (y_sum, _), (dx_sum, _, dscale_sum) = harness.vjp_under_jit(
            lambda x, residual, scale: liger_jax.fused_add_rms_norm(x, residual, scale, offset=1.0, **kwargs),
            (x, residual, scale),
            (dy, jnp.zeros_like(dy)),
        )
        y_ln, (dx_ln, dscale_ln, dbias_ln) = harness.vjp_under_jit(
            lambda x, scale, bias: liger_jax.layer_norm(x, scale, bias, **kwargs), (x, scale, bias), dy
        )
    summed = np.asarray(x, np.float64) + np.asarray(residual, np.float64)
    expected = [
        *rms_norm_closed_form(x, scale, dy, EPSILON, 1.0),
        *rms_norm_closed_form(summed, scale, dy, EPSILON, 1.0),
        *layer_norm_closed_form(x, scale, bias, dy, EPSILON),
    ]
    actual = [y, dx, dscale, y_sum, dx_sum, dscale_sum, y_ln, dx_ln, dscale_ln, dbias_ln]
    for value, closed in zip(actual, expected, strict=True):
        _assert_close(value, closed)


@pytest.mark.parametrize(
    ("n_cols", "block_d", "n_partials", "splits"),
    [(200, 64, 2, 2), (192, 64, 1, 1), (16384, 16384, 2, 1), (16384, 8192, 2, 1), (24576, 8192, 1, 1),
     (32768, 8192, 1, 2), (32769, 8192, 1, 2), (32768, 8192, 2, 2), (16385, 8192, 2, 2), (65536, 8192, 2, 4),
     (65537, 8192, 1, 4), (262144, 8192, 8, 32), (57344, 8192, 1, 2), (57345, 8192, 1, 4), (65536, 8192, 1, 4),
     (131072, 8192, 1, 4), (256, 32, 1, 4)],
)  # fmt: skip
def test_wide_rows_are_split_until_each_programs_partial_sums_fit_the_registers(n_cols, block_d, n_partials, splits):
    # Each split's blocks rounded up to a power of two, times the sums, within MAX_REGISTER_PARTIALS; at least two
    # splits from four blocks (three blocks of one sum stay whole) and four from eight (seven stay in two); a row of
    # one tile is never split; at one block a split, no further.
    assert (_tiling.MAX_REGISTER_PARTIALS, _tiling.SHARED_SUMS_MIN_BLOCKS) == (32768, 4)
    assert (_tiling.SUMS_AHEAD_SPLITS, _tiling.SUMS_AHEAD_SPLIT_BLOCKS) == (4, 2)
    assert _tiling.column_splits(n_cols, block_d, n_partials) == splits
    forced = _tiling.TilingOverride(column_splits=3)
    assert _tiling.column_splits(n_cols, block_d, n_partials, forced) == (1 if n_cols <= block_d else 3)
    with pytest.raises(ValueError, match="column_splits must be at least 1"):
        _tiling.TilingOverride(column_splits=0)


def test_an_override_sets_the_resident_programs_of_kernels_that_walk_row_tiles():
    # The rule's two programs a multiprocessor for reductions over 4096-column tiles, four below; the override's
    # count sizes the grid of a reduction over rows (132 multiprocessors: 132 programs of 8 tiles for 1056 tiles).
    assert _tiling.row_tiling(4096, reduces_rows=True).programs_per_sm == _tiling.WIDE_ROW_PROGRAMS_PER_SM == 2
    assert _tiling.row_tiling(2048, reduces_rows=True).programs_per_sm == _tiling.PROGRAMS_PER_SM == 4
    forced = _tiling.row_tiling(4096, reduces_rows=True, override=_tiling.TilingOverride(programs_per_sm=1))
    assert forced.programs_per_sm == 1
    with mock.patch.object(_tiling, "multiprocessor_count", return_value=132):
        assert _tiling.reduction_grid(1056, forced, "triton") == (132, 8)
        assert _tiling.reduction_grid(1056, _tiling.row_tiling(4096, reduces_rows=True), "triton") == (264, 4)
    with pytest.raises(ValueError, match="programs_per_sm must be at least 1"):
        _tiling.TilingOverride(programs_per_sm=0)


@pytest.mark.parametrize(
    ("n_cols", "override", "programs_per_sm"),
    [(200, _tiling.TilingOverride(block_d=32), 1),
     (200, _tiling.TilingOverride(block_d=32, sums_ahead=True), _tiling.PROGRAMS_PER_SM),
     (200, _tiling.TilingOverride(block_d=32, programs_per_sm=3), 3),
     (48, None, _tiling.PROGRAMS_PER_SM),
     (64, None, _tiling.PROGRAMS_PER_SM)],
)  # fmt: skip
def test_a_backward_walking_column_blocks_launches_one_program_a_multiprocessor(
    n_cols, override, programs_per_sm, monkeypatch
):
    # RMSNorm's backward grid is sized by split_launch's resident programs: one a multiprocessor where rows are walked
    # in column blocks (seven of 32 here, two splits), the tiling's where a split sums ahead or a row is one tile (one
    # exactly filling it too), the override's where it sets them.
    sized_for = []
    reduction_grid = _tiling.reduction_grid

    def spy(n_rows, tiling, implementation, segments=1):
        sized_for.append(tiling.programs_per_sm)
        return reduction_grid(n_rows, tiling, implementation, segments)

    monkeypatch.setattr(_tiling, "reduction_grid", spy)
    x, scale, dy = _normal(80, (9, n_cols)), _normal(81, (n_cols,)), _normal(82, (9, n_cols))
    with _tiling.overridden(override or _tiling.TilingOverride()):
        _, vjp = jax.vjp(lambda x: liger_jax.rms_norm(x, scale, implementation=harness.KERNEL_IMPLEMENTATION), x)
        jax.block_until_ready(vjp(dy))
    assert sized_for == [programs_per_sm]
    assert _tiling.COLUMN_BLOCK_PROGRAMS_PER_SM == 1


@pytest.mark.parametrize(
    ("n_cols", "splits", "override", "warps"),
    [(65536, 2, None, 8), (131072, 4, None, 8), (32768, 2, None, 16), (65536, 4, None, 16), (16384, 1, None, 16),
     (65536, 2, _tiling.TilingOverride(num_warps=4), 4)],
)  # fmt: skip
def test_a_split_of_four_column_blocks_or_more_runs_eight_warps(n_cols, splits, override, warps):
    # 8192-column blocks: four or more a split take SPLIT_WIDE_WARPS, fewer (or one tile) keep the tiling's 16.
    assert (_tiling.SPLIT_WIDE_BLOCKS, _tiling.SPLIT_WIDE_WARPS) == (4, 8)
    block_d = min(8192, n_cols)
    assert _tiling.split_warps(n_cols, block_d, splits, 16, override) == warps


@pytest.mark.parametrize(
    ("n_cols", "splits", "n_partials", "override", "ahead"),
    [(65536, 4, 1, None, True), (57345, 4, 1, None, True), (65536, 4, 2, None, False), (32768, 2, 1, None, False),
     (131072, 4, 1, None, False), (131072, 8, 1, None, True), (16384, 1, 1, None, False),
     (65536, 4, 1, _tiling.TilingOverride(sums_ahead=False), False),
     (32768, 2, 2, _tiling.TilingOverride(sums_ahead=True), True),
     (8192, 1, 1, _tiling.TilingOverride(sums_ahead=True), False)],
)  # fmt: skip
def test_four_splits_of_two_blocks_sum_the_next_row_tile_ahead(n_cols, splits, n_partials, override, ahead):
    # 8192-column blocks: four splits or more of at most two blocks and one partial sum sum ahead; two splits, four
    # of four blocks or LayerNorm's two partials do not; an override decides wherever rows are walked in blocks, and
    # a row of one tile never sums ahead.
    block_d = min(8192, n_cols)
    assert _tiling.sums_ahead(n_cols, block_d, splits, n_partials, override) == ahead


def test_the_rule_launches_rows_of_eight_blocks_in_four_splits_of_sixteen_warps_summing_ahead():
    tiling = _tiling.row_tiling(65536, reduces_rows=True)
    assert (tiling.block_d, tiling.num_warps) == (8192, 16)
    assert _tiling.split_launch(65536, tiling, 1) == _tiling.SplitLaunch(
        splits=4, warps=16, sums_ahead=True, programs_per_sm=2
    )
    assert _tiling.split_launch(131072, tiling, 1) == _tiling.SplitLaunch(
        splits=4, warps=8, sums_ahead=False, programs_per_sm=1
    )
    assert _tiling.split_launch(65536, tiling, 2) == _tiling.SplitLaunch(
        splits=4, warps=16, sums_ahead=False, programs_per_sm=1
    )


@triton.jit
def _store_split_columns(
    out_ptr, n_cols: tl.constexpr, BLOCK_D: tl.constexpr, COLUMN_SPLITS: tl.constexpr, SPLIT: tl.constexpr
):
    """Split SPLIT's second pass over its own column blocks with each column's index as its partial sum, stored."""
    OWN_BLOCKS: tl.constexpr = split_blocks(n_cols, BLOCK_D, COLUMN_SPLITS)
    first_col = SPLIT * OWN_BLOCKS * BLOCK_D
    partials = tl.zeros((partial_blocks(n_cols, BLOCK_D, COLUMN_SPLITS), BLOCK_D), dtype=tl.float32)
    for step in tl.range(0, OWN_BLOCKS):
        col = first_col + reversed_block(step, OWN_BLOCKS * BLOCK_D, BLOCK_D)
        partials = add_to_block(partials, col - first_col, (col + tl.arange(0, BLOCK_D)).to(tl.float32), BLOCK_D)
    store_blocks(out_ptr, partials, first_col, n_cols, OWN_BLOCKS, BLOCK_D)


@pytest.mark.parametrize(("n_cols", "block_d", "splits"), [(64, 32, 2), (100, 8, 3), (96, 8, 4), (37, 8, 2)])
def test_each_split_stores_its_own_share_of_the_row_and_nothing_else(n_cols, block_d, splits):
    # The row's blocks dealt out in order, ceil(blocks / splits) to a split: each split writes exactly its own
    # columns (the rest stay NaN under the interpreter) and visits every one of its blocks once.
    own = _tiling.cdiv(_tiling.cdiv(n_cols, block_d), splits) * block_d
    for split in range(splits):
        written = np.asarray(
            runtime.launch(
                _store_split_columns,
                out_shape=jax.ShapeDtypeStruct((n_cols,), jnp.float32),
                grid=(1,),
                implementation=harness.KERNEL_IMPLEMENTATION,
                n_cols=n_cols,
                BLOCK_D=block_d,
                COLUMN_SPLITS=splits,
                SPLIT=split,
            )
        )
        cols = np.arange(n_cols)
        mine = (cols >= split * own) & (cols < (split + 1) * own)
        np.testing.assert_array_equal(written[mine], cols[mine])
        if harness.KERNEL_IMPLEMENTATION == "interpret":
            assert np.isnan(written[~mine]).all()


@pytest.mark.parametrize(("op", "n_cols"), [("rms_norm", 32769), ("fused_add_rms_norm", 32769), ("layer_norm", 16385)])
def test_rows_split_among_programs_match_the_closed_forms(op, n_cols):
    # Rows too wide for one program's partial sums: the rule's splits share each row's columns (5 rows, with the
    # interpreter's programs shared among the splits, make one program of 5 row tiles a split).
    tiling = _tiling.row_tiling(n_cols, reduces_rows=True)
    assert _tiling.column_splits(n_cols, tiling.block_d, 2 if op == "layer_norm" else 1) == 2
    shape = (5, n_cols)
    x, residual, scale, bias, dy = (
        _normal(50 + i, s) for i, s in enumerate([shape, shape, (n_cols,), (n_cols,), shape])
    )
    kwargs = {"epsilon": EPSILON, "implementation": harness.KERNEL_IMPLEMENTATION}
    if op == "rms_norm":
        actual = harness.vjp_under_jit(lambda x, s: liger_jax.rms_norm(x, s, offset=1.0, **kwargs), (x, scale), dy)
        expected = rms_norm_closed_form(x, scale, dy, EPSILON, 1.0)
    elif op == "fused_add_rms_norm":
        (y, _), (dx, _, dscale) = harness.vjp_under_jit(
            lambda x, r, s: liger_jax.fused_add_rms_norm(x, r, s, offset=1.0, **kwargs),
            (x, residual, scale),
            (dy, jnp.zeros_like(dy)),
        )
        actual = y, (dx, dscale)
        expected = rms_norm_closed_form(np.asarray(x, np.float64) + np.asarray(residual), scale, dy, EPSILON, 1.0)
    else:
        actual = harness.vjp_under_jit(lambda x, s, b: liger_jax.layer_norm(x, s, b, **kwargs), (x, scale, bias), dy)
        expected = layer_norm_closed_form(x, scale, bias, dy, EPSILON)
    y, grads = actual
    for value, closed in zip((y, *grads), expected, strict=True):
        _assert_close(value, closed)


def _slots(sums: np.ndarray, unmarked: list[tuple[int, int]]) -> np.ndarray:
    """[splits, rows, 2] int32 slots as ``kernels._rows.store_split_sum`` writes them (the mark 1 in the low word,
    the fp32 sum's bits in the high one), but for the ``(split, row)`` slots in ``unmarked``, left zero."""
    marked = np.ones(sums.shape, bool)
    for split, row in unmarked:
        marked[split, row] = False
    bits = np.asarray(sums, np.float32).view(np.int32)
    return np.stack([marked.astype(np.int32), np.where(marked, bits, 0)], axis=-1)


@pytest.mark.parametrize("op", ["rms_norm", "layer_norm"])
def test_the_splits_of_a_row_share_their_own_columns_sums(op, monkeypatch):
    # Three splits of a 200-column row in blocks of 32 (96, 96 and 8 columns), two programs a split (111 rows: two
    # row tiles of 64): every split marked its slot of every row, and each stored the sums of exactly its own
    # columns (float64 closed forms), so no split needed another's columns.
    monkeypatch.setattr(_tiling, "INTERPRETER_PROGRAMS", 6)
    backward_results = []

    def launch_and_keep(kernel, *args, out_shape, **settings):
        results = launch(kernel, *args, out_shape=out_shape, **settings)
        if kernel.fn.__name__.endswith("_bwd"):  # traced: the values come back when the backward runs
            jax.debug.callback(lambda *values: backward_results.append(values), *results)
        return results

    launch = runtime.launch
    monkeypatch.setattr(runtime, "launch", launch_and_keep)
    shape, own = (111, 200), 96
    x, scale, bias, dy = (_normal(70 + i, s) for i, s in enumerate([shape, shape[1:], shape[1:], shape]))
    kwargs = {"epsilon": EPSILON, "implementation": harness.KERNEL_IMPLEMENTATION}
    xs, dys = np.asarray(x, np.float64), np.asarray(dy, np.float64)
    override = _tiling.TilingOverride(block_d=32, column_splits=3, separate_row_sums=False)
    with _tiling.overridden(override):
        if op == "rms_norm":
            jax.vjp(lambda x: liger_jax.rms_norm(x, scale, offset=1.0, **kwargs), x)[1](dy)
            normed = xs / np.sqrt(np.mean(xs * xs, axis=-1, keepdims=True) + EPSILON)
            terms = [dys * (1.0 + np.asarray(scale, np.float64)) * normed]
        else:
            jax.vjp(lambda x: liger_jax.layer_norm(x, scale, bias, **kwargs), x)[1](dy)
            centred = xs - xs.mean(axis=-1, keepdims=True)
            g = dys * np.asarray(scale, np.float64)
            terms = [g, g * centred / np.sqrt(np.mean(centred**2, axis=-1, keepdims=True) + EPSILON)]
    (results,) = backward_results
    assert _tiling.row_tiling(200, reduces_rows=True, override=override).block_rows == 64
    for slots, term in zip(results[-len(terms) :], terms, strict=True):
        slots = np.asarray(slots)
        assert slots.shape == (3, 111, 2)
        np.testing.assert_array_equal(slots[..., 0], 1)
        expected = np.stack([term[:, s * own : (s + 1) * own].sum(axis=-1) for s in range(3)])
        _assert_close(slots[..., 1].view(np.float32), expected)


@triton.jit
def _poll_slots(slots_ptr, paired_ptr, n_rows, arrived_ptr, sums_ptr, after_ptr, PAIRED: tl.constexpr):
    """Polls each of three splits' slots of rows 0-3 (of ``n_rows``), with the paired slots where PAIRED; stores
    whether each arrived [3] and its sums [3, 4] (the paired ones [3, 4] after them); ``after_ptr`` is ``slots_ptr``
    again, returned."""
    rows = tl.arange(0, 4).to(tl.int64)
    for split in tl.static_range(3):
        if PAIRED:
            arrived, sums, paired = arrived_split_sum(slots_ptr, paired_ptr, split, rows, n_rows)
        else:
            arrived, sums, paired = arrived_split_sum(slots_ptr, None, split, rows, n_rows)
        tl.store(arrived_ptr + split, arrived.to(tl.int32))
        tl.store(sums_ptr + split * 4 + rows, sums)
        tl.store(sums_ptr + 12 + split * 4 + rows, paired)


@pytest.mark.parametrize(
    "unmarked, paired_unmarked, arrived",
    [
        ([(1, 1)], None, [1, 0, 1]),  # split 1's row 1 not yet stored
        ([(1, 0)], None, [1, 0, 1]),  # split 0's row past n_rows is no slot of its own: split 1's row 0 follows it
        ([(0, 0), (1, 1), (1, 2)], None, [0, 0, 1]),
        ([], None, [1, 1, 1]),
        ([], [(2, 2)], [1, 1, 0]),  # a split arrives where both of its sums do
        ([(0, 0)], [(1, 2)], [0, 0, 1]),
    ],
)
def test_polling_reads_the_marked_slots_and_writes_nothing(unmarked, paired_unmarked, arrived):
    # Three splits' slots of three rows, each polled over a tile of four rows (the fourth past n_rows): a split has
    # arrived where every row of its slots is marked (in both sums, where paired), its sums come back bit for bit
    # (the paired ones as the first where none are paired), and the slots are left as they were (a poll that wrote
    # would mark sums not yet stored).
    sums = np.asarray(_normal(90, (3, 3)))
    slots = _slots(sums, unmarked)
    paired_slots = np.zeros((1, 1, 2), np.int32) if paired_unmarked is None else _slots(-sums, paired_unmarked)
    seen, polled, after = runtime.launch(
        _poll_slots,
        jnp.asarray(slots),
        jnp.asarray(paired_slots),
        3,
        out_shape=[
            jax.ShapeDtypeStruct((3,), jnp.int32),
            jax.ShapeDtypeStruct((2, 3, 4), jnp.float32),
            jax.ShapeDtypeStruct(slots.shape, jnp.int32),
        ],
        grid=(1,),
        implementation=harness.KERNEL_IMPLEMENTATION,
        input_output_aliases={0: 2},
        PAIRED=paired_unmarked is not None,
    )
    np.testing.assert_array_equal(seen, arrived)
    polled = np.asarray(polled)
    for split in range(3):
        if arrived[split]:
            np.testing.assert_array_equal(polled[0, split, :3], sums[split])
            paired = sums[split] if paired_unmarked is None else -sums[split]
            np.testing.assert_array_equal(polled[1, split, :3], paired)
    np.testing.assert_array_equal(after, slots)
