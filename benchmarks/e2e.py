"""End to end: a training step with and without liger, ``python -m benchmarks.e2e --out OUT``.

The model is ``liger_jax.models.llama`` at the ``1b`` preset (Llama-3.2-1B shapes), seq 2048, bf16 params and
compute (``--precision mixed``: fp32 params, bf16 compute), optionally each decoder layer rematerialised for both
(``--remat``), AdamW, one jitted step with donated state; cuDNN
attention for both (liger swaps RMSNorm, RoPE, SwiGLU and the LM head's loss, not attention). Rows
(``kind: "e2e"``) go to ``OUT/results.jsonl``:

* ``same_batch``: tokens/s, step time and peak memory of both at ``--batch``;
* ``max_batch``: both at the largest batch each fits, found by compiling (``e2e_trial --phase max_batch``: the
  answer bracketed between a fitting and a failing batch, the search under the trial's time), then run.

Every trial is a fresh process (so each peak is that process's own), the same-batch ones first, each provider's
same-batch footprint then seeding its search.

``--models tunix-llama3-1b,tunix-qwen3-1.7b,tunix-gemma3-1b`` measures Tunix's own models instead
(:mod:`benchmarks.tunix_models`: Tunix's attention, liger = ``apply_liger`` + ``peft_loss_fn``, xla = the model as
Tunix builds it + Tunix's default loss), one after another, each with a share of the budget that grows with its
layer count (its compile time), the time a model leaves passing to the next. ``--combined`` gives each provider of
a model one process for both phases (``e2e_trial --phase both``: the same-batch run, then the search and the
largest batch's run), which is what lets three models fit in one 10-minute call. Every row carries its model in
``config``; ``python -m benchmarks.report --rows OUT/results.jsonl`` reads them with the rest.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import pathlib
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

from benchmarks import processes, tunix_models
from benchmarks import rows as results
from benchmarks.memory import footprint_bytes
from benchmarks.providers import LIGER_JAX, XLA

PROVIDERS = (XLA, LIGER_JAX)
DEFAULT_BATCH = 8  # the bundled Llama's same batch
LLAMA_LAYERS, TRIAL_LAYERS = 16, 8  # for the models' time shares (see _weight)
TRIAL_TIMEOUT_S = 300.0
SEARCH_TRIAL_MIN_S = 90.0  # kept for each largest-batch trial still to come: tracing, ~4 compiles, the run
TIMEOUT_GRACE_S = 20.0  # past a trial's own time, before the driver stops it


def _env() -> dict[str, str]:
    # The allocator's limit, which the search sizes batches against, is 95% of the device, taken as one region at
    # start: grown on demand, the step's one ~100 GiB temporary found no contiguous range at 83% of the limit (XLA,
    # batch 32).
    env = processes.child_env(XLA_PYTHON_CLIENT_MEM_FRACTION="0.95", XLA_PYTHON_CLIENT_PREALLOCATE="true")
    # This run's trials share XLA's autotuning results: the two providers' steps share most of their matmuls, which
    # each trial would otherwise autotune again, and compiles are what a call's budget runs out of.
    env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} --xla_gpu_per_fusion_autotune_cache_dir={_autotune_cache()}"
    return env


@functools.cache
def _autotune_cache() -> str:
    """A fresh directory for this process's trials' autotuning results."""
    return tempfile.mkdtemp(prefix="e2e-autotune-")


def _command(args: argparse.Namespace, provider: str, phase: str, time_s: float, start_footprint: int | None):
    command = [sys.executable, "-m", "benchmarks.e2e_trial", "--provider", provider, "--phase", phase]
    command += ["--batch", str(args.batch), "--config", args.config, "--seq", str(args.seq)]
    command += ["--precision", args.precision, "--steps", str(args.steps), "--warmup", str(args.warmup)]
    command += ["--time-s", f"{time_s:.0f}"]
    if args.attention:
        command += ["--attention", args.attention]
    if args.remat:
        command += ["--remat"]
    if start_footprint:
        command += ["--start-footprint", str(start_footprint)]
    if phase in ("max_batch", "both") and args.capacity_from_batch:
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


def _trial(
    args: argparse.Namespace, provider: str, phase: str, time_s: float, start_footprint: int | None = None
) -> list[dict[str, Any]]:
    """The rows of one ``e2e_trial`` process in ``phase``, given ``time_s`` (a row saying why, where it ended
    early; in the ``both`` phase that row belongs to whichever phase the trial had reached)."""
    if time_s < 20:
        rows = [{"status": "skipped: time budget"}]
    else:
        command = _command(args, provider, phase, time_s, start_footprint)
        timeout = time_s + TIMEOUT_GRACE_S
        try:
            done = subprocess.run(command, env=_env(), capture_output=True, text=True, timeout=timeout, check=False)
            rows = _rows(done.stdout, done.returncode, done.stderr)
        except subprocess.TimeoutExpired as expired:
            stdout, stderr = (_text(stream) for stream in (expired.stdout, expired.stderr))
            stages = [line for line in stderr.splitlines() if line.startswith("e2e_trial:")]
            last = stages[-1] if stages else "none"
            rows = [*_rows(stdout, 0, ""), {"status": f"error: timed out after {timeout:.0f} s; last stage: {last}"}]
    if phase == "both":
        phase = "max_batch" if any(row.get("phase") == "same_batch" for row in rows) else "same_batch"
    batch = args.batch if phase == "same_batch" else None
    return [{"phase": phase, "batch": batch} | row for row in rows]


def _footprint(row: dict[str, Any]) -> int | None:
    """A successful run row's compiled footprint, if it has one."""
    return footprint_bytes(row) if row.get("status") == "ok" else None


