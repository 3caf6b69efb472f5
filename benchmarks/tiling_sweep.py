"""What the tiling sweeps (``benchmarks.norm_tiling``, ``benchmarks.row_tiling``) share: candidates forced on a
kernel's tiling rule through ``liger_jax.ops._tiling.overridden``, their timing rows, the tables, and ptxas's
register and spill counts for the kernels a candidate launches.

A candidate's row names the tilings its forward and backward launches get (strings its sweep builds); its backward
time is its fwd+bwd less the forward timed with the same forward tiling, so a candidate whose forward tiling an
earlier one already has is timed in fwd+bwd only.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import inspect
import json
import pathlib
import re
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # imported where used: providers.prepare_process must run before triton is imported
    from benchmarks.case import Case
    from liger_jax.ops._tiling import TilingOverride

TIME_PER_MEASUREMENT_S = 0.1
RULE, XLA_LABEL = "rule", "xla"
MODES = ("forward", "full")


@dataclasses.dataclass(frozen=True)
class Candidate:
    """A tiling forced on the rule (None: the rule itself), and whether its forward is timed on its own."""

    label: str
    override: TilingOverride | None
    times_forward: bool = True


# (override or None) -> (forward tiling, backward tiling), as a sweep describes them.
Tilings = Callable[["TilingOverride | None"], tuple[str, str]]


def parser(description: str, ops: Sequence[str], smoke_help: str) -> argparse.ArgumentParser:
    """The command line both sweeps share: ``--op`` (from ``ops``), ``--smoke``, ``--registers``, ``--out`` and
    ``--time-per-measurement``."""
    cli = argparse.ArgumentParser(description=description)
    cli.add_argument("--op", nargs="+", default=list(ops), choices=ops)
    cli.add_argument("--smoke", action="store_true", help=smoke_help)
    cli.add_argument("--registers", action="store_true", help="print registers and spills per kernel; no timing")
    cli.add_argument("--out", type=pathlib.Path, default=pathlib.Path("benchmarks/out"), help="folder for the rows")
    cli.add_argument("--time-per-measurement", type=float, default=TIME_PER_MEASUREMENT_S)
    return cli


def distinct(chosen: Sequence[Candidate], tilings: Tilings) -> list[Candidate]:
    """``chosen`` without the candidates whose forward and backward tilings an earlier one has; one whose forward
    tiling an earlier one has is timed in fwd+bwd only."""
    seen, forwards, kept = set(), set(), []
    for candidate in chosen:
        key = tilings(candidate.override)
        if key in seen:
            continue
        seen.add(key)
        times_forward = candidate.times_forward and key[0] not in forwards
        forwards.add(key[0])
        kept.append(dataclasses.replace(candidate, times_forward=times_forward))
    return kept


def sweep_case(
    case: Case, chosen: Sequence[Candidate], tilings: Tilings, policy, smoke: bool, out: pathlib.Path, start: float
) -> list[dict[str, Any]]:
    """Times XLA and every candidate on ``case`` (forward and fwd+bwd), appending each row to ``out`` as it is
    measured; returns the rows."""
    from benchmarks.providers import LIGER_JAX, XLA

    # One Case object for every provider, so its compiled input draws are shared (measure caches by it).
    case = dataclasses.replace(
        case,
        providers={XLA_LABEL: case.providers[XLA]} | {c.label: case.providers[LIGER_JAX] for c in chosen},
    )
    plan = [(XLA_LABEL, None, mode) for mode in MODES]
    plan += [(c.label, c, mode) for c in chosen for mode in MODES if c.times_forward or mode == "full"]
    rows = []
    out.parent.mkdir(parents=True, exist_ok=True)
    for label, candidate, mode in plan:
        override = None if candidate is None else candidate.override
        row = _measure(case, label, override, None if candidate is None else tilings(override), mode, policy, smoke)
        rows.append(row)
        with open(out, "a") as file:
            file.write(json.dumps(row, default=str) + "\n")
        status = f"{row['ms']:8.3f} ms" if row["status"] == "ok" else row["status"]
        print(f"[{time.monotonic() - start:6.1f} s] {case.op} {case.shape} {label} {mode}: {status}", flush=True)
    return rows


def _measure(case, label, override, tilings, mode, policy, smoke: bool) -> dict[str, Any]:
    """One row: ``case``'s provider ``label`` timed in ``mode`` with ``override`` forced on the rule (the kernels
    are traced, so their launchers built, inside the override's context), and the tilings that gives."""
    from benchmarks.measure import measure_jax

    row = {"op": case.op, "provider": label, "mode": mode, "shape": case.shape} | dict(case.params)
    if tilings is not None:
        row |= {"forward_tiling": tilings[0], "backward_tiling": tilings[1]}
    try:
        with forced(override):
            return row | measure_jax(case, label, mode, policy, smoke)
    except Exception as error:  # one failing candidate must not cost the rest of the sweep
        return row | {"status": f"error: {type(error).__name__}: {error}".splitlines()[0][:300]}


