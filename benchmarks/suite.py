"""The whole benchmark suite on one GPU in one go: ``python -m benchmarks.suite --out $OUT``.

Phases, each in fresh processes so that no JAX allocator outlives its phase, under one wall-clock budget:

1. ops (``benchmarks.run``): every op at the issues' target shapes in all modes, then the token and
   hidden/vocab sweeps in fwd+bwd for liger_jax and XLA, until the phase's share of the budget is spent; then, in
   a process of its own, tokamax at the target shapes in fwd+bwd;
2. peaks (``benchmarks.peak``): a fresh process's peak memory of fwd+bwd at each target shape, several at once;
3. end to end (``benchmarks.e2e``): the Llama step at the same batch, then each one's largest batch, searched
   for by compiling (autotuning on, as in the run, so nothing else may use the GPU meanwhile) and run;
4. report: ``results.csv``, ``results.json``, ``RESULTS.md`` and ``plots.tar`` beside ``results.jsonl``.

``--smoke`` runs the same phases on tiny shapes (CPU: XLA and Triton's interpreter) to check the code paths.
"""

from __future__ import annotations

import argparse
import pathlib
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any

from benchmarks import e2e, peak, processes, report
from benchmarks import rows as results
from benchmarks.case import shape_string
from benchmarks.providers import LIGER_JAX, LIGER_JAX_XLA, LIGER_TORCH, TOKAMAX, XLA

# Shares of the budget (seconds, for the default 575 s): ops 270, peaks 37 (~35 on the H200), the rest end to end
# (253: two same-batch trials of ~35 s; two largest-batch trials, each tracing, ~4 compiles of 13–25 s, the state
# and the run, ~190 s; 245 s in all on the H200), 15 for the report. The ops phase took 232 s on the H200 for 262
# rows; its plan now has 241 (estimated 230–245 s): no Liger (torch) rows at the 48 sweep points (~ -25 s) and no
# liger_jax_xla at FLCE's 4 (~ -7 s), but hidden 32768 (6 rows, ~ +8 s), the small preset's shapes in the token
# sweeps (16 rows, ~ +12 s) and gated_linear_unit's target (9 rows, ~ +12 s); then tokamax, in TOKAMAX_S.
OPS_SHARE, PEAK_SHARE, REPORT_S = 0.47, 0.065, 15.0
# The sweeps settle issue 19's "never slower than XLA"; Liger (torch) and tokamax, comparisons, run at the targets.
SWEEP_PROVIDERS = (LIGER_JAX, XLA)
# Kept for tokamax at the end of the ops phase (estimated: process start and imports ~8 s, five probes ~8 s, eight
# fwd+bwd rows ~15 s); running last, a short budget costs its rows first; it also gets whatever the rest leaves.
TOKAMAX_S = 30.0
# tokamax's ops in the order to measure them: its norms and gated linear unit, then its loss, whose XLA path
# materialises the logits and recomputes them (~3 s a row at N=8192, V=128256; ~6 s at 32768 × 256000).
TOKAMAX_OPS = ("rms_norm", "layer_norm", "gated_linear_unit", "fused_linear_cross_entropy")
OPS_OVERRUN_S = 90.0  # the budget stops new measurements; the last one started may still compile and time
MAX_OPS_RESTARTS = 3
PEAK_JOBS = 6  # parallel peak processes: CPU-bound start-up and Triton compiles on a 16-core host
PEAK_TIMEOUT_S = 60.0
CAPACITY_SHARE = 0.85  # of the device's memory limit, for the peak processes running at once


def _log(message: str, start: float) -> None:
    print(f"[suite {time.monotonic() - start:6.1f} s] {message}", flush=True)


def ops_phase(args: argparse.Namespace, budget_s: float) -> None:
    """Runs ``benchmarks.run`` in subprocesses, rows streamed to ``args.out``: liger_jax, XLA and Liger (torch) at
    the targets then liger_jax and XLA at the sweeps, all but :data:`TOKAMAX_S` of ``budget_s``; then tokamax at the
    targets, fwd+bwd only, in a fresh process (its allocator starts empty, as its loss's full logits want).
    """
    deadline = time.monotonic() + budget_s
    base = [sys.executable, "-m", "benchmarks.run", "--out", str(args.out), "--no-report"]
    base += ["--smoke"] if args.smoke else ["--time-per-measurement", "0.15"]
    main = [*base, "--op", *args.op, "--provider", LIGER_JAX, XLA, LIGER_JAX_XLA, LIGER_TORCH]
    main += ["--sweep", "target", "tokens", "hidden", "vocab", "--sweep-mode", "full"]
    main += ["--sweep-provider", *SWEEP_PROVIDERS]
    _run_ops(main, deadline - TOKAMAX_S)
    tokamax_ops = [name for name in TOKAMAX_OPS if "all" in args.op or name in args.op]
    if tokamax_ops:
        _run_ops([*base, "--op", *tokamax_ops, "--provider", TOKAMAX, "--sweep", "target", "--mode", "full"], deadline)


