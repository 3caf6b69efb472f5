"""Train a Llama-3-style model on the shipped corpus with liger_jax kernels swapped in: the main job.

    python examples/train_llama.py                      # tiny model, a few minutes on 2 CPU cores
    python examples/train_llama.py --config small --steps 200 --batch-size 16 --seq-len 1024
    python examples/train_llama.py --config 1b --no-liger   # the same run on flax's own modules
    python examples/train_llama.py --config 1b --keep rope  # every swap but RoPE's (an ablation)
    python examples/train_llama.py --mesh dp=2,fsdp=2,tp=2  # data, fully-sharded and tensor parallel on 8 devices

The model (:mod:`liger_jax.models.llama`) is written with plain flax parts; ``--liger`` (the default) calls
:func:`liger_jax.flax_layers.apply_liger` on it before training, which swaps RMSNorm, RoPE, the SwiGLU MLP and the
LM-head loss for the kernels in place. The kernels run through the default implementation: Triton on a GPU with
jax-triton, the XLA reference elsewhere (``--implementation`` overrides). Byte-level tokens of *Alice's Adventures
in Wonderland* (examples/data); AdamW with warmup and cosine decay; one ``jax.jit`` step with donated state.

Prints tokens/s (compilation excluded), peak device memory (where the backend reports it), the final and held-out
losses, and writes ``loss.png`` and ``summary.json`` into ``--out``. ``--mesh`` places the parameters, optimizer
state and batches on a device mesh (:mod:`liger_jax.models.sharding`); on CPU, 8 devices need
``XLA_FLAGS=--xla_force_host_platform_device_count=8``.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import byte_corpus
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from tqdm import tqdm

from liger_jax import runtime
from liger_jax.flax_layers import KINDS, apply_liger
from liger_jax.models import LlamaConfig, LlamaForCausalLM, llama_config, training
from liger_jax.models import sharding as model_sharding
from liger_jax.ops import _dispatch

# Peak AdamW learning rates: a ~2M-parameter byte model tolerates 3e-3; billion-scale Llamas train near 3e-4.
DEFAULT_LEARNING_RATES = {"tiny": 3e-3, "mini": 1e-3, "small": 6e-4, "1b": 3e-4}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line; flags are checked by :func:`check_args`."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="tiny", choices=sorted(DEFAULT_LEARNING_RATES), help="model preset")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--liger", action=argparse.BooleanOptionalAction, default=True, help="swap in the kernels")
    parser.add_argument(
        "--dtype", default=None, choices=["float32", "bfloat16", "float16"], help="compute dtype (bf16 on GPU)"
    )
    parser.add_argument(
        "--keep",
        action="append",
        default=[],
        choices=KINDS,
        metavar="KIND",
        help="a swap kind --liger leaves as flax's (repeatable; e.g. --keep rope, for an ablation)",
    )
    parser.add_argument("--remat", action="store_true", help="rematerialise each decoder layer")
    parser.add_argument("--implementation", default=None, choices=runtime.IMPLEMENTATIONS)
    parser.add_argument(
        "--mesh", default=None, help="device mesh, e.g. dp=4,tp=2 (axes dp, fsdp, tp: liger_jax.models.sharding)"
    )
    parser.add_argument("--attention", default=None, choices=["xla", "cudnn"], help="cudnn on GPU with bf16/fp16")
    parser.add_argument("--lr", type=float, default=None, help="peak learning rate (default: per preset)")
    parser.add_argument("--warmup", type=int, default=None, help="warmup steps (default: 10%% of --steps)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--log-every", type=int, default=10, help="steps between progress-bar loss updates")
    parser.add_argument("--eval-batches", type=int, default=8, help="held-out batches for the evaluation loss")
    parser.add_argument("--sample", type=int, default=200, help="bytes of text to generate at the end (0: none)")
    parser.add_argument("--out", type=Path, default=Path("runs/train_llama"), help="folder for loss.png, summary")
    args = parser.parse_args(argv)
    try:
        check_args(args)
    except ValueError as error:
        parser.error(str(error))
    return args


def check_args(args: argparse.Namespace) -> None:
    """Fills in the defaults that depend on the machine and preset, and raises ValueError for bad flags."""
    for name, least in [
        ("steps", 1),
        ("batch_size", 1),
        ("seq_len", 1),
        ("log_every", 1),
        ("eval_batches", 0),
        ("sample", 0),
    ]:
        if getattr(args, name) < least:
            raise ValueError(f"--{name.replace('_', '-')} must be at least {least}, got {getattr(args, name)}")
    on_gpu = jax.default_backend() in ("gpu", "cuda", "rocm")
    args.dtype = args.dtype or ("bfloat16" if on_gpu else "float32")
    if args.attention is None and on_gpu and args.dtype != "float32":
        args.attention = "cudnn"
    if args.attention == "cudnn" and args.dtype == "float32":
        raise ValueError("--attention cudnn needs --dtype bfloat16 or float16")
    args.lr = DEFAULT_LEARNING_RATES[args.config] if args.lr is None else args.lr
    args.warmup = args.steps // 10 if args.warmup is None else args.warmup
    if not 0 <= args.warmup < args.steps:
        raise ValueError(f"--warmup must be in [0, --steps), got {args.warmup} for {args.steps} steps")
    if args.keep and not args.liger:
        raise ValueError(f"--keep {args.keep[0]} needs --liger: without it nothing is swapped")
    if args.implementation is not None:
        runtime.resolve_implementation(args.implementation)
    if args.mesh is not None:
        mesh = model_sharding.make_mesh(args.mesh)
        data_ways = math.prod(size for axis, size in mesh.shape.items() if axis in ("dp", "fsdp"))
        if args.batch_size % data_ways:
            raise ValueError(f"--batch-size {args.batch_size} must divide into the mesh's {data_ways} data shards")


def model_config(args: argparse.Namespace) -> LlamaConfig:
    """The preset with the command line's dtype, remat and attention."""
    config = llama_config(args.config, dtype=args.dtype, remat=args.remat, attention=args.attention)
    if config.vocab_size < byte_corpus.VOCAB_SIZE:
        raise ValueError(f"--config {args.config} has {config.vocab_size} tokens, fewer than the 256 byte values")
    return config