def run_e2e(args: argparse.Namespace, deadline: float) -> list[dict[str, Any]]:
    """Every model of ``args.models`` in turn (:func:`run_model`), each until its share of the time to
    ``deadline`` (a ``time.monotonic()`` value) is spent; rows streamed to ``args.out``."""
    out = []
    weights = [_weight(model) for model in args.models]
    for index, model in enumerate(args.models):
        share = weights[index] / sum(weights[index:])
        out += run_model(_model_args(args, model), time.monotonic() + share * (deadline - time.monotonic()))
    return out


def _weight(model: str) -> float:
    """A model's share of the budget, in decoder layers: Tunix unrolls them, so compile time grows with them, and
    each trial's process start, trace, state and runs cost about as much as ``TRIAL_LAYERS`` more."""
    layers = tunix_models.model_spec(model).layers if tunix_models.is_tunix(model) else LLAMA_LAYERS
    return layers + TRIAL_LAYERS


def _model_args(args: argparse.Namespace, model: str) -> argparse.Namespace:
    """``args`` for one model: its name as ``config``, its default same batch unless ``--batch`` was given, and no
    attention choice for a Tunix model (it runs its own)."""
    tunix = tunix_models.is_tunix(model)
    batch = args.batch or (tunix_models.model_spec(model).batch if tunix else DEFAULT_BATCH)
    return argparse.Namespace(**vars(args) | {"config": model, "batch": batch} | ({"attention": None} if tunix else {}))


def run_model(args: argparse.Namespace, deadline: float) -> list[dict[str, Any]]:
    """One model's trials (``args.config``): separate same-batch and largest-batch trials (:func:`run_phases`), or
    with ``--combined`` one trial per provider (:func:`run_combined`)."""
    base = {"kind": "e2e", "config": args.config, "seq": args.seq, "precision": args.precision, "mode": "step"}
    base["remat"] = args.remat
    out = []

    def emit(provider: str, rows: list[dict[str, Any]]) -> None:
        for row in rows:
            row = base | {"provider": provider} | row
            out.append(row)
            results.append(args.out, row)
            print(f"e2e: {json.dumps(row, default=str)}", flush=True)

    (run_combined if args.combined else run_phases)(args, deadline, emit)
    return out


def run_combined(args: argparse.Namespace, deadline: float, emit: Callable[[str, list], None]) -> None:
    """Each provider's ``both``-phase trial in turn, each given an equal share of the time left (a trial that runs
    into its grace takes it from the next)."""
    for index, provider in enumerate(args.provider):
        time_s = (deadline - time.monotonic()) / (len(args.provider) - index)
        emit(provider, _trial(args, provider, "both", time_s))


