"""Row-kernel tiling sweep: ``python -m benchmarks.norm_tiling --out DIR`` (on the H200; ``--smoke`` on a CPU).

For RMSNorm, LayerNorm and fused add+RMSNorm in bf16 at 4096 × D, D from 1024 to 131072, times the forward and
fwd+bwd of XLA, of ``liger_jax.ops._tiling.row_tiling``'s rule, and of candidate tilings forced on it (see
:class:`Grid`: one tile per row at several warp counts, with and without the backward's prefetch; column blocks of
4096 and 8192 from D = 16384), as ``benchmarks.measure`` times every op (device time of back-to-back calls over
rotated input copies). Prints, per (op, D), each candidate's forward and backward tilings, its forward, backward and
fwd+bwd ms, their fractions of the HBM floor (bytes moved / 3.4 TB/s) and the fwd+bwd ratio to XLA, then the best
candidate per mode; rows go to ``DIR/norm_tiling.jsonl`` as they are measured.

A backward is fwd+bwd minus the forward timed with the same forward tiling (the forward never prefetches, so a
prefetch variant is timed in fwd+bwd only). ``--registers`` instead compiles every candidate's kernels for sm_90
(no GPU needed; run it without TRITON_INTERPRET) and prints ptxas's registers and spill bytes per thread: the
numbers behind ``_tiling``'s limits.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import pathlib
import re
import subprocess
import tempfile
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # imported where used: providers.prepare_process must run before triton is imported
    from liger_jax.ops._tiling import RowTiling, TilingOverride

TOKENS = 4096
HIDDEN = (1024, 4096, 8192, 16384, 32768, 65536, 131072)
MAX_ELEMENTS = 2**29  # tokens × D: 1 GiB of bf16 per activation
MAX_TILE_COLS = 65536  # the widest one-tile candidate: beyond, every kernel spills (see --registers)
OPS = ("rms_norm", "layer_norm", "fused_add_rms_norm")
TIME_PER_MEASUREMENT_S = 0.1
RULE, XLA_LABEL = "rule", "xla"


@dataclasses.dataclass(frozen=True)
class Grid:
    """The candidates besides the rule, lean enough that compiling them all takes about three minutes.

    Attributes:
        tokens: rows (fewer where tokens × D would pass MAX_ELEMENTS).
        hidden: row lengths D.
        tile_warps: warp counts for one tile per row, each kept where a thread gets 16 to 64 of the tile's
            elements; tiles of up to ``_tiling.MEASURED_TILE_LIMIT`` also with the backward's prefetch flipped
            (wider ones spill when they prefetch: see ``--registers``).
        column_blocks: ``(block_d, warps)`` of the column-block candidates, for rows of ``loop_from`` or more.
        loop_from: the shortest row that gets column-block candidates (shorter rows fit one tile without spilling).
    """

    tokens: int
    hidden: tuple[int, ...]
    tile_warps: tuple[int, ...]
    column_blocks: tuple[tuple[int, int], ...]
    loop_from: int


GPU_GRID = Grid(TOKENS, HIDDEN, (4, 8, 16, 32), column_blocks=((4096, 8), (4096, 16), (8192, 16)), loop_from=16384)
# On a CPU, every code path once: one tile, with and without prefetch, and 4 column blocks of 64 (the last partial).
SMOKE_GRID = Grid(37, (200,), (4,), column_blocks=((64, 8),), loop_from=1)


@dataclasses.dataclass(frozen=True)
class Candidate:
    """A tiling forced on the rule (None: the rule itself), and whether its forward is timed on its own."""

    label: str
    override: TilingOverride | None
    times_forward: bool = True


def candidates(n_cols: int, grid: Grid) -> list[Candidate]:
    """The rule, then ``grid``'s alternatives for rows of ``n_cols``; one whose forward and backward tilings are an
    earlier candidate's is dropped."""
    from liger_jax.ops import _tiling

    chosen = [Candidate(RULE, None)]
    single = _tiling.next_power_of_2(n_cols)
    tile = _tiling.rows_per_tile(single, _tiling.ROW_TILE_ELEMENTS) * single
    flipped = not _tiling.row_tiling(n_cols, reduces_rows=True).prefetch
    for warps in grid.tile_warps if single <= MAX_TILE_COLS else ():
        if 16 <= tile // (32 * warps) <= 64:
            chosen.append(Candidate(f"tile/w{warps}", _tiling.TilingOverride(block_d=single, num_warps=warps)))
            if tile <= _tiling.MEASURED_TILE_LIMIT:
                override = _tiling.TilingOverride(block_d=single, num_warps=warps, prefetch=flipped)
                variant = "prefetch" if flipped else "no-prefetch"
                chosen.append(Candidate(f"tile/w{warps}/{variant}", override, times_forward=False))
    for block, warps in grid.column_blocks if n_cols >= grid.loop_from else ():
        if block < n_cols:
            chosen.append(Candidate(f"cols{block}/w{warps}", _tiling.TilingOverride(block_d=block, num_warps=warps)))
    seen, kept = set(), []
    for candidate in chosen:
        key = (_describe(n_cols, candidate.override, False), _describe(n_cols, candidate.override, True))
        if key not in seen:
            seen.add(key)
            kept.append(candidate)
    return kept


