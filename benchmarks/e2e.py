"""End to end: a Llama training step with and without liger, ``python -m benchmarks.e2e --out OUT``.

The model is ``liger_jax.models.llama`` at the ``1b`` preset (Llama-3.2-1B shapes), seq 2048, bf16 params and
compute (``--precision mixed``: fp32 params, bf16 compute), optionally each decoder layer rematerialised for both
(``--remat``), AdamW, one jitted step with donated state; cuDNN
attention for both (liger swaps RMSNorm, RoPE, SwiGLU and the LM head's loss, not attention). Rows
(``kind: "e2e"``) go to ``OUT/results.jsonl``:

* ``same_batch``: tokens/s, step time and peak memory of both at ``--batch``;
* ``max_batch``: both at the largest batch each fits, found by ``e2e_trial probe`` (compiled footprints only,
  the answer bracketed between a fitting and a failing batch), then run; on an OOM one batch less is tried.

The probes only compile (autotuning off: no GPU work), so they run in the background, beside the suite's ops
phase. Then each provider gets two trial processes, the same batch and then the largest, so each peak is a fresh
process's (and the largest step does not meet the cached buffers of the smaller one).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

from benchmarks import processes
from benchmarks import rows as results
from benchmarks.providers import LIGER_JAX, XLA

PROVIDERS = (XLA, LIGER_JAX)
TRIAL_TIMEOUT_S = 300.0


def _env(probe: bool) -> dict[str, str]:
    # The allocator's limit, which probes size batches against, is 95% of the device. Probes, which may run beside
    # other work, allocate nothing up front; a run takes its whole share as one region at start, because grown on
    # demand the step's one ~100 GiB temporary found no contiguous range at 83% of the limit (XLA, batch 32).
    preallocate = "false" if probe else "true"
    return processes.child_env(
        autotune=not probe, XLA_PYTHON_CLIENT_MEM_FRACTION="0.95", XLA_PYTHON_CLIENT_PREALLOCATE=preallocate
    )


def _command(args: argparse.Namespace, action: str, provider: str, batch: int, phase: str | None = None) -> list[str]:
    command = [sys.executable, "-m", "benchmarks.e2e_trial", action, "--provider", provider]
    command += ["--batch", str(batch), "--config", args.config, "--seq", str(args.seq)]
    command += ["--precision", args.precision, "--steps", str(args.steps), "--warmup", str(args.warmup)]
    if args.attention:
        command += ["--attention", args.attention]
    if args.remat:
        command += ["--remat"]
    if phase:
        command += ["--phase", phase]
    if action == "probe" and args.capacity_from_batch:
        command += ["--capacity-from-batch", str(args.capacity_from_batch)]
    return command


def _text(stream: str | bytes | None) -> str:
    return stream.decode(errors="replace") if isinstance(stream, bytes) else stream or ""


def _rows(stdout: str, returncode: int, stderr: str) -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    if returncode != 0:
        tail = " | ".join(stderr.strip().splitlines()[-3:])
        rows.append({"status": f"error: exit {returncode}: {tail}"})
    return rows


def _run(
    args: argparse.Namespace, provider: str, max_batch: int | None, deadline: float, share: float
) -> list[dict[str, Any]]:
    """The provider's rows: the same batch, then ``max_batch``, each in a fresh process; a row saying why, where
    one ended early.

    The two may take ``share`` of the time left before ``deadline`` (so the next provider keeps its turn), the
    same-batch run at most half of it.
    """
    provider_deadline = time.monotonic() + share * (deadline - time.monotonic())
    print(f"e2e: {provider}: batch {args.batch}, then {max_batch or 'no largest batch'}", flush=True)
    rows = _trial(args, provider, "same_batch", args.batch, 0.5 * (provider_deadline - time.monotonic()))
    if max_batch:
        rows += _trial(args, provider, "max_batch", max_batch, provider_deadline - time.monotonic())
    return rows


def _trial(args: argparse.Namespace, provider: str, phase: str, batch: int, time_s: float) -> list[dict[str, Any]]:
    """The rows of one ``e2e_trial run`` process in ``phase`` at ``batch``, given at most ``time_s``
    (TRIAL_TIMEOUT_S)."""
    timeout = min(TRIAL_TIMEOUT_S, time_s)
    if timeout < 20:
        return [{"phase": phase, "batch": batch, "status": "skipped: time budget"}]
    command = _command(args, "run", provider, batch, phase)
    try:
        done = subprocess.run(command, env=_env(False), capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as expired:
        stdout, stderr = (_text(stream) for stream in (expired.stdout, expired.stderr))
        stages = [line for line in stderr.splitlines() if line.startswith("e2e_trial:")]
        status = f"error: timed out after {timeout:.0f} s; last stage: {stages[-1] if stages else 'none'}"
        return [*_rows(stdout, 0, ""), {"phase": phase, "batch": batch, "status": status}]
    return _rows(done.stdout, done.returncode, done.stderr)


class Search:
    """The two ``probe`` trials, started in the background (they use CPU, not the GPU, so they can overlap).

    Their output goes to temporary files, not pipes: nobody reads a pipe until the end, and a full one would
    stall the probe.
    """

    def __init__(self, args: argparse.Namespace):
        self.processes = {}
        for provider in args.provider:
            stdout, stderr = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
            command = _command(args, "probe", provider, args.batch)
            process = subprocess.Popen(command, env=_env(True), stdout=stdout, stderr=stderr, text=True)
            self.processes[provider] = (process, stdout, stderr)

    def results(self, deadline: float) -> dict[str, dict[str, Any]]:
        """Each provider's probe row, waiting at most until ``deadline`` (then the probe is killed)."""
        found = {}
        for provider, (process, stdout, stderr) in self.processes.items():
            try:
                process.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
                found[provider] = {"status": "error: probe ran past the time budget"}
                continue
            stdout.seek(0)
            stderr.seek(0)
            rows = _rows(stdout.read(), process.returncode, stderr.read())
            found[provider] = rows[0] if rows else {"status": "error: the probe printed nothing"}
        return found


