"""Peak device memory of one forward+backward, each measured in a fresh process.

``python -m benchmarks.peak --op OP --shape SHAPE --dtype DTYPE --provider P`` prints one JSON row. A fresh process
is needed because JAX's allocator cannot reset its peak. The program is compiled before any input exists, with
XLA's autotuning off (its trial buffers would otherwise be the peak), then run once on fresh inputs:
``peak_extra_bytes`` is the peak minus the bytes in use just before the run (the inputs), as Liger reports it.
Should the run stay below the peak that compiling or drawing the inputs reached, ``peak_masked`` says the numbers
are only upper bounds.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from benchmarks import processes
from benchmarks.case import parse_shape


def measure_peak(op: str, shape: str, dtype: str, provider: str) -> dict[str, Any]:
    """Peak bytes of the ``full`` program for one case, in this (fresh) process."""
    import jax

    from benchmarks import measure, memory
    from benchmarks.cases import build_case

    case = build_case(op, parse_shape(shape), dtype)
    body, make = measure.mode_program(case, provider, "full")
    key = jax.random.key(0)
    compiled = jax.jit(body).lower(*jax.eval_shape(make, key)).compile()
    compile_peak = memory.jax_memory_stats().get("peak_bytes_in_use")
    inputs = jax.block_until_ready(make(key))
    before = memory.jax_memory_stats().get("bytes_in_use")
    inputs_peak = memory.jax_memory_stats().get("peak_bytes_in_use")
    jax.block_until_ready(compiled(*inputs))
    peak = memory.jax_memory_stats().get("peak_bytes_in_use")
    return {
        "kind": "peak",
        "op": op,
        "provider": provider,
        "mode": "full",
        "shape": shape,
        "dtype": dtype,
        "peak_bytes": peak,
        "peak_extra_bytes": None if peak is None else peak - before,
        "compile_peak_bytes": compile_peak,
        # The run never rose above what compiling or drawing the inputs reached: the peak is only an upper bound.
        "peak_masked": peak is not None and peak <= max(compile_peak or 0, inputs_peak or 0),
    }


def peak_command(row: dict[str, Any]) -> list[str]:
    """The command line measuring the peak of a timing row's case."""
    return [
        sys.executable,
        "-m",
        "benchmarks.peak",
        *("--op", row["op"], "--shape", row["shape"], "--dtype", row["dtype"], "--provider", row["provider"]),
    ]


def run_pool(
    rows: Sequence[dict[str, Any]],
    *,
    capacity_bytes: float,
    max_jobs: int,
    deadline: float,
    timeout_s: float,
    emit: Callable[[dict[str, Any]], None],
) -> None:
    """Measures the peak of each row's case in subprocesses, several at once while their memory fits.

    A row's estimate is its compiled argument + output + temp bytes. Jobs start largest first; one starts when
    fewer than ``max_jobs`` run and its estimate fits beside the running ones in ``capacity_bytes`` (or nothing
    runs). No job starts after ``deadline`` (a ``time.monotonic()`` value). Each result, or a row saying why there
    is none, goes to ``emit`` (called from worker threads, one at a time).
    """
    pending = sorted(rows, key=_estimate, reverse=True)
    lock, running, used = threading.Lock(), [], [0.0]

    def work(row: dict[str, Any]) -> None:
        result = _run_one(row, timeout_s)
        with lock:
            emit(result)
            used[0] -= _estimate(row)

    while pending and time.monotonic() < deadline:
        running = [thread for thread in running if thread.is_alive()]
        with lock:
            fits = not running or (len(running) < max_jobs and used[0] + _estimate(pending[0]) <= capacity_bytes)
            if fits:
                row = pending.pop(0)
                used[0] += _estimate(row)
        if fits:
            thread = threading.Thread(target=work, args=(row,))
            thread.start()
            running.append(thread)
        else:
            time.sleep(0.05)
    for thread in running:
        thread.join()
    for row in pending:
        emit(_key(row) | {"kind": "peak", "peak_status": "skipped: time budget"})


def _estimate(row: dict[str, Any]) -> float:
    return sum(row.get(key) or 0 for key in ("arg_bytes", "out_bytes", "temp_bytes"))


def _key(row: dict[str, Any]) -> dict[str, Any]:
    return {key: row[key] for key in ("op", "provider", "mode", "shape", "dtype")}


def _run_one(row: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    try:
        done = subprocess.run(
            peak_command(row),
            env=processes.child_env(autotune=False),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return _key(row) | {"kind": "peak", "peak_status": f"error: timed out after {timeout_s:.0f} s"}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        return _key(row) | {"kind": "peak", "peak_status": f"error: exit {done.returncode}: {' | '.join(tail)}"}
    return json.loads(lines[-1]) | {"peak_status": "ok"}


def main(argv: Sequence[str] | None = None) -> None:
    """Command line: measure one case's peak and print it as a JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--op", required=True)
    parser.add_argument("--shape", required=True, help="as in a results row, e.g. tokens=16384,hidden=4096")
    parser.add_argument("--dtype", required=True)
    parser.add_argument("--provider", required=True)
    args = parser.parse_args(argv)
    from benchmarks.providers import prepare_process

    prepare_process()
    print(json.dumps(measure_peak(args.op, args.shape, args.dtype, args.provider)), flush=True)


if __name__ == "__main__":
    main()