def _describe(n_cols: int, override: TilingOverride | None, reduces_rows: bool) -> str:
    """``rows x block_d/wW[/pf][/loop]``: the tiling a forward or backward launch gets."""
    from liger_jax.ops import _tiling

    t = _tiling.row_tiling(n_cols, reduces_rows=reduces_rows, override=override)
    return (
        f"{t.block_rows}x{t.block_d}/w{t.num_warps}"
        + ("/pf" if t.prefetch else "")
        + ("/loop" if t.block_d < n_cols else "")
    )


def sweep(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Measures every (op, D, candidate, mode); returns the rows (also appended to ``args.out``)."""
    from benchmarks import providers
    from benchmarks.cases import OPS as CASE_OPS
    from benchmarks.timing import SMOKE_POLICY, Policy

    providers.prepare_process()
    policy = SMOKE_POLICY if args.smoke else Policy(budget_s=args.time_per_measurement)
    start, rows = time.monotonic(), []
    out = args.out / "norm_tiling.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    for op in args.op:
        for n_cols in args.hidden:
            params = {"tokens": min(args.grid.tokens, MAX_ELEMENTS // n_cols), "hidden": n_cols}
            case = CASE_OPS[op].build(params, "bfloat16")
            chosen = candidates(n_cols, args.grid)
            # One Case object for every provider, so its compiled input draws are shared (measure caches by it).
            case = dataclasses.replace(
                case,
                providers={XLA_LABEL: providers.xla_provider(op)}
                | {c.label: providers.kernel_provider(op) for c in chosen},
            )
            plan = [(XLA_LABEL, None, mode) for mode in ("forward", "full")]
            plan += [
                (c.label, c, mode) for c in chosen for mode in ("forward", "full") if c.times_forward or mode == "full"
            ]
            for label, candidate, mode in plan:
                row = _measure(case, label, None if candidate is None else candidate.override, mode, policy, args.smoke)
                rows.append(row)
                with open(out, "a") as file:
                    file.write(json.dumps(row, default=str) + "\n")
                status = f"{row['ms']:8.3f} ms" if row["status"] == "ok" else row["status"]
                print(f"[{time.monotonic() - start:6.1f} s] {op} D={n_cols} {label} {mode}: {status}", flush=True)
    return rows


def _measure(case, label: str, override: TilingOverride | None, mode: str, policy, smoke: bool) -> dict[str, Any]:
    """One row: ``case``'s provider ``label`` timed in ``mode`` with ``override`` forced on the rule (the kernels
    are traced, so their launchers built, inside the override's context), and the tilings that gives."""
    from benchmarks.measure import measure_jax
    from liger_jax.ops import _tiling

    n_cols = case.params["hidden"]
    row = {"op": case.op, "provider": label, "mode": mode, "hidden": n_cols, "tokens": case.params["tokens"]}
    if label != XLA_LABEL:
        row |= {
            "forward_tiling": _describe(n_cols, override, False),
            "backward_tiling": _describe(n_cols, override, True),
        }
    try:
        with contextlib.nullcontext() if override is None else _tiling.overridden(override):
            return row | measure_jax(case, label, mode, policy, smoke)
    except Exception as error:  # one failing candidate must not cost the rest of the sweep
        return row | {"status": f"error: {type(error).__name__}: {error}".splitlines()[0][:300]}


@dataclasses.dataclass(frozen=True)
class Result:
    """One candidate at one (op, D): its tilings, times in ms and fractions of the floor (None: not measured)."""

    label: str
    forward_tiling: str
    backward_tiling: str
    forward_ms: float | None
    forward_floor: float | None
    backward_ms: float | None
    full_ms: float | None
    full_floor: float | None
    vs_xla: float | None  # XLA's fwd+bwd time over this one's


def results(rows: list[dict[str, Any]]) -> dict[tuple[str, int, int], list[Result]]:
    """The measured rows as :class:`Result` per (op, tokens, D). A backward is the fwd+bwd less the forward timed
    with the same forward tiling (XLA's: its own)."""
    groups: dict[tuple[str, int, int], list[dict[str, Any]]] = {}
    for row in rows:
        if row.get("status") == "ok":
            groups.setdefault((row["op"], row["tokens"], row["hidden"]), []).append(row)
    grouped = {}
    for key, found in groups.items():
        by_key = {(row["provider"], row["mode"]): row for row in found}
        forward_ms = {_forward_key(row): row["ms"] for row in found if row["mode"] == "forward"}
        xla_full = by_key.get((XLA_LABEL, "full"))
        grouped[key] = []
        for label in dict.fromkeys(row["provider"] for row in found):
            forward, full = by_key.get((label, "forward")), by_key.get((label, "full"))
            tilings = full or forward
            grouped[key].append(
                Result(
                    label,
                    tilings.get("forward_tiling", "-"),
                    tilings.get("backward_tiling", "-"),
                    _get(forward, "ms"),
                    _get(forward, "fraction_of_floor"),
                    full["ms"] - forward_ms[_forward_key(full)] if full and _forward_key(full) in forward_ms else None,
                    _get(full, "ms"),
                    _get(full, "fraction_of_floor"),
                    xla_full["ms"] / full["ms"] if full and xla_full else None,
                )
            )
    return grouped


def _best(found: list[Result], field: str) -> Result | None:
    """The fastest liger candidate by ``field`` (``forward_ms``, ``backward_ms`` or ``full_ms``)."""
    timed = [r for r in found if r.label != XLA_LABEL and getattr(r, field) is not None]
    return min(timed, key=lambda r: getattr(r, field), default=None)


def table(grouped: dict[tuple[str, int, int], list[Result]]) -> str:
    """Per (op, D): every candidate's tilings, forward / backward / fwd+bwd ms, fractions of the floor and the
    fwd+bwd ratio to XLA; then the best candidate per mode."""
    header = (
        f"{'candidate':<22} {'fwd tiling':<18} {'bwd tiling':<22} {'fwd ms':>8} {'floor':>6} {'bwd ms':>8} "
        f"{'full ms':>8} {'floor':>6} {'vs XLA':>7}"
    )
    lines = []
    for (op, tokens, n_cols), found in grouped.items():
        lines += ["", f"{op}  tokens={tokens}  D={n_cols}", header]
        for r in found:
            lines.append(
                f"{r.label:<22} {r.forward_tiling:<18} {r.backward_tiling:<22} {_number(r.forward_ms, '.3f'):>8} "
                f"{_number(r.forward_floor, '.0%'):>6} {_number(r.backward_ms, '.3f'):>8} "
                f"{_number(r.full_ms, '.3f'):>8} {_number(r.full_floor, '.0%'):>6} {_number(r.vs_xla, '.2f'):>6}x"
            )
        for mode in ("forward", "backward", "full"):
            best = _best(found, f"{mode}_ms")
            if best is not None:
                lines.append(f"  best {mode:<8} {best.label} ({getattr(best, f'{mode}_ms'):.3f} ms)")
    return "\n".join(lines)


def summary(grouped: dict[tuple[str, int, int], list[Result]]) -> str:
    """One line per (op, D): the rule's fwd+bwd (fraction of the floor, ratio to XLA) and the best candidates."""
    lines = [
        f"{'op':<19} {'D':>6} {'rule full':>10} {'floor':>6} {'vs XLA':>7}   best fwd / bwd / full ms (floor, vs XLA)"
    ]
    for (op, _, n_cols), found in grouped.items():
        rule = next((r for r in found if r.label == RULE), None)
        if rule is None or rule.full_ms is None:
            continue
        bests = []
        for mode in ("forward", "backward", "full"):
            best = _best(found, f"{mode}_ms")
            bests.append("-" if best is None else f"{best.label} {getattr(best, f'{mode}_ms'):.3f}")
        best_full = _best(found, "full_ms")
        bests[-1] += f" ({_number(best_full.full_floor, '.0%')}, {_number(best_full.vs_xla, '.2f')}x)"
        lines.append(
            f"{op:<19} {n_cols:>6} {rule.full_ms:>10.3f} {_number(rule.full_floor, '.0%'):>6} "
            f"{_number(rule.vs_xla, '.2f'):>6}x   {' / '.join(bests)}"
        )
    return "\n".join(lines)


def _forward_key(row: dict[str, Any]) -> str:
    return row.get("forward_tiling", row["provider"])


def _get(row: dict[str, Any] | None, key: str) -> Any:
    return None if row is None else row[key]


def _number(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


# The kernels' constexprs as the ops launch them (Llama casting, no offset); sizes and tiling are added per case.
_KERNELS = {
    "rms_norm": ("rms_norm_fwd", "rms_norm_bwd", {"eps": 1e-6, "offset": 0.0, "CASTING": 1}),
    "layer_norm": ("layer_norm_fwd", "layer_norm_bwd", {"eps": 1e-5}),
    "fused_add_rms_norm": (
        "fused_add_rms_norm_fwd",
        "fused_add_rms_norm_bwd",
        {"eps": 1e-6, "offset": 0.0, "CASTING": 1},
    ),
}


def registers(args: argparse.Namespace) -> None:
    """Compiles each candidate's forward and backward kernels for sm_90 and prints registers and spill bytes."""
    from liger_jax.kernels import layer_norm, rms_norm
    from liger_jax.ops import _tiling

    modules = {"rms_norm": rms_norm, "layer_norm": layer_norm, "fused_add_rms_norm": rms_norm}
    print(f"{'op':<20} {'D':>7} {'candidate':<22} {'kernel':<24} {'tiling':<22} {'regs':>5} {'spill B':>8}")
    for op in args.op:
        forward_name, backward_name, settings = _KERNELS[op]
        for n_cols in args.hidden:
            for candidate in candidates(n_cols, args.grid):
                for name, reduces_rows in ((forward_name, False), (backward_name, True)):
                    if not (reduces_rows or candidate.times_forward):
                        continue  # a prefetch variant's forward is the plain candidate's
                    tiling = _tiling.row_tiling(n_cols, reduces_rows=reduces_rows, override=candidate.override)
                    regs, spill = _kernel_usage(getattr(modules[op], name), settings, n_cols, tiling, reduces_rows)
                    text = _describe(n_cols, candidate.override, reduces_rows)
                    print(f"{op:<20} {n_cols:>7} {candidate.label:<22} {name:<24} {text:<22} {regs:>5} {spill:>8}")


def _kernel_usage(
    kernel, settings: dict[str, Any], n_cols: int, tiling: RowTiling, reduces_rows: bool
) -> tuple[int, int]:
    """``(registers, spill bytes)`` per thread of ``kernel`` compiled for sm_90 as the ops launch it (bf16)."""
    import triton
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    names = [p.name for p in kernel.params]
    constexprs = {k: v for k, v in settings.items() if k in names}
    constexprs |= {"n_cols": n_cols, "row_stride": n_cols, "BLOCK_ROWS": tiling.block_rows, "BLOCK_D": tiling.block_d}
    if reduces_rows:
        constexprs |= {"PREFETCH": tiling.prefetch, "TILES_PER_PROGRAM": 4}
    signature = {n: "constexpr" if n in constexprs else _pointer_type(n) for n in names}
    # Pointers are 16-byte aligned, as jax-triton declares XLA's buffers.
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names) if n.endswith("_ptr")}
    source = ASTSource(fn=kernel, signature=signature, constexprs=constexprs, attrs=attrs)
    options = {"num_warps": tiling.num_warps, "num_stages": 1}
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)
    return _ptxas_usage(compiled.asm["ptx"], knobs.nvidia.ptxas.path)


