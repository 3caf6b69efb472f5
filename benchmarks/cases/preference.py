"""Preference and RL losses on the LM head: DPO with a reference model, and GRPO.

The ``xla`` baseline is what JAX post-training stacks (Tunix, MaxText, EasyDeL) write today: the full
``[B, S, V]`` logits of the policy (and of the reference model), an fp32 ``log_softmax``, the picked log-probs, then
the loss. ``liger_jax_xla`` is liger_jax's own chunked pure-JAX path. Every provider returns the scalar loss only
(the metrics carry no gradient).
"""

from __future__ import annotations

import dataclasses

from benchmarks import draws
from benchmarks.case import Case, Op, TorchProgram, itemsize
from benchmarks.providers import LIGER_JAX, LIGER_JAX_XLA, XLA, KernelOp, liger_op, xla_provider

HIDDEN, VOCAB = 4096, 128256  # Llama-3-8B's head
DPO_PAIRS, DPO_LENGTH = 4, 2048
GRPO_COMPLETIONS, GRPO_LENGTH = 8, 1024
BETA = 0.1


def _kernel_provider(kind, name: str, **options):
    """A :class:`KernelOp` subclass that maps the case's positional inputs to the loss's keywords and returns the
    loss alone (MissingOpError while liger_jax lacks the op)."""
    liger_op(name)
    return kind(name, options)


def _xla_loss_of(name: str, **options):
    call = xla_provider(name, **options)
    return lambda *args, **keywords: call(*args, **keywords)[0]


def _full_logit_logps(x, weight, tokens, temperature=1.0):
    """The baseline's per-token log-probs: every logit materialised, fp32 log_softmax."""
    import jax
    import jax.numpy as jnp

    logits = (x @ weight).astype(jnp.float32) / temperature
    log_p = jax.nn.log_softmax(logits, axis=-1)
    return jnp.take_along_axis(log_p, tokens[..., None], axis=-1)[..., 0]


def _naive_dpo(x, weight, labels, ref_x, ref_weight):
    import jax
    import jax.numpy as jnp

    def sequence_logps(x, weight):
        mask = labels != -100
        return jnp.sum(jnp.where(mask, _full_logit_logps(x, weight, jnp.where(mask, labels, 0)), 0.0), axis=-1)

    ratios = sequence_logps(x, weight) - jax.lax.stop_gradient(sequence_logps(ref_x, ref_weight))
    pairs = labels.shape[0] // 2
    return -jnp.mean(jax.nn.log_sigmoid(BETA * (ratios[:pairs] - ratios[pairs:])))


def _naive_grpo(x, weight, tokens, mask, advantages, ref_logps, old_logps):
    from liger_jax.ops.grpo import grpo_loss_from_logps

    logps = _full_logit_logps(x, weight, tokens)
    return grpo_loss_from_logps(logps, mask, advantages, ref_per_token_logps=ref_logps, old_per_token_logps=old_logps)[
        0
    ]


def _head_bytes_and_flops(rows, hidden, vocab, dtype, reference_rows):
    """HBM bytes (x, weight, the reference's x and weight read; dx, dweight written) and matmul flops (policy
    forward 2·N·H·V, reference forward 2·N·H·V, backward dx and dweight 4·N·H·V) of a loss on the LM head."""
    size = itemsize(dtype)
    x, weight, ref = rows * hidden * size, hidden * vocab * size, reference_rows * hidden * size
    forward = 2 * rows * hidden * vocab + 2 * reference_rows * hidden * vocab
    backward = 4 * rows * hidden * vocab
    reads = x + weight + (ref + weight if reference_rows else 0)
    bytes_moved = {"forward": reads, "backward": 2 * (x + weight), "full": reads + x + weight}
    return bytes_moved, {"forward": forward, "backward": backward, "full": forward + backward}


