"""One measurement of a JAX provider: compile, memory analysis, timing, and the row that records them."""

from __future__ import annotations

import concurrent.futures
import functools
import math
import time
from collections.abc import Callable
from typing import Any

import jax

from benchmarks import hardware, memory, modes
from benchmarks.case import Case
from benchmarks.timing import Policy, Timing, time_batches

# One pass over the copies streams 3 × L2 of inputs, so no copy is still cached when it is read again. Copies are
# only needed for small inputs, so they cost little memory; the cap bounds the program size (one op per copy).
ROTATION_BYTES = 3 * hardware.L2_BYTES
MAX_COPIES = 16


def copies_for(bytes_per_copy: int, smoke: bool) -> int:
    """How many input copies to rotate over so one pass reads about 3 × L2 (2 in smoke runs)."""
    if smoke:
        return 2
    return min(MAX_COPIES, max(1, math.ceil(ROTATION_BYTES / max(bytes_per_copy, 1))))


@functools.lru_cache(maxsize=1)
def _input_draws(make_inputs: Callable) -> Callable:
    """``make_inputs`` jitted once per case: its providers and modes share one compiled draw program."""
    return jax.jit(make_inputs)


def mode_program(case: Case, provider: str, mode: str) -> tuple[Callable, Callable]:
    """``(body, make)``: the mode's program for ``provider``, and ``make(key)`` drawing one input set for it.

    The draws are jitted, so XLA fuses them with their casts and no fp32 temporaries reach memory.
    """
    body, prepare = modes.program(
        case.providers[provider], case.diff_argnums, mode, draw_cotangent=case.cotangent_is_residual
    )
    draw_inputs = _input_draws(case.make_inputs)

    def make(key):
        inputs_key, cotangent_key = jax.random.split(key)
        return prepare(draw_inputs(inputs_key), cotangent_key)

    return body, make


def _compile_both(single: jax.stages.Lowered, copies: jax.stages.Lowered | None) -> tuple[Any, Any]:
    """The one-copy program (for its memory analysis) and the timed one, compiled side by side.

    XLA compiles without the GIL, so the two compiles overlap; the timed one is the one-copy program when
    ``copies`` is None.
    """
    if copies is None:
        compiled = single.compile()
        return compiled, compiled
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        one, timed = pool.map(lambda lowered: lowered.compile(), (single, copies))
    return one, timed


def timed_program(case: Case, provider: str, mode: str) -> tuple[Callable, Callable, Callable]:
    """``(step, make, run)``: the jitted program that is timed, ``make(key)`` drawing one input set for it, and
    ``run(step, columns, calls)`` calling it back to back on :func:`columns` of input sets (returns the last output).

    ``step`` applies the mode's program to each input set in turn. In ``full`` mode an op whose dead inputs or
    residual cotangent the case names donates them, and each call's gradients become the next call's (see
    :func:`modes.recycling`).
    """
    body, make = mode_program(case, provider, mode)
    recycled = mode == "full" and (bool(case.dead_argnums) or case.cotangent_is_residual)
    if recycled:
        split, body = modes.recycling(
            body, case.diff_argnums, case.dead_argnums, cotangent_from_gradient=case.cotangent_is_residual
        )
        make = functools.partial(_split_draw, make, split)

    def run(step: Callable, columns: list[list], calls: int) -> Any:
        for _ in range(calls):
            out = step(*columns)
            if recycled:
                columns[1] = [donated for donated, _ in out]
        return out

    return jax.jit(modes.over_copies(body), donate_argnums=1 if recycled else ()), make, run


def measure_jax(case: Case, provider: str, mode: str, policy: Policy, smoke: bool) -> dict[str, Any]:
    """Times ``provider`` on ``case`` in ``mode`` and returns the row (timing, throughput, floor, memory)."""
    timed, make, run = timed_program(case, provider, mode)
    first = make(jax.random.key(0))
    count = copies_for(memory.tree_bytes(first), smoke)
    inputs = columns([first] + [make(jax.random.key(seed)) for seed in range(1, count)])
    single, compiled = _compile_both(timed.lower(*columns([first])), None if count == 1 else timed.lower(*inputs))
    row = memory.compiled_memory(single)

    def run_batch(calls: int) -> float:
        start = time.perf_counter()
        jax.block_until_ready(run(compiled, inputs, calls))
        return time.perf_counter() - start

    timing = time_batches(run_batch, policy, ops_per_call=count)
    row.update(copies=count)
    return timing_row(case, provider, mode, timing) | row


def _split_draw(make: Callable, split: Callable, key: Any) -> tuple:
    """One input set drawn by ``make`` and parted by ``split`` into (kept, donated)."""
    return split(*make(key))


def columns(copies: list[tuple]) -> list[list]:
    """The copies' k-th inputs, one list per k, as :func:`modes.over_copies` takes them."""
    return [list(column) for column in zip(*copies, strict=True)]


def timing_row(case: Case, provider: str, mode: str, timing: Timing) -> dict[str, Any]:
    """The identifying and timing fields of a row, with achieved throughput and the fraction of the floor."""
    bytes_moved, flops = case.bytes_moved[mode], case.flops[mode]
    floor = hardware.floor_ms(bytes_moved, flops)
    return {
        "op": case.op,
        "provider": provider,
        "mode": mode,
        "shape": case.shape,
        "dtype": case.dtype,
        "status": "ok",
        "ms": timing.ms,
        "p20_ms": timing.p20_ms,
        "p80_ms": timing.p80_ms,
        "samples": timing.samples,
        "calls_per_sample": timing.calls_per_sample,
        "gb_per_s": bytes_moved / timing.ms / 1e6,
        "tflop_per_s": flops / timing.ms / 1e9 if flops else None,
        "floor_ms": floor,
        "fraction_of_floor": floor / timing.ms,
        "bytes_moved": bytes_moved,
        "flops": flops,
    }