def build_model(config: LlamaConfig, args: argparse.Namespace) -> tuple[LlamaForCausalLM, dict[str, int]]:
    """The model with fresh parameters, liger kernels swapped in unless ``--no-liger``; and the swap counts."""
    model = LlamaForCausalLM(config, rngs=nnx.Rngs(args.seed))
    switches = dict.fromkeys(args.keep, False)
    counts = apply_liger(model, implementation=args.implementation, **switches) if args.liger else {}
    return model, counts


def op_implementations(config: LlamaConfig, args: argparse.Namespace) -> dict[str, str]:
    """The implementation each swapped op runs at this run's shapes: ``--implementation``, or the default with the
    size rule (:mod:`liger_jax.ops._dispatch`) applied to the whole batch's operands; ``--keep`` ops left out."""
    tokens = args.batch_size * args.seq_len
    row_op = (tokens * config.hidden_size, config.hidden_size)
    sizes = {  # (elements, row length) as _dispatch.resolve counts them
        "rms_norm": row_op,
        "fused_add_rms_norm": row_op,
        "swiglu": (tokens * config.intermediate_size, 0),
        "rope": (tokens * (config.num_heads + config.num_kv_heads) * config.head_dim, 0),
        "fused_linear_cross_entropy": (tokens * config.vocab_size, 0),
    }
    return {op: _dispatch.resolve(args.implementation, op, *size) for op, size in sizes.items() if op not in args.keep}


def evaluation_loss(graphdef, state: training.TrainState, tokens: np.ndarray, args: argparse.Namespace) -> float:
    """Mean loss of the trained model over ``--eval-batches`` held-out batches."""
    loss = jax.jit(lambda state, x, y: nnx.merge(graphdef, state.params, state.rest).loss(x, y))
    windows = byte_corpus.batches(tokens, args.batch_size, args.seq_len, seed=args.seed + 1)
    return float(np.mean([loss(state, *next(windows)) for _ in range(args.eval_batches)]))


def sample_text(graphdef, state: training.TrainState, prompt: str, length: int, args: argparse.Namespace) -> str:
    """``length`` bytes continuing ``prompt``, drawn at temperature 0.8 over a sliding ``--seq-len`` window."""
    window = args.seq_len

    @jax.jit
    def next_token(state, tokens, count, key):
        logits = nnx.merge(graphdef, state.params, state.rest)(tokens[None])[0, count - 1]
        return jax.random.categorical(key, logits.astype(jnp.float32) / 0.8)

    tokens = list(byte_corpus.encode(prompt))
    keys = jax.random.split(jax.random.key(args.seed), length)
    for key in keys:
        context = tokens[-window:]
        padded = np.zeros(window, np.int32)
        padded[: len(context)] = context
        tokens.append(int(next_token(state, padded, len(context), key)))
    return byte_corpus.decode(tokens)


def peak_memory_bytes() -> int | None:
    """Peak bytes in use on the first device, or None where the backend does not report it (CPU)."""
    stats = jax.devices()[0].memory_stats()
    return None if not stats else stats.get("peak_bytes_in_use")


def run_steps(step, state: training.TrainState, batches, args: argparse.Namespace):
    """Runs ``--steps`` training steps with a progress bar.

    Returns:
        ``(state, losses, compile_s, timed_s)``: the final state, the per-step losses, the seconds of the first step
        (compilation included) and of all the others.
    """
    tokens_per_step = args.batch_size * args.seq_len
    started = time.perf_counter()
    state, loss = step(state, *next(batches))
    losses = [float(loss)]  # waits for the first step: compilation plus one step
    compile_s = time.perf_counter() - started
    timed_from, pending = time.perf_counter(), []
    progress = tqdm(range(1, args.steps), initial=1, total=args.steps, desc="train", unit="step")
    for index in progress:
        state, loss = step(state, *next(batches))
        pending.append(loss)
        if len(pending) == args.log_every or index == args.steps - 1:
            losses.extend(float(value) for value in pending)  # one device sync per log interval
            pending.clear()
            rate = index * tokens_per_step / (time.perf_counter() - timed_from)
            progress.set_postfix(loss=f"{losses[-1]:.3f}", tokens_per_s=f"{rate:,.0f}")
    jax.block_until_ready(state)
    timed_s = time.perf_counter() - timed_from
    progress.close()
    return state, losses, compile_s, timed_s


