"""Row-kernel tiling sweep: ``python -m benchmarks.norm_tiling --out DIR`` (on the H200; ``--smoke`` on a CPU).

For RMSNorm, LayerNorm and fused add+RMSNorm in bf16 at 4096 × D, D from 1024 to 131072, times the forward and
fwd+bwd of XLA, of ``liger_jax.ops._tiling.row_tiling``'s rule, and of candidate tilings forced on it (see
:class:`Grid`: one tile per row at several warp counts, with and without the backward's prefetch; column blocks of
4096 and 8192 from D = 16384), as ``benchmarks.measure`` times every op (device time of back-to-back calls over
rotated input copies). Prints, per (op, D), each candidate's forward and backward tilings, its forward, backward and
fwd+bwd ms, their fractions of the HBM floor (bytes moved / the device's bandwidth, ``benchmarks.hardware``) and the
fwd+bwd ratio to XLA, then the best candidate per mode; rows go to ``DIR/norm_tiling.jsonl`` as they are measured.

A backward is fwd+bwd minus the forward timed with the same forward tiling (the forward never prefetches, so a
prefetch variant is timed in fwd+bwd only; see ``benchmarks.tiling_sweep``). ``--registers`` instead compiles every
candidate's kernels for sm_90 (no GPU needed; run it without TRITON_INTERPRET) and prints ptxas's registers and
spill bytes per thread: the numbers behind ``_tiling``'s limits.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from benchmarks import tiling_sweep
from benchmarks.tiling_sweep import RULE, Candidate

if TYPE_CHECKING:  # imported where used: providers.prepare_process must run before triton is imported
    from liger_jax.ops._tiling import TilingOverride

TOKENS = 4096
HIDDEN = (1024, 4096, 8192, 16384, 32768, 65536, 131072)
MAX_ELEMENTS = 2**29  # tokens × D: 1 GiB of bf16 per activation
MAX_TILE_COLS = 65536  # the widest one-tile candidate: beyond, every kernel spills (see --registers)
OPS = ("rms_norm", "layer_norm", "fused_add_rms_norm")


@dataclasses.dataclass(frozen=True)
class Grid:
    """The candidates besides the rule, lean enough that compiling them all takes about three minutes.

    Attributes:
        tokens: rows (fewer where tokens × D would pass MAX_ELEMENTS).
        hidden: row lengths D.
        tile_warps: warp counts for one tile per row, each kept where a thread gets 16 to 64 of the tile's
            elements; tiles of up to ``_tiling.MEASURED_TILE_LIMIT`` also with the backward's prefetch flipped
            (wider ones spill when they prefetch: see ``--registers``).
        column_blocks: ``(block_d, warps, column_splits, separate_row_sums)`` of the column-block candidates, for
            rows of ``loop_from`` or more (``column_splits`` None: the rule's splits of the backward;
            ``separate_row_sums`` True: LayerNorm's backward sums its rows in a kernel of their own, a candidate of
            layer_norm only).
        loop_from: the shortest row that gets column-block candidates (shorter rows fit one tile without spilling).
        sums_ahead: whether the rule and each column-block candidate are also timed with the backward summing the
            next row tile's statistics in the pass that writes this one's dx (``TilingOverride.sums_ahead``).
    """

    tokens: int
    hidden: tuple[int, ...]
    tile_warps: tuple[int, ...]
    column_blocks: tuple[tuple[int, int, int | None, bool], ...]
    loop_from: int
    sums_ahead: bool = False


GPU_GRID = Grid(
    TOKENS,
    HIDDEN,
    (4, 8, 16, 32),
    column_blocks=(
        (4096, 8, None, False),
        (4096, 16, None, False),
        (8192, 16, None, False),
        (8192, 16, 2, False),
        (8192, 16, 4, False),
        (8192, 16, None, True),
    ),
    loop_from=16384,
)
# The wide rows alone (``--grid wide``): the rule against forced backward splits at 32768 and 65536 columns, and
# LayerNorm's backward with its row sums from a kernel of their own (each split then reads only its own columns;
# also at the rule's tiling, see candidates), in about two minutes for the three ops.
WIDE_GRID = Grid(
    TOKENS,
    (32768, 65536),
    (),
    column_blocks=(
        (8192, 16, 1, False),
        (8192, 16, 2, False),
        (8192, 16, 4, False),
        (8192, 16, 8, True),
    ),
    loop_from=16384,
)
# The backward's splits sharing their row sums (each split sums its own columns), at 16 and 8 warps (``--grid
# exchange``), and the rule alone from 32768 columns (``--grid rule``; LayerNorm's also with its row sums apart).
EXCHANGE_GRID = Grid(
    TOKENS,
    (32768, 65536),
    (),
    column_blocks=((8192, 16, 2, False), (8192, 8, 2, False), (8192, 16, 4, False), (8192, 8, 4, False)),
    loop_from=16384,
)
RULE_GRID = Grid(TOKENS, (32768, 65536, 131072), (), column_blocks=(), loop_from=16384)
# The backward summing the next row tile ahead (``--grid ahead``), at the rule's tiling and at 16 warps in
# 8192-column blocks, four and eight splits.
AHEAD_GRID = Grid(
    TOKENS,
    (32768, 65536, 131072),
    (),
    column_blocks=((8192, 16, 4, False), (8192, 16, 8, False)),
    loop_from=16384,
    sums_ahead=True,
)
GRIDS = {"full": GPU_GRID, "wide": WIDE_GRID, "exchange": EXCHANGE_GRID, "rule": RULE_GRID, "ahead": AHEAD_GRID}
# On a CPU, every code path once: one tile, with and without prefetch, and 4 column blocks of 64 (the last partial),
# in one program a row and split among 3, LayerNorm's also with its row sums apart.
SMOKE_GRID = Grid(
    37, (200,), (4,), column_blocks=((64, 8, None, False), (64, 8, 3, False), (64, 8, 3, True)), loop_from=1
)


def candidates(n_cols: int, grid: Grid, op: str) -> list[Candidate]:
    """The rule, then ``grid``'s alternatives for ``op``'s rows of ``n_cols`` (for LayerNorm's rows walked in column
    blocks, first the rule with the backward's row sums apart); one whose forward and backward tilings are an
    earlier candidate's is dropped."""
    from liger_jax.ops import _tiling

    chosen = [Candidate(RULE, None)]
    if grid.sums_ahead:
        chosen.append(Candidate("ahead", _tiling.TilingOverride(sums_ahead=True)))
    single = _tiling.next_power_of_2(n_cols)
    tile = _tiling.rows_per_tile(single, _tiling.ROW_TILE_ELEMENTS) * single
    flipped = not _tiling.row_tiling(n_cols, reduces_rows=True).prefetch
    for warps in grid.tile_warps if single <= MAX_TILE_COLS else ():
        if 16 <= tile // (32 * warps) <= 64:
            chosen.append(Candidate(f"tile/w{warps}", _tiling.TilingOverride(block_d=single, num_warps=warps)))
            if tile <= _tiling.MEASURED_TILE_LIMIT:
                override = _tiling.TilingOverride(block_d=single, num_warps=warps, prefetch=flipped)
                variant = "prefetch" if flipped else "no-prefetch"
                chosen.append(Candidate(f"tile/w{warps}/{variant}", override))
    if op == "layer_norm" and _tiling.row_tiling(n_cols, reduces_rows=True).block_d < n_cols:
        chosen.append(Candidate("sums", _tiling.TilingOverride(separate_row_sums=True)))
    for block, warps, splits, sums_apart in grid.column_blocks if n_cols >= grid.loop_from else ():
        if block < n_cols and (op == "layer_norm" or not sums_apart):
            override = _tiling.TilingOverride(
                block_d=block, num_warps=warps, column_splits=splits, separate_row_sums=sums_apart
            )
            label = f"cols{block}/w{warps}" + (f"/split{splits}" if splits else "") + ("/sums" if sums_apart else "")
            chosen.append(Candidate(label, override))
            if grid.sums_ahead:
                ahead = dataclasses.replace(override, sums_ahead=True)
                chosen.append(Candidate(label + "/ahead", ahead))
    return tiling_sweep.distinct(chosen, functools.partial(_tilings, op, n_cols))


def _describe(op: str, n_cols: int, override: TilingOverride | None, reduces_rows: bool) -> str:
    """``rows x block_d/wW[/pf][/loop][/splitS][/sums][/ahead][/pP]``: the tiling a forward or backward launch of
    ``op`` gets (``splitS``: S programs share a row; ``sums``: LayerNorm's row sums in a kernel of their own;
    ``pP``: P resident programs a multiprocessor, where a backward walks column blocks)."""
    from liger_jax.ops import _tiling

    t = _tiling.row_tiling(n_cols, reduces_rows=reduces_rows, override=override)
    split, sums_apart = _tiling.SplitLaunch.unsplit(t), False
    if reduces_rows:
        split = _tiling.split_launch(n_cols, t, 2 if op == "layer_norm" else 1, override)
        sums_apart = op == "layer_norm" and _tiling.separate_row_sums(n_cols, override)
    warps, splits = split.warps, split.splits
    return (
        f"{t.block_rows}x{t.block_d}/w{warps}"
        + ("/pf" if t.prefetch else "")
        + ("/loop" if t.block_d < n_cols else "")
        + (f"/split{splits}" if splits > 1 else "")
        + ("/sums" if sums_apart else "")
        + ("/ahead" if split.sums_ahead and not sums_apart else "")
        + (f"/p{split.programs_per_sm}" if reduces_rows and t.block_d < n_cols else "")
    )


def sweep(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Measures every (op, D, candidate, mode); returns the rows (also appended to ``args.out``)."""
    from benchmarks import providers
    from benchmarks.timing import SMOKE_POLICY, Policy

    providers.prepare_process()
    policy = SMOKE_POLICY if args.smoke else Policy(budget_s=args.time_per_measurement)
    start, rows = time.monotonic(), []
    for case, chosen in _cases(args):
        n_cols = case.params["hidden"]
        tilings = functools.partial(_tilings, case.op, n_cols)
        rows += tiling_sweep.sweep_case(
            case, chosen, tilings, policy, args.smoke, args.out / "norm_tiling.jsonl", start
        )
    return rows


def _cases(args: argparse.Namespace):
    """``(case, candidates)`` per (op, D) of the sweep."""
    from benchmarks.cases import OPS as CASE_OPS

    for op in args.op:
        for n_cols in args.hidden:
            params = {"tokens": min(args.grid.tokens, MAX_ELEMENTS // n_cols), "hidden": n_cols}
            yield CASE_OPS[op].build(params, "bfloat16"), candidates(n_cols, args.grid, op)


def _tilings(op: str, n_cols: int, override: TilingOverride | None) -> tuple[str, str]:
    return _describe(op, n_cols, override, False), _describe(op, n_cols, override, True)


def parser() -> argparse.ArgumentParser:
    """The command line of ``python -m benchmarks.norm_tiling``."""
    cli = tiling_sweep.parser(__doc__.splitlines()[0], OPS, "a few tiny cases through the interpreter, on a CPU")
    cli.add_argument("--hidden", nargs="+", type=int, help="row lengths D (default: the grid's)")
    cli.add_argument(
        "--grid",
        choices=tuple(GRIDS),
        default="full",
        help="the candidates: GPU_GRID's, WIDE_GRID's, EXCHANGE_GRID's, RULE_GRID's or AHEAD_GRID's",
    )
    return cli


def main(argv: Sequence[str] | None = None) -> None:
    """Command line entry point."""
    args = parser().parse_args(argv)
    args.grid = SMOKE_GRID if args.smoke else GRIDS[args.grid]
    args.hidden = args.hidden or list(args.grid.hidden)
    if args.registers:
        tiling_sweep.print_registers(_cases(args))
        return
    print(tiling_sweep.report(sweep(args), args.out / "norm_tiling.txt"), flush=True)


if __name__ == "__main__":
    main()
