"""The benchmark harness's logic, and one op's smoke run end to end on CPU (nothing here measures speed)."""

import argparse
import functools
import re

import pytest

from benchmarks import (
    e2e,
    e2e_trial,
    main_job,
    peak,
    providers,
    report,
    run,
    targets,
    timing,
    tokamax_provider,
    wall_and_busy,
)
from benchmarks import rows as results
from benchmarks.case import MODES, shape_string
from benchmarks.cases import OPS, build_case, off_line, sweep_line
from benchmarks.hardware import floor_ms


def test_plan_puts_targets_first_and_measures_each_case_once():
    ops = [OPS["rms_norm"], OPS["swiglu"]]
    planned = [(op.name, shape, dtype) for op, shape, dtype in run.plan(ops, ["target", "tokens"], smoke=False)]
    assert len(planned) == len(set(map(str, planned)))
    n_targets = len(OPS["rms_norm"].targets) + len(OPS["swiglu"].targets)
    assert [p[2] for p in planned[:n_targets]] == [d for op in ops for _, d in op.targets]
    assert ("rms_norm", {"tokens": 2048, "hidden": 4096}, "bfloat16") in planned[n_targets:]


def test_floor_is_the_larger_of_bandwidth_and_matmul_time():
    # This CPU is no listed device: the H200's ceilings apply.
    assert floor_ms(3.4e9, 0) == pytest.approx(1.0)
    assert floor_ms(1.0, 650e9) == pytest.approx(1.0)
    assert floor_ms(3.4e9, 650e9) == pytest.approx(1.0)
    assert floor_ms(6.8e9, 650e9) == pytest.approx(2.0)


def test_time_batches_reports_per_application_percentiles():
    elapsed = iter([0.5, 0.01, 0.02] + [0.01 * k for k in (2, 4, 2, 4, 3)])
    policy = timing.Policy(warmup=1, min_samples=5, max_samples=5, budget_s=0.0, sample_s=0.02)
    calls = []

    def run_batch(n):
        calls.append(n)
        return next(elapsed)

    result = timing.time_batches(run_batch, policy, ops_per_call=2)
    assert calls == [1, 1, 1, 2, 2, 2, 2, 2]  # warm-up, two sizing calls, samples of 0.02 s / 0.01 s = 2 calls
    assert result.samples == 5 and result.calls_per_sample == 2
    assert result.ms == pytest.approx(1e3 * 0.03 / 4)  # median sample 0.03 s over 2 calls × 2 applications


def test_slow_ops_reuse_the_sizing_calls_as_samples():
    elapsed = iter([9.0, 1.0, 3.0, 2.0, 2.0, 2.0])
    policy = timing.Policy(warmup=1, min_samples=5, max_samples=40, budget_s=0.1, sample_s=0.004)
    result = timing.time_batches(lambda n: next(elapsed), policy)
    assert (result.samples, result.calls_per_sample, result.ms) == (5, 1, pytest.approx(2e3))


def test_peak_rows_merge_into_their_timing_rows():
    key = {"op": "rms_norm", "provider": "xla", "mode": "full", "shape": "tokens=1,hidden=2", "dtype": "float32"}
    merged = results.merged([key | {"status": "ok", "ms": 1.0}, key | {"kind": "peak", "peak_bytes": 7}])
    assert merged == [key | {"status": "ok", "ms": 1.0, "peak_bytes": 7}]


def test_peak_pool_keeps_parallel_jobs_within_memory(monkeypatch):
    import threading
    import time

    running, most = [], [0]
    lock = threading.Lock()

    def fake_run(row, timeout_s):
        with lock:
            running.append(row["temp_bytes"])
            most[0] = max(most[0], sum(running))
        time.sleep(0.05)
        with lock:
            running.remove(row["temp_bytes"])
        return peak._key(row) | {"kind": "peak", "peak_status": "ok"}

    monkeypatch.setattr(peak, "_run_one", fake_run)
    base = {"provider": "xla", "mode": "full", "shape": "tokens=1,hidden=1", "dtype": "float32"}
    rows = [base | {"op": f"op{i}", "temp_bytes": size} for i, size in enumerate([60, 50, 30, 20, 10])]
    emitted = []
    peak.run_pool(rows, capacity_bytes=80, max_jobs=3, deadline=time.monotonic() + 60, timeout_s=1, emit=emitted.append)
    assert len(emitted) == 5 and all(e["peak_status"] == "ok" for e in emitted)
    assert most[0] <= 80


class _FootprintTrial:
    """A trial whose compiled footprint at each batch is ``footprint(batch)`` (the state alone at batch 0); it
    counts its compiles."""

    def __init__(self, footprint):
        self.compiled = []
        self._footprint = footprint
        self.state_bytes = footprint(0)

    def footprint(self, batch):
        self.compiled.append(batch)
        return self._footprint(batch)


