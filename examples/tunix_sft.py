"""Fine-tune a Tunix Qwen3 on the shipped corpus with Tunix's own PeftTrainer, liger_jax's kernels swapped in.

    python examples/tunix_sft.py                    # tiny Qwen3, a few minutes on 2 CPU cores
    python examples/tunix_sft.py --no-liger         # Tunix's own modules and loss, for comparison
    python examples/tunix_sft.py --config 0.6b --batch-size 8 --seq-len 2048   # Qwen3-0.6B's shapes, on a GPU

The model is Tunix's own ``tunix.models.qwen3`` ``Qwen3`` with fresh weights on byte tokens (no tokenizer and no
checkpoint to download). ``--liger`` (the default) calls :func:`liger_jax.flax_layers.apply_liger` on it, which
swaps its RMSNorms (the per-head q/k norms too), SwiGLU MLPs and RoPE for the kernels in place, and hands
:func:`liger_jax.integrations.tunix.peft_loss_fn` to the trainer (``with_loss_fn``): the loss from the final hidden
states through the fused linear cross-entropy, without ``[B, S, V]`` logits. ``--no-liger`` trains Tunix's model
with the trainer's default loss. Tunix's ``PeftTrainer`` runs everything else: its jitted step, the optax AdamW
given to it (warmup and cosine decay), its metrics and progress bar; checkpointing is off. The kernels run
through the default implementation: Triton on a GPU with jax-triton, the XLA reference elsewhere
(``--implementation`` overrides).

Prints tokens/s (compilation excluded), peak device memory (where the backend reports it) and the loss curve, and
writes ``loss.png`` and ``summary.json`` into ``--out``.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import time
from pathlib import Path

import byte_corpus
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from train_llama import peak_memory_bytes, report
from tunix.models.qwen3 import model as qwen3
from tunix.sft import hooks, peft_trainer
from tunix.sft import utils as sft_utils

from liger_jax import runtime
from liger_jax.flax_layers import apply_liger
from liger_jax.integrations.tunix import peft_loss_fn
from liger_jax.models import training

# The tiny preset mirrors train_llama's: 4 layers of 192, 6 query heads of 32 over 2 key-value heads, tied bytes.
PRESETS = {
    "tiny": lambda: qwen3.ModelConfig(
        num_layers=4,
        vocab_size=byte_corpus.VOCAB_SIZE,
        embed_dim=192,
        hidden_dim=512,
        num_heads=6,
        head_dim=32,
        num_kv_heads=2,
        rope_theta=10_000,
        norm_eps=1e-6,
        use_tied_embedding=True,
    ),
    "0.6b": qwen3.ModelConfig.qwen3_0p6b,
    "1.7b": qwen3.ModelConfig.qwen3_1p7b,
}
# Peak AdamW learning rates: a ~2M-parameter byte model tolerates 3e-3; billion-scale models train near 3e-4.
DEFAULT_LEARNING_RATES = {"tiny": 3e-3, "0.6b": 3e-4, "1.7b": 2e-4}
CURVE_POINTS = 10  # losses printed along the run


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line; flags are checked by :func:`check_args`."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="tiny", choices=sorted(PRESETS), help="Qwen3 preset")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--liger", action=argparse.BooleanOptionalAction, default=True, help="swap in the kernels")
    parser.add_argument("--dtype", default=None, choices=["float32", "bfloat16"], help="compute dtype (bf16 on GPU)")
    parser.add_argument("--implementation", default=None, choices=runtime.IMPLEMENTATIONS)
    parser.add_argument("--lr", type=float, default=None, help="peak learning rate (default: per preset)")
    parser.add_argument("--warmup", type=int, default=None, help="warmup steps (default: 10%% of --steps)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eval-batches", type=int, default=8, help="held-out batches for the evaluation loss")
    parser.add_argument("--out", type=Path, default=Path("runs/tunix_sft"), help="folder for loss.png, summary")
    args = parser.parse_args(argv)
    try:
        check_args(args)
    except ValueError as error:
        parser.error(str(error))
    return args


def check_args(args: argparse.Namespace) -> None:
    """Fills in the defaults that depend on the machine and preset, and raises ValueError for bad flags."""
    for name, least in [("steps", 2), ("batch_size", 1), ("seq_len", 2), ("eval_batches", 0)]:
        if getattr(args, name) < least:
            raise ValueError(f"--{name.replace('_', '-')} must be at least {least}, got {getattr(args, name)}")
    on_gpu = jax.default_backend() in ("gpu", "cuda", "rocm")
    args.dtype = args.dtype or ("bfloat16" if on_gpu else "float32")
    args.lr = DEFAULT_LEARNING_RATES[args.config] if args.lr is None else args.lr
    args.warmup = args.steps // 10 if args.warmup is None else args.warmup
    if not 0 <= args.warmup < args.steps:
        raise ValueError(f"--warmup must be in [0, --steps), got {args.warmup} for {args.steps} steps")
    if args.implementation is not None:
        runtime.resolve_implementation(args.implementation)


def build_model(args: argparse.Namespace) -> tuple[qwen3.Qwen3, dict[str, int]]:
    """Tunix's Qwen3 of the preset with fresh fp32 parameters computing in ``--dtype``, liger kernels swapped in
    unless ``--no-liger``; and the swap counts."""
    config = dataclasses.replace(PRESETS[args.config](), dtype=jnp.dtype(args.dtype), param_dtype=jnp.float32)
    model = qwen3.Qwen3(config, rngs=nnx.Rngs(args.seed))
    counts = apply_liger(model, implementation=args.implementation) if args.liger else {}
    return model, counts


def training_inputs(tokens: np.ndarray, args: argparse.Namespace, seed: int):
    """Endless ``TrainingInput`` batches of ``--seq-len`` byte tokens, every token a target (no padding)."""
    for inputs, _ in byte_corpus.batches(tokens, args.batch_size, args.seq_len, seed=seed):
        yield peft_trainer.TrainingInput(input_tokens=inputs, input_mask=np.ones_like(inputs, dtype=bool))


def model_inputs(example: peft_trainer.TrainingInput) -> dict[str, jax.Array]:
    """The loss function's arguments: the tokens and mask, with Tunix's positions and causal attention mask."""
    return {
        "input_tokens": example.input_tokens,
        "input_mask": example.input_mask,
        "positions": sft_utils.build_positions_from_mask(example.input_mask),
        "attention_mask": sft_utils.make_causal_attn_mask(example.input_mask),
    }


class StepClock(hooks.TrainingHooks):
    """Records each training step's loss and when the trainer reported it (it waits for the step's loss first)."""

    def __init__(self):
        self.times: list[float] = []
        self.losses: list[float] = []

    def on_train_step_end(self, train_ctx, train_step, train_loss):
        del train_ctx, train_step
        self.losses.append(float(train_loss))
        self.times.append(time.perf_counter())

    def on_train_start(self, train_ctx):
        del train_ctx

    def on_train_end(self, train_ctx):
        del train_ctx

    def on_train_step_start(self, train_ctx):
        del train_ctx

    def on_eval_step_start(self, train_ctx):
        del train_ctx

    def on_eval_step_end(self, train_ctx, eval_loss):
        del train_ctx, eval_loss


def make_trainer(model: qwen3.Qwen3, args: argparse.Namespace) -> peft_trainer.PeftTrainer:
    """Tunix's PeftTrainer for ``--steps`` steps, checkpointing off, evaluating once at the start and once at the
    end; with liger's loss unless ``--no-liger``."""
    config = peft_trainer.TrainingConfig(
        eval_every_n_steps=args.steps, max_steps=args.steps, checkpoint_root_directory=None
    )
    optimizer = training.adamw_cosine(args.lr, args.steps, warmup_steps=args.warmup)
    trainer = peft_trainer.PeftTrainer(model, optimizer, config).with_gen_model_input_fn(model_inputs)
    if args.liger:
        implementation = args.implementation

        def liger_loss(model, input_tokens, input_mask, positions, attention_mask, images=None):
            return peft_loss_fn(
                model, input_tokens, input_mask, positions, attention_mask, images, implementation=implementation
            )

        trainer = trainer.with_loss_fn(liger_loss)
    return trainer


