"""One end-to-end trial, in its own process: a training step with or without liger, timed.

The model is the bundled Llama at a preset (``--config 1b``) or a Tunix model (``--config tunix-gemma3-1b``, see
:mod:`benchmarks.tunix_models`).

``python -m benchmarks.e2e_trial --provider liger_jax --batch 8`` compiles the jitted optimizer step (AdamW,
donated state), runs warm-up and timed steps and prints a JSON row: tokens/s, step time, peak device bytes (this
fresh process's), compiled temp bytes, the last loss.

``--phase max_batch`` first searches for the largest batch whose compiled footprint (arguments + outputs −
donated + temporaries) fits in ``FIT`` of the allocator's limit (see :func:`largest_batch`), then runs the
executable it compiled for that batch; after an out-of-memory, the next smaller batch seen to fit. The search
compiles in this process, as the run does: with XLA's autotuning on, which changes the step XLA builds near the
memory limit (on the H200 the 1b step at batch 81 needed 132 GB compiled without autotuning, 212 GB with it,
because the chosen kernels left XLA's rematerialisation less to remove). Each phase needs its own process: one
that ran a smaller batch keeps that step's freed buffers cached, and the largest step's one temporary buffer
then no longer fits (seen on the H200: 103 GiB refused at a footprint 15% under the limit).

``--phase both`` runs the same batch and then the max_batch phase in one process, saving a process start, a trace
and a compile where a call's budget holds no more (three Tunix models, both providers, in one 10-minute call). It
relies on the driver's preallocated allocator (one region, so the blocks the first run freed coalesce) and on
:func:`run` leaving no buffer behind; an out-of-memory at the largest batch still falls back to the next fit.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

_STARTED = time.perf_counter()
FIT = 0.95  # of the allocator's limit: room for fragmentation and the workspaces outside XLA's buffer plan
MAX_COMPILES = 10  # per search, each 20–30 s for the 1b model with autotuning
RUN_RESERVE_S = 20.0  # of a max_batch trial's time, kept for building the state and running the batch found
WARM_RUN_RESERVE_S = 10.0  # the same in the both phase, whose state initialiser is already compiled
FIRST_COMPILE_S = 30.0  # what the search expects a compile to take before it has timed one
PRECISIONS = {"bf16": ("bfloat16", "bfloat16"), "mixed": ("bfloat16", "float32")}  # (compute, params) dtypes


class StepTrial:
    """The jitted AdamW step (donated state) of the model ``make_model()`` builds, compiled once per batch.

    Subclasses say what a batch is (:meth:`batch_specs`, :meth:`draw_batch`; here ``(tokens, labels)`` int32
    ``[B, S]``) and what a row should add about them (:meth:`describe`).
    """

    def __init__(self, make_model: Callable[[], Any], seq: int, vocab_size: int, loss_fn: Callable | None = None):
        """``loss_fn(model, *batch)``; None: the model's own ``loss(tokens, labels)``."""
        import jax

        from benchmarks.memory import tree_bytes
        from liger_jax.models.training import adamw_cosine, init_train_state, make_train_step

        self.seq, self.vocab_size = seq, vocab_size
        self.optimizer = adamw_cosine(3e-4, 1000, warmup_steps=10)
        graphdefs = []

        def build():
            graphdef, state = init_train_state(make_model(), self.optimizer)
            graphdefs.append(graphdef)
            return state

        self.build = jax.jit(build)
        self.abstract_state = jax.eval_shape(build)
        self.state_bytes = tree_bytes(self.abstract_state)
        self.step = make_train_step(graphdefs[0], self.optimizer, loss_fn=loss_fn)
        self._compiled: dict[int, tuple[Any, float]] = {}
        self._initialiser = None

    def batch_specs(self, batch: int) -> tuple[Any, ...]:
        """Abstract ``(tokens, labels)`` for ``batch`` sequences."""
        import jax
        import jax.numpy as jnp

        spec = jax.ShapeDtypeStruct((batch, self.seq), jnp.int32)
        return spec, spec

    def draw_batch(self, batch: int) -> tuple[Any, ...]:
        """Random ``(tokens, labels)`` for ``batch`` sequences."""
        import jax

        key_tokens, key_labels = jax.random.split(jax.random.key(batch))
        shape = (batch, self.seq)
        return tuple(jax.random.randint(k, shape, 0, self.vocab_size, dtype="int32") for k in (key_tokens, key_labels))

    def describe(self) -> dict[str, Any]:
        """What a row should say about this trial beyond the measurements."""
        return {}

    def initial_state(self) -> Any:
        """A fresh train state, from an initialiser compiled once."""
        if self._initialiser is None:
            self._initialiser = self.build.lower().compile()
            _stage("state's initialiser compiled")
        return self._initialiser()

    def compile(self, batch: int) -> tuple[Any, float]:
        """``(executable, seconds it took to compile)`` for ``batch`` sequences, compiled once per batch from
        abstract inputs: the executable a search judged is the one that runs."""
        if batch not in self._compiled:
            start = time.perf_counter()
            compiled = self.step.lower(self.abstract_state, *self.batch_specs(batch)).compile()
            self._compiled[batch] = (compiled, time.perf_counter() - start)
        return self._compiled[batch]

    def footprint(self, batch: int) -> int:
        """Device bytes the compiled step needs at ``batch``: arguments + outputs − donated + temporaries."""
        from benchmarks.memory import compiled_memory, footprint_bytes

        return footprint_bytes(compiled_memory(self.compile(batch)[0]))