def _run_ops(command: list[str], deadline: float) -> None:
    """Runs one ``benchmarks.run`` command, measuring nothing new after ``deadline`` (a ``time.monotonic()``).

    A process that dies (a crash, or a kernel fault that leaves the device unusable) is restarted with
    ``--resume`` while time is left: a fresh process gets a fresh CUDA context and carries on after the fault.
    """
    for attempt in range(MAX_OPS_RESTARTS + 1):
        left = deadline - time.monotonic()
        if left <= 0:
            return
        resume = ["--resume"] if attempt else []
        try:
            done = subprocess.run(
                [*command, *resume, "--budget-s", str(left)],
                check=False,
                timeout=left + OPS_OVERRUN_S,
                env=processes.child_env(),
            )
        except subprocess.TimeoutExpired:
            print("suite: the ops phase ran past its budget and was stopped; its rows so far are kept", flush=True)
            return
        if done.returncode == 0:
            return
        print(f"suite: the ops process exited with {done.returncode}; resuming in a fresh one", flush=True)


def peak_phase(args: argparse.Namespace, deadline: float) -> None:
    """Measures fresh-process peaks for the target shapes' fwd+bwd rows (for --smoke: two rows)."""
    from benchmarks.cases import OPS

    targets = {
        (name, shape_string(p), d) for name, op in OPS.items() for p, d in (op.smoke if args.smoke else op.targets)
    }
    path = args.out / results.JSONL
    rows = [
        r
        for r in (results.merged(results.load(path)) if path.exists() else [])
        if r.get("kind") is None
        and r["status"] == "ok"
        and r["mode"] == "full"
        and r["provider"] in (LIGER_JAX, XLA, LIGER_JAX_XLA)
        and (r["op"], r["shape"], r["dtype"]) in targets
    ]
    if args.smoke:
        rows = rows[:2]
    limit = next((r["device_memory_bytes"] for r in rows if r.get("device_memory_bytes")), None)
    peak.run_pool(
        rows,
        capacity_bytes=CAPACITY_SHARE * limit if limit else float("inf"),
        max_jobs=PEAK_JOBS,
        deadline=deadline,
        timeout_s=PEAK_TIMEOUT_S,
        emit=lambda row: results.append(args.out, row),
    )


def main(argv: Sequence[str] | None = None) -> None:
    """Command line entry point."""
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("--out", type=pathlib.Path, required=True, help="the one folder all results go to")
    cli.add_argument("--budget-s", type=float, default=575.0, help="wall-clock budget for everything")
    cli.add_argument("--op", nargs="+", default=["all"], help="ops for the ops phase")
    cli.add_argument("--smoke", action="store_true", help="tiny shapes on CPU: checks every phase's code path")
    cli.add_argument("--skip-e2e", action="store_true")
    args = cli.parse_args(argv)
    start = time.monotonic()
    end = start + args.budget_s
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / results.JSONL).unlink(missing_ok=True)

    _phase("ops", start, lambda: ops_phase(args, OPS_SHARE * args.budget_s))
    _phase("peaks", start, lambda: peak_phase(args, time.monotonic() + PEAK_SHARE * args.budget_s))
    if not args.skip_e2e:
        e2e_args = e2e.parse(["--out", str(args.out), *(["--smoke"] if args.smoke else [])])
        _phase("end to end", start, lambda: e2e.run_e2e(e2e_args, end - REPORT_S))
    _phase("report", start, lambda: report.write(args.out, pack_plots=True))
    _log(f"done; results in {args.out}", start)


def _phase(name: str, start: float, work: Callable[[], Any]) -> Any:
    """Runs one phase; a bug in it is printed, and the later phases still run (None is returned)."""
    _log(name, start)
    try:
        return work()
    except Exception:  # the report must still be written from whatever rows exist
        traceback.print_exc()
        print(f"suite: phase '{name}' failed; carrying on", flush=True)
        return None


if __name__ == "__main__":
    main()
