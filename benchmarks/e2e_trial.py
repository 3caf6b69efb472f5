"""One end-to-end trial, in its own process: a Llama training step with or without liger, timed or sized.

``python -m benchmarks.e2e_trial run --provider liger_jax --batch 8`` compiles the jitted optimizer step (AdamW,
donated state), runs warm-up and timed steps and prints a JSON row: tokens/s, step time, peak device bytes (this
fresh process's), compiled temp bytes, the last loss. With ``--phase max_batch`` the row is the largest-batch run,
and an out-of-memory (its row says ``oom``) is followed by a run at one batch less. Each phase needs its own
process: one that ran a smaller batch keeps that step's freed buffers cached, and the largest step's one temporary
buffer then no longer fits (seen on the H200: 103 GiB refused at a footprint 15% under the limit).

``python -m benchmarks.e2e_trial probe --provider xla --batch 8`` finds, without running anything, the largest
batch whose compiled footprint (arguments + outputs − donated + temporaries) fits in ``FIT`` of the device's
memory limit: it compiles batches until one that fits and the next one up that does not are found (see
:func:`probe`). It holds no arrays and runs nothing on the GPU (autotuning is off for it), so it can
run beside a timed trial.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Iterator, Sequence
from typing import Any

_STARTED = time.perf_counter()
FIT = 0.95  # of the allocator's limit: room for fragmentation and the workspaces outside XLA's buffer plan
MAX_PROBES = 10  # compiles per search, each ~20 s for the 1b model
PRECISIONS = {"bf16": ("bfloat16", "bfloat16"), "mixed": ("bfloat16", "float32")}  # (compute, params) dtypes


class Trial:
    """The model, optimizer and jitted step for one (provider, config, seq, precision, attention)."""

    def __init__(self, provider: str, config: str, seq: int, precision: str, attention: str | None, remat: bool):
        import jax
        from flax import nnx

        from benchmarks.providers import LIGER_JAX, kernel_implementation
        from liger_jax.flax_layers import apply_liger
        from liger_jax.models import LlamaForCausalLM, llama_config
        from liger_jax.models.training import adamw_cosine, init_train_state, make_train_step

        compute, params = PRECISIONS[precision]
        self.config = llama_config(config, dtype=compute, param_dtype=params, attention=attention, remat=remat)
        self.seq = seq
        self.optimizer = adamw_cosine(3e-4, 1000, warmup_steps=10)
        graphdefs = []

        def build():
            model = LlamaForCausalLM(self.config, rngs=nnx.Rngs(0))
            if provider == LIGER_JAX:
                apply_liger(model, implementation=kernel_implementation())
            graphdef, state = init_train_state(model, self.optimizer)
            graphdefs.append(graphdef)
            return state

        self.build = jax.jit(build)
        self.abstract_state = jax.eval_shape(build)
        self.step = make_train_step(graphdefs[0], self.optimizer)

    def batch_specs(self, batch: int):
        """Abstract ``(tokens, labels)`` for ``batch`` sequences."""
        import jax
        import jax.numpy as jnp

        spec = jax.ShapeDtypeStruct((batch, self.seq), jnp.int32)
        return spec, spec

    def compile(self, batch: int):
        """The step compiled for ``batch`` sequences, from abstract inputs (nothing is allocated)."""
        return self.step.lower(self.abstract_state, *self.batch_specs(batch)).compile()

    def footprint(self, batch: int) -> int:
        """Device bytes the compiled step needs at ``batch``: arguments + outputs − donated + temporaries."""
        from benchmarks.memory import compiled_memory

        m = compiled_memory(self.compile(batch))
        return m["arg_bytes"] + m["out_bytes"] - m["alias_bytes"] + m["temp_bytes"]


def run(trial: Trial, batch: int, steps: int, warmup: int, state: Any) -> tuple[dict[str, Any], Any]:
    """Compiles the step for ``batch``, runs ``warmup`` + ``steps`` steps on ``state`` (built if None).

    Returns:
        ``(row, state)``: what was measured, and the trained state (the input state was donated).
    """
    import jax

    from benchmarks.memory import compiled_memory, jax_memory_stats

    start = time.perf_counter()
    compiled = trial.compile(batch)
    row = {"compile_s": time.perf_counter() - start, **compiled_memory(compiled)}
    _stage(f"compiled batch {batch}")
    row["compile_peak_bytes"] = jax_memory_stats().get("peak_bytes_in_use")
    if state is None:
        build = trial.build.lower().compile()
        _stage("state's initialiser compiled")
        state = build()
        jax.block_until_ready(state)
        _stage("state built")
    key_tokens, key_labels = jax.random.split(jax.random.key(batch))
    vocab = trial.config.vocab_size
    tokens = jax.random.randint(key_tokens, (batch, trial.seq), 0, vocab, dtype="int32")
    labels = jax.random.randint(key_labels, (batch, trial.seq), 0, vocab, dtype="int32")
    for _ in range(warmup):
        state, loss = compiled(state, tokens, labels)
    jax.block_until_ready((state, loss))
    _stage(f"{warmup} warm-up steps done")
    start = time.perf_counter()
    for _ in range(steps):
        state, loss = compiled(state, tokens, labels)
    jax.block_until_ready((state, loss))
    elapsed = time.perf_counter() - start
    loss = float(loss)
    row |= {
        "tokens_per_s": batch * trial.seq * steps / elapsed,
        "step_ms": 1e3 * elapsed / steps,
        "peak_bytes": jax_memory_stats().get("peak_bytes_in_use"),
        "loss": loss,
        "status": "ok" if math.isfinite(loss) else f"error: loss is {loss}",
    }
    return row, state


def _stage(what: str) -> None:
    """Progress on stderr (seconds since the process started), which the driver quotes if the trial runs past
    its time limit."""
    print(f"e2e_trial: {what} at {time.perf_counter() - _STARTED:.0f} s", file=sys.stderr, flush=True)


def probe(trial: Trial, start: int, capacity_from_batch: int | None) -> dict[str, Any]:
    """The largest batch whose footprint fits in ``FIT`` × the memory limit, and the footprints it compiled.

    Footprints grow about linearly in the batch, but not exactly: buffer assignment, layout choices, and XLA's own
    rematerialisation, which holds the footprint flat near its own limit (on the H200 a line through two such
    batches of XLA's step, ~117 GB with the budget at 135 GB, pointed at batch 1.9e10). So the search
    brackets the answer between the largest batch seen to fit and the smallest seen to fail, and narrows it with
    lines through known footprints: before a failure it at most doubles the batch where the footprint flattens;
    after one it bisects when the lines stop halving the bracket. At most ``MAX_PROBES`` compiles; the answer is
    the largest batch seen to fit. A batch that does not compile (past int32 extents, or cuDNN's limits) does not
    fit; its error is kept in ``errors``.
    ``capacity_from_batch`` pretends the device holds exactly that batch (CPU smoke runs, which have no limit).
    """
    from benchmarks.memory import jax_memory_stats

    sizes: dict[int, int] = {}
    errors: dict[int, str] = {}

    def size(batch: int) -> int:
        if batch not in sizes:
            sizes[batch] = trial.footprint(batch)
            _stage(f"batch {batch}: footprint {sizes[batch] / 1e9:.1f} GB")
        return sizes[batch]

    def fits_budget(batch: int) -> bool:
        try:
            return size(batch) <= budget
        except Exception as error:  # the search goes on below this batch; the row says why it failed
            errors[batch] = f"{type(error).__name__}: {error}".splitlines()[0][:200]
            return False

    budget = FIT * jax_memory_stats()["bytes_limit"] if capacity_from_batch is None else size(capacity_from_batch)
    found = {"budget_bytes": budget, "footprints": sizes, "errors": errors}
    if size(start) > budget:
        return {"max_batch": None} | found
    previous, fits, too_big, chord_turn, widths = start, start, None, False, []
    candidate = 2 * start
    while len(sizes) + len(errors) < MAX_PROBES:
        if fits_budget(candidate):
            previous, fits = fits, candidate
        else:
            too_big = candidate if too_big is None else min(too_big, candidate)
        if too_big is not None and too_big - fits <= 1:
            break
        # The tangent (the line through the last two fitting batches) and, once a batch failed, the chord (through
        # the largest fit and the smallest failure) cross the budget on either side of the answer for a footprint
        # that curves one way: alternate between them, each step shrinking the bracket from its side.
        chord_turn = too_big is not None and not chord_turn
        use_chord = too_big in sizes and (chord_turn or fits == previous)
        left, right = (fits, too_big) if use_chord else (previous, fits)
        slope = (size(right) - size(left)) / (right - left) if right != left else 0.0
        predicted = fits + max(1, math.floor((budget - size(fits)) / slope)) if slope > 0 else None
        if too_big is None:
            average = (size(fits) - size(start)) / (fits - start) if fits != start else slope
            flattening = slope < 0.5 * average
            candidate = 2 * fits if predicted is None or (flattening and predicted > 2 * fits) else predicted
            continue
        widths.append(too_big - fits)
        stalled = len(widths) > 1 and 2 * widths[-1] > widths[-2]
        candidate = (fits + too_big) // 2 if predicted is None or stalled else min(predicted, too_big - 1)
    return {"max_batch": fits} | found


class _Session:
    """One process's trial and model state across runs; a run falls back from cuDNN to XLA attention once.

    cuDNN's fused attention is what training uses on a GPU; should it refuse these shapes, XLA's runs instead. A
    probe does not fall back: XLA attention's footprint is not the run's, and its scores pass int32 dimensions
    from batch 16 (B·32·2048² elements), so the fallback would only hide the cuDNN error.
    """

    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.attention = args.attention
        self.fallback = args.action == "run"
        self.trial: Trial | None = None
        self.state = None

    def attempt(self, work) -> dict[str, Any]:
        """``work(trial)``'s row, or a row whose status says what went wrong (``oom: ...`` or ``error: ...``)."""
        args = self.args
        try:
            if self.trial is None:
                self.trial = Trial(args.provider, args.config, args.seq, args.precision, self.attention, args.remat)
                _stage("model traced")
            return {"attention": self.attention or "xla"} | work(self.trial)
        except Exception as error:  # the driver reads the row; an OOM is a result, not a crash
            self.state = None  # it may have been donated to the failed step
            message = f"{type(error).__name__}: {error}".splitlines()[0][:300]
            if "RESOURCE_EXHAUSTED" in message:
                return {"attention": self.attention or "xla", "status": f"oom: {message}"}
            if self.attention == "cudnn" and self.fallback:
                print(f"attention=cudnn failed ({message}); retrying with XLA attention", file=sys.stderr, flush=True)
                self.attention, self.trial = None, None
                return self.attempt(work)
            return {"attention": self.attention or "xla", "status": f"error: {message}"}

    def measure(self, phase: str, batch: int) -> dict[str, Any]:
        """One timed run at ``batch``, continuing from the state of the last one."""

        def work(trial: Trial) -> dict[str, Any]:
            row, self.state = run(trial, batch, self.args.steps, self.args.warmup, self.state)
            return row

        return {"phase": phase, "batch": batch} | self.attempt(work)


def _runs(args: argparse.Namespace) -> Iterator[dict[str, Any]]:
    """The rows of ``run``: one run at ``args.batch``; in the max_batch phase one batch less after an OOM."""
    session = _Session(args)
    row = session.measure(args.phase, args.batch)
    if args.phase == "max_batch" and row["status"].startswith("oom") and args.batch > 1:
        yield row | {"phase": "max_batch_oom"}
        row = session.measure(args.phase, args.batch - 1)
    yield row


def main(argv: Sequence[str] | None = None) -> None:
    """Command line: ``run`` prints a JSON row per run, ``probe`` one JSON row."""
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("action", choices=("run", "probe"))
    cli.add_argument("--provider", required=True, choices=("liger_jax", "xla"))
    cli.add_argument("--config", default="1b")
    cli.add_argument("--seq", type=int, default=2048)
    cli.add_argument("--batch", type=int, required=True, help="run: the batch to run; probe: the first compiled")
    cli.add_argument("--phase", default="same_batch", choices=("same_batch", "max_batch"), help="run: the row's phase")
    cli.add_argument("--precision", default="bf16", choices=tuple(PRECISIONS))
    cli.add_argument("--attention", default=None, choices=("cudnn", "xla"))
    cli.add_argument("--remat", action="store_true", help="rematerialise each decoder layer")
    cli.add_argument("--steps", type=int, default=5)
    cli.add_argument("--warmup", type=int, default=2)
    cli.add_argument("--capacity-from-batch", type=int, help="probe: pretend the device holds exactly this batch")
    args = cli.parse_args(argv)
    from benchmarks.providers import prepare_process

    prepare_process()
    import jax

    # XLA inlines every threefry call of the model's initialiser: on the H200 the 1b initialiser took 75 s to
    # compile (its training step, 20 s). Lowered to JAX's CUDA threefry kernel instead, with the same bits.
    jax.config.update("jax_threefry_gpu_kernel_lowering", True)
    base = {"provider": args.provider, "config": args.config, "seq": args.seq, "precision": args.precision}
    base["remat"] = args.remat
    if args.action == "probe":
        found = _Session(args).attempt(
            lambda trial: {"status": "ok"} | probe(trial, args.batch, args.capacity_from_batch)
        )
        print(json.dumps(base | found, default=str), flush=True)
        return
    for row in _runs(args):
        print(json.dumps(base | row, default=str), flush=True)


if __name__ == "__main__":
    main()