class Trial(StepTrial):
    """The bundled Llama (``liger_jax.models``) for one (provider, config, seq, precision, attention)."""

    def __init__(self, provider: str, config: str, seq: int, precision: str, attention: str | None, remat: bool):
        from flax import nnx

        from benchmarks.providers import LIGER_JAX, kernel_implementation
        from liger_jax.flax_layers import apply_liger
        from liger_jax.models import LlamaForCausalLM, llama_config

        compute, params = PRECISIONS[precision]
        self.config = llama_config(config, dtype=compute, param_dtype=params, attention=attention, remat=remat)

        def make_model():
            model = LlamaForCausalLM(self.config, rngs=nnx.Rngs(0))
            if provider == LIGER_JAX:
                apply_liger(model, implementation=kernel_implementation())
            return model

        super().__init__(make_model, seq, self.config.vocab_size)


def run(trial: StepTrial, batch: int, steps: int, warmup: int) -> dict[str, Any]:
    """Compiles the step for ``batch`` (unless a search did), builds the state, runs ``warmup`` + ``steps`` steps.

    Every device buffer the run made is gone when it returns, so a later run in this process finds the allocator
    as this one did (but for its cached blocks).

    Returns:
        The row: compile seconds and compiled memory, tokens/s, step time, this process's peak bytes, last loss.
    """
    import jax

    from benchmarks.memory import compiled_memory, jax_memory_stats

    compiled, compile_s = trial.compile(batch)
    row = {"compile_s": compile_s, **compiled_memory(compiled)}
    _stage(f"compiled batch {batch}")
    row["compile_peak_bytes"] = jax_memory_stats().get("peak_bytes_in_use")
    state = jax.block_until_ready(trial.initial_state())
    _stage("state built")
    inputs = trial.draw_batch(batch)
    for _ in range(warmup):
        state, _ = compiled(state, *inputs)
    jax.block_until_ready(state)
    _stage(f"{warmup} warm-up steps done")
    start = time.perf_counter()
    for _ in range(steps):
        state, loss = compiled(state, *inputs)
    jax.block_until_ready((state, loss))
    elapsed = time.perf_counter() - start
    loss = float(loss)
    row |= trial.describe()
    return row | {
        "tokens_per_s": batch * trial.seq * steps / elapsed,
        "step_ms": 1e3 * elapsed / steps,
        "peak_bytes": jax_memory_stats().get("peak_bytes_in_use"),
        "loss": loss,
        "status": "ok" if math.isfinite(loss) else f"error: loss is {loss}",
    }


def _stage(what: str) -> None:
    """Progress on stderr (seconds since the process started), which the driver quotes if the trial runs past
    its time limit."""
    print(f"e2e_trial: {what} at {time.perf_counter() - _STARTED:.0f} s", file=sys.stderr, flush=True)