def dpo_case(params, dtype: str) -> Case:
    """``fused_linear_dpo`` (sigmoid) on ``pairs`` chosen/rejected pairs of ``length`` tokens with a reference
    model (its own hidden states and head); gradients for x and the weight."""
    pairs, length, hidden, vocab = params["pairs"], params["length"], params["hidden"], params["vocab"]
    batch = 2 * pairs

    def make_inputs(key):
        kx, kw, kl, krx, krw = draws.keys(key, 5)
        x = draws.normal(kx, (batch, length, hidden), dtype)
        weight = draws.normal(kw, (hidden, vocab), dtype, hidden**-0.5)
        labels = draws.labels(kl, batch * length, vocab).reshape(batch, length)
        ref_x = draws.normal(krx, (batch, length, hidden), dtype)
        ref_weight = draws.normal(krw, (hidden, vocab), dtype, hidden**-0.5)
        return x, weight, labels, ref_x, ref_weight

    def torch_program():
        from liger_kernel.chunked_loss import LigerFusedLinearDPOLoss

        loss = LigerFusedLinearDPOLoss(beta=BETA, use_ref_model=True)

        def liger_dpo(x, weight, labels, ref_x, ref_weight):  # Liger's heads are (V, H)
            return loss(weight, x, labels, ref_input=ref_x, ref_weight=ref_weight)[0]

        return TorchProgram(
            liger_dpo,
            lambda: (
                draws.torch_normal((batch, length, hidden), dtype),
                draws.torch_normal((vocab, hidden), dtype, hidden**-0.5),
                draws.torch_labels(batch * length, vocab).view(batch, length),
                draws.torch_normal((batch, length, hidden), dtype, grad=False),
                draws.torch_normal((vocab, hidden), dtype, hidden**-0.5, grad=False),
            ),
            (0, 1),
        )

    rows = batch * length
    bytes_moved, flops = _head_bytes_and_flops(rows, hidden, vocab, dtype, rows)

    name = "fused_linear_dpo"
    return Case(
        name,
        params,
        dtype,
        make_inputs,
        (0, 1),
        {
            LIGER_JAX: _kernel_provider(_DPOWithReference, name, beta=BETA),
            XLA: _naive_dpo,
            LIGER_JAX_XLA: lambda x, w, y, rx, rw: _xla_loss_of(name, beta=BETA)(x, w, y, ref_x=rx, ref_weight=rw),
        },
        bytes_moved,
        flops,
        torch_program,
    )


@dataclasses.dataclass(frozen=True)
class _DPOWithReference(KernelOp):
    """``fused_linear_dpo(x, weight, labels, ref_x=..., ref_weight=...)`` from the case's positional inputs."""

    def with_implementation(self, implementation):
        op = liger_op(self.name)

        def call(x, weight, labels, ref_x, ref_weight):
            return op(
                x, weight, labels, ref_x=ref_x, ref_weight=ref_weight, implementation=implementation, **self.options
            )[0]

        return call


