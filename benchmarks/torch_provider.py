"""The liger_torch provider: Liger-Kernel's own ops timed with CUDA events, in the benchmark's process.

torch is imported only here, only when the provider runs. Timing follows the JAX side: input copies rotated
(same count rule), warm-up, samples of back-to-back calls, the per-application median.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from typing import Any

from benchmarks import memory
from benchmarks.case import Case
from benchmarks.measure import copies_for, timing_row
from benchmarks.providers import LIGER_TORCH
from benchmarks.timing import Policy, time_batches


def _outputs(out: Any) -> tuple[Any, ...]:
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def _cotangents(outputs: tuple[Any, ...]) -> tuple[Any, ...]:
    import torch

    return tuple(torch.ones_like(o) if o.dim() == 0 else torch.randn_like(o) for o in outputs)


def _one_pass(fn: Callable, diff_argnums: tuple[int, ...], mode: str, copies: list) -> Callable[[], None]:
    """A callable that applies ``mode`` once to every input copy."""
    import torch

    def differentiated(inputs):
        return [inputs[i] for i in diff_argnums]

    match mode:
        case "forward":

            def run():
                for inputs in copies:
                    fn(*inputs)

        case "backward":
            graphs = [(inputs, _outputs(fn(*inputs))) for inputs in copies]
            cotangents = [_cotangents(outputs) for _, outputs in graphs]

            def run():
                for (inputs, outputs), cotangent in zip(graphs, cotangents, strict=True):
                    torch.autograd.grad(outputs, differentiated(inputs), cotangent, retain_graph=True)

        case "full":
            cotangents = [_cotangents(_outputs(fn(*inputs))) for inputs in copies]

            def run():
                for inputs, cotangent in zip(copies, cotangents, strict=True):
                    torch.autograd.grad(_outputs(fn(*inputs)), differentiated(inputs), cotangent)

        case _:
            raise ValueError(f"unknown mode {mode!r}")
    return run


def measure_torch(case: Case, mode: str, policy: Policy) -> dict[str, Any]:
    """Times Liger (torch) on ``case`` in ``mode``; ``full`` also records the peak bytes of one application."""
    import torch

    if not os.environ.get("TRITON_CACHE_DIR"):
        # jax-triton empties TRITON_CACHE_DIR when imported; Triton under torch then has nowhere to cache kernels.
        os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="liger_torch_triton_")
    row = _measure(case, mode, policy)
    torch.cuda.empty_cache()  # hand the freed inputs back, so JAX can grow into them
    return row


def _measure(case: Case, mode: str, policy: Policy) -> dict[str, Any]:
    import torch

    program = case.torch_program()
    first = program.make_inputs()
    count = copies_for(memory.tree_bytes(list(first)), smoke=False)
    copies = [first] + [program.make_inputs() for _ in range(count - 1)]
    one_pass = _one_pass(program.fn, program.diff_argnums, mode, copies)

    def run_batch(calls: int) -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            one_pass()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3

    row = timing_row(case, LIGER_TORCH, mode, time_batches(run_batch, policy, ops_per_call=count))
    row.update(copies=count, implementation="torch")
    if mode == "full":
        row.update(_peak(_one_pass(program.fn, program.diff_argnums, mode, copies[:1]), memory.tree_bytes(list(first))))
    return row


def _peak(one_pass: Callable[[], None], input_bytes: int) -> dict[str, int]:
    """Peak bytes of one pass, as the JAX rows count them: one input set plus what the pass adds."""
    import torch

    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    one_pass()
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - before
    return {"peak_extra_bytes": extra, "peak_bytes": input_bytes + extra}