def _search(footprint, capacity_batch, known=None, deadline=float("inf")):
    """The search's answer and trial when the budget holds exactly ``capacity_batch``."""
    trial = _FootprintTrial(footprint)
    budget = footprint(capacity_batch)
    return e2e_trial.largest_batch(trial, start=8, budget=budget, known=known or {}, deadline=deadline), trial


def _flat_from(batch, slope, cliff):
    """Linear to ``batch``, then held at ``slope`` bytes per sequence (XLA's own remat) until ``cliff``."""
    return lambda b: 2e10 + 4e9 * min(b, batch) + slope * max(b - batch, 0) + (1e12 if b > cliff else 0.0)


@pytest.mark.parametrize(
    ("footprint", "capacity_batch"),
    [
        # A line with buffer-assignment wobble.
        (lambda b: 1000 + 37 * b + (5 if b % 2 else 0), 23),
        (lambda b: 9.5e9 + 0.236e9 * b, 500),
        # Grows faster than the line through batches 8 and 16 (liger's remat step on the H200).
        (lambda b: 11.4e9 + 0.236e9 * b + (0.4e6 * (b - 100) ** 2 if b > 100 else 0.0), 400),
        # Flattens near the limit (XLA's own rematerialisation), so the line overshoots.
        (lambda b: 2e10 + 4e9 * b - (0.5e9 * (b - 30) if b > 30 else 0.0), 34),
        (lambda b: 1e9 * b**0.5, 400),
        # Held nearly flat below the limit, then too big at once; on the H200 the line through two such batches
        # had a slope of a few bytes and pointed at batch 1.9e10.
        (_flat_from(25, 1e6, 40), 40),
        (_flat_from(25, 40.0, 40), 40),
        # The 1b step on the H200 with autotuning (GB): XLA's, then liger's.
        (lambda b: 1e9 * (7.4 + 4.07 * b if b <= 8 else 40.0 + 3.03 * (b - 8) + 0.23 * max(b - 36, 0)), 39),
        (lambda b: 1e9 * (7.4 + 2.71 * b if b <= 8 else 29.1 + 2.54 * (b - 8)), 50),
    ],
)
def test_batch_search_finds_the_largest_fitting_batch(footprint, capacity_batch):
    found, trial = _search(footprint, capacity_batch)
    assert (found["max_batch"], found["status"]) == (capacity_batch, "converged")
    assert len(trial.compiled) <= e2e_trial.MAX_COMPILES and max(trial.compiled) < 4 * capacity_batch


def test_batch_search_of_a_line_takes_three_compiles_from_a_known_start():
    # The first guess is the line through the state alone (batch 0) and the known batch 8: right for a line,
    # then one compile to confirm the answer and one to see the next batch fail.
    line = lambda b: 7.4e9 + 3.0e9 * b + (1e6 if b % 3 else 0.0)  # noqa: E731
    found, trial = _search(line, 41, known={8: line(8)})
    assert found["max_batch"] == 41 and 8 not in trial.compiled and len(trial.compiled) <= 3


def _piecewise(points):
    """Footprints (GB) through ``points`` (batch: GB), linear between them and past the last two."""
    import numpy as np

    batches, sizes = zip(*sorted(points.items()), strict=True)
    slope = (sizes[-1] - sizes[-2]) / (batches[-1] - batches[-2])
    return lambda b: 1e9 * (np.interp(b, batches, sizes) if b <= batches[-1] else sizes[-1] + slope * (b - batches[-1]))


def test_batch_search_of_xla_on_the_h200_takes_four_compiles():
    # The 1b flax step's footprints measured with autotuning on the H200 (GB): flat from 31 to 35 (XLA's remat),
    # then growing at 3.26 GB a sequence again; the 2026-12-03 search compiled 31, 35, then jumped to 58.
    xla = _piecewise({0: 7.4, 8: 40.0, 31: 119.1, 35: 121.5, 58: 196.4})
    trial = _FootprintTrial(xla)
    found = e2e_trial.largest_batch(trial, 8, 135.476e9, {8: xla(8)}, float("inf"))
    assert (found["max_batch"], trial.compiled) == (39, [31, 35, 39, 40])


def test_batch_search_without_a_slope_stays_within_its_compiles():
    # Exactly flat from batch 25 to 34: lines predict nothing, so the search doubles, then bisects.
    found, trial = _search(_flat_from(25, 0.0, 34), 34)
    assert found["max_batch"] in (33, 34)
    assert len(trial.compiled) <= e2e_trial.MAX_COMPILES and max(trial.compiled) <= 52


def test_batch_search_stops_before_a_compile_it_has_no_time_for():
    import time

    found, trial = _search(lambda b: 1e9 * b, 40, deadline=time.perf_counter())
    assert (found["max_batch"], found["status"], trial.compiled) == (8, "stopped: out of time", [8])


def test_batch_search_treats_a_batch_that_does_not_compile_as_too_big():
    def footprint(batch):  # the memory holds batch 100, but nothing past 30 compiles
        if batch > 30:
            raise ValueError(f"overflow in static extent product: dimensions=[{batch}, 2048, 128256]")
        return 1e9 * batch

    found = e2e_trial.largest_batch(_FootprintTrial(footprint), 8, 1e11, {}, float("inf"))
    assert found["max_batch"] == 30
    assert found["errors"] and all(message.startswith("ValueError: overflow") for message in found["errors"].values())


