"""examples/train_llama.py end to end, for a few steps in a subprocess (the environment's implementation: Triton's
interpreter on CPU, the GPU kernels on a GPU)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parents[1] / "examples" / "train_llama.py"
SMALL_RUN = ["--steps", "4", "--batch-size", "2", "--seq-len", "16", "--log-every", "2", "--eval-batches", "1"]


def _run(*flags: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *flags], capture_output=True, text=True, env=os.environ.copy(), timeout=600
    )


@pytest.mark.parametrize("liger", ["--liger", "--no-liger"])
def test_example_trains_and_reports(tmp_path, liger):
    result = _run(*SMALL_RUN, "--sample", "4" if liger == "--liger" else "0", liger, "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert (tmp_path / "loss.png").stat().st_size > 0
    assert len(summary["losses"]) == 4 and all(0 < loss < 10 for loss in summary["losses"])
    assert summary["tokens_per_s"] > 0 and 0 < summary["eval_loss"] < 10
    assert summary["liger"] == (liger == "--liger")
    if summary["liger"]:
        assert summary["swapped"]["rms_norm"] == 9 and summary["swapped"]["fused_linear_cross_entropy"] == 1
        # Shapes this small run XLA by the size rule where the default is Triton; the interpreter, or an
        # implementation set for every op by the environment, keeps the kernels.
        expected = summary["implementation"]
        if expected == "triton" and not os.environ.get("LIGER_JAX_IMPLEMENTATION"):
            expected = "xla"
        ops = ("rms_norm", "fused_add_rms_norm", "swiglu", "rope", "fused_linear_cross_entropy")
        assert summary["op_implementations"] == dict.fromkeys(ops, expected)
        assert summary["sample"].startswith("Alice ") and len(summary["sample"]) > len("Alice ")
    for line in ("tokens/s (compile excluded):", "peak device memory:", "loss:"):
        assert line in result.stdout


def test_example_keeps_the_kinds_it_is_told_to(tmp_path):
    result = _run(*SMALL_RUN, "--sample", "0", "--keep", "rope", "--keep", "swiglu", "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["kept"] == ["rope", "swiglu"]
    assert summary["swapped"]["rope"] == summary["swapped"]["swiglu"] == 0 and summary["swapped"]["rms_norm"] == 9
    assert set(summary["op_implementations"]) == {"rms_norm", "fused_add_rms_norm", "fused_linear_cross_entropy"}


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (("--steps", "10", "--warmup", "10"), "--warmup must be in [0, --steps)"),
        (("--no-liger", "--keep", "rope"), "--keep rope needs --liger"),
        (("--keep", "ropes"), "argument --keep: invalid choice: 'ropes'"),
    ],
)
def test_example_rejects_bad_flags(flags, message):
    result = _run(*flags)
    assert result.returncode == 2 and message in result.stderr