def run_phases(args: argparse.Namespace, deadline: float, emit: Callable[[str, list], None]) -> None:
    """Each provider's same-batch trial, then each one's largest-batch trial.

    A same-batch trial gets at most a fifth of the time left (TRIAL_TIMEOUT_S). The largest-batch trials go in
    the order of their same-batch compile times, quickest first, so the slowest search inherits what the others
    leave; each gets the time left but ``SEARCH_TRIAL_MIN_S`` (and the grace) for each one after it.
    """
    seeds, compile_s = {}, {}
    for provider in args.provider:
        rows = _trial(args, provider, "same_batch", min(TRIAL_TIMEOUT_S, 0.2 * (deadline - time.monotonic())))
        seeds[provider] = next((f for f in map(_footprint, rows) if f), None)
        compile_s[provider] = next((r["compile_s"] for r in rows if r.get("compile_s")), math.inf)
        emit(provider, rows)
    order = sorted(args.provider, key=compile_s.__getitem__)
    for index, provider in enumerate(order):
        later = len(order) - index - 1
        time_s = deadline - time.monotonic() - (SEARCH_TRIAL_MIN_S + TIMEOUT_GRACE_S) * later - TIMEOUT_GRACE_S
        emit(provider, _trial(args, provider, "max_batch", time_s, seeds[provider]))


def parser() -> argparse.ArgumentParser:
    """The command line of ``python -m benchmarks.e2e``."""
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("--out", type=pathlib.Path, default=pathlib.Path("benchmarks/out"))
    cli.add_argument("--provider", nargs="+", default=list(PROVIDERS), choices=PROVIDERS)
    cli.add_argument("--config", default="1b", help="the bundled Llama's preset (when --models is not given)")
    cli.add_argument(
        "--models",
        type=lambda text: text.split(","),
        help=f"comma-separated: Llama presets and Tunix models ({', '.join(tunix_models.SMOKE)})",
    )
    cli.add_argument("--combined", action="store_true", help="one trial process per provider and model, both phases")
    cli.add_argument("--seq", type=int, default=2048)
    cli.add_argument(
        "--batch", type=int, help=f"the same-batch comparison's batch (default {DEFAULT_BATCH}; Tunix: per model)"
    )
    cli.add_argument("--precision", default="bf16", choices=("bf16", "mixed"))
    cli.add_argument("--attention", default="cudnn", choices=("cudnn", "xla"))
    cli.add_argument("--remat", action="store_true", help="both models rematerialise each decoder layer")
    cli.add_argument("--steps", type=int, default=5, help="timed steps per run")
    cli.add_argument("--warmup", type=int, default=2)
    cli.add_argument("--budget-s", type=float, default=600.0)
    cli.add_argument("--capacity-from-batch", type=int, help="search as if the device held exactly this batch")
    cli.add_argument("--smoke", action="store_true", help="the tiny model on CPU: checks the code paths")
    return cli


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parses the command line; ``--smoke`` replaces the sizes with a tiny CPU run (Tunix models by their tiny
    twins, :data:`benchmarks.tunix_models.SMOKE`)."""
    args = parser().parse_args(argv)
    args.models = args.models or [args.config]
    for model in args.models:
        if tunix_models.is_tunix(model):
            tunix_models.model_spec(model)  # an unknown name fails here, not in every trial
    if args.smoke:
        args.models = [tunix_models.SMOKE.get(m, m) if tunix_models.is_tunix(m) else "tiny" for m in args.models]
        args.config, args.seq, args.batch, args.steps, args.warmup = "tiny", 32, 2, 1, 0
        args.attention, args.capacity_from_batch = "xla", args.capacity_from_batch or 3
    return args


def summary(rows: list[dict[str, Any]]) -> str:
    """One short line per row (model, provider, phase, batch, tokens/s, peak GiB, search, status): the rows
    themselves are long, and a GPU call returns only the end of its output."""
    lines = []
    for row in rows:
        peak = row.get("peak_bytes")
        search = (row.get("search") or {}).get("status", "")
        cells = [row.get("config"), row.get("provider"), row.get("phase"), f"batch {row.get('batch')}"]
        cells += [
            f"{row.get('tokens_per_s') or 0:,.0f} tokens/s",
            "peak –" if peak is None else f"peak {peak / 2**30:.1f} GiB",
        ]
        cells += [f"compile {row.get('compile_s') or 0:.0f} s", search, row.get("status")]
        lines.append("e2e summary: " + " | ".join(str(cell) for cell in cells if cell != ""))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    """Command line entry point."""
    args = parse(argv)
    print(summary(run_e2e(args, time.monotonic() + args.budget_s)), flush=True)


if __name__ == "__main__":
    main()