def test_batch_search_reports_none_when_the_first_batch_does_not_fit():
    found = e2e_trial.largest_batch(_FootprintTrial(lambda b: 100 * b), 8, 400, {}, float("inf"))
    assert found["max_batch"] is None


def test_report_keeps_the_hand_written_header(tmp_path):
    md = tmp_path / "RESULTS.md"
    md.write_text(f"# Mine\n\nhand-written notes\n\n{report.MARKER}\nold generated text\n")
    row = {"op": "rms_norm", "provider": "xla", "mode": "full", "shape": "tokens=16384,hidden=4096"}
    row |= {"dtype": "bfloat16", "status": "ok", "ms": 0.35, "p20_ms": 0.34, "p80_ms": 0.36, "gb_per_s": 1900.0}
    row |= {"tflop_per_s": None, "floor_ms": 0.2, "fraction_of_floor": 0.57, "temp_bytes": 0, "device": "gpu:H200"}
    results.append(tmp_path, row)
    report.write(tmp_path, results_md=md, plots_dir=tmp_path / "plots")
    text = md.read_text()
    assert text.startswith("# Mine\n\nhand-written notes\n") and "old generated text" not in text
    assert "| tokens=16384,hidden=4096 | bfloat16 | full | xla | 0.350 (0.340–0.360) | 1.00x |" in text
    assert (tmp_path / "plots" / "rms_norm.png").exists()


def test_rms_norm_smoke_run_writes_every_output(tmp_path):
    run.main(["--op", "rms_norm", "--smoke", "--mode", "full", "--out", str(tmp_path)])
    rows = results.merged(results.load(tmp_path / results.JSONL))
    missing = tokamax_provider.unavailable()  # CI does not install tokamax: its rows then say so
    tokamax = ("tokamax", "ok" if missing is None else f"skipped: {missing}")
    assert {(r["provider"], r["status"]) for r in rows} == {("liger_jax", "ok"), ("xla", "ok"), tokamax}
    assert all(r["ms"] > 0 and r["temp_bytes"] is not None for r in rows if r["status"] == "ok")
    assert {"results.csv", "results.json", "RESULTS.md"} <= {p.name for p in tmp_path.iterdir()}


def test_wall_and_busy_runs_the_timed_program_donating_as_the_benchmark_does(capsys):
    # cross_entropy's logits are donated: each call's gradient is the next call's logits (CPU: no device trace).
    wall_and_busy.main(["cross_entropy:tokens=37,vocab=300", "--provider", "xla", "--dtype", "float32"])
    line = capsys.readouterr().out.splitlines()[0]
    assert line.startswith("cross_entropy tokens=37,vocab=300 xla: wall ") and "device busy 0.000" in line


def test_distillation_memory_variant_is_the_plain_loss_in_bf16_chunks_of_its_size(monkeypatch):
    import jax
    import jax.numpy as jnp

    import liger_jax
    from tests import harness

    calls = []
    distillation = liger_jax.fused_linear_distillation
    monkeypatch.setattr(
        liger_jax, "fused_linear_distillation", lambda *a, **k: calls.append(k) or distillation(*a, **k)
    )
    params, dtype = next((p, d) for p, d in OPS["fused_linear_distillation_memory"].smoke if d == "bfloat16")
    variant = build_case("fused_linear_distillation_memory", params, dtype)
    plain = build_case("fused_linear_distillation", {k: v for k, v in params.items() if k != "chunk"}, dtype)
    args = variant.make_inputs(jax.random.key(0))
    outputs = [
        jax.value_and_grad(case.providers["liger_jax"].with_implementation("xla"), argnums=case.diff_argnums)(*args)
        for case in (variant, plain)
    ]
    harness.assert_close_trees(outputs[0], outputs[1], jnp.bfloat16)
    assert (calls[0]["accum_dtype"], calls[0]["chunk_size"]) == ("bfloat16", params["chunk"])


def test_sweeps_run_only_the_sweep_providers_and_a_missing_provider_says_why(tmp_path, monkeypatch):
    measured = []

    def measure_one(case, provider, mode, policy, smoke):
        measured.append((case.shape, provider, mode))
        return {"op": case.op, "provider": provider, "mode": mode, "shape": case.shape, "dtype": case.dtype} | {
            "status": "skipped: not timed in this test"
        }

    monkeypatch.setattr(run, "_measure_one", measure_one)
    monkeypatch.setattr(providers, "unavailable", lambda provider: "not here" if provider == "tokamax" else None)
    argv = ["--op", "rms_norm", "--sweep", "hidden", "--sweep-mode", "full", "--out", str(tmp_path)]
    rows = run.run(
        run.parser().parse_args([*argv, "--provider", "liger_jax", "xla", "tokamax", "--sweep-provider", "xla"])
    )
    target = "tokens=16384,hidden=4096"  # a target shape, in the hidden sweep too: every provider, every mode
    swept = {shape_string(p) for p in OPS["rms_norm"].sweeps["hidden"][1]} - {target}
    assert {(shape, provider, mode) for shape, provider, mode in measured if shape != target} == {
        (shape, "xla", "full") for shape in swept
    }
    assert {(p, m) for shape, p, m in measured if shape == target} == {
        (p, m) for p in ("liger_jax", "xla") for m in MODES
    }
    skipped = {(r["shape"], r["mode"], r["status"]) for r in rows if r["provider"] == "tokamax"}
    assert skipped == {(target, mode, "skipped: not here") for mode in MODES}


