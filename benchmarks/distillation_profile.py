"""Where a fused distillation step's time goes: fwd+bwd of one op at the issue-20 shape, traced kernel by kernel.

``python -m benchmarks.distillation_profile [--op fused_linear_jsd] [--accum-dtype bfloat16] [--chunk-size 128]``

Prints ms per step against the matmul floor (four matmuls: both models' logits, the student's dx and dweight), the
compiled temporaries against the issue's bound (1/8 of one model's fp32 logits), the dot ops of the optimized program
(four per traced chunk when the backward pass only scales the forward's gradients) and the device kernels by time:
the matmuls against the chunks' elementwise passes over their ``[chunk, V]`` buffers. ``--smoke`` runs a tiny shape
on any backend.
"""

from __future__ import annotations

import argparse
import re
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks import draws, trace_summary
from benchmarks.cases.distillation import BETA, HIDDEN, TEMPERATURE, TOKENS, VOCAB
from benchmarks.hardware import floor_ms
from benchmarks.memory import compiled_memory

OPS = ("fused_linear_distillation", "fused_linear_jsd")
TIMED_STEPS = 10


def profile(op: str, rows: int, hidden: int, vocab: int, options: dict, trace_dir: Path) -> list[str]:
    """Report lines for ``op`` at ``rows × hidden → vocab`` in bf16, both heads ``[hidden, vocab]``."""
    import jax

    import liger_jax

    kx, kw, ktx, ktw, kl = draws.keys(jax.random.key(0), 5)
    args = (
        draws.normal(kx, (rows, hidden), "bfloat16"),
        draws.normal(kw, (hidden, vocab), "bfloat16", hidden**-0.5),
        draws.normal(ktx, (rows, hidden), "bfloat16"),
        draws.normal(ktw, (hidden, vocab), "bfloat16", hidden**-0.5),
        draws.labels(kl, rows, vocab),
    )
    loss = getattr(liger_jax, op)
    step = jax.jit(
        jax.value_and_grad(lambda x, w, tx, tw, labels: loss(x, w, tx, tw, labels, **options), argnums=(0, 1))
    )
    compiled = step.lower(*args).compile()
    jax.block_until_ready(compiled(*args))
    times = []
    for _ in range(TIMED_STEPS):
        started = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        times.append(time.perf_counter() - started)
    summary = trace_summary.profiled(lambda: compiled(*args), TIMED_STEPS, 20, trace_dir)
    ms = 1e3 * statistics.median(times)
    floor = floor_ms(0, 4 * 2 * rows * hidden * vocab)
    temp = compiled_memory(compiled)["temp_bytes"]
    bound = rows * vocab * 4 / 8
    dots = len(re.findall(r"\bdot\(|custom_call_target=\"__cublas", compiled.as_text()))
    shape = f"tokens={rows},hidden={hidden},vocab={vocab}"
    return [
        f"{op} {shape} bf16 {options}",
        f"  {ms:.2f} ms/step = {ms / floor:.3f}x the matmul floor ({floor:.2f} ms)",
        f"  temp {temp / 2**20:,.0f} MiB = {temp / bound:.2f}x the bound (N·V·4/8 = {bound / 2**20:,.0f} MiB)",
        f"  dot ops in the optimized program: {dots}",
        *trace_summary.format_summary("  trace", summary),
    ]


def main(argv=None) -> None:
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("--op", choices=OPS, default=OPS[0])
    cli.add_argument("--accum-dtype", default="float32")
    cli.add_argument("--chunk-size", type=int, default=None)
    cli.add_argument("--smoke", action="store_true", help="a tiny shape, on any backend")
    args = cli.parse_args(argv)
    options = {"beta": BETA, "temperature": TEMPERATURE, "accum_dtype": args.accum_dtype, "chunk_size": args.chunk_size}
    shape = (64, 32, 300) if args.smoke else (TOKENS, HIDDEN, VOCAB)
    with tempfile.TemporaryDirectory() as trace_dir:
        print("\n".join(profile(args.op, *shape, options, Path(trace_dir))))


if __name__ == "__main__":
    main()
