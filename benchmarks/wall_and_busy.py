"""The timing method's check: host wall time per call of an op's timed program against the device's busy time.

    python -m benchmarks.wall_and_busy tvd:tokens=8192,vocab=128256 --provider liger_jax xla

Runs the program ``benchmarks.measure`` times (``full`` mode, one input copy, donated as it donates) back to back,
then again under the profiler. When the wall time per call stands well above the kernels' busy time, the device
waits on the host (dispatch, allocation, a sync) and a timing of that program says more about the host than the op;
when a benchmark row stands above both, the sampling adds time of its own (``benchmarks.timing``). Prints one line
per (case, provider), and the costliest host events where the wall time is over 1.3 times the busy time.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence

CALLS = 20
TRACED_CALLS = 10
WARM_UP = 3
SLOW_HOST = 1.3  # wall over busy above which the host's events are listed


def wall_and_busy(op: str, params: dict, provider: str, dtype: str = "bfloat16") -> tuple[float, dict]:
    """``(wall ms per call, trace summary per call)`` of ``provider``'s ``full``-mode program for ``op`` at
    ``params`` (see :func:`benchmarks.trace_summary.summarise` for the summary's fields)."""
    import jax

    from benchmarks import measure, trace_summary
    from benchmarks.cases import build_case

    step, make, run = measure.timed_program(build_case(op, params, dtype), provider, "full")
    inputs = measure.columns([make(jax.random.key(0))])
    jax.block_until_ready(run(step, inputs, WARM_UP))
    start = time.perf_counter()
    jax.block_until_ready(run(step, inputs, CALLS))
    wall_ms = 1e3 * (time.perf_counter() - start) / CALLS
    return wall_ms, trace_summary.profiled(lambda: run(step, inputs, 1), TRACED_CALLS, top=6)


def main(argv: Sequence[str] | None = None) -> None:
    """Command line entry point."""
    from benchmarks import providers

    providers.prepare_process()
    from benchmarks.case import parse_shape

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cases", nargs="+", help="OP:SHAPE, e.g. tvd:tokens=8192,vocab=128256")
    parser.add_argument("--provider", nargs="+", default=["liger_jax", "xla"])
    parser.add_argument("--dtype", default="bfloat16")
    args = parser.parse_args(argv)
    for spec in args.cases:
        op, shape = spec.split(":")
        for provider in args.provider:
            wall_ms, summary = wall_and_busy(op, parse_shape(shape), provider, args.dtype)
            busy_ms = summary["device_busy_ms"]
            print(f"{op} {shape} {provider}: wall {wall_ms:.3f} ms/call, device busy {busy_ms:.3f}", flush=True)
            if wall_ms > SLOW_HOST * busy_ms:
                for name, ms, count in summary["host_top"]:
                    print(f"    host {ms:8.3f} ms ({count:4.1f}/call) {name}")


if __name__ == "__main__":
    main()
