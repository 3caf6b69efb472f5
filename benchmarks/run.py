"""Op benchmarks: ``python -m benchmarks.run --op rms_norm --sweep tokens``.

Measures every (shape, provider, mode) of the chosen ops and sweeps, appending one row per measurement to
``OUT/results.jsonl``, then (unless ``--no-report``) writes ``results.csv``, ``results.json``, ``RESULTS.md`` and
the plots to ``OUT``. ``--smoke`` runs tiny shapes with a token timing policy: on a CPU, through XLA and Triton's
interpreter, it checks every code path in seconds. Peak memory needs fresh processes: ``benchmarks.peak``.

A measurement that leaves the device unusable (a kernel fault poisons the CUDA context) ends the process with
exit code 3; ``--resume`` then carries on after it, recording the measurement that was in flight as an error.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time
import traceback
from collections.abc import Sequence
from typing import Any

from benchmarks import rows as results
from benchmarks.case import MODES, Op, shape_string


def sweep_names(ops: dict[str, Op]) -> tuple[str, ...]:
    """``"target"`` and every sweep some op of ``ops`` has, by name."""
    return ("target", *sorted({name for op in ops.values() for name in op.sweeps}))


DEFAULT_OUT = pathlib.Path("benchmarks/out")
DEVICE_LOST = 3  # exit code: the device no longer runs anything; rerun with --resume


def plan(ops: Sequence[Op], sweeps: Sequence[str], smoke: bool) -> list[tuple[Op, dict[str, int], str]]:
    """The cases to run, in priority order: sweep by sweep, op by op, each (op, shape, dtype) once."""
    chosen, seen = [], set()
    for sweep in ("smoke",) if smoke else sweeps:
        for op in ops:
            if sweep == "smoke":
                points = list(op.smoke)
            elif sweep == "target":
                points = list(op.targets)
            else:
                points = [(params, "bfloat16") for params in op.sweeps.get(sweep, ("", []))[1]]
            for params, dtype in points:
                key = (op.name, shape_string(params), dtype)
                if key not in seen:
                    seen.add(key)
                    chosen.append((op, dict(params), dtype))
    return chosen


def _previous(out_dir: pathlib.Path) -> tuple[set[tuple], set[tuple]]:
    """Keys of the measurements an earlier run of this folder finished, and of those it started and never ended."""
    path = out_dir / results.JSONL
    rows = results.load(path) if path.exists() else []
    finished = {tuple(r[k] for k in results.KEY) for r in rows if r.get("kind") is None}
    started = {tuple(r[k] for k in results.KEY) for r in rows if r.get("kind") == "attempt"}
    return finished, started - finished


def _device_usable() -> bool:
    import jax
    import jax.numpy as jnp

    try:
        return float(jax.block_until_ready(jnp.arange(4.0).sum())) == 6.0
    except Exception:  # any failure here means the context is gone
        return False


class _Runner:
    """Measures cases and streams their rows; remembers what an earlier, interrupted run already did."""

    def __init__(self, args: argparse.Namespace):
        from benchmarks import hardware, providers
        from benchmarks.timing import SMOKE_POLICY, Policy

        providers.prepare_process()
        self.args = args
        self.policy = SMOKE_POLICY if args.smoke else Policy(budget_s=args.time_per_measurement)
        self.torch_missing = providers.liger_torch_unavailable()
        if providers.LIGER_TORCH in args.provider and self.torch_missing:
            print(f"liger_torch skipped: {self.torch_missing}", flush=True)
        # tokamax, where it cannot run, gets rows that say why (liger_torch gets none: see providers()).
        tokamax_missing = providers.unavailable(providers.TOKAMAX) if providers.TOKAMAX in args.provider else None
        self.missing = {providers.TOKAMAX: tokamax_missing} if tokamax_missing else {}
        self.environment = hardware.jax_device_description() | {"versions": hardware.package_versions()}
        self.environment["started"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        self.deadline = time.monotonic() + args.budget_s
        self.finished, died = _previous(args.out) if args.resume else (set(), set())
        self.rows: list[dict[str, Any]] = []
        for key in sorted(died):
            self.emit(dict(zip(results.KEY, key, strict=True)) | {"status": "error: the process died during this"})

    def emit(self, row: dict[str, Any]) -> None:
        row = row | self.environment
        self.finished.add(tuple(row[k] for k in results.KEY))
        self.rows.append(row)
        results.append(self.args.out, row)
        _print(row)

    def providers(self, case, chosen: Sequence[str]) -> list[str]:
        """Those of ``chosen`` that run on ``case``."""
        from benchmarks import providers

        torch_ok = not self.torch_missing
        return [p for p in chosen if p in case.providers or (p == providers.LIGER_TORCH and torch_ok)]

    def run_case(self, op: Op, params: dict[str, int], dtype: str, chosen: Sequence[str]) -> None:
        """Every mode of one case for the ``chosen`` providers (skipped rows when out of time or the op does not
        exist)."""
        from benchmarks.providers import MissingOpError

        try:
            case = op.build(params, dtype)
        except MissingOpError as error:
            for row in _skipped(op.name, params, dtype, chosen, self.args.mode, str(error)):
                self.emit(row)
            return
        is_target = self.args.smoke or (params, dtype) in [(dict(p), d) for p, d in op.targets]
        at_sweep = self.args.sweep_provider or self.args.provider
        for provider in self.providers(case, [p for p in chosen if is_target or p in at_sweep]):
            for mode in self.args.mode if is_target else self.args.sweep_mode or self.args.mode:
                key = (case.op, provider, mode, case.shape, case.dtype)
                if key in self.finished:
                    continue
                if provider in self.missing or time.monotonic() > self.deadline:
                    why = self.missing.get(provider, "time budget")
                    self.emit(_skipped(op.name, params, dtype, [provider], [mode], why)[0])
                    continue
                results.append(self.args.out, dict(zip(results.KEY, key, strict=True)) | {"kind": "attempt"})
                row = _measure_one(case, provider, mode, self.policy, self.args.smoke)
                self.emit(row)
                if row["status"].startswith("error") and not _device_usable():
                    print("the device no longer runs anything; stopping (rerun with --resume)", flush=True)
                    sys.exit(DEVICE_LOST)


def _skipped(op: str, params: dict[str, int], dtype: str, providers, modes, why: str) -> list[dict[str, Any]]:
    base = {"op": op, "shape": shape_string(params), "dtype": dtype, "status": f"skipped: {why}"}
    return [base | {"provider": p, "mode": m} for p in providers for m in modes]


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Runs the measurements ``args`` asks for; returns their rows (also streamed to ``args.out``)."""
    from benchmarks.cases import OPS
    from benchmarks.providers import LIGER_TORCH

    runner = _Runner(args)
    ops = [OPS[name] for name in (OPS if "all" in args.op else args.op)]
    cases = plan(ops, sweep_names(OPS) if "all" in args.sweep else args.sweep, args.smoke)
    # Liger (torch) runs every case first: JAX's allocator never hands memory back, so once the largest XLA
    # baselines have grown it, torch's largest losses would find too little left.
    torch_first = [[p for p in args.provider if p == LIGER_TORCH], [p for p in args.provider if p != LIGER_TORCH]]
    for chosen in filter(None, torch_first):
        for op, params, dtype in cases:
            runner.run_case(op, params, dtype, chosen)
    return runner.rows