def test_issue_19_shapes_are_in_the_sweeps():
    for name in ("rms_norm", "layer_norm", "fused_add_rms_norm"):
        assert {16384, 32768} <= {p["hidden"] for p in OPS[name].sweeps["hidden"][1]}
    axis, points = OPS["rms_norm"].sweeps["tokens"]
    line = sweep_line(axis, points)
    assert line == {"hidden": 4096}
    assert [off_line(axis, p, line) for p in points] == [{"hidden": 768}, {}, {}, {}, {}]
    for name, op in OPS.items():  # every token sweep holds the main job's small preset at batch 16 x 128
        if "tokens" in op.sweeps:
            axis, points = op.sweeps["tokens"]
            small = [p for p in points if off_line(axis, p, sweep_line(axis, points))]
            assert [p.get("tokens", p.get("batch", 0) * p.get("seq", 0)) for p in small] == [2048], name


class _FakeKernel:
    """A liger_jax provider whose default (``implementation=None``) is its XLA path, or a kernel, as asked."""

    def __init__(self, default_is_xla):
        self.default_is_xla = default_is_xla

    def with_implementation(self, implementation):
        import jax
        import jax.numpy as jnp

        @jax.custom_vjp  # made anew on each call, as an op's custom_vjp closes over its options
        def xla_path(x):
            return jnp.sin(x)

        xla_path.defvjp(lambda x: (xla_path(x), x), lambda x, g: (g * jnp.cos(x),))
        if implementation == "xla" or (implementation is None and self.default_is_xla):
            return xla_path
        return lambda x: jax.pure_callback(jnp.sin, jax.ShapeDtypeStruct(x.shape, x.dtype), x)


@pytest.mark.parametrize("default_is_xla", [True, False])
def test_the_size_rules_choice_is_read_from_the_traced_program(default_is_xla):
    import jax

    from benchmarks.case import Case

    make_inputs = lambda key: (jax.random.normal(key, (4, 8)),)  # noqa: E731
    kernel = _FakeKernel(default_is_xla)
    params = {"rows": 4, "default_is_xla": int(default_is_xla)}
    case = Case("fake", params, "float32", make_inputs, (0,), {"liger_jax": kernel}, {}, {})
    assert providers.size_rule_picks_xla(case) is default_is_xla


def _full_row(op, shape, provider, ms, **fields):
    row = {"op": op, "provider": provider, "mode": "full", "shape": shape, "dtype": "bfloat16", "status": "ok"}
    row |= {"ms": ms, "p20_ms": ms, "p80_ms": ms, "gb_per_s": 1.0, "tflop_per_s": None, "floor_ms": ms / 2}
    return row | {"fraction_of_floor": 0.5, "temp_bytes": 0} | fields


def test_report_flags_every_sweep_shape_below_the_bar():
    small, mid, large = "tokens=2048,hidden=768", "tokens=2048,hidden=4096", "tokens=8192,hidden=4096"
    largest = "tokens=65536,hidden=4096"
    rows = [
        _full_row("rms_norm", small, "liger_jax", 0.050, implementation="triton"),
        _full_row("rms_norm", small, "xla", 0.040),
        _full_row("rms_norm", mid, "liger_jax", 0.046, implementation="triton"),
        _full_row("rms_norm", mid, "xla", 0.075),
        _full_row("rms_norm", large, "liger_jax", 0.210, default_implementation="xla"),  # the size rule picks XLA
        _full_row("rms_norm", large, "xla", 0.200),
        _full_row("rms_norm", largest, "liger_jax", 0.700, default_implementation="xla"),  # a rule to retune
        _full_row("rms_norm", largest, "xla", 1.400),
    ]
    text = report.render(rows, set(), "# head\n")
    assert "| rms_norm | tokens | tokens=2048,hidden=768 | 0.050 | 0.040 | 0.80x | **below 0.97x** |" in text
    assert "| rms_norm | tokens | tokens=2048,hidden=4096 | 0.046 | 0.075 | 1.63x | ok |" in text
    assert "| rms_norm | tokens | tokens=8192,hidden=4096 | 0.210 | 0.200 | 0.95x | XLA by the size rule |" in text
    assert "| tokens=65536,hidden=4096 | 0.700 | 1.40 | 2.00x | ok, though the size rule picks XLA |" in text
    assert "| 2048 (hidden=768) | 0.050 (**0.80x**, 50%) | 0.040 (1.00x, 50%) |" in text
    assert "| 8192 | 0.210 (0.95x, 50%, XLA by the size rule) | 0.200 (1.00x, 50%) |" in text
    goal = next(line for line in text.splitlines() if "every sweep shape" in line)
    assert "3 of 4 shapes; below: rms_norm tokens=2048,hidden=768 0.80x;" in goal and goal.endswith("| **missed** |")