def _pointer_type(name: str) -> str:
    if not name.endswith("_ptr"):
        return "i32"  # n_rows
    return "*fp32" if name in ("rstd_ptr", "mean_ptr") or "partial" in name else "*bf16"


def _ptxas_usage(ptx: str, ptxas: str) -> tuple[int, int]:
    """``(registers, spill store bytes)`` per thread, from ``ptxas -v`` on ``ptx`` for sm_90a."""
    with tempfile.NamedTemporaryFile("w", suffix=".ptx") as source:
        source.write(ptx)
        source.flush()
        log = subprocess.run(
            [ptxas, "-v", "--gpu-name=sm_90a", source.name, "-o", "/dev/null"], capture_output=True, text=True
        ).stderr
    regs = re.search(r"Used (\d+) registers", log)
    spill = re.search(r"(\d+) bytes spill stores", log)
    return int(regs.group(1)) if regs else -1, int(spill.group(1)) if spill else -1


def parser() -> argparse.ArgumentParser:
    """The command line of ``python -m benchmarks.norm_tiling``."""
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("--op", nargs="+", default=list(OPS), choices=OPS)
    cli.add_argument("--hidden", nargs="+", type=int, help="row lengths D (default: 1024 ... 131072)")
    cli.add_argument("--smoke", action="store_true", help="a few tiny cases through the interpreter, on a CPU")
    cli.add_argument("--registers", action="store_true", help="print registers and spills per kernel; no timing")
    cli.add_argument("--out", type=pathlib.Path, default=pathlib.Path("benchmarks/out"), help="folder for the rows")
    cli.add_argument("--time-per-measurement", type=float, default=TIME_PER_MEASUREMENT_S)
    return cli


def main(argv: Sequence[str] | None = None) -> None:
    """Command line entry point."""
    args = parser().parse_args(argv)
    args.grid = SMOKE_GRID if args.smoke else GPU_GRID
    args.hidden = args.hidden or list(args.grid.hidden)
    if args.registers:
        registers(args)
        return
    grouped = results(sweep(args))
    report = f"{table(grouped)}\n\n{summary(grouped)}\n"
    (args.out / "norm_tiling.txt").write_text(report)
    print(report, flush=True)


if __name__ == "__main__":
    main()