def largest_batch(
    trial: StepTrial,
    start: int,
    budget: float,
    known: dict[int, int],
    deadline: float,
    first_compile_s: float = FIRST_COMPILE_S,
) -> dict[str, Any]:
    """The largest batch whose footprint fits in ``budget`` bytes, and the footprints it compiled.

    Footprints grow about linearly in the batch, but not exactly: buffer assignment, layout choices, and XLA's own
    rematerialisation, which can hold the footprint flat near its own limit. So the search brackets the answer
    between the largest batch seen to fit and the smallest seen to fail, and narrows it with lines through known
    footprints, the first through batch 0 (the state alone, ``trial.state_bytes``) and ``start``: before a
    failure, where the footprint flattens, it tries the average growth's answer, else at most doubles the batch;
    after one it bisects when the lines stop halving the bracket. A batch that does not compile (past int32
    extents, or cuDNN's limits) does not fit; its error is kept in ``errors``. ``known`` holds footprints
    measured elsewhere (the same-batch trial's), which save compiles. The search stops after ``MAX_COMPILES``
    compiles, or before a compile that would end past ``deadline`` (``time.perf_counter()``), a compile taking as
    long as the longest it has timed (``first_compile_s`` before the first); ``status`` says whether the bracket
    closed.
    """
    sizes: dict[int, int] = {0: trial.state_bytes} | known
    errors: dict[int, str] = {}
    compile_s: list[float] = []

    def fits_budget(batch: int) -> bool:
        if batch not in sizes:
            began = time.perf_counter()
            try:
                sizes[batch] = trial.footprint(batch)
            except Exception as error:  # the search goes on below this batch; the row says why it failed
                errors[batch] = f"{type(error).__name__}: {error}".splitlines()[0][:200]
                return False
            finally:
                compile_s.append(time.perf_counter() - began)
            _stage(f"batch {batch}: footprint {sizes[batch] / 1e9:.1f} GB")
        return sizes[batch] <= budget

    found = {"budget_bytes": budget, "footprints": sizes, "errors": errors}
    if not fits_budget(start):
        return {"max_batch": None, "status": "converged: the first batch does not fit"} | found
    previous, fits, too_big, chord_turn, widths = 0, start, None, False, []
    while too_big is None or too_big - fits > 1:
        if len(compile_s) >= MAX_COMPILES:
            return {"max_batch": fits, "status": f"stopped after {MAX_COMPILES} compiles"} | found
        if time.perf_counter() + max(compile_s, default=first_compile_s) > deadline:
            return {"max_batch": fits, "status": "stopped: out of time"} | found
        # The tangent (the line through the last two fitting batches) and, once a batch failed, the chord (through
        # the largest fit and the smallest failure) cross the budget on either side of the answer for a footprint
        # that curves one way: alternate between them, each step shrinking the bracket from its side.
        chord_turn = too_big is not None and not chord_turn
        use_chord = too_big in sizes and (chord_turn or fits == previous)
        left, right = (fits, too_big) if use_chord else (previous, fits)
        slope = (sizes[right] - sizes[left]) / (right - left)
        predicted = fits + max(1, math.floor((budget - sizes[fits]) / slope)) if slope > 0 else None
        if too_big is None:
            average = (sizes[fits] - sizes[start]) / (fits - start) if fits != start else slope
            flattening = average > 0 and slope < 0.5 * average
            # Where the footprint flattens, XLA's remat may hold it for a stretch and then let it grow at the
            # earlier rate again (the 1b step on the H200: 119.1 GB at batch 31, 121.5 at 35, 196 at 58): try the
            # batch the average growth since `start` points at, unless that is the next batch (a long flat stretch:
            # then the tangent, at most doubling).
            by_average = fits + math.floor((budget - sizes[fits]) / average) if flattening else 0
            if by_average > fits + 1:
                candidate = by_average
            else:
                candidate = 2 * fits if predicted is None or (flattening and predicted > 2 * fits) else predicted
        else:
            widths.append(too_big - fits)
            stalled = len(widths) > 1 and 2 * widths[-1] > widths[-2]
            candidate = (fits + too_big) // 2 if predicted is None or stalled else min(predicted, too_big - 1)
        if fits_budget(candidate):
            previous, fits = fits, candidate
        else:
            too_big = candidate if too_big is None else min(too_big, candidate)
    return {"max_batch": fits, "status": "converged"} | found