@pytest.mark.parametrize("name", ["rms_norm", "layer_norm", "fused_linear_cross_entropy", "gated_linear_unit"])
def test_tokamax_provider_computes_what_the_xla_baseline_computes(name, full_precision_matmuls):
    pytest.importorskip("tokamax")
    import jax
    import numpy as np

    params = next(p for p, dtype in OPS[name].smoke if dtype == "float32")
    case = build_case(name, params, "float32")
    args = case.make_inputs(jax.random.key(0))
    tokamax = case.providers["tokamax"]
    through_xla = functools.partial(tokamax.call, tokamax_provider.tokamax_module(), "xla")
    ours, baseline = (_value_and_grads(fn, args, case.diff_argnums) for fn in (through_xla, case.providers["xla"]))
    for got, want in zip(ours, baseline, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_tokamax_provider_falls_back_to_the_first_implementation_that_runs(monkeypatch):
    pytest.importorskip("tokamax")
    monkeypatch.setitem(tokamax_provider.PREFERENCES, "layer_norm", ("no_such_kernel", "xla"))
    monkeypatch.setattr(tokamax_provider, "_CHOSEN", {})
    case = build_case("layer_norm", OPS["layer_norm"].smoke[0][0], "float32")
    row = providers.implementation(case, "tokamax")
    assert row == {
        "implementation": "xla",
        "implementation_note": "no_such_kernel: ValueError: Unknown implementation: no_such_kernel",
    }


def _value_and_grads(fn, args, diff_argnums):
    """``sum(fn(*args))`` in fp32 and its gradients with respect to ``diff_argnums``."""
    import jax
    import jax.numpy as jnp

    def total(*differentiated):
        full = list(args)
        for argnum, value in zip(diff_argnums, differentiated, strict=True):
            full[argnum] = value
        return jnp.sum(fn(*full).astype(jnp.float32))

    value, grads = jax.value_and_grad(total, argnums=tuple(range(len(diff_argnums))))(*(args[i] for i in diff_argnums))
    return [value, *grads]


def test_resume_knows_what_finished_and_what_died_in_flight(tmp_path):
    done = {"op": "rms_norm", "provider": "xla", "mode": "full", "shape": "tokens=1,hidden=1", "dtype": "float32"}
    died = done | {"provider": "liger_jax"}
    for row in (done | {"kind": "attempt"}, done | {"status": "ok"}, died | {"kind": "attempt"}):
        results.append(tmp_path, row)
    finished, in_flight = run._previous(tmp_path)
    assert finished == {tuple(done.values())} and in_flight == {tuple(died.values())}


def _trial_args(**values):
    return argparse.Namespace(**({"batch": 8, "phase": "same_batch", "attention": None} | values))


def test_largest_batch_trial_runs_the_next_smaller_fit_after_running_out_of_memory(monkeypatch):
    def search(self):
        return {
            "max_batch": 41,
            "status": "converged",
            "budget_bytes": 100,
            "footprints": {0: 5, 8: 30, 40: 98, 41: 99},
        }

    def measure(self, phase, batch):
        return {"phase": phase, "batch": batch, "status": "oom: RESOURCE_EXHAUSTED" if batch == 41 else "ok"}

    monkeypatch.setattr(e2e_trial._Session, "search", search)
    monkeypatch.setattr(e2e_trial._Session, "measure", measure)
    same = list(e2e_trial._runs(_trial_args(batch=4)))
    largest = list(e2e_trial._runs(_trial_args(phase="max_batch")))
    assert [(r["phase"], r["batch"], r["status"][:3]) for r in same + largest] == [
        ("same_batch", 4, "ok"),
        ("max_batch_oom", 41, "oom"),
        ("max_batch", 40, "ok"),
    ]
    assert largest[-1]["search"]["max_batch"] == 41


def test_largest_batch_trial_says_why_it_found_no_batch(monkeypatch):
    monkeypatch.setattr(e2e_trial._Session, "search", lambda self: {"attention": "cudnn", "status": "error: boom"})
    assert [r["status"] for r in e2e_trial._runs(_trial_args(phase="max_batch"))] == ["error: boom"]


def test_e2e_runs_same_batches_first_and_seeds_each_search_with_its_footprint(monkeypatch, tmp_path):
    calls = []

    def trial(args, provider, phase, time_s, start_footprint=None):
        calls.append((provider, phase, start_footprint, time_s))
        sizes = {"arg_bytes": 10, "out_bytes": 10, "alias_bytes": 10, "temp_bytes": 5 if provider == "xla" else 3}
        return [{"phase": phase, "batch": 8, "status": "ok", "compile_s": 20.0 if provider == "xla" else 17.0} | sizes]

    monkeypatch.setattr(e2e, "_trial", trial)
    args = e2e.parse(["--out", str(tmp_path)])
    rows = e2e.run_e2e(args, deadline=__import__("time").monotonic() + 600)
    # The quicker compile searches first and leaves time to the slower.
    assert [c[:3] for c in calls] == [
        ("xla", "same_batch", None),
        ("liger_jax", "same_batch", None),
        ("liger_jax", "max_batch", 13),
        ("xla", "max_batch", 15),
    ]
    first_search_s, last_search_s = calls[2][3], calls[3][3]
    assert first_search_s <= 600 - e2e.SEARCH_TRIAL_MIN_S - 2 * e2e.TIMEOUT_GRACE_S < last_search_s
    assert len(rows) == 4 and len(results.load(tmp_path / results.JSONL)) == 4


class _RefusingTrial:
    """A trial whose every piece of work fails as cuDNN does when it cannot build its attention graph."""

    made = []

    def __init__(self, provider, config, seq, precision, attention, remat):
        self.made.append(attention)


def _refused(trial):
    raise RuntimeError("cuDNN could not build the graph")


@pytest.mark.parametrize(("phase", "attentions"), [("same_batch", ["cudnn", None]), ("max_batch", ["cudnn"])])
def test_only_a_same_batch_run_falls_back_from_cudnn_to_xla_attention(monkeypatch, phase, attentions):
    monkeypatch.setattr(e2e_trial, "Trial", _RefusingTrial)
    _RefusingTrial.made = []
    args = argparse.Namespace(phase=phase, provider="xla", config="tiny", seq=8, precision="bf16", remat=False)
    row = e2e_trial._Session(argparse.Namespace(attention="cudnn", **vars(args))).attempt(_refused)
    assert _RefusingTrial.made == attentions
    assert row["status"] == "error: RuntimeError: cuDNN could not build the graph"


def test_e2e_verdicts_compare_runs_with_the_same_remat_setting():
    def row(provider, phase, remat, batch, peak_gib, tokens_per_s):
        return {"provider": provider, "phase": phase, "remat": remat, "batch": batch, "status": "ok"} | {
            "peak_bytes": peak_gib * 2**30,
            "tokens_per_s": tokens_per_s,
        }

    rows = [
        row("liger_jax", "same_batch", False, 8, 27.0, 70.0),
        row("xla", "same_batch", False, 8, 37.0, 68.0),
        row("liger_jax", "same_batch", True, 8, 9.0, 55.0),
        row("xla", "same_batch", True, 8, 20.0, 50.0),
        row("xla", "same_batch", True, 16, 33.0, 50.0),
        row("liger_jax", "same_batch", True, 16, 12.0, 55.0),
        row("liger_jax", "same_batch", True, 32, 14.0, 55.0),  # no XLA run at this batch: no ratio
        row("liger_jax", "max_batch", True, 90, 130.0, 66.0),
        row("xla", "max_batch", True, 40, 130.0, 50.0),
    ]
    verdicts = targets.e2e_verdicts(rows)
    assert [(measured, met) for _, _, measured, met in verdicts] == [
        ("1.37x lower (batch 8)", False),
        ("not measured", None),
        ("2.22x lower (batch 8)", True),
        ("2.75x lower (batch 16)", True),
        ("1.32x (batch 90 vs 40)", True),
    ]
    assert verdicts[2][1].endswith("(both remat)")
    assert {issue for issue, *_ in verdicts} == {6}


def test_e2e_memory_verdict_waits_for_measured_peaks():
    rows = [
        {"provider": p, "phase": "same_batch", "remat": False, "batch": 2, "status": "ok", "peak_bytes": None}
        for p in ("liger_jax", "xla")
    ]
    assert targets.e2e_verdicts(rows)[0][2:] == ("not measured", None)


def test_e2e_table_says_whether_each_largest_batch_search_converged():
    search = {"status": "converged", "budget_bytes": 100, "footprints": {"0": 5, "8": 30, "39": 99, "40": 101}}
    rows = [
        {"provider": "xla", "phase": "max_batch", "batch": 39, "status": "ok", "search": search},
        {"provider": "xla", "phase": "same_batch", "batch": 8, "status": "ok"},
    ]
    table = report._e2e(rows)
    assert "| converged; 40 too big | ok |" in table and "| – | ok |" in table


def test_tunix_rows_are_judged_by_their_own_goals_apart_from_the_llama_rows():
    from benchmarks import tunix_models

    def row(config, provider, phase, batch, peak_gib, tokens_per_s, loss_fn=tunix_models.PEFT_LOSS_FN):
        return {"config": config, "provider": provider, "phase": phase, "batch": batch, "remat": False} | {
            "status": "ok",
            "peak_bytes": peak_gib * 2**30,
            "tokens_per_s": tokens_per_s,
            "loss_fn": loss_fn if provider == "liger_jax" else "tunix default",
        }

    rows = [
        row("1b", "liger_jax", "same_batch", 8, 27.0, 70.0),
        row("1b", "xla", "same_batch", 8, 37.0, 68.0),
        row("tunix-gemma3-1b", "xla", "same_batch", 8, 90.0, 50.0),
        row("tunix-gemma3-1b", "liger_jax", "same_batch", 8, 30.0, 56.0),
        row("tunix-gemma3-1b", "xla", "max_batch", 12, 130.0, 50.0),
        row("tunix-gemma3-1b", "liger_jax", "max_batch", 30, 130.0, 54.0),
        row("tunix-llama3-1b", "xla", "max_batch", 10, 130.0, 40.0),
        row("tunix-llama3-1b", "liger_jax", "max_batch", 11, 130.0, 48.0, loss_fn="tunix default: missing"),
    ]
    verdicts = targets.e2e_verdicts(rows)
    assert [(measured, met) for _, _, measured, met in verdicts] == [
        ("1.37x lower (batch 8)", False),  # the bundled Llama's, not mixed with Tunix's batch 8
        ("not measured", None),
        ("3.00x lower (batch 8)", True),
        ("1.08x (batch 30 vs 12)", False),
        ("1.20x (batch 11 vs 10), but liger ran tunix default: missing", None),
    ]
    assert [goal.split(":")[0] for _, goal, _, _ in verdicts[2:]] == ["tunix-gemma3-1b"] * 2 + ["tunix-llama3-1b"]
    assert [issue for issue, *_ in verdicts] == [6, 6, 18, 18, 18]
    tables = report._e2e(rows)
    assert "## End to end: Llama `1b`" in tables and "## End to end: Tunix `tunix-gemma3-1b`" in tables


def test_tunix_smoke_runs_each_provider_once_for_both_phases(tmp_path):
    import time

    pytest.importorskip("tunix")
    from benchmarks import tunix_models

    argv = ["--smoke", "--combined", "--models", "tunix-gemma3-1b", "--capacity-from-batch", "2"]
    argv += ["--out", str(tmp_path)]
    rows = e2e.run_e2e(e2e.parse(argv), deadline=time.monotonic() + 300)
    assert [(r["provider"], r["phase"], r["batch"], r["status"]) for r in rows] == [
        (provider, phase, 2, "ok") for provider in ("xla", "liger_jax") for phase in ("same_batch", "max_batch")
    ]
    assert {r["config"] for r in rows} == {"tunix-gemma3-tiny"} and len(results.load(tmp_path / results.JSONL)) == 4
    xla, liger = rows[0], rows[2]
    assert xla["loss_fn"] == "tunix default" and liger["loss_fn"] == tunix_models.PEFT_LOSS_FN
    assert liger["swaps"]["rms_norm"] > 0
    # The same random model and tokens, one warm-up step then one timed step: the same loss up to bf16 rounding.
    assert liger["loss"] == pytest.approx(xla["loss"], rel=1e-2)


@pytest.mark.parametrize("name", ["multi_token_attention", "fused_neighborhood_attention"])
def test_score_attention_cases_agree_with_xla_at_their_smoke_sizes(name):
    # Values at every smoke size; gradients in float32 (two bf16 backward passes differ by more than one bf16
    # rounding; the ops' own tests check bf16 gradients against a float64 oracle).
    import jax
    import jax.numpy as jnp

    from tests import harness

    def loss(case, provider, *args):
        return jnp.sum(case.providers[provider](*args).astype(jnp.float32) ** 2)

    for params, dtype in OPS[name].smoke:
        case = build_case(name, params, dtype)
        args = case.make_inputs(jax.random.key(0))
        harness.assert_close(case.providers["liger_jax"](*args), case.providers["xla"](*args), jnp.dtype(dtype))
        if dtype == "float32":
            kernel_grads, xla_grads = (
                jax.grad(functools.partial(loss, case, provider), argnums=case.diff_argnums)(*args)
                for provider in ("liger_jax", "xla")
            )
            harness.assert_close_trees(kernel_grads, xla_grads, jnp.float32)


def test_an_output_residual_op_gets_its_own_donated_cotangent_fed_from_its_gradient():
    import jax
    import jax.numpy as jnp
    import numpy as np

    from benchmarks import measure, modes

    case = build_case("softmax", {"tokens": 3, "cols": 5}, "float32")
    assert case.cotangent_is_residual
    body, make = measure.mode_program(case, "xla", "full")
    args, cotangent = make(jax.random.key(0))
    assert cotangent.shape == (3, 5)  # drawn, not the forward's output
    split, run_once = modes.recycling(body, case.diff_argnums, case.dead_argnums, cotangent_from_gradient=True)
    kept, donated = split(args, cotangent)
    [x] = args
    assert kept == (x,) and donated == ((), cotangent)  # only the cotangent is donated
    (dead, next_cotangent), (y, other_gradients) = run_once(kept, donated)
    expected_y, pullback = jax.vjp(jax.nn.softmax, x)
    np.testing.assert_allclose(y, expected_y, rtol=1e-6)
    np.testing.assert_allclose(next_cotangent, pullback(cotangent)[0], rtol=1e-5, atol=1e-7)
    assert dead == () and other_gradients == ()
    assert not jnp.array_equal(next_cotangent, cotangent)


def test_a_loss_with_dead_logits_donates_them_and_the_cotangent_and_keeps_the_labels():
    import jax

    from benchmarks import measure, modes

    case = build_case("cross_entropy", OPS["cross_entropy"].smoke[0][0], "float32")
    body, make = measure.mode_program(case, "xla", "full")
    args, cotangent = make(jax.random.key(0))
    split, run_once = modes.recycling(body, case.diff_argnums, case.dead_argnums)
    kept, donated = split(args, cotangent)
    assert kept[0] is None and kept[1] is args[1] and donated == ((args[0],), cotangent)
    (dead, same_cotangent), _ = run_once(kept, donated)
    assert dead[0].shape == args[0].shape and same_cotangent is cotangent


def test_kernel_times_runs_every_tiling_of_a_case(capsys):
    from benchmarks import kernel_times

    kernel_times.main(["softmax:tokens=8,cols=16", "--warps", "2"])
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[2] for line in lines] == ["rule", "r1/w2"]