def run_e2e(args: argparse.Namespace, deadline: float, search: Search | None = None) -> list[dict[str, Any]]:
    """The batch search, then one trial per provider (same batch, then largest); rows streamed to ``args.out``."""
    search = search or Search(args)
    base = {"kind": "e2e", "config": args.config, "seq": args.seq, "precision": args.precision, "mode": "step"}
    base["remat"] = args.remat
    out = []
    # Each trial needs about a minute and a half: keep three minutes for the two.
    probes = search.results(deadline - 180)
    for index, provider in enumerate(args.provider):
        probe = probes[provider]
        found = {k: probe.get(k) for k in ("max_batch", "budget_bytes", "footprints", "errors", "status")}
        for row in _run(args, provider, probe.get("max_batch"), deadline, 1 / (len(args.provider) - index)):
            row = base | {"provider": provider} | row
            if row.get("phase", "").startswith("max_batch"):
                row["search"] = found
            out.append(row)
            results.append(args.out, row)
            print(f"e2e: {json.dumps(row, default=str)}", flush=True)
        if not probe.get("max_batch"):
            row = base | {"provider": provider, "phase": "max_batch", "search": found}
            row["status"] = f"no batch found: {probe.get('status')}"
            out.append(row)
            results.append(args.out, row)
    return out


def parser() -> argparse.ArgumentParser:
    """The command line of ``python -m benchmarks.e2e``."""
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("--out", type=pathlib.Path, default=pathlib.Path("benchmarks/out"))
    cli.add_argument(
        "--provider", nargs="+", default=list(PROVIDERS), choices=PROVIDERS, help="one provider fits a 10-minute call"
    )
    cli.add_argument("--config", default="1b")
    cli.add_argument("--seq", type=int, default=2048)
    cli.add_argument("--batch", type=int, default=8, help="the same-batch comparison's batch (sequences)")
    cli.add_argument("--precision", default="bf16", choices=("bf16", "mixed"))
    cli.add_argument("--attention", default="cudnn", choices=("cudnn", "xla"))
    cli.add_argument("--remat", action="store_true", help="both models rematerialise each decoder layer")
    cli.add_argument("--steps", type=int, default=5, help="timed steps per run")
    cli.add_argument("--warmup", type=int, default=2)
    cli.add_argument("--budget-s", type=float, default=600.0)
    cli.add_argument("--capacity-from-batch", type=int, help="probe as if the device held exactly this batch")
    cli.add_argument("--smoke", action="store_true", help="the tiny model on CPU: checks the code paths")
    return cli


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parses the command line; ``--smoke`` replaces the sizes with a tiny CPU run."""
    args = parser().parse_args(argv)
    if args.smoke:
        args.config, args.seq, args.batch, args.steps, args.warmup = "tiny", 32, 2, 1, 1
        args.attention, args.capacity_from_batch = "xla", args.capacity_from_batch or 3
    return args


def main(argv: Sequence[str] | None = None) -> None:
    """Command line entry point."""
    args = parse(argv)
    run_e2e(args, time.monotonic() + args.budget_s)


if __name__ == "__main__":
    main()