def train(args: argparse.Namespace) -> dict:
    """Runs the training job and returns its summary (also written to ``--out/summary.json``)."""
    config = model_config(args)
    train_tokens, eval_tokens = byte_corpus.load_splits()
    model, counts = build_model(config, args)
    optimizer = training.adamw_cosine(args.lr, args.steps, warmup_steps=args.warmup)
    graphdef, state = training.init_train_state(model, optimizer)
    del model  # the state now owns the parameters; the step donates them
    mesh = model_sharding.make_mesh(args.mesh) if args.mesh else None
    if mesh is not None:
        state = model_sharding.shard_train_state(state, mesh, config)
    step = training.make_train_step(graphdef, optimizer)
    implementation = runtime.resolve_implementation(args.implementation) if args.liger else "flax"
    op_choices = op_implementations(config, args) if args.liger else {}
    print(
        f"{args.config}: {training.parameter_count(state) / 1e6:.2f}M params, {config.dtype}, liger={args.liger} "
        f"({implementation}; per op {op_choices}), swapped {counts}, {jax.devices()[0].device_kind}"
    )
    batches = byte_corpus.batches(train_tokens, args.batch_size, args.seq_len, seed=args.seed)
    if mesh is not None:
        batches = model_sharding.sharded_batches(batches, mesh)
    state, losses, compile_s, timed_s = run_steps(step, state, batches, args)

    timed_steps = args.steps - 1
    summary = {
        "config": args.config,
        "model": {name: getattr(config, name) for name in config.__dataclass_fields__},
        "params": training.parameter_count(state),
        "liger": args.liger,
        "kept": args.keep,
        "implementation": implementation,
        "op_implementations": op_choices,
        "swapped": counts,
        "device": jax.devices()[0].device_kind,
        "mesh": args.mesh,
        "steps": args.steps,
        "batch_size": args.batch_size,
        "seq_len": args.seq_len,
        "learning_rate": args.lr,
        "compile_and_first_step_s": compile_s,
        "step_ms": 1e3 * timed_s / timed_steps if timed_steps else None,
        "tokens_per_s": timed_steps * args.batch_size * args.seq_len / timed_s if timed_steps else None,
        "peak_memory_bytes": peak_memory_bytes(),
        "first_loss": losses[0],
        "final_loss": losses[-1],
        "final_loss_mean_10": float(np.mean(losses[-10:])),
        "eval_loss": evaluation_loss(graphdef, state, eval_tokens, args) if args.eval_batches else None,
        "losses": losses,
    }
    if args.sample:
        summary["sample"] = sample_text(graphdef, state, "Alice ", args.sample, args)
    report(summary, args.out)
    return summary


def report(summary: dict, out: Path, model_name: str = "Llama") -> None:
    """Prints the headline numbers and writes ``summary.json`` and ``loss.png`` (titled after ``model_name``) into
    ``out``."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    figure, axes = plt.subplots(figsize=(7, 4))
    axes.plot(np.arange(1, len(summary["losses"]) + 1), summary["losses"], linewidth=1)
    axes.set(xlabel="step", ylabel="train loss (nats/byte)", yscale="log")
    axes.set_title(f"{summary['config']} {model_name}, liger={summary['liger']} ({summary['implementation']})")
    axes.grid(True, which="both", alpha=0.3)
    figure.tight_layout()
    figure.savefig(out / "loss.png", dpi=120)
    plt.close(figure)

    peak, rate, step_ms = summary["peak_memory_bytes"], summary["tokens_per_s"], summary["step_ms"]
    print(f"tokens/s (compile excluded): {'n/a' if rate is None else f'{rate:,.0f}'}")
    print(f"step time: {'n/a' if step_ms is None else f'{step_ms:.1f} ms'}")
    print(f"peak device memory: {'n/a on this backend' if peak is None else f'{peak / 2**30:.2f} GiB'}")
    print(f"loss: {summary['first_loss']:.3f} -> {summary['final_loss']:.3f} (ln 256 = {math.log(256):.3f})")
    if summary["eval_loss"] is not None:
        print(f"held-out loss: {summary['eval_loss']:.3f}")
    if "sample" in summary:
        print(f"sample: {summary['sample']!r}")
    print(f"wrote {out / 'summary.json'} and {out / 'loss.png'}")


def main(argv: list[str] | None = None) -> None:
    """Parses the command line and trains."""
    train(parse_args(argv))


if __name__ == "__main__":
    main()