def forced(override: TilingOverride | None) -> contextlib.AbstractContextManager:
    """``_tiling.overridden(override)``, or nothing for the rule."""
    from liger_jax.ops import _tiling

    return contextlib.nullcontext() if override is None else _tiling.overridden(override)


@dataclasses.dataclass(frozen=True)
class Result:
    """One candidate at one (op, shape): its tilings, times in ms and fractions of the floor (None: not measured)."""

    label: str
    forward_tiling: str
    backward_tiling: str
    forward_ms: float | None
    forward_floor: float | None
    backward_ms: float | None
    full_ms: float | None
    full_floor: float | None
    vs_xla: float | None  # XLA's fwd+bwd time over this one's


def results(rows: list[dict[str, Any]]) -> dict[tuple[str, str], list[Result]]:
    """The measured rows as :class:`Result` per (op, shape). A backward is the fwd+bwd less the forward timed
    with the same forward tiling (XLA's: its own)."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for row in rows:
        if row.get("status") == "ok":
            groups.setdefault((row["op"], row["shape"]), []).append(row)
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


def table(grouped: dict[tuple[str, str], list[Result]]) -> str:
    """Per (op, shape): every candidate's tilings, forward / backward / fwd+bwd ms, fractions of the floor and the
    fwd+bwd ratio to XLA; then the best candidate per mode."""
    header = (
        f"{'candidate':<22} {'fwd tiling':<22} {'bwd tiling':<22} {'fwd ms':>8} {'floor':>6} {'bwd ms':>8} "
        f"{'full ms':>8} {'floor':>6} {'vs XLA':>7}"
    )
    lines = []
    for (op, shape), found in grouped.items():
        lines += ["", f"{op}  {shape}", header]
        for r in found:
            lines.append(
                f"{r.label:<22} {r.forward_tiling:<22} {r.backward_tiling:<22} {_number(r.forward_ms, '.3f'):>8} "
                f"{_number(r.forward_floor, '.0%'):>6} {_number(r.backward_ms, '.3f'):>8} "
                f"{_number(r.full_ms, '.3f'):>8} {_number(r.full_floor, '.0%'):>6} {_number(r.vs_xla, '.2f'):>6}x"
            )
        for mode in ("forward", "backward", "full"):
            best = _best(found, f"{mode}_ms")
            if best is not None:
                lines.append(f"  best {mode:<8} {best.label} ({getattr(best, f'{mode}_ms'):.3f} ms)")
    return "\n".join(lines)


def summary(grouped: dict[tuple[str, str], list[Result]]) -> str:
    """One line per (op, shape): the rule's fwd+bwd (fraction of the floor, ratio to XLA) and the best candidates."""
    lines = [f"{'op':<19} {'shape':<36} {'rule full':>10} {'floor':>6} {'vs XLA':>7}   best fwd / bwd / full ms"]
    for (op, shape), found in grouped.items():
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
            f"{op:<19} {shape:<36} {rule.full_ms:>10.3f} {_number(rule.full_floor, '.0%'):>6} "
            f"{_number(rule.vs_xla, '.2f'):>6}x   {' / '.join(bests)}"
        )
    return "\n".join(lines)


def report(rows: list[dict[str, Any]], path: pathlib.Path) -> str:
    """The tables and the summary of ``rows``, also written to ``path``."""
    grouped = results(rows)
    text = f"{table(grouped)}\n\n{summary(grouped)}\n"
    path.write_text(text)
    return text


def _forward_key(row: dict[str, Any]) -> str:
    return row.get("forward_tiling", row["provider"])


def _get(row: dict[str, Any] | None, key: str) -> Any:
    return None if row is None else row[key]


