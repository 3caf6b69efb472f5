"""Tiling sweep of the catalog's row kernels at their target shapes: ``python -m benchmarks.row_tiling --out DIR``
(on the H200; ``--smoke`` on a CPU).

For softmax, sparsemax, DyT, PolyNorm, modulated RMSNorm, GroupNorm, kl_div and tvd, in bf16 (fp32 with ``--dtype``) at
their benchmark targets (``benchmarks.cases``), times the forward and fwd+bwd of XLA, of the op's tiling rule and of a
handful of candidate tilings forced on it through ``liger_jax.ops._tiling.overridden`` (see :func:`candidates`): warps
and rows per tile around the rule for the row kernels (``_tiling.row_tiling``, with ``_heavy_rows``' warps for DyT,
PolyNorm and modulated RMSNorm), column blocks for rows of 32768; the vocabulary block, warps and pipelining stages of
the divergence kernel (``_divergence_rows.block_tiling``); channels per block, tokens per chunk, warps, stages and token
splits of GroupNorm's (``group_norm.group_tiling``). Prints the tables of ``benchmarks.norm_tiling`` per (op, shape) and
rows go to ``DIR/row_tiling.jsonl`` as they are measured. ``--registers`` instead compiles every candidate's kernels for
sm_90 (no GPU needed; run it without TRITON_INTERPRET) and prints ptxas's registers and spill bytes per thread.
"""

from __future__ import annotations

import argparse
import functools
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from benchmarks import tiling_sweep
from benchmarks.tiling_sweep import RULE, Candidate

if TYPE_CHECKING:  # imported where used: providers.prepare_process must run before triton is imported
    from benchmarks.case import Case, Params
    from liger_jax.ops._tiling import RowTiling, TilingOverride

# How each op's launches are tiled: "rows" (``_tiling.row_tiling``), "heavy" (with ``_heavy_rows``' warps),
# "divergence", "group"; and which of its row kernels can prefetch row tiles, if one can: modulated RMSNorm's
# backward, sparsemax's forward (it walks tiles: ``_rows.row_launcher``'s ``walks_tiles``).
# ONE_TILE_OPS keep a row in one tile (no column-block path): their wide rows get the one-tile candidates.
FAMILIES = {
    "softmax": ("rows", None),
    "sparsemax": ("rows", "forward"),
    "dyt": ("heavy", None),
    "poly_norm": ("heavy", None),
    "modulated_rms_norm": ("heavy", "backward"),
    "group_norm": ("group", None),
    "kl_div": ("divergence", None),
    "tvd": ("divergence", None),
}
ONE_TILE_OPS = frozenset({"poly_norm", "modulated_rms_norm"})
OPS = tuple(FAMILIES)
DTYPE = "bfloat16"
# Candidates kept on a CPU besides the rule: the first alternative of each family exercises its override.
SMOKE_CANDIDATES = 1


def _override(**settings) -> TilingOverride:
    from liger_jax.ops import _tiling

    return _tiling.TilingOverride(**settings)


def _label(override: TilingOverride) -> str:
    """``d4096/r2/w8/s2/t4/l132/p1/pf``: the settings an override forces."""
    parts = {
        "block_d": "d",
        "block_rows": "r",
        "num_warps": "w",
        "num_stages": "s",
        "token_splits": "t",
        "split_lag": "l",
        "programs_per_sm": "p",
    }
    texts = [f"{short}{getattr(override, name)}" for name, short in parts.items() if getattr(override, name)]
    if override.prefetch is not None:
        texts.append("pf" if override.prefetch else "no-pf")
    return "/".join(texts)