def grpo_case(params, dtype: str) -> Case:
    """``fused_linear_grpo`` (DAPO, token-level, KL against precomputed reference log-probs, off-policy old
    log-probs) on ``completions`` sampled completions of ``length`` tokens; gradients for x and the weight."""
    completions, length, hidden, vocab = params["completions"], params["length"], params["hidden"], params["vocab"]

    def make_inputs(key):
        import jax.numpy as jnp

        kx, kw, kt, ka, kr, ko = draws.keys(key, 6)
        x = draws.normal(kx, (completions, length, hidden), dtype)
        weight = draws.normal(kw, (hidden, vocab), dtype, hidden**-0.5)
        tokens = draws.labels(kt, completions * length, vocab).reshape(completions, length)
        tokens = jnp.maximum(tokens, 0)  # sampled tokens: no ignored positions
        mask = jnp.ones((completions, length), jnp.bool_)
        advantages = draws.normal(ka, (completions,), "float32")
        ref_logps = draws.normal(kr, (completions, length), "float32", 0.1, -11.8)  # ≈ log(1 / 128256)
        old_logps = draws.normal(ko, (completions, length), "float32", 0.1, -11.8)
        return x, weight, tokens, mask, advantages, ref_logps, old_logps

    def torch_program():
        import torch
        from liger_kernel.chunked_loss import LigerFusedLinearGRPOLoss

        loss = LigerFusedLinearGRPOLoss(beta=0.04, use_ref_model=True, loss_type="dapo")

        def liger_grpo(x, weight, tokens, mask, advantages, ref_logps, old_logps):  # Liger's heads are (V, H)
            return loss(
                x, weight, tokens, mask, advantages, ref_per_token_logps=ref_logps, old_per_token_logps=old_logps
            )[0]

        def make_inputs():
            logps = (completions, length)
            return (
                draws.torch_normal((completions, length, hidden), dtype),
                draws.torch_normal((vocab, hidden), dtype, hidden**-0.5),
                draws.torch_labels(completions * length, vocab).view(completions, length).clamp(min=0),
                torch.ones(logps, dtype=torch.bool, device="cuda"),
                draws.torch_normal((completions,), "float32", grad=False),
                draws.torch_normal(logps, "float32", 0.1, -11.8, grad=False),
                draws.torch_normal(logps, "float32", 0.1, -11.8, grad=False),
            )

        return TorchProgram(liger_grpo, make_inputs, (0, 1))

    bytes_moved, flops = _head_bytes_and_flops(completions * length, hidden, vocab, dtype, 0)
    name = "fused_linear_grpo"

    return Case(
        name,
        params,
        dtype,
        make_inputs,
        (0, 1),
        {
            LIGER_JAX: _kernel_provider(_GRPOWithLogps, name),
            XLA: _naive_grpo,
            LIGER_JAX_XLA: lambda x, w, t, m, a, r, o: _xla_loss_of(name)(
                x, w, t, m, a, ref_per_token_logps=r, old_per_token_logps=o
            ),
        },
        bytes_moved,
        flops,
        torch_program,
    )


@dataclasses.dataclass(frozen=True)
class _GRPOWithLogps(KernelOp):
    """``fused_linear_grpo(..., ref_per_token_logps=..., old_per_token_logps=...)`` from positional inputs."""

    def with_implementation(self, implementation):
        op = liger_op(self.name)

        def call(x, weight, tokens, mask, advantages, ref_logps, old_logps):
            return op(
                x, weight, tokens, mask, advantages, ref_per_token_logps=ref_logps, old_per_token_logps=old_logps,
                implementation=implementation, **self.options,
            )[0]  # fmt: skip

        return call


OPS = [
    Op(
        "fused_linear_dpo",
        dpo_case,
        [({"pairs": DPO_PAIRS, "length": DPO_LENGTH, "hidden": HIDDEN, "vocab": VOCAB}, "bfloat16")],
        {
            "length": (
                "length",
                [{"pairs": DPO_PAIRS, "length": n, "hidden": HIDDEN, "vocab": VOCAB} for n in (512, 1024, 2048)],
            )
        },
        [
            ({"pairs": 2, "length": 7, "hidden": 32, "vocab": 300}, "float32"),
            ({"pairs": 1, "length": 16, "hidden": 64, "vocab": 512}, "bfloat16"),
        ],
    ),
    Op(
        "fused_linear_grpo",
        grpo_case,
        [({"completions": GRPO_COMPLETIONS, "length": GRPO_LENGTH, "hidden": HIDDEN, "vocab": VOCAB}, "bfloat16")],
        {
            "length": (
                "length",
                [
                    {"completions": GRPO_COMPLETIONS, "length": n, "hidden": HIDDEN, "vocab": VOCAB}
                    for n in (256, 1024, 4096)
                ],
            )
        },
        [
            ({"completions": 3, "length": 7, "hidden": 32, "vocab": 300}, "float32"),
            ({"completions": 2, "length": 16, "hidden": 64, "vocab": 512}, "bfloat16"),
        ],
    ),
]
