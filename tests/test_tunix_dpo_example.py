"""examples/tunix_dpo.py end to end, for two steps in a subprocess: Tunix's DPOTrainer with liger's swapped policy
and fused DPO loss (the GPU kernels on a GPU; on CPU the XLA paths, Triton's interpreter being too slow for a run)."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import jax

SCRIPT = Path(__file__).parents[1] / "examples" / "tunix_dpo.py"
SMALL_RUN = ["--steps", "2", "--batch-size", "2", "--prompt-len", "8", "--completion-len", "8"]
IMPLEMENTATION = [] if jax.default_backend() == "gpu" else ["--implementation", "xla"]
# The tiny Qwen3's 4 layers each have 4 RMSNorms (input, post-attention, per-head q and k), plus the final norm.
TINY_SWAPS = {"rms_norm": 4 * 4 + 1, "swiglu": 4, "rope": 4}


def _run(*flags: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *flags], capture_output=True, text=True, env=os.environ.copy(), timeout=600
    )


def test_example_aligns_and_reports(tmp_path):
    result = _run(*SMALL_RUN, *IMPLEMENTATION, "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert (tmp_path / "loss.png").stat().st_size > 0
    assert summary["liger"] and {kind: summary["swapped"][kind] for kind in TINY_SWAPS} == TINY_SWAPS
    # The policy starts as its frozen reference: every log-ratio is 0 and the DPO loss log 2 (to bf16 on a GPU).
    assert len(summary["losses"]) == 2 and math.isclose(summary["first_loss"], math.log(2), abs_tol=1e-2)
    assert summary["final_loss"] < summary["first_loss"]
    assert summary["tokens_per_s"] > 0 and 0 <= summary["final_reward_accuracy"] <= 1
    for line in ("tokens/s (compile excluded):", "loss curve: 1: ", "final reward accuracy:"):
        assert line in result.stdout
