"""Align a Tunix Qwen3 with DPO through Tunix's own DPOTrainer, liger_jax's kernels and fused DPO loss swapped in.

    python examples/tunix_dpo.py                    # tiny Qwen3 on byte tokens, a few minutes on 2 CPU cores
    python examples/tunix_dpo.py --no-liger         # Tunix's own modules and loss, for comparison

The preference pairs come from the shipped corpus: a prompt of ``--prompt-len`` bytes, the text that follows it as
the chosen completion, and random bytes as the rejected one (a preference a fresh model learns in minutes). The
policy is Tunix's ``Qwen3`` with fresh weights (``examples/tunix_sft.py``'s tiny preset) and the reference model a
frozen copy of it. ``--liger`` (the default) swaps the policy's RMSNorms, SwiGLU MLPs and RoPE for the kernels
(:func:`liger_jax.flax_layers.apply_liger`) and hands :func:`liger_jax.integrations.tunix.dpo.dpo_loss_fn` to the
trainer: the completion log-probs from the final hidden states through :func:`liger_jax.fused_linear_logprobs`,
without ``[B, S, V]`` logits. Tunix's ``DPOTrainer`` runs everything else (the reference log-probs, the jitted step,
AdamW, its metrics).

Prints tokens/s (compilation excluded), the loss curve and the final reward accuracy, and writes ``loss.png`` and
``summary.json`` into ``--out``.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import byte_corpus
import jax
import jax.numpy as jnp
import numpy as np
from train_llama import peak_memory_bytes, report
from tunix.sft.dpo import dpo_trainer
from tunix_sft import StepClock, build_model

from liger_jax import runtime
from liger_jax.integrations.tunix.dpo import dpo_loss_fn
from liger_jax.models import training

CURVE_POINTS = 10


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--batch-size", type=int, default=8, help="preference pairs per step")
    parser.add_argument("--prompt-len", type=int, default=48)
    parser.add_argument("--completion-len", type=int, default=32)
    parser.add_argument("--beta", type=float, default=0.1)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--liger", action=argparse.BooleanOptionalAction, default=True, help="swap in the kernels")
    parser.add_argument("--implementation", default=None, choices=runtime.IMPLEMENTATIONS)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("runs/tunix_dpo"), help="folder for loss.png, summary")
    args = parser.parse_args(argv)
    for name in ("steps", "batch_size", "prompt_len", "completion_len"):
        if getattr(args, name) < 2:
            parser.error(f"--{name.replace('_', '-')} must be at least 2, got {getattr(args, name)}")
    args.config, args.dtype = "tiny", "bfloat16" if jax.default_backend() == "gpu" else "float32"
    return args


def preference_pairs(tokens: np.ndarray, args: argparse.Namespace):
    """Endless ``TrainingInput`` batches: a corpus prompt, its true continuation (chosen) and random bytes
    (rejected), all real tokens (masks of ones)."""
    rng = np.random.default_rng(args.seed + 1)
    for inputs, _ in byte_corpus.batches(tokens, args.batch_size, args.prompt_len + args.completion_len, args.seed):
        prompts, chosen = inputs[:, : args.prompt_len], inputs[:, args.prompt_len :]
        rejected = rng.integers(0, byte_corpus.VOCAB_SIZE, chosen.shape, dtype=chosen.dtype)
        ones = np.ones_like(chosen, dtype=bool)
        yield dpo_trainer.TrainingInput(
            prompt_ids=prompts,
            prompt_mask=np.ones_like(prompts, dtype=bool),
            chosen_ids=chosen,
            chosen_mask=ones,
            rejected_ids=rejected,
            rejected_mask=ones,
        )


def make_trainer(policy, reference, args: argparse.Namespace) -> dpo_trainer.DPOTrainer:
    """Tunix's DPOTrainer for ``--steps`` steps without checkpoints; liger's loss unless ``--no-liger``."""
    config = dpo_trainer.DPOTrainingConfig(
        algorithm="dpo", beta=args.beta, eval_every_n_steps=args.steps, max_steps=args.steps,
        checkpoint_root_directory=None,
    )  # fmt: skip
    optimizer = training.adamw_cosine(args.lr, args.steps, warmup_steps=args.steps // 10)
    trainer = dpo_trainer.DPOTrainer(policy, reference, optimizer, config)
    if args.liger:
        implementation = args.implementation

        def liger_dpo_loss(model, train_example, algorithm="dpo", beta=0.1, lambda_orpo=0.1, label_smoothing=0.0):
            return dpo_loss_fn(
                model, train_example, algorithm, beta, lambda_orpo, label_smoothing, implementation=implementation
            )

        trainer = trainer.with_loss_fn(liger_dpo_loss, has_aux=True)
    return trainer


def train(args: argparse.Namespace) -> dict:
    """Runs the DPO job and returns its summary (also written to ``--out/summary.json``)."""
    train_tokens, _ = byte_corpus.load_splits()
    policy, counts = build_model(args)
    # The same seed: the frozen reference starts as the policy does.
    reference, _ = build_model(argparse.Namespace(**{**vars(args), "liger": False}))
    implementation = runtime.resolve_implementation(args.implementation) if args.liger else "tunix"
    print(f"Qwen3 tiny DPO: liger={args.liger} ({implementation}), swapped {counts}, {jax.devices()[0].device_kind}")
    trainer = make_trainer(policy, reference, args)
    clock = StepClock()
    trainer.with_training_hooks(clock)
    trainer.train(preference_pairs(train_tokens, args))

    timed_steps, timed_s = len(clock.times) - 1, clock.times[-1] - clock.times[0]
    tokens_per_step = 2 * args.batch_size * (args.prompt_len + args.completion_len)
    accuracy = trainer.metrics_logger.get_metric_history("", "rewards/accuracy", "train")
    summary = {
        "config": args.config,
        "liger": args.liger,
        "implementation": implementation,
        "swapped": counts,
        "device": jax.devices()[0].device_kind,
        "steps": args.steps,
        "batch_size": args.batch_size,
        "prompt_len": args.prompt_len,
        "completion_len": args.completion_len,
        "beta": args.beta,
        "step_ms": 1e3 * timed_s / timed_steps,
        "tokens_per_s": timed_steps * tokens_per_step / timed_s,
        "peak_memory_bytes": peak_memory_bytes(),
        "first_loss": clock.losses[0],
        "final_loss": clock.losses[-1],
        "final_reward_accuracy": float(jnp.asarray(accuracy[-1])) if len(accuracy) else None,
        "eval_loss": None,  # no held-out pairs
        "losses": clock.losses,
    }
    marks = np.unique(np.linspace(0, len(clock.losses) - 1, CURVE_POINTS).round().astype(int))
    print("loss curve: " + ", ".join(f"{mark + 1}: {clock.losses[mark]:.3f}" for mark in marks))
    print(f"final reward accuracy: {summary['final_reward_accuracy']}")
    report(summary, args.out, model_name="Qwen3 (Tunix) DPO")
    return summary


def main(argv: list[str] | None = None) -> None:
    """Parses the command line and trains."""
    train(parse_args(argv))


if __name__ == "__main__":
    start = time.perf_counter()
    main()
    print(f"done in {time.perf_counter() - start:.0f} s")
