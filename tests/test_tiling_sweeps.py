"""The tiling sweeps (benchmarks.norm_tiling, benchmarks.row_tiling) on CPU: their smoke runs, and the override
hooks they force on the kernels that tile rows their own way (GroupNorm, the divergences)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import norm_tiling, row_tiling, tiling_sweep
from benchmarks.cases import OPS
from liger_jax.ops import _divergence_rows, _tiling, group_norm

REPOSITORY = Path(__file__).resolve().parents[1]  # where `python -m benchmarks...` finds the benchmarks package


def _rows(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_row_tiling_smoke_times_xla_the_rule_and_a_candidate_per_op(tmp_path):
    ops = ["modulated_rms_norm", "group_norm", "kl_div"]
    row_tiling.main(["--smoke", "--op", *ops, "--out", str(tmp_path)])
    rows = _rows(tmp_path / "row_tiling.jsonl")
    assert all(row["status"] == "ok" for row in rows), [row["status"] for row in rows]
    for op in ops:
        providers = {row["provider"] for row in rows if row["op"] == op and row["mode"] == "full"}
        assert len(providers) == 3 and {tiling_sweep.XLA_LABEL, tiling_sweep.RULE} < providers
    assert "best full" in (tmp_path / "row_tiling.txt").read_text()


def test_norm_tiling_smoke_runs_on_the_shared_sweep(tmp_path):
    norm_tiling.main(["--smoke", "--op", "rms_norm", "--out", str(tmp_path)])
    rows = _rows(tmp_path / "norm_tiling.jsonl")
    assert rows and all(row["status"] == "ok" for row in rows)
    # The prefetch variants share their plain candidate's forward, so they are timed in fwd+bwd only.
    assert not [row for row in rows if row["provider"].endswith("prefetch") and row["mode"] == "forward"]


@pytest.mark.parametrize("op", row_tiling.OPS)
def test_row_tiling_candidates_are_few_and_distinct(op):
    for params, dtype in OPS[op].targets:
        if dtype == row_tiling.DTYPE:
            chosen = row_tiling.candidates(op, params)
            assert chosen[0].label == tiling_sweep.RULE and 4 <= len(chosen) <= 8
            described = [row_tiling.tilings(op, params)(c.override) for c in chosen]
            assert len(set(described)) == len(described)


def test_row_tiling_shapes_replace_the_targets_and_one_tile_ops_get_no_column_blocks():
    args = row_tiling.parser().parse_args(["--op", "dyt", "poly_norm", "--shape", "hidden=16384", "tokens=8,hidden=96"])
    cases = list(row_tiling.cases(args.op, smoke=False, shapes=args.shape))
    assert [(case.op, case.params) for case, _ in cases] == [
        ("dyt", {"tokens": 16384, "hidden": 16384}),
        ("dyt", {"tokens": 8, "hidden": 96}),
        ("poly_norm", {"tokens": 16384, "hidden": 16384}),
        ("poly_norm", {"tokens": 8, "hidden": 96}),
    ]
    wide_dyt, wide_poly = cases[0][1], cases[2][1]
    assert any(c.override and c.override.block_d and c.override.block_d < 16384 for c in wide_dyt)
    assert not any(c.override and c.override.block_d for c in wide_poly)
    with pytest.raises(SystemExit):
        row_tiling.parser().parse_args(["--shape", "hidden"])


@pytest.mark.parametrize(
    ("op", "override", "expected"),
    [
        (
            "group_norm",
            _tiling.TilingOverride(block_d=128, block_rows=64, num_warps=8, num_stages=2),
            {"BLOCK_C": 128, "BLOCK_S": 64, "GROUPS_PER_BLOCK": 8},
        ),
        ("kl_div", _tiling.TilingOverride(block_d=8192, block_rows=2, num_warps=16, num_stages=3), {"BLOCK_V": 8192}),
        ("dyt", _tiling.TilingOverride(block_rows=4, num_warps=32, num_stages=2), {"BLOCK_ROWS": 4}),
    ],
)
def test_an_override_reaches_every_launch_of_the_op(op, override, expected):
    params, dtype = OPS[op].targets[0]
    recorded = tiling_sweep.launches(OPS[op].build(params, dtype), override)
    assert recorded
    for launch in recorded:
        assert dict(launch.constexprs).items() >= expected.items()
        assert (launch.num_warps, launch.num_stages) == (override.num_warps, override.num_stages)
    for launch in tiling_sweep.launches(OPS[op].build(params, dtype), None):
        assert launch.num_stages == 1 and not dict(launch.constexprs).items() >= expected.items()


def test_group_and_divergence_rules_take_the_override():
    rule = group_norm.group_tiling(4096, 512, 32)
    forced = group_norm.group_tiling(4096, 512, 32, _tiling.TilingOverride(block_d=32, block_rows=128))
    assert (rule.block_c, rule.block_s, rule.num_stages) == (64, group_norm.SPLIT_CHUNK_ELEMENTS // 64, 1)
    assert (forced.groups_per_block, forced.block_c, forced.block_s) == (2, 32, 128)
    assert forced.num_warps == max(4, 128 * 32 // group_norm.SPLIT_ELEMENTS_PER_WARP)
    divergence = _divergence_rows.block_tiling(128256, "triton")
    assert (divergence.block_d, divergence.block_rows, divergence.num_warps) == (4096, 1, 4)
    assert _divergence_rows.block_tiling(300, "triton", _tiling.TilingOverride(block_d=4096)).block_d == 512


def test_norm_kernels_compile_for_the_gpu_in_one_tile_in_column_blocks_and_split():
    # Triton's compiler rejects code its interpreter runs (a name rebound to another type in a loop): every kernel
    # of every smoke candidate (one tile, column blocks, rows split among programs, LayerNorm's row sums apart)
    # compiled for sm_90, as a GPU would launch it, in a process without the interpreter.
    environment = os.environ | {"TRITON_INTERPRET": "0"}
    command = [sys.executable, "-m", "benchmarks.norm_tiling", "--registers", "--smoke", "--op", *norm_tiling.OPS]
    done = subprocess.run(command, cwd=REPOSITORY, env=environment, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    compiled = [line.split() for line in done.stdout.splitlines()[1:]]
    assert "cols64/w8/split3/sums" in [
        c.label for c in norm_tiling.candidates(200, norm_tiling.SMOKE_GRID, "layer_norm")
    ]
    for op in norm_tiling.OPS:
        candidates = [c.label for c in norm_tiling.candidates(200, norm_tiling.SMOKE_GRID, op)]
        assert "cols64/w8/split3" in candidates
        for label in candidates:
            kernels = {row[3] for row in compiled if row[0] == op and row[2] == label}
            row_sums = {f"{op}_bwd_row_sums"} if label.endswith("/sums") else set()
            assert kernels == {f"{op}_fwd", f"{op}_bwd", *row_sums}, (op, label)


def test_sparsemax_forward_compiles_for_the_gpu_walking_prefetched_row_tiles():
    # 600 rows of 16384, prefetching forced by the "pf" candidates: 16 warps, 264 programs as a CPU plans them,
    # walking 3 tiles each, so the loop and its prefetch are compiled (one tile a program leaves the prefetch dead).
    environment = os.environ | {"TRITON_INTERPRET": "0"}
    command = [sys.executable, "-m", "benchmarks.row_tiling", "--registers", "--op", "sparsemax"]
    command += ["--shape", "tokens=600,cols=16384"]
    done = subprocess.run(command, cwd=REPOSITORY, env=environment, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    compiled = {(row[2], row[3], row[4].split(",")[0]) for row in map(str.split, done.stdout.splitlines()[1:])}
    assert {("rule", "sparsemax_fwd", "PREFETCH=False"), ("pf", "sparsemax_fwd", "PREFETCH=True")} <= compiled
