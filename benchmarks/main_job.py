"""The main job with and without liger, interleaved: ``examples/train_llama.py`` at each preset, runs alternating
liger / flax so that drift in the machine's state touches both alike, then the median tokens/s of each.

    python -m benchmarks.main_job --out OUT                        # tiny, mini, small at their defaults, 3 runs each
    python -m benchmarks.main_job --out OUT --preset 1b:8:2048      # preset:batch:seq
    python -m benchmarks.main_job --out OUT --preset 1b:8:2048 --ablate rope swiglu,rms_norm  # liger without them

Each run is a fresh process (its own compile; tokens/s excludes it). ``--ablate`` adds, per preset, runs of liger
with the given swap kinds left as flax's (the example's ``--keep``), interleaved with the others. Prints a markdown
table (each liger variant against flax) and writes it to OUT/main_job.md, with every run's summary in
OUT/main_job.jsonl.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "train_llama.py"
# A run's variant: the swap kinds liger keeps as flax's (() for every swap), or FLAX for flax's own modules.
Variant = tuple[str, ...] | None
FLAX: Variant = None


def _flags(variant: Variant) -> list[str]:
    """The example's swap flags for ``variant``."""
    if variant is FLAX:
        return ["--no-liger"]
    return ["--liger", *(flag for kind in variant for flag in ("--keep", kind))]


def _run(preset: str, batch: int, seq: int, variant: Variant, steps: int, timeout_s: float) -> dict:
    """One run of the example as ``variant``; its summary.json, or ``{"error": ...}``."""
    with tempfile.TemporaryDirectory() as out:
        command = [sys.executable, str(EXAMPLE), "--config", preset, *_flags(variant), "--steps", str(steps)]
        command += ["--batch-size", str(batch), "--seq-len", str(seq), "--sample", "0", "--eval-batches", "0"]
        command += ["--out", out]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return {"error": f"timed out after {timeout_s:.0f} s"}
        if done.returncode != 0:
            return {"error": done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "failed"}
        return json.loads((Path(out) / "summary.json").read_text())


def _parse_preset(text: str) -> tuple[str, int, int]:
    name, _, rest = text.partition(":")
    batch, _, seq = rest.partition(":")
    return name, int(batch or 16), int(seq or 128)


def main() -> None:
    cli = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    cli.add_argument("--out", type=Path, required=True)
    cli.add_argument("--preset", nargs="+", default=["tiny", "mini", "small"], help="name[:batch[:seq]]")
    cli.add_argument("--runs", type=int, default=3)
    cli.add_argument("--steps", type=int, default=60, help="training steps per run")
    cli.add_argument("--timeout-s", type=float, default=150.0, help="per run")
    cli.add_argument("--ablate", nargs="*", default=[], help="kinds liger keeps as flax's in extra runs: rope,swiglu")
    args = cli.parse_args()
    variants = [(), FLAX, *(tuple(ablation.split(",")) for ablation in args.ablate)]
    args.out.mkdir(parents=True, exist_ok=True)
    presets = [_parse_preset(text) for text in args.preset]
    rates: dict[tuple, list[float]] = {}
    with open(args.out / "main_job.jsonl", "a") as log:
        for run in range(args.runs):
            for preset in presets:
                for variant in variants:
                    swap = " ".join(_flags(variant))
                    summary = _run(*preset, variant, args.steps, args.timeout_s)
                    summary.update(preset=":".join(map(str, preset)), swap=swap, run=run)
                    summary.pop("losses", None)
                    log.write(json.dumps(summary) + "\n")
                    log.flush()
                    if "error" in summary:
                        print(f"{summary['preset']} {swap} run {run}: {summary['error']}", flush=True)
                        continue
                    rates.setdefault((preset, variant), []).append(summary["tokens_per_s"])
                    print(f"{summary['preset']} {swap} run {run}: {summary['tokens_per_s']:,.0f} tokens/s", flush=True)
    lines = ["| preset (batch x seq) | liger tokens/s | flax tokens/s | liger / flax | runs |", "|---|---|---|---|---|"]
    for name, batch, seq in presets:
        flax = rates.get(((name, batch, seq), FLAX), [])
        for kept in (variant for variant in variants if variant is not FLAX):
            liger = rates.get(((name, batch, seq), kept), [])
            label = f"{name} ({batch} x {seq})" + (f", keeps {', '.join(kept)} as flax's" if kept else "")
            if not liger or not flax:
                lines.append(f"| {label} | - | - | - | {len(liger)} / {len(flax)} |")
                continue
            ratio = statistics.median(liger) / statistics.median(flax)
            lines.append(
                f"| {label} | {statistics.median(liger):,.0f} | {statistics.median(flax):,.0f} | "
                f"{ratio:.3f}x | {len(liger)} / {len(flax)} |"
            )
    table = "\n".join(lines)
    (args.out / "main_job.md").write_text(table + "\n")
    print(table)


if __name__ == "__main__":
    main()