def train(args: argparse.Namespace) -> dict:
    """Runs the fine-tuning job and returns its summary (also written to ``--out/summary.json``)."""
    train_tokens, eval_tokens = byte_corpus.load_splits()
    model, counts = build_model(args)
    params = sum(leaf.size for leaf in jax.tree.leaves(nnx.state(model, nnx.Param)))
    implementation = runtime.resolve_implementation(args.implementation) if args.liger else "tunix"
    print(
        f"Qwen3 {args.config}: {params / 1e6:.2f}M params, {args.dtype}, liger={args.liger} ({implementation}), "
        f"swapped {counts}, {jax.devices()[0].device_kind}"
    )
    trainer = make_trainer(model, args)
    clock = StepClock()
    trainer.with_training_hooks(clock)
    held_out = list(itertools.islice(training_inputs(eval_tokens, args, seed=args.seed + 1), args.eval_batches))
    trainer.train(training_inputs(train_tokens, args, seed=args.seed), held_out or None)

    # Step 1's report comes after its compilation: the steps after it are timed.
    timed_steps, timed_s = len(clock.times) - 1, clock.times[-1] - clock.times[0]
    tokens_per_step = args.batch_size * args.seq_len
    config = model.config
    summary = {
        "config": args.config,
        "model": {
            name: getattr(config, name)
            for name in ("num_layers", "vocab_size", "embed_dim", "hidden_dim", "num_heads", "head_dim")
        }
        | {"num_kv_heads": config.num_kv_heads, "use_tied_embedding": config.use_tied_embedding},
        "params": int(params),
        "dtype": args.dtype,
        "liger": args.liger,
        "implementation": implementation,
        "swapped": counts,
        "device": jax.devices()[0].device_kind,
        "steps": args.steps,
        "batch_size": args.batch_size,
        "seq_len": args.seq_len,
        "learning_rate": args.lr,
        "step_ms": 1e3 * timed_s / timed_steps,
        "tokens_per_s": timed_steps * tokens_per_step / timed_s,
        "peak_memory_bytes": peak_memory_bytes(),
        "first_loss": clock.losses[0],
        "final_loss": clock.losses[-1],
        "final_loss_mean_10": float(np.mean(clock.losses[-10:])),
        "eval_loss": float(trainer.metrics_logger.get_metric_history("", "loss", "eval")[-1]) if held_out else None,
        "losses": clock.losses,
    }
    marks = np.unique(np.linspace(0, len(clock.losses) - 1, CURVE_POINTS).round().astype(int))
    print("loss curve: " + ", ".join(f"{mark + 1}: {clock.losses[mark]:.3f}" for mark in marks))
    report(summary, args.out, model_name="Qwen3 (Tunix)")
    return summary


def main(argv: list[str] | None = None) -> None:
    """Parses the command line and fine-tunes."""
    train(parse_args(argv))


if __name__ == "__main__":
    main()
