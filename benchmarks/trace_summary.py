"""A JAX profiler trace summarised to text: device time per kernel, device busy time, the host's costliest events."""

from __future__ import annotations

import collections
import gzip
import json
import tempfile
from collections.abc import Callable
from pathlib import Path

# Host events that tell a launch path's cost apart: XLA's command buffers and custom calls, the driver's graph and
# kernel launches, cuDNN.
HOST_FOCUS = ("CommandBuffer", "CustomCall", "Triton", "triton", "cuGraph", "cuLaunch", "cudnn", "Cudnn")


def trace_file(log_dir: Path) -> Path:
    """The ``*.trace.json.gz`` that ``jax.profiler.trace(log_dir)`` wrote (the latest run's)."""
    runs = sorted((log_dir / "plugins" / "profile").iterdir(), key=lambda path: path.stat().st_mtime)
    [path] = runs[-1].glob("*.trace.json.gz")
    return path


def profiled(step: Callable[[], object], steps: int, top: int = 12, log_dir: Path | None = None) -> dict:
    """:func:`summarise` of a trace of ``steps`` calls of ``step()`` back to back (the last output waited for inside
    the trace); the trace goes to ``log_dir`` (a new temporary folder when None)."""
    import jax

    log_dir = Path(tempfile.mkdtemp()) if log_dir is None else log_dir
    with jax.profiler.trace(str(log_dir)):
        for _ in range(steps):
            out = step()
        jax.block_until_ready(out)
    return summarise(trace_file(log_dir), steps, top)


def summarise(path: Path, steps: int, top: int = 12) -> dict:
    """Per-step numbers of a trace of ``steps`` training steps.

    Device events are the kernels of the GPU's stream lines (``Stream #...`` threads of a ``/device:GPU`` process;
    every device line where the trace names no stream). Host events are the host process's named regions
    (Python frames, named ``$file:line``, left out).

    Returns:
        ``{"device_busy_ms", "device_kernels", "device_top", "host_top", "host_focus"}`` per step: the lists hold
        ``(name, ms, count)``, the costliest first; ``host_focus`` only the host events named after one of
        :data:`HOST_FOCUS`; ``device_busy_ms`` is the union of the kernels' intervals (overlapping streams count
        once).
    """
    with gzip.open(path, "rt") as handle:
        events = json.load(handle)["traceEvents"]
    processes = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e["name"] == "process_name"}
    threads = {
        (e["pid"], e["tid"]): e["args"]["name"] for e in events if e.get("ph") == "M" and e["name"] == "thread_name"
    }
    spans = [e for e in events if e.get("ph") == "X" and "dur" in e]
    device_pids = {pid for pid, name in processes.items() if "/device:GPU" in name}
    device = [e for e in spans if e["pid"] in device_pids]
    streams = [e for e in device if threads.get((e["pid"], e["tid"]), "").startswith("Stream")]
    kernels = streams or device
    host = [e for e in spans if e["pid"] not in device_pids and not e["name"].startswith("$")]
    return {
        "device_busy_ms": _union_us(kernels) / 1e3 / steps,
        "device_kernels": len(kernels) / steps,
        "device_top": _top(kernels, steps, top),
        "host_top": _top(host, steps, top),
        "host_focus": _top([e for e in host if any(word in e["name"] for word in HOST_FOCUS)], steps, top),
    }


def _top(spans, steps: int, top: int) -> list[tuple[str, float, float]]:
    total, count = collections.Counter(), collections.Counter()
    for span in spans:
        total[span["name"]] += span["dur"]
        count[span["name"]] += 1
    return [(name[:90], us / 1e3 / steps, count[name] / steps) for name, us in total.most_common(top)]


def _union_us(spans) -> float:
    busy, end = 0.0, float("-inf")
    for start, stop in sorted((s["ts"], s["ts"] + s["dur"]) for s in spans):
        if stop > end:
            busy += stop - max(start, end)
            end = stop
    return busy


def format_summary(title: str, summary: dict) -> list[str]:
    """Report lines for one summarised trace."""
    lines = [
        f"{title}: device busy {summary['device_busy_ms']:.3f} ms/step, {summary['device_kernels']:.0f} kernels/step",
        "  device, ms/step (count/step):",
    ]
    lines += [f"    {ms:8.3f} ({n:5.1f})  {name}" for name, ms, n in summary["device_top"]]
    for key, title in (("host_top", "host"), ("host_focus", "host, launch-path events")):
        lines.append(f"  {title}, ms/step (count/step):")
        lines += [f"    {ms:8.3f} ({n:5.1f})  {name}" for name, ms, n in summary[key]]
    return lines