def test_kernel_counters_reads_ncu_raw_csv_after_the_programs_own_lines():
    from benchmarks import kernel_counters

    metrics = list(kernel_counters.METRICS.values())
    header = ",".join(f'"{name}"' for name in ["ID", "Kernel Name", *metrics])
    units = ",".join(['""', '""'] + ['""'] * len(metrics))
    values = {metric: '"1"' for metric in metrics}
    values |= {
        "gpu__time_duration.sum": '"391,680"',
        "dram__bytes_read.sum": '"577,580,800"',
        "launch__grid_size": '"256"',
    }
    row = ",".join(['"0"', '"rms_norm_bwd"'] + [values[metric] for metric in metrics])
    table = kernel_counters.counters_table("\n".join(["==PROF== Connected", header, units, row]))
    assert table.loc[0, "kernel"] == "rms_norm_bwd"
    assert table.loc[0, "us"] == pytest.approx(391.68) and table.loc[0, "read MB"] == pytest.approx(577.5808)
    assert table.loc[0, "grid"] == 256 and table.loc[0, "DRAM %"] == 1
    with pytest.raises(ValueError, match="no ncu CSV table"):
        kernel_counters.counters_table("==PROF== No kernels were profiled.")


def test_kernel_counters_child_runs_a_case_under_a_parsed_override():
    from benchmarks import kernel_counters
    from liger_jax.ops import _tiling

    override = kernel_counters.parse_override("block_d=16,num_warps=2,prefetch=false")
    assert override == _tiling.TilingOverride(block_d=16, num_warps=2, prefetch=False)
    kernel_counters.main(["--child", "softmax:tokens=8,cols=40", "--override", "block_d=16,num_warps=2"])