def _row_alternatives(n_cols: int, family: str, prefetches: str | None, one_tile: bool) -> list[TilingOverride]:
    """Around ``_tiling.row_tiling``: warps and rows per tile for one-tile rows, column blocks (and stages in their
    loop) for rows wider than MEASURED_TILE_LIMIT unless the kernel keeps a row in one tile; the backward's prefetch
    forced on where it has one, a walking forward's forced both ways (at the rule's warps and at 16)."""
    from liger_jax.ops import _tiling

    walking = [_override(num_warps=warps, prefetch=p) for warps in (None, 16) for p in (True, False)]
    if n_cols > _tiling.MEASURED_TILE_LIMIT and not one_tile:
        tile = _tiling.next_power_of_2(n_cols)
        blocks = [
            _override(block_d=4096, num_warps=8),
            _override(block_d=8192, num_warps=16),
            _override(block_d=8192, num_warps=16, num_stages=2),
            _override(block_d=16384, num_warps=32),
            _override(block_d=tile, num_warps=16),
        ]
        if prefetches == "forward":  # its prefetch both ways, then only the two widest blocks: at most 8 in all
            return walking + blocks[3:]
        return blocks
    if family == "heavy" and prefetches == "backward":
        # Modulated RMSNorm's grouped backward prefetches only when forced (``_heavy_rows``). The resident programs
        # are as many as fit a multiprocessor (ptxas, sm_90, 4096 columns: 84 registers at 16 warps, 99 prefetching,
        # 165-169 at 8): one, where the grid's two would leave a second wave waiting.
        chosen = [_override(num_warps=32), _override(block_rows=2, num_warps=16), _override(prefetch=True)]
        chosen += [_override(num_warps=w, prefetch=p, programs_per_sm=1) for w in (16, 8) for p in (False, True)]
    elif family == "heavy":  # the rule gives 8 elements a thread
        chosen = [
            _override(num_warps=8),
            _override(num_warps=32),
            _override(block_rows=2, num_warps=16),
            _override(block_rows=4, num_warps=32),
            _override(block_rows=1, num_warps=4),
            _override(block_rows=8, num_warps=8),
        ]
    else:  # 16 to 32 elements a thread
        chosen = [
            _override(num_warps=8),
            _override(num_warps=16),
            _override(block_rows=2, num_warps=8),
            _override(block_rows=4, num_warps=16),
            _override(block_rows=8, num_warps=32),
        ]
    if prefetches == "forward":
        chosen += [o for o in walking if o.prefetch]
    return chosen


# Around the divergence kernel's rule (4096-class blocks, one row, 4 warps): wider and narrower blocks, more warps,
# and the V loop pipelined.
DIVERGENCE_ALTERNATIVES = (
    {"block_d": 2048, "num_warps": 4},
    {"num_warps": 8},
    {"block_d": 8192, "num_warps": 8},
    {"block_d": 8192, "num_warps": 16},
    {"num_stages": 2},
    {"num_warps": 8, "num_stages": 3},
    {"block_d": 8192, "num_warps": 8, "num_stages": 2},
)
# Around GroupNorm's rule (64-channel blocks, and at the target its 128 programs' tokens split in 16, each pass one
# ordered launch whose statistics run 132 items ahead, in chunks of 128 tokens at 4 warps): the rule before (4 splits
# of 512-token chunks at 16 warps, 66 ahead), 256-token chunks at 8 warps and 8 splits, other splits and lags.
GROUP_ALTERNATIVES = (
    {"block_rows": 512, "num_warps": 16, "token_splits": 4, "split_lag": 66},
    {"block_rows": 256, "num_warps": 8, "token_splits": 8, "split_lag": 132},
    {"token_splits": 16, "split_lag": 264},
    {"token_splits": 16, "split_lag": 528},
    {"token_splits": 8, "split_lag": 132},
    {"block_rows": 64, "token_splits": 32, "split_lag": 132},
    {"token_splits": 16},
)


def candidates(op: str, params: Params) -> list[Candidate]:
    """The rule, then the alternatives of ``op``'s family at ``params``; one whose forward and backward tilings are
    an earlier candidate's is dropped."""
    family, prefetches = FAMILIES[op]
    if family == "divergence":
        alternatives = [_override(**settings) for settings in DIVERGENCE_ALTERNATIVES]
    elif family == "group":
        alternatives = [_override(**settings) for settings in GROUP_ALTERNATIVES]
    else:
        alternatives = _row_alternatives(_row_length(params), family, prefetches, op in ONE_TILE_OPS)
    chosen = [Candidate(RULE, None)] + [Candidate(_label(o), o) for o in alternatives]
    return tiling_sweep.distinct(chosen, tilings(op, params))


def _row_length(params: Params) -> int:
    return params.get("cols") or params["hidden"]


def tilings(op: str, params: Params) -> Callable[[TilingOverride | None], tuple[str, str]]:
    """``override -> (forward tiling, backward tiling)`` of ``op`` at ``params`` as the launches get them."""
    family, prefetches = FAMILIES[op]
    match family:
        case "divergence":
            return functools.partial(_divergence_tilings, params["vocab"])
        case "group":
            return functools.partial(_group_tilings, params)
        case _:
            describe = functools.partial(_row_tiling, op, _row_length(params), family == "heavy")
            return lambda override: (
                describe(override, reduces_rows=False, walks_tiles=prefetches == "forward"),
                describe(override, reduces_rows=prefetches == "backward", walks_tiles=False),
            )


def _describe(t: RowTiling, n_cols: int, prefetching: bool) -> str:
    """``rows x block/wW[/sS][/pf/pP][/loop]``: P resident programs a multiprocessor where tiles are walked."""
    return (
        f"{t.block_rows}x{t.block_d}/w{t.num_warps}"
        + (f"/s{t.num_stages}" if t.num_stages > 1 else "")
        + ("/pf" if prefetching and t.prefetch else "")
        + (f"/p{t.programs_per_sm}" if prefetching else "")
        + ("/loop" if t.block_d < n_cols else "")
    )


