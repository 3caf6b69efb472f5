"""Timing core: warm-up, then many samples of back-to-back calls, each sample ended by a device sync.

A sample dispatches ``calls`` calls without waiting and then waits for the device, so host dispatch overlaps the
device work of earlier calls and the time per call is the device's steady-state time (what a training step sees),
not dispatch latency. The caller supplies ``run_batch(n)``: dispatch n calls, wait, return elapsed seconds (a host
clock around a ``block_until_ready`` for JAX, CUDA events for torch).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import numpy as np


@dataclasses.dataclass(frozen=True)
class Policy:
    """How much to time one measurement.

    Attributes:
        warmup: untimed calls after compilation (module load, allocator growth, autotuning stay out).
        min_samples: fewest samples, however slow a call is.
        max_samples: most samples, however fast a call is.
        budget_s: timed seconds to aim for per measurement (samples = budget / sample length, clamped).
        sample_s: a sample spans at least this long, so what a sample pays once is a small part of it: it starts
            on an idle device, which waits for the first call's dispatch, and ends with a sync (together 0.2-0.3 ms
            on the H200: with 4 ms samples a 2 ms op read 0.2-0.3 ms slow, XLA's and liger_jax's alike).
    """

    warmup: int = 2
    min_samples: int = 5
    max_samples: int = 40
    budget_s: float = 0.25
    sample_s: float = 0.025


# Tiny shapes on CPU: the point is to run every code path once, not to get numbers.
SMOKE_POLICY = Policy(warmup=1, min_samples=3, max_samples=3, budget_s=0.0, sample_s=0.0)


@dataclasses.dataclass(frozen=True)
class Timing:
    """Milliseconds per op application: the median and the 20th/80th percentiles over samples."""

    ms: float
    p20_ms: float
    p80_ms: float
    samples: int
    calls_per_sample: int


def time_batches(run_batch: Callable[[int], float], policy: Policy, ops_per_call: int = 1) -> Timing:
    """Times a callable by samples of back-to-back calls.

    Args:
        run_batch: ``run_batch(n)`` dispatches n calls, waits for the device, returns elapsed seconds.
        policy: warm-up and sample counts.
        ops_per_call: op applications one call performs (a call may run the op over several input copies).

    Returns:
        The per-application :class:`Timing`.
    """
    for _ in range(policy.warmup):
        run_batch(1)
    sizing = [run_batch(1), run_batch(1)]
    first = max(min(sizing), 1e-9)  # the lower of two: a one-off stall does not size the samples
    calls = max(1, math.ceil(policy.sample_s / first))
    samples = int(policy.budget_s / (first * calls))
    samples = min(max(samples, policy.min_samples), policy.max_samples)
    seconds = sizing[: samples if calls == 1 else 0]  # single-call samples already taken (slow ops) count
    seconds += [run_batch(calls) for _ in range(samples - len(seconds))]
    per_op_ms = 1e3 * np.array(seconds) / (calls * ops_per_call)
    p20, median, p80 = np.percentile(per_op_ms, [20, 50, 80])
    return Timing(float(median), float(p20), float(p80), samples, calls)