def test_kernel_counters_knows_every_launched_kernel_by_its_function_name():
    from benchmarks import kernel_counters

    names = kernel_counters.liger_kernel_names()
    assert {"rms_norm_bwd", "group_norm_split_moments", "cross_entropy_loss_and_grad", "rope"} <= names
    assert not any("fusion" in name for name in names)
    pattern = re.compile(kernel_counters.liger_kernels_regex())
    assert pattern.match("rms_norm_bwd") and pattern.match("rope")
    assert not pattern.match("rms_norm_bwd_1") and not pattern.match("loop_add_fusion")


def test_main_job_interleaves_the_ablations_and_tables_each_against_flax(tmp_path, monkeypatch):
    rates = {
        "--liger": 130.0,
        "--no-liger": 100.0,
        "--liger --keep rope": 120.0,
        "--liger --keep swiglu --keep rms_norm": 90.0,
    }
    calls = []

    def fake_run(preset, batch, seq, variant, steps, timeout_s):
        swap = " ".join(main_job._flags(variant))
        calls.append((preset, swap))
        return {"tokens_per_s": rates[swap] + len(calls) * 1e-3}

    monkeypatch.setattr(main_job, "_run", fake_run)
    argv = [
        "main_job",
        "--out",
        str(tmp_path),
        "--preset",
        "tiny:2:16",
        "--runs",
        "2",
        "--ablate",
        "rope",
        "swiglu,rms_norm",
    ]
    monkeypatch.setattr("sys.argv", argv)
    main_job.main()
    assert [swap for _, swap in calls] == list(rates) * 2
    table = (tmp_path / "main_job.md").read_text().splitlines()
    assert table[2].startswith("| tiny (2 x 16) | 130 | 100 | 1.300x | 2 / 2 |")
    assert table[3].startswith("| tiny (2 x 16), keeps rope as flax's | 120 | 100 | 1.200x |")
    assert table[4].startswith("| tiny (2 x 16), keeps swiglu, rms_norm as flax's | 90 | 100 | 0.900x |")