def _measure_one(case, provider: str, mode: str, policy, smoke: bool) -> dict[str, Any]:
    from benchmarks import providers
    from benchmarks.measure import measure_jax

    try:
        if provider == providers.LIGER_TORCH:
            from benchmarks.torch_provider import measure_torch

            return measure_torch(case, mode, policy)
        return measure_jax(case, provider, mode, policy, smoke) | providers.implementation(case, provider)
    except Exception as error:  # one failing measurement must not cost the rest of the run
        traceback.print_exc()
        message = f"{type(error).__name__}: {error}".splitlines()[0][:300]
        return {"op": case.op, "provider": provider, "mode": mode, "shape": case.shape, "dtype": case.dtype} | {
            "status": f"error: {message}"
        }


def _print(row: dict[str, Any]) -> None:
    head = f"{row['op']:<28} {row['shape']:<40} {row['dtype']:<9} {row['provider']:<14} {row['mode']:<9}"
    if row["status"] != "ok":
        print(f"{head} {row['status']}", flush=True)
        return
    rate = f"{row['tflop_per_s']:7.1f} TFLOP/s" if row.get("tflop_per_s") else f"{row['gb_per_s']:7.0f} GB/s"
    temp = row.get("temp_bytes")
    temp_text = "" if temp is None else f" temp {temp / 2**20:9.1f} MiB"
    print(f"{head} {row['ms']:9.3f} ms {rate} {row['fraction_of_floor']:6.1%} of floor{temp_text}", flush=True)


def parser() -> argparse.ArgumentParser:
    """The command line of ``python -m benchmarks.run``."""
    from benchmarks.providers import PROVIDERS

    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    from benchmarks.cases import OPS

    cli.add_argument("--op", nargs="+", default=["all"], choices=(*OPS, "all"), help="liger_jax op names")
    cli.add_argument("--sweep", nargs="+", default=["target"], choices=(*sweep_names(OPS), "all"))
    cli.add_argument("--mode", nargs="+", default=list(MODES), choices=MODES)
    cli.add_argument("--sweep-mode", nargs="+", choices=MODES, help="modes at sweep points (default: --mode)")
    cli.add_argument("--provider", nargs="+", default=list(PROVIDERS), choices=PROVIDERS)
    cli.add_argument(
        "--sweep-provider", nargs="+", choices=PROVIDERS, help="providers at sweep points that are not targets"
    )
    cli.add_argument("--smoke", action="store_true", help="tiny shapes, token timing: checks the code paths")
    cli.add_argument("--out", type=pathlib.Path, default=DEFAULT_OUT, help="folder for results (appended to)")
    cli.add_argument("--resume", action="store_true", help="skip what OUT's results.jsonl already has")
    cli.add_argument("--budget-s", type=float, default=float("inf"), help="start no measurement after this many s")
    cli.add_argument("--time-per-measurement", type=float, default=0.25, help="timed seconds per measurement")
    cli.add_argument("--no-report", action="store_true", help="only stream rows; no csv/json/md/plots")
    return cli


def main(argv: Sequence[str] | None = None) -> None:
    """Command line entry point."""
    args = parser().parse_args(argv)
    run(args)
    if not args.no_report:
        from benchmarks import report

        report.write(args.out)


if __name__ == "__main__":
    main()