class _Session:
    """One process's trial (the bundled Llama, or a Tunix model: :mod:`benchmarks.tunix_models`); a same-batch run
    falls back from cuDNN to XLA attention once.

    cuDNN's fused attention is what training uses on a GPU; should it refuse these shapes, XLA's runs instead. The
    largest-batch phase does not fall back: XLA attention's footprint is not the one its search measured, and its
    scores pass int32 dimensions from batch 16 (B·32·2048² elements), so the fallback would only hide the cuDNN
    error.
    """

    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.attention = args.attention
        self.fallback = args.phase == "same_batch"
        self.trial: StepTrial | None = None
        self.seeds: dict[int, int] = {}  # footprints this process measured, for the search
        self.compile_s: float = FIRST_COMPILE_S  # what the search expects a compile to take

    def _new_trial(self) -> StepTrial:
        from benchmarks import tunix_models

        args = self.args
        if tunix_models.is_tunix(args.config):
            return tunix_models.TunixTrial(args.provider, args.config, args.seq, args.precision, args.remat)
        return Trial(args.provider, args.config, args.seq, args.precision, self.attention, args.remat)

    def attempt(self, work) -> dict[str, Any]:
        """``work(trial)``'s row, or a row whose status says what went wrong (``oom: ...`` or ``error: ...``)."""
        try:
            if self.trial is None:
                self.trial = self._new_trial()
                _stage("model traced")
            return {"attention": self.attention or "xla"} | work(self.trial)
        except Exception as error:  # the driver reads the row; an OOM is a result, not a crash
            message = f"{type(error).__name__}: {error}".splitlines()[0][:300]
            if "RESOURCE_EXHAUSTED" in message:
                return {"attention": self.attention or "xla", "status": f"oom: {message}"}
            if self.attention == "cudnn" and self.fallback:
                print(f"attention=cudnn failed ({message}); retrying with XLA attention", file=sys.stderr, flush=True)
                self.attention, self.trial = None, None
                return self.attempt(work)
            return {"attention": self.attention or "xla", "status": f"error: {message}"}

    def measure(self, phase: str, batch: int) -> dict[str, Any]:
        """One timed run at ``batch``."""
        args = self.args
        return {"phase": phase, "batch": batch} | self.attempt(lambda trial: run(trial, batch, args.steps, args.warmup))

    def seed(self, row: dict[str, Any]) -> None:
        """Keeps a successful run's footprint and compile time for the search that follows in this process."""
        from benchmarks.memory import footprint_bytes

        footprint = footprint_bytes(row) if row.get("status") == "ok" else None
        if footprint:
            self.seeds[row["batch"]] = footprint
            self.compile_s = row["compile_s"]

    def search(self) -> dict[str, Any]:
        """The largest batch's search (:func:`largest_batch`) from ``--batch``, within ``--time-s``."""
        from benchmarks.memory import jax_memory_stats

        args = self.args
        known = ({args.batch: args.start_footprint} if args.start_footprint else {}) | self.seeds
        deadline = _STARTED + args.time_s - (RUN_RESERVE_S if args.phase == "max_batch" else WARM_RUN_RESERVE_S)

        def work(trial: StepTrial) -> dict[str, Any]:
            if args.capacity_from_batch is None:
                budget = FIT * jax_memory_stats()["bytes_limit"]
            else:
                budget = trial.footprint(args.capacity_from_batch)
            return largest_batch(trial, args.batch, budget, known, deadline, self.compile_s)

        return self.attempt(work)


def _runs(args: argparse.Namespace) -> Iterator[dict[str, Any]]:
    """The rows of a trial: one run at ``args.batch``; or, in the max_batch phase, the search and a run at the
    largest batch it found, then at the next smaller batch seen to fit should that run out of memory; or, in the
    ``both`` phase, the run at ``args.batch`` first (its peak this fresh process's own), then the max_batch phase
    seeded with its footprint and compile time (whose rows' peak is then the process's, both runs')."""
    session = _Session(args)
    if args.phase in ("same_batch", "both"):
        row = session.measure("same_batch", args.batch)
        yield row
        if args.phase == "same_batch":
            return
        session.seed(row)
    search = session.search()
    found = {"search": {k: v for k, v in search.items() if k != "attention"}}
    if search.get("max_batch") is None:
        status = search["status"] if search["status"].startswith(("oom", "error")) else "no batch fits"
        yield {"phase": "max_batch", "batch": None, "status": status} | found
        return
    budget = search["budget_bytes"]
    fitting = sorted((b for b, size in search["footprints"].items() if b and size <= budget), reverse=True)
    row = session.measure("max_batch", fitting[0])
    if row["status"].startswith("oom") and len(fitting) > 1:
        yield row | {"phase": "max_batch_oom"} | found
        row = session.measure("max_batch", fitting[1])
    yield row | found


def main(argv: Sequence[str] | None = None) -> None:
    """Command line: prints a JSON row per run."""
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("--provider", required=True, choices=("liger_jax", "xla"))
    cli.add_argument("--config", default="1b", help="a preset of the bundled Llama, or a Tunix model (tunix-...)")
    cli.add_argument("--seq", type=int, default=2048)
    cli.add_argument("--batch", type=int, required=True, help="the batch to run; max_batch: where the search starts")
    cli.add_argument("--phase", default="same_batch", choices=("same_batch", "max_batch", "both"))
    cli.add_argument("--precision", default="bf16", choices=tuple(PRECISIONS))
    cli.add_argument("--attention", default=None, choices=("cudnn", "xla"))
    cli.add_argument("--remat", action="store_true", help="rematerialise each decoder layer")
    cli.add_argument("--steps", type=int, default=5)
    cli.add_argument("--warmup", type=int, default=2)
    cli.add_argument("--start-footprint", type=int, help="max_batch: --batch's footprint, measured by another trial")
    cli.add_argument(
        "--time-s",
        type=float,
        default=600.0,
        help="this process's time limit; a search ends RUN_RESERVE_S (both phase: WARM_RUN_RESERVE_S) before it",
    )
    cli.add_argument("--capacity-from-batch", type=int, help="max_batch: pretend the device holds exactly this batch")
    args = cli.parse_args(argv)
    from benchmarks.providers import prepare_process

    prepare_process()
    base = {"provider": args.provider, "config": args.config, "seq": args.seq, "precision": args.precision}
    base["remat"] = args.remat
    for row in _runs(args):
        print(json.dumps(base | row, default=str), flush=True)


if __name__ == "__main__":
    main()