def _row_tiling(
    op: str, n_cols: int, heavy: bool, override: TilingOverride | None, *, reduces_rows: bool, walks_tiles: bool
) -> str:
    """The tiling ``_tiling.row_tiling`` gives ``op``'s launch (``reduces_rows`` and ``walks_tiles`` as its)."""
    from liger_jax.ops import _heavy_rows, _tiling

    if heavy:
        with tiling_sweep.forced(override):
            override = _heavy_rows.heavy_row_override(op, n_cols, reduces_rows=reduces_rows)
    tiling = _tiling.row_tiling(n_cols, reduces_rows=reduces_rows, walks_tiles=walks_tiles, override=override)
    return _describe(tiling, n_cols, reduces_rows or walks_tiles)


def _divergence_tilings(n_cols: int, override: TilingOverride | None) -> tuple[str, str]:
    from benchmarks.providers import kernel_implementation
    from liger_jax.ops import _divergence_rows

    text = _describe(_divergence_rows.block_tiling(n_cols, kernel_implementation(), override), n_cols, False)
    return text, text


def _group_tilings(params: Params, override: TilingOverride | None) -> tuple[str, str]:
    from liger_jax.ops import group_norm

    t = group_norm.group_tiling(
        params["tokens"], params["channels"], params["groups"], override, n_batch=params["batch"]
    )
    text = (
        f"{t.block_s}x{t.block_c}/w{t.num_warps}"
        + (f"/s{t.num_stages}" if t.num_stages > 1 else "")
        + (f"/t{t.token_splits}" if t.token_splits > 1 else "")
        + (f"/l{t.split_lag}" if t.split_lag else "")
    )
    return text, text


def cases(
    ops: Sequence[str], smoke: bool, shapes: Sequence[Params] = (), dtype: str = DTYPE
) -> Iterator[tuple[Case, list[Candidate]]]:
    """``(case, candidates)`` per op and bf16 target shape (its bf16 smoke shape, and fewer candidates, on a CPU);
    ``shapes`` replace the targets (each a target's params with some of them changed)."""
    from benchmarks.cases import OPS as CASE_OPS

    for op in ops:
        plan = CASE_OPS[op]
        chosen_shapes = [({**plan.targets[0][0], **shape}, dtype) for shape in shapes] or plan.targets
        for params, case_dtype in plan.smoke if smoke else chosen_shapes:
            if case_dtype == dtype:
                chosen = candidates(op, params)
                yield plan.build(params, case_dtype), chosen[: 1 + SMOKE_CANDIDATES] if smoke else chosen


def sweep(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Measures every (op, shape, candidate, mode); returns the rows (also appended to ``args.out``)."""
    from benchmarks import providers
    from benchmarks.timing import SMOKE_POLICY, Policy

    providers.prepare_process()
    policy = SMOKE_POLICY if args.smoke else Policy(budget_s=args.time_per_measurement)
    start, rows, out = time.monotonic(), [], args.out / "row_tiling.jsonl"
    for case, chosen in cases(args.op, args.smoke, args.shape, args.dtype):
        rows += tiling_sweep.sweep_case(case, chosen, tilings(case.op, case.params), policy, args.smoke, out, start)
    return rows


def parser() -> argparse.ArgumentParser:
    """The command line of ``python -m benchmarks.row_tiling``."""
    smoke = "each op at a tiny shape through the interpreter, on a CPU"
    cli = tiling_sweep.parser(__doc__.splitlines()[0], OPS, smoke)
    cli.add_argument(
        "--shape",
        nargs="+",
        type=_parse_shape,
        default=[],
        help="shapes instead of the targets, each the target's params it changes: hidden=1024 tokens=8192,hidden=512",
    )
    cli.add_argument("--dtype", choices=("bfloat16", "float32"), default=DTYPE, help="the inputs' dtype")
    return cli


def _parse_shape(text: str) -> dict[str, int]:
    """``"tokens=8192,hidden=512"`` → ``{"tokens": 8192, "hidden": 512}``."""
    pairs = [item.partition("=") for item in text.split(",")]
    if any(not key or not sep or not value.isdigit() for key, sep, value in pairs):
        raise argparse.ArgumentTypeError(f"a shape is name=int[,name=int...], got {text!r}")
    return {key: int(value) for key, _, value in pairs}


def main(argv: Sequence[str] | None = None) -> None:
    """Command line entry point."""
    args = parser().parse_args(argv)
    if args.registers:
        tiling_sweep.print_registers(cases(args.op, smoke=False, shapes=args.shape, dtype=args.dtype))
        return
    print(tiling_sweep.report(sweep(args), args.out / "row_tiling.txt"), flush=True)


if __name__ == "__main__":
    main()
