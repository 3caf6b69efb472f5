"""examples/tunix_sft.py end to end, for a few steps in a subprocess (the environment's implementation: Triton's
interpreter on CPU, the GPU kernels on a GPU)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parents[1] / "examples" / "tunix_sft.py"
SMALL_RUN = ["--steps", "3", "--batch-size", "2", "--seq-len", "16", "--eval-batches", "1"]
# The tiny Qwen3's 4 layers each have 4 RMSNorms (input, post-attention, per-head q and k), plus the final norm.
TINY_SWAPS = {"rms_norm": 4 * 4 + 1, "swiglu": 4, "rope": 4}


def _run(*flags: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *flags], capture_output=True, text=True, env=os.environ.copy(), timeout=600
    )


@pytest.mark.parametrize("liger", ["--liger", "--no-liger"])
def test_example_fine_tunes_and_reports(tmp_path, liger):
    result = _run(*SMALL_RUN, liger, "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert (tmp_path / "loss.png").stat().st_size > 0
    assert len(summary["losses"]) == 3 and all(0 < loss < 10 for loss in summary["losses"])
    assert summary["tokens_per_s"] > 0 and 0 < summary["eval_loss"] < 10
    assert summary["liger"] == (liger == "--liger")
    if summary["liger"]:
        assert {kind: summary["swapped"][kind] for kind in TINY_SWAPS} == TINY_SWAPS
    for line in ("tokens/s (compile excluded):", "peak device memory:", "loss curve: 1: "):
        assert line in result.stdout


def test_example_rejects_bad_flags():
    result = _run("--steps", "10", "--warmup", "10")
    assert result.returncode == 2 and "--warmup must be in [0, --steps)" in result.stderr
