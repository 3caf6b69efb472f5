"""Device time of each kernel of an op's fwd+bwd under forced warps, from a profiler trace (on a GPU):

    python -m benchmarks.kernel_times poly_norm:tokens=16384,hidden=4096 --warps 2 4 8 16 32

Where ``benchmarks.row_tiling`` times whole programs, this splits one into its kernels (the forward's, the
backward's, XLA's sums of partials), so a tiling that helps one kernel and hurts the other shows. Each case runs the
op's liger_jax provider under its tiling rule, then with one-row tiles at each of ``--warps`` forced through
``liger_jax.ops._tiling.overridden``, in the very program ``benchmarks.run`` times (``full`` mode, one input copy,
donated as it donates, so no kernel that writes over its cotangent makes XLA copy it first). Prints one line per
(case, tiling): the device's busy time per step and each kernel's.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence

STEPS = 15
WARM_UP = 3


def warmed_program(op: str, params: dict, override, calls: int) -> tuple[Callable, list, Callable]:
    """``(step, inputs, run)`` of ``op``'s liger_jax fwd+bwd program at ``params`` in bf16 (``benchmarks.measure.
    timed_program``'s, on one input set), compiled and called ``calls`` times under ``override`` (None: the rule)."""
    import jax

    from benchmarks import measure, tiling_sweep
    from benchmarks.cases import build_case

    step, make, run = measure.timed_program(build_case(op, params, "bfloat16"), "liger_jax", "full")
    inputs = measure.columns([make(jax.random.key(0))])
    # ``step`` is a new jit per call, so it is traced afresh, inside the override: the tiling is read then.
    with tiling_sweep.forced(override):
        jax.block_until_ready(run(step, inputs, calls))
    return step, inputs, run


def kernel_times(op: str, params: dict, override) -> tuple[float, list[tuple[str, float]]]:
    """``(busy ms, [(kernel, ms)])`` per fwd+bwd step of ``op`` at ``params`` in bf16 under ``override`` (None:
    the rule)."""
    from benchmarks import trace_summary

    step, inputs, run = warmed_program(op, params, override, WARM_UP)
    summary = trace_summary.profiled(lambda: run(step, inputs, 1), STEPS, top=8)
    return summary["device_busy_ms"], [(name, ms) for name, ms, _ in summary["device_top"]]


def main(argv: Sequence[str] | None = None) -> None:
    """Command line entry point."""
    from benchmarks import providers

    providers.prepare_process()
    from benchmarks.case import parse_shape
    from liger_jax.ops import _tiling

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cases", nargs="+", help="OP:SHAPE, e.g. dyt:tokens=16384,hidden=4096")
    parser.add_argument("--warps", type=int, nargs="*", default=[2, 4, 8, 16, 32])
    args = parser.parse_args(argv)
    tilings = [("rule", None)] + [
        (f"r1/w{warps}", _tiling.TilingOverride(block_rows=1, num_warps=warps)) for warps in args.warps
    ]
    for spec in args.cases:
        op, shape = spec.split(":")
        for label, override in tilings:
            busy, kernels = kernel_times(op, parse_shape(shape), override)
            listed = "  ".join(f"{name[:34]} {ms:.4f}" for name, ms in kernels if ms > 0.004)
            print(f"{op:18s} {shape:38s} {label:8s} busy {busy:.4f}  {listed}", flush=True)


if __name__ == "__main__":
    main()
