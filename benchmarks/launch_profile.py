"""Where a kernel launch's fixed cost goes on a GPU, and the numbers that decide the launch path and the size rule.

    python -m benchmarks.launch_profile --out OUT             # the H200: ~4 minutes (--budget-s)
    python -m benchmarks.launch_profile --out OUT --smoke     # CPU, tiny sizes, Triton's interpreter
    python -m benchmarks.launch_profile --out OUT --jobs crossover,tiny   # the jobs a budget left out

Each job runs in a fresh process, because XLA's flags and liger_jax's custom call are fixed when a program is
compiled; jobs run in the order below while the time budget lasts. The settings: ``ffi`` (liger_jax's launches
lowered to jaxlib's command-buffer-compatible FFI target, the default) or ``legacy`` (jax-triton 0.3's legacy
custom call), each with XLA's command buffers (CUDA graphs) on, or off (``--xla_gpu_enable_command_buffer=``).

* ``launch``: one jit of 64 chained launches of a trivial kernel, of 64 chained XLA ops (fusion barred), and of 64
  launches each followed by 6 XLA ops: µs per launch in steady state (jits called back to back: the larger of
  device and host time) and on the host alone (enqueueing one jit while the device is idle).
* ``model``: a Llama preset's training step (bf16, cuDNN attention, AdamW, donated state, the batch on the device)
  in a tight loop, against flax's own modules: liger with the default implementation (the size rule applies),
  with every kernel forced (``liger triton``), with RoPE alone forced (``rope triton``, issue 19's 2.3x slowdown),
  with the XLA references (``liger xla``); step and host ms, tokens/s. A profiler trace of some variants,
  summarised: device busy time and kernel count per step, the costliest device kernels and host events.
* ``ops``: each op forward+backward (a random cotangent) at the small preset's shapes: triton, xla, default.
* ``crossover``: each op forward+backward over sizes 4x apart: the first size from which the kernel keeps up
  with XLA, the value for ``liger_jax.ops._dispatch.MIN_KERNEL_ELEMENTS``.

Prints a report and writes it to OUT/report.md, with every number in OUT/results.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# Names the parent uses without importing jax (a GPU process it started would hold memory its children need).
CUSTOM_CALL_ENV = "LIGER_JAX_TRITON_CUSTOM_CALL"  # liger_jax._triton_ffi.ENV_VAR, checked in the child
NO_COMMAND_BUFFERS = "--xla_gpu_enable_command_buffer="
SETTINGS: dict[str, dict[str, str]] = {
    "ffi": {CUSTOM_CALL_ENV: "ffi"},
    "legacy": {CUSTOM_CALL_ENV: "legacy"},
    "ffi, no command buffers": {CUSTOM_CALL_ENV: "ffi", "XLA_FLAGS": NO_COMMAND_BUFFERS},
    "legacy, no command buffers": {CUSTOM_CALL_ENV: "legacy", "XLA_FLAGS": NO_COMMAND_BUFFERS},
}
CHAIN_LENGTH = 64
XLA_OPS_PER_LAUNCH = 6  # more than XLA's default minimum command-buffer size (5): each segment could be a graph
OPS = (
    "rms_norm",
    "layer_norm",
    "fused_add_rms_norm",
    "swiglu",
    "rope",
    "cross_entropy",
    "fused_linear_cross_entropy",
)


@dataclasses.dataclass(frozen=True)
class Job:
    """One child process: a section run under a setting."""

    name: str
    section: str
    setting: str
    params: dict
    estimate_s: float  # on the H200, start-up and compiles included


def _model(
    preset: str,
    variants: list[str],
    layers: int | None = None,
    trace: tuple[str, ...] = (),
    batch: int = 16,
    seq: int = 128,
) -> dict:
    return {"preset": preset, "layers": layers, "variants": variants, "trace": list(trace), "batch": batch, "seq": seq}


JOBS: tuple[Job, ...] = (
    Job("launch-ffi", "launch", "ffi", {}, 15),
    Job("launch-legacy", "launch", "legacy", {}, 15),
    Job(
        "small",
        "model",
        "ffi",
        _model(
            "small",
            ["flax", "liger", "liger-fused_add", "liger triton", "rope triton", "liger xla"],
            trace=("flax", "liger", "rope triton"),
        ),
        105,
    ),
    Job("small4-legacy", "model", "legacy", _model("small", ["flax", "rope triton"], 4, ("rope triton",)), 30),
    Job("small4-legacy-nocb", "model", "legacy, no command buffers", _model("small", ["flax", "rope triton"], 4), 25),
    Job("crossover", "crossover", "ffi", {}, 50),
    Job("ops", "ops", "ffi", {}, 35),
    Job("small4-ffi", "model", "ffi", _model("small", ["flax", "rope triton"], 4), 25),
    Job(
        "tiny",
        "model",
        "ffi",
        _model("tiny", ["flax", "liger", "liger-fused_add", "liger triton", "liger xla"], trace=("flax", "liger")),
        45,
    ),
    Job(
        "small4-kinds",
        "model",
        "ffi",
        _model("small", ["flax", "rms_norm triton", "swiglu triton", "flce triton"], 4),
        30,
    ),
    Job(
        "small4-kinds-xla",
        "model",
        "ffi",
        _model("small", ["flax", "rms_norm xla", "swiglu xla", "rope xla", "flce xla"], 4),
        35,
    ),
    Job("launch-ffi-nocb", "launch", "ffi, no command buffers", {}, 15),
    Job("launch-legacy-nocb", "launch", "legacy, no command buffers", {}, 15),
    Job("small4-ffi-nocb", "model", "ffi, no command buffers", _model("small", ["flax", "rope triton"], 4), 25),
    Job("mini", "model", "ffi", _model("mini", ["flax", "liger", "liger-fused_add", "liger triton"]), 55),
    Job("ops-legacy", "ops", "legacy", {}, 35),
    Job(
        "1b",
        "model",
        "ffi",
        _model(
            "1b",
            ["flax", "liger", "flce triton", "rms_norm triton", "swiglu triton", "rope triton"],
            trace=("flax", "liger"),
            batch=8,
            seq=2048,
        ),
        240,
    ),
)


# ---------------------------------------------------------------------------------------------------- the parent


def main(argv: list[str] | None = None) -> None:
    """Runs the jobs in child processes and writes the report."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="folder for report.md and results.json (required)")
    parser.add_argument("--smoke", action="store_true", help="CPU, tiny sizes, the interpreter: every code path")
    parser.add_argument("--budget-s", type=float, default=240.0, help="skip jobs once their estimate would pass it")
    parser.add_argument("--jobs", default=None, help="comma-separated job names (default: all, in order)")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:
        _run_child(json.loads(args.child))
        return
    if args.out is None:
        parser.error("--out is required")
    chosen = _chosen_jobs(args.jobs)
    args.out.mkdir(parents=True, exist_ok=True)
    started, results = time.perf_counter(), []
    for job in chosen:
        left = args.budget_s - (time.perf_counter() - started)
        if not args.smoke and job.estimate_s > left:
            results.append({"job": dataclasses.asdict(job), "skipped": f"budget: ~{job.estimate_s:.0f} s > {left:.0f}"})
            continue
        print(f"[{time.perf_counter() - started:6.1f} s] {job.name} ({job.setting})", flush=True)
        results.append(_run_job(job, args.smoke, timeout_s=max(120.0, 4 * job.estimate_s)))
    (args.out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    report = "\n".join(_report(results))
    (args.out / "report.md").write_text(report + "\n")
    print(report)


def _chosen_jobs(names: str | None) -> list[Job]:
    if names is None:
        return list(JOBS)
    by_name = {job.name: job for job in JOBS}
    unknown = [name for name in names.split(",") if name not in by_name]
    if unknown:
        raise SystemExit(f"unknown jobs {unknown}; choose from {list(by_name)}")
    return [by_name[name] for name in names.split(",")]


def _run_job(job: Job, smoke: bool, timeout_s: float) -> dict:
    """Runs one job in a child process; its result, or the tail of its error."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.getcwd(), env.get("PYTHONPATH")]))
    settings = dict(SETTINGS[job.setting])
    settings["XLA_FLAGS"] = " ".join(filter(None, [env.get("XLA_FLAGS"), settings.get("XLA_FLAGS")]))
    env |= settings
    if smoke:
        env["TRITON_INTERPRET"] = "1"
    with tempfile.TemporaryDirectory() as scratch:
        spec = {"job": dataclasses.asdict(job), "smoke": smoke, "result": f"{scratch}/result.json", "scratch": scratch}
        command = [sys.executable, "-m", "benchmarks.launch_profile", "--child", json.dumps(spec)]
        started = time.perf_counter()
        try:
            done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return {"job": spec["job"], "error": f"timed out after {timeout_s:.0f} s"}
        result_path = Path(spec["result"])
        if done.returncode or not result_path.exists():
            tail = (done.stderr or done.stdout)[-1500:]
            return {"job": spec["job"], "error": f"exit {done.returncode}: {tail}"}
        result = json.loads(result_path.read_text())
    return {"job": spec["job"], "wall_s": time.perf_counter() - started, **result}


# ----------------------------------------------------------------------------------------------------- the child


def _run_child(spec: dict) -> None:
    import jax

    from liger_jax import _triton_ffi

    assert _triton_ffi.ENV_VAR == CUSTOM_CALL_ENV
    job, smoke = spec["job"], spec["smoke"]
    context = _Context(smoke=smoke, on_gpu=jax.default_backend() in ("gpu", "cuda"), scratch=Path(spec["scratch"]))
    section = {"launch": _launch_section, "model": _model_section, "ops": _ops_section, "crossover": _crossover}
    result = section[job["section"]](context, **job["params"])
    result["device"] = jax.devices()[0].device_kind
    result["custom_call"] = _triton_ffi.custom_call()
    Path(spec["result"]).write_text(json.dumps(result))


@dataclasses.dataclass(frozen=True)
class _Context:
    smoke: bool
    on_gpu: bool
    scratch: Path

    @property
    def kernel(self) -> str:
        """The implementation that runs the kernels here."""
        return "triton" if self.on_gpu else "interpret"

    @property
    def dtype(self):
        import jax.numpy as jnp

        return jnp.bfloat16 if self.on_gpu else jnp.float32

    @property
    def policy(self):
        from benchmarks import timing

        # Samples of several calls back to back: the host enqueues the next while the device runs the last.
        return timing.SMOKE_POLICY if self.smoke else timing.Policy(budget_s=0.4, max_samples=15, sample_s=0.03)


def _timed(context: _Context, call, ops_per_call: int = 1) -> float:
    """Device steady-state ms per op of ``call()`` (returns arrays), called back to back."""
    import jax

    from benchmarks import timing

    def run_batch(n: int) -> float:
        start = time.perf_counter()
        for _ in range(n):
            out = call()
        jax.block_until_ready(out)
        return time.perf_counter() - start

    return timing.time_batches(run_batch, context.policy, ops_per_call).ms


def _host_ms(call, repeats: int = 5) -> float:
    """Median ms for ``call()`` to return (enqueue its work) while the device is idle."""
    import jax
    import numpy as np

    seconds = []
    for _ in range(repeats):
        jax.block_until_ready(call())
        start = time.perf_counter()
        out = call()
        seconds.append(time.perf_counter() - start)
        jax.block_until_ready(out)
    return 1e3 * float(np.median(seconds))


@functools.cache
def _add_one_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def add_one(x_ptr, y_ptr, N: tl.constexpr, BLOCK: tl.constexpr):
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < N
        tl.store(y_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) + 1.0, mask=mask)

    return add_one


def _launch_section(context: _Context) -> dict:
    """µs per trivial launch against µs per XLA op, on the device and on the host."""
    import jax
    import jax.numpy as jnp

    from liger_jax import runtime

    n, size, block = (4, 64, 64) if context.smoke else (CHAIN_LENGTH, 4096, 1024)

    def launch(x):
        return runtime.launch(
            _add_one_kernel(),
            x,
            out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
            grid=(size // block,),
            implementation=context.kernel,
            N=size,
            BLOCK=block,
        )

    def xla_op(x):
        return jax.lax.optimization_barrier(x + 1.0)

    def chain(steps):
        def run(x):
            for _ in range(n):
                for step in steps:
                    x = step(x)
            return x

        return jax.jit(run)

    chains = {
        "xla op": chain([xla_op]),
        "launch": chain([launch]),
        f"launch + {XLA_OPS_PER_LAUNCH} xla ops": chain([launch] + [xla_op] * XLA_OPS_PER_LAUNCH),
    }
    x = jnp.zeros((size,), jnp.float32)
    result = {}
    for name, fn in chains.items():
        jax.block_until_ready(fn(x))
        device_us = 1e3 * _timed(context, lambda fn=fn: fn(x)) / n
        result[name] = {"device_us": device_us, "host_us": 1e3 * _host_ms(lambda fn=fn: fn(x)) / n}
    xla = result["xla op"]
    mixed = result[f"launch + {XLA_OPS_PER_LAUNCH} xla ops"]
    result["launch inside an xla stream"] = {
        kind: mixed[kind] - XLA_OPS_PER_LAUNCH * xla[kind] for kind in ("device_us", "host_us")
    }
    return {"launch": result, "chain": n}


def _swap(model, variant: str, kernel: str) -> None:
    """Applies a variant's liger swaps to ``model`` in place.

    ``variant`` is ``"flax"`` (none) or ``"<kinds> [implementation]"``: kinds ``liger`` (all), ``liger-<kind>``
    (all but one) or one of rms_norm, fused_add (the Llama layer's fused add+RMSNorm), swiglu, rope, flce;
    implementation ``triton`` (``kernel``, forced), ``xla``, or none for the default.
    """
    from liger_jax.flax_layers import apply_liger

    if variant == "flax":
        return
    kinds = {
        "rms_norm": "rms_norm",
        "fused_add": "fused_add_rms_norm",
        "swiglu": "swiglu",
        "rope": "rope",
        "flce": "fused_linear_cross_entropy",
    }
    what, _, implementation = variant.partition(" ")
    left_out = what.removeprefix("liger-") if what.startswith("liger-") else None
    if (what not in ("liger", *kinds) and left_out not in kinds) or implementation not in ("", "triton", "xla"):
        raise ValueError(f"unknown model variant {variant!r}")
    if left_out is not None:
        switches = {kinds[left_out]: False}
    else:
        switches = {} if what == "liger" else {kind: name == what for name, kind in kinds.items()}
    apply_liger(model, implementation={"": None, "triton": kernel}.get(implementation, implementation), **switches)


def _model_section(
    context: _Context, preset: str, layers: int | None, variants: list[str], trace: list[str], batch: int, seq: int
) -> dict:
    """The preset's training step per variant: device and host ms per step, tokens/s, traces."""
    import jax
    from flax import nnx

    from benchmarks import trace_summary
    from liger_jax.models import LlamaForCausalLM, llama_config, training

    batch, seq = (2, 16) if context.smoke else (batch, seq)
    overrides = {"num_layers": 1 if context.smoke else layers} if (layers or context.smoke) else {}
    config = llama_config(
        "tiny" if context.smoke else preset,
        dtype="bfloat16" if context.on_gpu else "float32",
        attention="cudnn" if context.on_gpu else None,
        **overrides,
    )
    keys = jax.random.split(jax.random.key(0), 2)
    tokens, labels = (jax.random.randint(key, (batch, seq), 0, config.vocab_size) for key in keys)
    rows = {}
    for variant in variants:
        model = LlamaForCausalLM(config, rngs=nnx.Rngs(0))
        _swap(model, variant, context.kernel)
        optimizer = training.adamw_cosine(1e-4, 1000, warmup_steps=10)
        graphdef, state = training.init_train_state(model, optimizer)
        started = time.perf_counter()
        step = training.make_train_step(graphdef, optimizer).lower(state, tokens, labels).compile()
        compile_s = time.perf_counter() - started
        holder = [state]

        def call(step=step, holder=holder):
            holder[0], loss = step(holder[0], tokens, labels)
            return loss

        jax.block_until_ready(call())
        step_ms = _timed(context, call)
        row = {"step_ms": step_ms, "host_ms": _host_ms(call), "tokens_per_s": batch * seq / step_ms * 1e3}
        row |= {"compile_s": compile_s, "hlo": hlo_stats(step.as_text())}
        if variant in trace:
            log_dir = context.scratch / variant.replace(" ", "_")
            steps = 2 if context.smoke else 5
            row["trace"] = trace_summary.profiled(call, steps, 30, log_dir)
        rows[variant] = row
    preset = "tiny" if context.smoke else preset
    return {"model": rows, "shape": {"preset": preset, "layers": config.num_layers, "batch": batch, "seq": seq}}


def hlo_stats(text: str) -> dict[str, int]:
    """What an optimized HLO module launches: XLA's command buffers (CUDA graphs, outlined as ``command_buffer``
    computations), its fusions, and its custom calls by target."""
    stats = {
        "command buffers": len(re.findall(r"to_apply=%?command_buffer", text)),
        "fusions": len(re.findall(r" fusion\(", text)),
    }
    for target in re.findall(r'custom_call_target="([^"]+)"', text):
        stats[target] = stats.get(target, 0) + 1
    return stats


def _op_case(context: _Context, op: str, rows: int, wide: bool):
    """``(loss(implementation), diff arrays, (fixed arrays, cotangents), elements)`` for one op on ``rows`` rows.

    ``loss(implementation)(diff, fixed, cotangents)`` is the op's output dotted with random cotangents (a loss op:
    the loss itself), so XLA cannot simplify the backward. ``wide``: the crossover's Llama-3-8B-like widths, else
    the small preset's.
    """
    import jax
    import jax.numpy as jnp
    import numpy as np

    import liger_jax

    if context.smoke:
        hidden, intermediate, vocab, heads, head_dim, seq = 24, 40, 50, (4, 2), 8, 8
    elif wide:
        hidden, intermediate, vocab, heads, head_dim, seq = 2048, 8192, 32000, (32, 8), 128, 128
    else:
        hidden, intermediate, vocab, heads, head_dim, seq = 768, 2048, 32000, (12, 4), 64, 128
    rng = np.random.default_rng(rows)

    def normal(*shape, dtype=context.dtype, scale=1.0):
        return jnp.asarray(scale * rng.standard_normal(shape, np.float32)).astype(dtype)

    labels = jnp.asarray(rng.integers(0, vocab, rows), jnp.int32)
    x = normal(rows, hidden)
    scale = normal(hidden, dtype=jnp.float32)
    match op:
        case "rms_norm":
            fn, diff, fixed = liger_jax.rms_norm, (x, scale), ()
        case "layer_norm":
            fn, diff, fixed = liger_jax.layer_norm, (x, scale, normal(hidden, dtype=jnp.float32)), ()
        case "fused_add_rms_norm":
            fn, diff, fixed = liger_jax.fused_add_rms_norm, (x, normal(rows, hidden), scale), ()
        case "swiglu":
            fn, diff, fixed = liger_jax.swiglu, (normal(rows, intermediate), normal(rows, intermediate)), ()
        case "rope":
            q, k = (normal(rows // seq, seq, h, head_dim) for h in heads)
            fn, diff, fixed = liger_jax.apply_rotary_pos_emb, (q, k), liger_jax.rope_cos_sin(jnp.arange(seq), head_dim)
        case "cross_entropy":
            fn, diff, fixed = liger_jax.cross_entropy, (normal(rows, vocab),), (labels,)
        case "fused_linear_cross_entropy":
            fn, diff, fixed = (
                liger_jax.fused_linear_cross_entropy,
                (x, normal(hidden, vocab, scale=hidden**-0.5)),
                (labels,),
            )
        case _:
            raise ValueError(f"unknown op {op!r}")
    outputs = jax.eval_shape(lambda: fn(*diff, *fixed, implementation="xla"))
    cotangents = tuple(normal(*o.shape, dtype=o.dtype) for o in jax.tree.leaves(outputs) if o.ndim)
    # As liger_jax.ops._dispatch counts them: the main operand, q and k together, the logits FLCE never builds.
    elements = diff[0].size
    if op == "rope":
        elements += diff[1].size
    elif op == "fused_linear_cross_entropy":
        elements = rows * vocab

    def loss(implementation):
        def value(diff, fixed, cotangents):
            out = fn(*diff, *fixed, implementation=implementation)
            if not cotangents:
                return out
            leaves = jax.tree.leaves(out)
            return sum(
                jnp.vdot(a.astype(jnp.float32), c.astype(jnp.float32)) for a, c in zip(leaves, cotangents, strict=True)
            )

        return value

    return loss, diff, (fixed, cotangents), elements


def _fwd_bwd_ms(context: _Context, loss, diff, rest) -> float:
    import jax

    step = jax.jit(jax.value_and_grad(loss))
    jax.block_until_ready(step(diff, *rest))
    return _timed(context, lambda: step(diff, *rest))


def _ops_section(context: _Context) -> dict:
    """Each op fwd+bwd at the small preset's shapes (2048 rows): kernel, XLA and the default."""
    rows = 16 if context.smoke else 2048
    result = {}
    for op in OPS:
        loss, diff, rest, elements = _op_case(context, op, rows, wide=False)
        result[op] = {"elements": elements}
        for name, implementation in (("triton", context.kernel), ("xla", "xla"), ("default", None)):
            result[op][name] = _fwd_bwd_ms(context, loss(implementation), diff, rest)
    return {"ops": result}


# Rows per crossover size, 4x apart (elements at the crossover's widths in the comments). LayerNorm and fused
# add+RMSNorm are the same row-kernel family as RMSNorm, launched the same way: they take its threshold.
CROSSOVER_ROWS: dict[str, tuple[int, ...]] = {
    "rms_norm": (512, 2048, 8192),  # x [rows, 2048]: 1M, 4M, 16M
    "swiglu": (512, 2048, 8192),  # gate [rows, 8192]: 4M, 16M, 67M
    "rope": (256, 1024, 4096),  # q and k [rows, 32 + 8 heads, 128]: 1.3M, 5.2M, 21M
    "cross_entropy": (32, 128, 512),  # logits [rows, 32000]: 1M, 4M, 16M
    "fused_linear_cross_entropy": (128, 512, 2048),  # [rows, 2048] @ [2048, 32000]: 4M, 16M, 66M logits
}
SAME_THRESHOLD_AS = {"layer_norm": "rms_norm", "fused_add_rms_norm": "rms_norm", "geglu": "swiglu"}


def _crossover(context: _Context) -> dict:
    """Each op fwd+bwd over row counts 4x apart at Llama-3-8B-like widths, kernel against XLA."""
    result = {}
    for op, row_counts in CROSSOVER_ROWS.items():
        points = []
        for rows in (8, 16) if context.smoke else row_counts:
            loss, diff, rest, elements = _op_case(context, op, rows, wide=True)
            points.append(
                {
                    "rows": rows,
                    "elements": elements,
                    "triton": _fwd_bwd_ms(context, loss(context.kernel), diff, rest),
                    "xla": _fwd_bwd_ms(context, loss("xla"), diff, rest),
                }
            )
        result[op] = {"points": points, "min_kernel_elements": crossover_elements(points)}
    return {"crossover": result}


def crossover_elements(points: list[dict], tolerance: float = 1.0) -> int | None:
    """The fewest elements from which the kernel is within ``tolerance`` of XLA's time at every larger size measured.

    Args:
        points: ``{"elements", "triton", "xla"}`` per size (ms), any order.
        tolerance: the kernel counts as keeping up while ``triton <= tolerance · xla``.

    Returns:
        That size, or None when the kernel loses at the largest size measured.
    """
    best = None
    for point in sorted(points, key=lambda p: p["elements"], reverse=True):
        if point["triton"] > tolerance * point["xla"]:
            break
        best = point["elements"]
    return best


# ---------------------------------------------------------------------------------------------------- the report


def _report(results: list[dict]) -> list[str]:
    lines = ["# launch profile", ""]
    by_section: dict[str, list[dict]] = {}
    for result in results:
        if "skipped" in result or "error" in result:
            reason = result.get("skipped") or result["error"]
            lines.append(f"- job {result['job']['name']} not measured: {reason}")
            continue
        by_section.setdefault(result["job"]["section"], []).append(result)
    if len(lines) > 2:
        lines.append("")
    if results and all("device" not in r for r in results):
        return lines
    device = next(r["device"] for r in results if "device" in r)
    lines.insert(1, f"device: {device}")
    lines += _decision_lines(by_section)
    lines += _launch_lines(by_section.get("launch", []))
    lines += _model_lines(by_section.get("model", []))
    lines += _ops_lines(by_section.get("ops", []))
    lines += _crossover_lines(by_section.get("crossover", []))
    return lines


def _decision_lines(by_section: dict[str, list[dict]]) -> list[str]:
    """The numbers each decision rests on, gathered from the sections below."""
    lines = ["## what it decides", ""]
    in_stream = f"launch + {XLA_OPS_PER_LAUNCH} xla ops"
    for result in by_section.get("launch", []):
        cost = result["launch"]["launch inside an xla stream"]
        lines.append(
            f"- {result['job']['setting']} ({result['custom_call']}): a launch among XLA ops adds "
            f"{cost['device_us']:.2f} µs in steady state, {cost['host_us']:.2f} µs on the host ({in_stream} chain)"
        )
    lines.append(
        "  -> keep liger_jax._triton_ffi's default ('ffi') if its jobs ran and it is not slower than 'legacy'; "
        "else default to 'legacy' there."
    )
    for result in by_section.get("model", []):
        rows = result["model"]
        if "flax" not in rows:
            continue
        ratios = ", ".join(
            f"{variant} {rows['flax']['step_ms'] / row['step_ms']:.2f}x"
            for variant, row in rows.items()
            if variant != "flax"
        )
        lines.append(f"- {result['job']['name']} ({result['job']['setting']}): vs flax {ratios}")
    lines.append(
        "  -> the main job wins when 'liger' (the default, size rule included) is >= 1.00x flax at every preset."
    )
    if by_section.get("crossover"):
        lines.append("- size rule: set MIN_KERNEL_ELEMENTS in liger_jax/ops/_dispatch.py from the crossover below.")
    return [*lines, ""]


def _launch_lines(results: list[dict]) -> list[str]:
    if not results:
        return []
    names = list(results[0]["launch"])
    lines = [
        f"## launch: µs per call in a jit of {results[0]['chain']} chained calls (back to back, steady state / host "
        "enqueue of one jit while the device is idle)",
        "",
        "| setting (custom call) | " + " | ".join(names) + " |",
        "|---|" + "---|" * len(names),
    ]
    for result in results:
        cells = [f"{result['launch'][n]['device_us']:.2f} / {result['launch'][n]['host_us']:.2f}" for n in names]
        lines.append(f"| {result['job']['setting']} ({result['custom_call']}) | " + " | ".join(cells) + " |")
    return [*lines, ""]


def _model_lines(results: list[dict]) -> list[str]:
    lines = []
    for result in results:
        shape, rows = result["shape"], result["model"]
        flax = rows.get("flax")
        lines += [
            f"## model {result['job']['name']}: {shape['preset']} preset, {shape['layers']} layers, batch "
            f"{shape['batch']} x {shape['seq']}, {result['job']['setting']} ({result['custom_call']})",
            "",
            "| variant | step ms | host ms | tokens/s | vs flax | compile s | optimized HLO |",
            "|---|---|---|---|---|---|---|",
        ]
        for variant, row in rows.items():
            ratio = f"{flax['step_ms'] / row['step_ms']:.2f}x" if flax else "-"
            hlo = ", ".join(f"{name} {count}" for name, count in row["hlo"].items())
            lines.append(
                f"| {variant} | {row['step_ms']:.3f} | {row['host_ms']:.3f} | {row['tokens_per_s']:,.0f} | {ratio} "
                f"| {row['compile_s']:.1f} | {hlo} |"
            )
        lines.append("")
        for variant, row in rows.items():
            if "trace" in row:
                from benchmarks import trace_summary

                lines += ["```", *trace_summary.format_summary(f"trace of {variant}", row["trace"]), "```", ""]
    return lines


def _ops_lines(results: list[dict]) -> list[str]:
    lines = []
    for result in results:
        lines += [
            f"## ops fwd+bwd at the small preset's shapes, ms ({result['job']['setting']}, {result['custom_call']})",
            "",
            "| op | elements | triton | xla | default | xla / triton |",
            "|---|---|---|---|---|---|",
        ]
        for op, row in result["ops"].items():
            lines.append(
                f"| {op} | {row['elements']:,} | {row['triton']:.4f} | {row['xla']:.4f} | {row['default']:.4f} "
                f"| {row['xla'] / row['triton']:.2f}x |"
            )
        lines.append("")
    return lines


def _crossover_lines(results: list[dict]) -> list[str]:
    lines = []
    for result in results:
        lines += [
            f"## crossover fwd+bwd ({result['job']['setting']}, {result['custom_call']}): xla / triton time per size",
            "",
        ]
        suggested = {}
        for op, row in result["crossover"].items():
            cells = [f"{p['elements']:,}: {p['xla'] / p['triton']:.2f}x ({p['triton']:.3f} ms)" for p in row["points"]]
            lines.append(f"- {op}: " + ", ".join(cells))
            suggested[op] = row["min_kernel_elements"]
        suggested |= {op: suggested[like] for op, like in SAME_THRESHOLD_AS.items() if like in suggested}
        lines += [
            "",
            "Suggested `MIN_KERNEL_ELEMENTS` (first size measured from which the kernel keeps up; None: never):",
            "```",
            json.dumps(suggested, indent=1),
            "```",
            "",
        ]
    return lines


if __name__ == "__main__":
    main()
