"""Launch heuristics for row-wise kernels, in one place: block shapes, warps, prefetching and program counts.

The norm kernels (``liger_jax.kernels.rms_norm``, ``liger_jax.kernels.layer_norm``) are cut as :func:`row_tiling`
says. A benchmark can force part of that choice with :func:`overridden` (benchmarks/norm_tiling.py does, to measure
the candidates the rule picks from).

Register counts below are ptxas's for sm_90 (bf16, the kernels compiled by Triton 3.6; benchmarks/norm_tiling.py
``--registers`` prints them). A thread has at most 65536 / (32 · num_warps) registers when one program fills an SM,
and what does not fit spills to local memory.
"""

import contextlib
import contextvars
import dataclasses
import functools
from collections.abc import Iterator

import jax

# Rows shorter than this share a program, so each program still moves enough bytes to hide memory latency.
TILE_ELEMENTS = 4096
# The same for the norm kernels, as measured on the H200 (see row_tiling).
ROW_TILE_ELEMENTS = 2048
MAX_BLOCK_ROWS = 64
# The longest row a forward norm kernel keeps in one tile, in registers: at 32768 columns and 32 warps the three
# forward kernels use at most 64 registers per thread and spill nothing; at 65536 every warp count spills. Longer
# rows are walked in blocks of this width (see COLUMN_BLOCK).
MAX_FORWARD_TILE_COLS = 32768
# The same for the backward kernels, which also hold fp32 rows of the program's dscale (and dbias) and, without
# prefetching, load the tile and scale again after the row sums rather than hold them (kernels._rows.
# load_tile_again). At 16384 columns RMSNorm's and the fused add's spill nothing at 8 or 16 warps (0-40 bytes per
# thread at 32), LayerNorm's 0-96 with bf16 weights (0 at 8 warps, 32 at 16) and 152-172 with fp32 ones; holding the
# tile, 108-408 at 8-32 warps. Spills go to L1: Liger's 16-warp torch kernel runs at 95% of the HBM floor there,
# against 10% for an 8-warp kernel that prefetches and spills 4 KB. At 32768 columns, 260-904 bytes.
MAX_BACKWARD_TILE_COLS = 16384
# Longer rows are walked in column blocks: a backward's of this many columns, 16 columns per thread
# (COLUMN_ELEMENTS_PER_WARP), a forward's of MAX_FORWARD_TILE_COLS at MAX_WARPS. The backward's, measured on the H200
# (4096 × 32768 bf16 fwd+bwd, benchmarks.norm_tiling; the partial sums in registers): RMSNorm 0.611 ms (1.06x XLA)
# against 0.755 ms with 4096-column blocks, fused add+RMSNorm 0.735 ms (1.48x XLA, 86% of its floor) against 0.994
# ms. On an H100 (2026-12-06, 4096 rows, bf16), 16384-column blocks at 32 warps lost there (RMSNorm's backward 0.419
# ms against 0.382 at 32768, LayerNorm's 1.209 against 0.542), and so did the partial sums kept in memory rather than
# in registers (0.613-0.807 ms against 0.389). A forward holds no partials, and its widest blocks read the row back
# from L2: at 32768 columns a program takes 46-64 registers a thread, so one fills a multiprocessor, and the rows in
# flight (132 × 128 KB at 65536 columns) stay in L2 for the second pass, where two programs of 16384-column blocks
# a multiprocessor (32 registers) read 842 MB from HBM for RMSNorm's 537 (ncu). Forward ms on an H100 (4096 rows,
# bf16, two runs), 32768-column blocks against 16384: at 65536 columns RMSNorm 0.401 against 0.473 (8192 columns at
# 16 warps: 0.499-0.507), LayerNorm 0.421-0.427 against 0.465, fused add+RMSNorm 0.909-0.912 against 0.941-0.944;
# at 131072 0.950 against 1.028, 0.981-0.984 against 1.101, 2.014-2.017 against 2.051-2.056; softmax, sparsemax and
# DyT (16384 × 65536) within 0.5%.
COLUMN_BLOCK = 8192
COLUMN_ELEMENTS_PER_WARP = 512
# Tiles up to this size keep the warp counts measured on the H200 (see row_tiling); wider ones get 32 elements of a
# row per thread (Liger's 16 warps at 16384 columns, 32 at 32768): the forward kernels fit that without spilling.
MEASURED_TILE_LIMIT = 8192
WIDE_TILE_ELEMENTS_PER_WARP = 1024
MAX_WARPS = 32
# The most fp32 partial sums a backward program keeps in registers while it walks column blocks: 128 KB, half the
# register file of an H200 SM, which one 16-warp program fills. ptxas (sm_90, Triton 3.6, bf16) for the norms'
# backward in 8192-column blocks at 16 warps, each split's sums at this limit: RMSNorm 127 registers a thread at
# 32768 columns (1 split) and at 65536 (2 splits), LayerNorm's dscale and dbias 124 at 32768 (2) and at 65536 (4),
# no spills; one split more, 100 and 89. Twice the sums a program spill 504-3068 bytes a thread.
MAX_REGISTER_PARTIALS = 32768
# The splits of a row share their row sums: each sums its own columns, stores them and reads the others'
# (liger_jax.kernels._rows.store_split_sum), so no split reads another's columns. Rows of this many column blocks
# or more get at least two splits, whose programs each hold half the row's partial sums. H100, 4096 rows, bf16,
# backward ms against each split reading the whole row for the sums (one run with both): fused add+RMSNorm at 32768
# columns 0.457-0.470 (one program a row) → 0.389-0.406 (two splits), at 65536 1.03-1.08 → 0.89-0.92 (two splits of
# 8 warps); RMSNorm 0.394 → 0.386-0.395 at 32768 and 0.860-0.867 → 0.886 at 65536; LayerNorm at 32768 0.516-0.526
# (row sums apart) → 0.496-0.501.
SHARED_SUMS_MIN_BLOCKS = 4
# A split that owns this many column blocks or more runs SPLIT_WIDE_WARPS warps (ptxas: 242 registers a thread for
# RMSNorm's and the fused add's 4 blocks, no spills): at 65536 columns the fused add's backward 0.890-0.921 ms
# against 1.064-1.091 at 16 warps, RMSNorm's 0.886 against 1.020-1.046; at 2 blocks a split 16 warps win (fused add
# 0.389-0.406 against 0.539).
SPLIT_WIDE_BLOCKS = 4
SPLIT_WIDE_WARPS = 8
# A row of SUMS_AHEAD_SPLITS · SUMS_AHEAD_SPLIT_BLOCKS column blocks or more gets at least SUMS_AHEAD_SPLITS splits
# (not two of four blocks at SPLIT_WIDE_WARPS); where they own at most two blocks each and one partial sum, the
# backward sums the next row tile's row statistics in the pass that writes this tile's dx (kernels.rms_norm's
# SUMS_AHEAD): a split's sums are shared a whole row tile before its partners need them, so no split waits on the
# slowest of four, and the next tile's loads from HBM are in flight beside this one's from L2. H100, 4096 rows, bf16,
# backward ms, two runs (benchmarks/rows/2026-12-07f): at 65536 columns RMSNorm 0.780-0.792 against two splits of
# four blocks at 8 warps (the rule before) 0.875-0.879 and four splits without the sums ahead 1.056-1.061; the fused
# add 0.797-0.811 against 0.892-0.900 and 1.066-1.073. Two splits gain nothing from it (at 32768 columns RMSNorm
# 0.405 against 0.391, the fused add 0.406 against 0.390); eight lose (two blocks each at 131072 columns: 2.458 and
# 2.465 against four splits of four blocks at 8 warps, 1.767 and 1.781), and four of four blocks spill with it (2.241
# against 1.781, the fused add), so wider rows keep the splits of more blocks without it. LayerNorm's two partials
# and two sums spill with the next tile's (60 bytes a thread at 65536 columns; 1.314 against 1.001), so its backward
# never sums ahead by the rule.
SUMS_AHEAD_SPLITS = 4
SUMS_AHEAD_SPLIT_BLOCKS = 2
# LayerNorm's backward sums its rows in a kernel of their own where a row is shared by this many splits or more (see
# separate_row_sums): its column-block kernel then reads only each split's own columns, and the row sums' kernel
# reads the rows once more from HBM, at the forward's tiling. H100, 4096 rows, bf16, backward ms: at 65536 columns
# 0.952-0.966 against 1.002-1.016 with the 4 splits sharing their sums (and 1.681 with each reading the whole row);
# at 131072 1.866 against 5.815 reading whole rows.
SEPARATE_ROW_SUMS_MIN_SPLITS = 4
# Programs per multiprocessor for kernels that reduce across rows: enough resident programs to keep HBM busy,
# few enough that the [num_programs, D] fp32 partials stay a small fraction of the traffic.
PROGRAMS_PER_SM = 4
WIDE_ROW_PROGRAMS_PER_SM = 2
# A backward that walks column blocks fills a multiprocessor with one program (ptxas, sm_90: 122-128 registers a
# thread at 16 warps, 250-255 at 8), so the grid launches one a multiprocessor, one wave, rather than
# WIDE_ROW_PROGRAMS_PER_SM's two waves (half the partial sums, too); except where it sums ahead, whose two waves ran
# faster. H100, 4096 rows, bf16, backward ms, two programs a multiprocessor → one (benchmarks/rows/2026-12-07h, with
# the 64-bit split-sum slots): RMSNorm 0.346 → 0.336 at 32768 columns, 1.724 → 1.683 at 131072; LayerNorm 0.484 →
# 0.459 at 32768, 0.954 → 0.931 at 65536 (row sums apart), 1.882 → 1.856 at 131072; the fused add 0.341 → 0.335 at
# 32768, 1.740 → 1.712 at 131072; summing ahead at 65536, RMSNorm 0.760 both, the fused add 0.833 → 0.843.
COLUMN_BLOCK_PROGRAMS_PER_SM = 1
# The interpreter runs programs one after another; a handful exercises the partial-sum path without the wait.
INTERPRETER_PROGRAMS = 3


