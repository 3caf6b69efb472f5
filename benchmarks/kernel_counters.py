"""Hardware counters of each kernel of an op's fwd+bwd, from Nsight Compute (on a GPU with ``ncu``):

    python -m benchmarks.kernel_counters rms_norm:tokens=4096,hidden=32768 layer_norm:tokens=4096,hidden=32768
    python -m benchmarks.kernel_counters rms_norm:tokens=4096,hidden=65536 --override block_d=16384,num_warps=32

Where ``benchmarks.kernel_times`` says how long each kernel takes, this says why. Each case's program (the one
``benchmarks.run`` times in ``full`` mode, liger_jax provider, bf16) runs once in a child process under ``ncu``, which
replays every matching kernel with the caches flushed; one line per kernel gives its grid, block and registers, its
duration, the DRAM bytes it read and wrote, DRAM throughput as a share of the peak, the L2 hit rate, the warps
active (occupancy) and the cycles between a warp's instructions. A kernel that reads about the floor's bytes yet
runs well below the DRAM peak is latency- or issue-bound, not short of cache. ``--kernels`` is a regular expression
on kernel names for ncu to profile (default: liger_jax's Triton kernels, by name: profiling every kernel replays XLA's
autotuning and input draws too, minutes a case; ``.`` profiles everything); the override sets
``liger_jax.ops._tiling.TilingOverride`` fields. ``--out DIR`` keeps each case's raw CSV.
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

# Table column -> ncu metric (Nsight Compute 2025+, sm_90).
METRICS = {
    "grid": "launch__grid_size",
    "block": "launch__block_size",
    "regs": "launch__registers_per_thread",
    "us": "gpu__time_duration.sum",
    "read MB": "dram__bytes_read.sum",
    "write MB": "dram__bytes_write.sum",
    "DRAM %": "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "L2 hit %": "lts__t_sector_hit_rate.pct",
    "warps %": "sm__warps_active.avg.pct_of_peak_sustained_active",
    "cycles/issue": "smsp__average_warp_latency_per_inst_issued.ratio",
}
# ncu reports these in ns and bytes (with thousands separators); the table shows µs and MB.
SCALES = {"us": 1e-3, "read MB": 1e-6, "write MB": 1e-6}


def parse_override(text: str | None):
    """``block_d=16384,num_warps=32,prefetch=false`` -> a TilingOverride (None for None)."""
    from liger_jax.ops import _tiling

    if text is None:
        return None
    settings = {}
    for item in text.split(","):
        name, _, value = item.partition("=")
        settings[name] = value.lower() == "true" if value.lower() in ("true", "false") else int(value)
    return _tiling.TilingOverride(**settings)


def liger_kernel_names() -> set[str]:
    """The names of liger_jax's Triton functions (compiled or interpreted): a launched kernel keeps its function's
    name."""
    import importlib
    import pkgutil

    import triton

    from liger_jax import kernels

    names = set()
    for module in pkgutil.iter_modules(kernels.__path__):
        loaded = importlib.import_module(f"{kernels.__name__}.{module.name}")
        names |= {name for name, value in vars(loaded).items() if isinstance(value, triton.runtime.KernelInterface)}
    return names


def run_case(spec: str, override_text: str | None) -> None:
    """Compiles ``spec``'s (``op:shape``) fwd+bwd program under the override and runs it once."""
    from benchmarks.case import parse_shape
    from benchmarks.kernel_times import warmed_program

    op, shape = spec.split(":")
    warmed_program(op, parse_shape(shape), parse_override(override_text), calls=1)


def counters_table(ncu_csv: str) -> pd.DataFrame:
    """The table (one row per kernel launch: ``kernel`` and METRICS' columns) of ``ncu --csv --page raw`` output,
    which may start with the profiled program's own lines; a units row follows the header."""
    lines = ncu_csv.splitlines()
    header = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if header is None:
        raise ValueError("no ncu CSV table in the output: did any kernel match?")
    raw = pd.read_csv(io.StringIO("\n".join(lines[header:])), skiprows=[1], thousands=",")
    missing = sorted(set(METRICS.values()) - set(raw.columns))
    if missing:
        raise ValueError(f"ncu did not report {missing}")
    table = pd.DataFrame({"kernel": raw["Kernel Name"]})
    for column, metric in METRICS.items():
        table[column] = pd.to_numeric(raw[metric]) * SCALES.get(column, 1)
    return table


def _ncu() -> str:
    path = shutil.which("ncu") or "/usr/local/cuda/bin/ncu"
    if not os.path.exists(path):
        raise SystemExit("ncu (Nsight Compute) not found on PATH or in /usr/local/cuda/bin")
    return path


def liger_kernels_regex() -> str:
    """A regular expression matching exactly the names of liger_jax's Triton kernels."""
    return "^(" + "|".join(sorted(liger_kernel_names())) + ")$"


def profile(spec: str, override_text: str | None, kernels: str) -> str:
    """``ncu``'s raw CSV for one case, profiled in a child process: the kernels whose names match ``kernels``."""
    child = [sys.executable, "-m", "benchmarks.kernel_counters", "--child", spec]
    child += ["--override", override_text] if override_text else []
    command = [_ncu(), "--kernel-name", f"regex:{kernels}"]
    command += ["--metrics", ",".join(METRICS.values()), "--csv", "--page", "raw"]
    done = subprocess.run([*command, *child], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"ncu failed on {spec}:\n{done.stderr[-2000:]}")
    return done.stdout


def main(argv: Sequence[str] | None = None) -> None:
    """Command line entry point."""
    from benchmarks import providers

    providers.prepare_process()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cases", nargs="+", help="OP:SHAPE, e.g. rms_norm:tokens=4096,hidden=32768")
    parser.add_argument("--override", help="TilingOverride fields, e.g. block_d=16384,num_warps=32")
    parser.add_argument("--kernels", help="regular expression on kernel names (default: liger_jax's)")
    parser.add_argument("--out", type=Path, help="folder for each case's raw CSV")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        for spec in args.cases:
            run_case(spec, args.override)
        return
    tables = []
    for index, spec in enumerate(args.cases):
        csv = profile(spec, args.override, args.kernels or liger_kernels_regex())
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / f"case{index}.csv").write_text(csv)
        tables.append(counters_table(csv).assign(case=spec))
    table = pd.concat(tables, ignore_index=True).set_index(["case", "kernel"])
    print(table.to_string(float_format=lambda value: f"{value:,.1f}"))


if __name__ == "__main__":
    main()