def _number(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


@dataclasses.dataclass(frozen=True)
class Launch:
    """One kernel launch as an op makes it: the kernel, its operands' and outputs' Triton types, its settings."""

    kernel: Any
    signature: tuple[tuple[str, str], ...]  # (parameter, Triton type) of every non-constexpr parameter
    constexprs: tuple[tuple[str, Any], ...]
    num_warps: int
    num_stages: int

    @property
    def name(self) -> str:
        return self.kernel.fn.__name__

    def settings(self) -> str:
        """``BLOCK_ROWS=..,BLOCK_D=../w16/s1``: the block constexprs, warps and stages."""
        blocks = ",".join(f"{k}={v}" for k, v in self.constexprs if k.startswith(("BLOCK_", "PREFETCH", "COLUMN_")))
        return f"{blocks}/w{self.num_warps}/s{self.num_stages}"


def launches(case: Case, override: TilingOverride | None) -> list[Launch]:
    """The distinct kernel launches of ``case``'s liger_jax forward and fwd+bwd as a GPU would run them with
    ``override``, recorded while tracing (no GPU, no kernel runs)."""
    from unittest import mock

    import jax

    from benchmarks.measure import mode_program
    from benchmarks.providers import LIGER_JAX
    from liger_jax import runtime

    recorded: dict[tuple, Launch] = {}

    def record(kernel, *args, out_shape, grid, implementation, num_warps=4, num_stages=1, **options):
        del grid, implementation
        options.pop("input_output_aliases", None)
        options.pop("zeroed_outputs", None)
        single = isinstance(out_shape, jax.ShapeDtypeStruct)
        outs = (out_shape,) if single else tuple(out_shape)
        names = [name for name in _parameters(kernel) if name not in options]
        types = [_triton_type(a) for a in args] + [_triton_type(o) for o in outs]
        launch = Launch(kernel, tuple(zip(names, types, strict=True)), tuple(options.items()), num_warps, num_stages)
        recorded.setdefault((launch.name, launch.signature, launch.constexprs, num_warps, num_stages), launch)
        results = tuple(jax.numpy.zeros(o.shape, o.dtype) for o in outs)
        return results[0] if single else results

    kernel_op = case.providers[LIGER_JAX]
    traced = dataclasses.replace(case, providers={LIGER_JAX: kernel_op.with_implementation("triton")})
    with (
        mock.patch.object(runtime, "launch", record),
        mock.patch.object(runtime, "resolve_implementation", lambda implementation: implementation or "triton"),
        forced(override),
    ):
        for mode in MODES:
            body, make = mode_program(traced, LIGER_JAX, mode)
            jax.make_jaxpr(body)(*jax.eval_shape(make, jax.random.key(0)))
    return list(recorded.values())


_POINTER_TYPES = {
    "bfloat16": "*bf16",
    "float16": "*fp16",
    "float32": "*fp32",
    "int8": "*i8",
    "int32": "*i32",
    "int64": "*i64",
    "bool": "*i1",
}


def _parameters(kernel) -> list[str]:
    """The parameter names of a ``@triton.jit`` kernel (compiled or interpreted)."""
    return list(inspect.signature(kernel.fn).parameters)


def _triton_type(value) -> str:
    """The Triton type of a launch operand: an int scalar, or a pointer to an array's elements."""
    return "i32" if isinstance(value, int) else _POINTER_TYPES[str(value.dtype)]


def kernel_usage(launch: Launch) -> tuple[int, int]:
    """``(registers, spill bytes)`` per thread of ``launch``'s kernel compiled for sm_90 as it was launched."""
    import triton
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    signature = dict(launch.signature) | {name: "constexpr" for name, _ in launch.constexprs}
    names = _parameters(launch.kernel)
    # Pointers are 16-byte aligned, as jax-triton declares XLA's buffers.
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names) if signature[n].startswith("*")}
    source = ASTSource(fn=launch.kernel, signature=signature, constexprs=dict(launch.constexprs), attrs=attrs)
    options = {"num_warps": launch.num_warps, "num_stages": launch.num_stages}
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)
    return ptxas_usage(compiled.asm["ptx"], knobs.nvidia.ptxas.path)


def ptxas_usage(ptx: str, ptxas: str) -> tuple[int, int]:
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


def print_registers(cases: Iterator[tuple[Case, Sequence[Candidate]]]) -> None:
    """For every case and candidate, each distinct kernel launch of its forward and fwd+bwd compiled for sm_90:
    registers and spill bytes per thread."""
    print(f"{'op':<19} {'shape':<36} {'candidate':<20} {'kernel':<28} {'settings':<44} {'regs':>5} {'spill B':>8}")
    for case, chosen in cases:
        for candidate in chosen:
            for launch in launches(case, candidate.override):
                regs, spill = kernel_usage(launch)
                print(
                    f"{case.op:<19} {case.shape:<36} {candidate.label:<20} {launch.name:<28} {launch.settings():<44} "
                    f"{regs:>5} {spill:>8}",
                    flush=True,
                )