def next_power_of_2(n: int) -> int:
    """The smallest power of two ≥ n (≥ 1)."""
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def rows_per_tile(block_cols: int, tile_elements: int = TILE_ELEMENTS) -> int:
    """How many rows of ``block_cols`` share a tile of about ``tile_elements`` (1 to MAX_BLOCK_ROWS)."""
    return max(1, min(MAX_BLOCK_ROWS, tile_elements // block_cols))


def cdiv(a: int, b: int) -> int:
    """Ceiling division of non-negative ints."""
    return -(-a // b)


@dataclasses.dataclass(frozen=True)
class RowTiling:
    """How a [n_rows, n_cols] row-wise kernel is cut: BLOCK_ROWS × BLOCK_D tiles, ``num_warps`` each, and (for
    kernels that sum over rows, and a forward that walks tiles when it prefetches) ``programs_per_sm`` resident
    programs walking the tiles, loading the next tile before computing the current one when ``prefetch``. A row
    longer than ``block_d`` is walked in column blocks.
    """

    block_rows: int
    block_d: int
    num_warps: int
    programs_per_sm: int = PROGRAMS_PER_SM
    prefetch: bool = False
    num_stages: int = 1


@dataclasses.dataclass(frozen=True)
class TilingOverride:
    """Settings forced on :func:`row_tiling` (and on the tiling rules of the kernels that cut rows their own way:
    the divergences' and GroupNorm's); None leaves the rule's choice.

    Attributes:
        block_d: columns per tile, a power of two; a row longer than this is walked in column blocks, and a
            shorter one gets one tile of its own length rounded up to a power of two.
        block_rows: rows per tile, a power of two.
        num_warps: warps per program.
        prefetch: whether the backward kernels (and a forward that walks tiles) load the next row tile before
            computing this one (one-tile rows only; column blocks are never prefetched).
        num_stages: Triton's software-pipelining stages for the kernels' loops.
        column_splits: programs that share each row walked in column blocks, in the norms' backward kernels
            (see :func:`column_splits`); any count ≥ 1.
        token_splits: programs that share each example's block of groups in GroupNorm's kernels, each taking a run
            of its tokens (see ``group_norm.group_tiling``); any count ≥ 1.
        split_lag: with token splits, GroupNorm runs each pass as one launch whose statistics items run this many
            items ahead of its output items (at least the splits; ``kernels.group_norm``) instead of two launches.
        separate_row_sums: whether LayerNorm's backward sums its rows in a kernel of their own where it walks them
            in column blocks (see :func:`separate_row_sums`).
        sums_ahead: whether the norms' backward, walking column blocks, sums the next row tile's row statistics in
            the pass that writes this one's dx (see :func:`sums_ahead`).
        programs_per_sm: resident programs per multiprocessor of a kernel that walks row tiles (see
            :class:`RowTiling`); any count ≥ 1.
    """

    block_d: int | None = None
    block_rows: int | None = None
    num_warps: int | None = None
    prefetch: bool | None = None
    num_stages: int | None = None
    column_splits: int | None = None
    token_splits: int | None = None
    split_lag: int | None = None
    separate_row_sums: bool | None = None
    sums_ahead: bool | None = None
    programs_per_sm: int | None = None

    def __post_init__(self):
        for name in ("block_d", "block_rows"):
            value = getattr(self, name)
            if value is not None and (value < 1 or value & (value - 1)):
                raise ValueError(f"{name} must be a power of two, got {value}")
        for name in ("column_splits", "token_splits", "split_lag", "programs_per_sm"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be at least 1, got {value}")


_OVERRIDE: contextvars.ContextVar[TilingOverride | None] = contextvars.ContextVar("row_tiling_override", default=None)


@contextlib.contextmanager
def overridden(override: TilingOverride) -> Iterator[None]:
    """Row-wise ops traced inside this context launch their kernels with ``override`` forced on the rule.

    The override is read when an op is traced (its launchers are built then, see ``ops._rows.row_launcher``), so it
    holds for everything a ``jax.jit`` traces inside the context; a program traced before keeps its tiling.
    """
    token = _OVERRIDE.set(override)
    try:
        yield
    finally:
        _OVERRIDE.reset(token)


def current_override() -> TilingOverride | None:
    """The override of the innermost :func:`overridden` context, or None outside one."""
    return _OVERRIDE.get()


def row_tiling(
    n_cols: int, *, reduces_rows: bool = False, walks_tiles: bool = False, override: TilingOverride | None = None
) -> RowTiling:
    """Tile shape, warps and prefetching for rows of ``n_cols`` elements.

    Measured on the H200 (bf16, D = 1024, 4096, 8192; benchmarks/RESULTS.md): 2048-element tiles with 4 warps
    serve the one-pass kernels best up to D = 8192, wider rows need more warps to keep registers per thread low;
    the kernels that walk tiles and sum over rows want 8 warps, 2 programs per SM and prefetching from D = 4096.
    Wider rows follow the register counts (see the constants): one tile up to MAX_FORWARD_TILE_COLS and
    MAX_BACKWARD_TILE_COLS, without prefetching beyond MEASURED_TILE_LIMIT (a second tile does not fit), column
    blocks beyond. A forward kernel that can walk row tiles (``walks_tiles``: sparsemax's, whose one-tile
    iteration has no load in flight where one program fills a multiprocessor) walks them, the next one prefetched,
    only where an override forces prefetching (not yet timed on a GPU), with programs of MAX_WARPS warps in all
    per multiprocessor. ``override`` (see :func:`overridden`) replaces any of block_d, block_rows, warps,
    prefetching, stages and resident programs per multiprocessor.
    """
    override = override or TilingOverride()
    max_tile_cols = MAX_BACKWARD_TILE_COLS if reduces_rows else MAX_FORWARD_TILE_COLS
    column_block = COLUMN_BLOCK if reduces_rows else MAX_FORWARD_TILE_COLS
    block_d = override.block_d or (next_power_of_2(n_cols) if n_cols <= max_tile_cols else column_block)
    block_d = min(block_d, next_power_of_2(n_cols))
    one_tile = block_d >= n_cols
    block_rows = override.block_rows or rows_per_tile(block_d, ROW_TILE_ELEMENTS)
    tile = block_rows * block_d
    if not one_tile:
        num_warps = max(4, min(MAX_WARPS, tile // COLUMN_ELEMENTS_PER_WARP))
    elif tile <= MEASURED_TILE_LIMIT:
        num_warps = max(8 if reduces_rows and block_d >= 4096 else 4, min(16, tile // 2048))
    else:
        num_warps = min(MAX_WARPS, tile // WIDE_TILE_ELEMENTS_PER_WARP)
    prefetch = reduces_rows and tile <= MEASURED_TILE_LIMIT
    if override.prefetch is not None:
        prefetch = override.prefetch
    num_warps = override.num_warps or num_warps
    if walks_tiles:
        programs_per_sm = max(1, MAX_WARPS // num_warps)
    else:
        programs_per_sm = WIDE_ROW_PROGRAMS_PER_SM if reduces_rows and block_d >= 4096 else PROGRAMS_PER_SM
    programs_per_sm = override.programs_per_sm or programs_per_sm
    return RowTiling(
        block_rows=block_rows,
        block_d=block_d,
        num_warps=num_warps,
        programs_per_sm=programs_per_sm,
        prefetch=prefetch and one_tile,
        num_stages=override.num_stages or 1,
    )


def column_splits(n_cols: int, block_d: int, n_partials: int, override: TilingOverride | None = None) -> int:
    """How many programs share each row of ``n_cols`` in a backward kernel that walks column blocks of ``block_d``
    and sums ``n_partials`` weight gradients over rows: each sums its own columns for the row statistics and shares
    the sums with the others (``liger_jax.kernels._rows.store_split_sum``), then writes dx and sums the partials
    of its own :func:`split_blocks` only, which must fit MAX_REGISTER_PARTIALS fp32 registers; at least two from
    SHARED_SUMS_MIN_BLOCKS blocks and SUMS_AHEAD_SPLITS from SUMS_AHEAD_SPLITS · SUMS_AHEAD_SPLIT_BLOCKS. 1 for a row
    of one tile; else the override's count if it sets one."""
    blocks = cdiv(n_cols, block_d)
    if blocks > 1 and override is not None and override.column_splits is not None:
        return override.column_splits
    splits = 2 if blocks >= SHARED_SUMS_MIN_BLOCKS else 1
    if blocks >= SUMS_AHEAD_SPLITS * SUMS_AHEAD_SPLIT_BLOCKS:
        splits = SUMS_AHEAD_SPLITS
    while splits < blocks and n_partials * next_power_of_2(cdiv(blocks, splits)) * block_d > MAX_REGISTER_PARTIALS:
        splits *= 2
    return splits


def split_warps(n_cols: int, block_d: int, splits: int, num_warps: int, override: TilingOverride | None = None) -> int:
    """The warps of a backward program that owns its split of a row of ``n_cols`` in column blocks of ``block_d``:
    SPLIT_WIDE_WARPS where a split owns SPLIT_WIDE_BLOCKS blocks or more, else ``num_warps`` (the tiling's); the
    override's warps where it sets them."""
    if override is not None and override.num_warps is not None:
        return override.num_warps
    walks_blocks = block_d < n_cols
    return SPLIT_WIDE_WARPS if walks_blocks and cdiv(cdiv(n_cols, block_d), splits) >= SPLIT_WIDE_BLOCKS else num_warps


def sums_ahead(n_cols: int, block_d: int, splits: int, n_partials: int, override: TilingOverride | None = None) -> bool:
    """Whether a backward kernel walking rows of ``n_cols`` in column blocks of ``block_d``, ``splits`` programs a
    row, summing ``n_partials`` weight gradients, sums the next row tile's row statistics in the pass that writes
    this tile's dx: where SUMS_AHEAD_SPLITS or more splits own at most SUMS_AHEAD_SPLIT_BLOCKS blocks each and one
    partial sum (see the constants); the override's choice where it sets one (for rows walked in blocks only)."""
    if block_d >= n_cols:
        return False
    if override is not None and override.sums_ahead is not None:
        return override.sums_ahead
    return (
        n_partials == 1
        and splits >= SUMS_AHEAD_SPLITS
        and cdiv(cdiv(n_cols, block_d), splits) <= SUMS_AHEAD_SPLIT_BLOCKS
    )


@dataclasses.dataclass(frozen=True)
class SplitLaunch:
    """How a backward kernel that sums weight gradients over rows shares each row: ``splits`` programs a row of
    ``warps`` warps each, summing the next row tile's row statistics ahead or not (``sums_ahead``), with
    ``programs_per_sm`` resident programs a multiprocessor."""

    splits: int
    warps: int
    sums_ahead: bool
    programs_per_sm: int

    @classmethod
    def unsplit(cls, tiling: RowTiling) -> "SplitLaunch":
        """A launch of ``tiling`` that shares no row: one split at its warps and resident programs."""
        return cls(1, tiling.num_warps, False, tiling.programs_per_sm)


def split_launch(
    n_cols: int, tiling: RowTiling, n_partials: int, override: TilingOverride | None = None
) -> SplitLaunch:
    """The :class:`SplitLaunch` of a backward launch that walks rows of ``n_cols`` at ``tiling`` and sums
    ``n_partials`` weight gradients over rows: :func:`column_splits`' count, :func:`split_warps`' warps for it,
    :func:`sums_ahead`'s choice, and COLUMN_BLOCK_PROGRAMS_PER_SM resident programs where the rows are walked in
    column blocks and not summed ahead (else the tiling's, and the override's where it sets them)."""
    splits = column_splits(n_cols, tiling.block_d, n_partials, override)
    ahead = sums_ahead(n_cols, tiling.block_d, splits, n_partials, override)
    programs_per_sm = tiling.programs_per_sm
    forced = override is not None and override.programs_per_sm is not None
    if tiling.block_d < n_cols and not ahead and not forced:
        programs_per_sm = COLUMN_BLOCK_PROGRAMS_PER_SM
    return SplitLaunch(
        splits, split_warps(n_cols, tiling.block_d, splits, tiling.num_warps, override), ahead, programs_per_sm
    )


def separate_row_sums(n_cols: int, override: TilingOverride | None = None) -> bool:
    """Whether LayerNorm's backward on rows of ``n_cols`` first sums each row (Σ g, Σ g · n) in a kernel of its own,
    so that its column-block kernel reads only each split's own columns and shares no sums: where
    SEPARATE_ROW_SUMS_MIN_SPLITS splits or more share a row, or wherever the backward walks column blocks if
    ``override`` says so."""
    tiling = row_tiling(n_cols, reduces_rows=True, override=override)
    if tiling.block_d >= n_cols:
        return False
    if override is not None and override.separate_row_sums is not None:
        return override.separate_row_sums
    return column_splits(n_cols, tiling.block_d, 2, override) >= SEPARATE_ROW_SUMS_MIN_SPLITS


@functools.cache
def multiprocessor_count() -> int:
    """The default device's multiprocessors (streaming multiprocessors on a GPU); 132, an H100's or H200's, where
    the device does not say (a CPU)."""
    return int(getattr(jax.devices()[0], "core_count", 0) or 132)


def reduction_grid(n_rows: int, tiling: RowTiling, implementation: str, segments: int = 1) -> tuple[int, int]:
    """``(programs, tiles_per_program)`` for a kernel whose programs each walk a contiguous run of row tiles (and
    emit one partial sum, where it sums over rows); every program has work, and together they cover all
    ``n_rows``. For ``segments`` launched together (each its own ``n_rows``, programs = segments × the result's
    programs), the programs are shared out among them; so they are among the column splits of a row
    (``column_splits``)."""
    if implementation == "interpret":
        limit = INTERPRETER_PROGRAMS
    else:
        limit = tiling.programs_per_sm * multiprocessor_count()
    limit = max(1, limit // segments)
    tiles = cdiv(n_rows, tiling.block_rows)
    tiles_per_program = cdiv(tiles, max(1, min(tiles, limit)))
    return cdiv(tiles, tiles_per_program), tiles_per_program
