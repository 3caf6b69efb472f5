"""LM-head losses for distillation and RL: per-token log-probs, fused JSD, and Liger's chunked distillation loss.

The ``xla`` baseline is what JAX users write today: the full ``[N, V]`` logits of each model (``x @ W``), then the
loss on them upcast to fp32 (MaxText's and Tunix's distillation, Tunix's ``logp`` step). ``liger_jax_xla`` is
liger_jax's own chunked pure-JAX path. The teacher is frozen: only the student's x and weight are differentiated.
Matmul-bound: each model's logits cost 2·N·H·V flops, and the student's dx and dweight 2·N·H·V each.
"""

from __future__ import annotations

import dataclasses

from benchmarks import draws
from benchmarks.case import Case, Op, TorchProgram, itemsize
from benchmarks.providers import LIGER_JAX, LIGER_JAX_XLA, XLA, kernel_provider, xla_provider

HIDDEN, VOCAB, TOKENS = 4096, 128256, 8192  # Llama-3-8B's head, the target shape
SMALL_HIDDEN, SMALL_VOCAB, SMALL_TOKENS = 768, 32000, 2048  # the main job's small preset
BETA, TEMPERATURE = 0.5, 1.0
IGNORED_EVERY = 8  # every 8th label is ignore_index (-100): prompt tokens of an SFT batch


def _naive_logits(x, weight):
    import jax.numpy as jnp

    return (x @ weight).astype(jnp.float32) / TEMPERATURE


def _naive_logprobs(x, weight, tokens):
    import jax
    import jax.numpy as jnp

    log_p = jax.nn.log_softmax(_naive_logits(x, weight), axis=-1)
    return jnp.take_along_axis(log_p, tokens[:, None], axis=-1)[:, 0]


def _naive_jsd_rows(student_logits, teacher_logits):
    import jax
    import jax.numpy as jnp

    log_q, log_p = jax.nn.log_softmax(student_logits, axis=-1), jax.nn.log_softmax(teacher_logits, axis=-1)
    q, p = jnp.exp(log_q), jnp.exp(log_p)
    log_m = jnp.log(BETA * p + (1.0 - BETA) * q)
    return jnp.sum(BETA * p * (log_p - log_m) + (1.0 - BETA) * q * (log_q - log_m), axis=-1)


def _naive_jsd(x, weight, teacher_x, teacher_weight, labels):
    import jax
    import jax.numpy as jnp

    teacher_logits = jax.lax.stop_gradient(_naive_logits(teacher_x, teacher_weight))
    rows = _naive_jsd_rows(_naive_logits(x, weight), teacher_logits)
    counted = labels != -100
    return jnp.sum(jnp.where(counted, rows, 0.0)) / jnp.maximum(jnp.sum(counted), 1)


def _naive_distillation(x, weight, teacher_x, teacher_weight, labels):
    import jax
    import jax.numpy as jnp

    student_logits = (x @ weight).astype(jnp.float32)
    counted = labels != -100
    log_q = jax.nn.log_softmax(student_logits, axis=-1)
    picked = jnp.take_along_axis(log_q, jnp.where(counted, labels, 0)[:, None], axis=-1)
    hard = -jnp.sum(jnp.where(counted, picked[:, 0], 0.0)) / jnp.maximum(jnp.sum(counted), 1)
    return 0.5 * hard + 0.5 * _naive_jsd(x, weight, teacher_x, teacher_weight, labels)


def _labels(key, rows, vocab):
    return draws.labels(key, rows, vocab).at[::IGNORED_EVERY].set(-100)


def _torch_labels(rows, vocab):
    labels = draws.torch_labels(rows, vocab)
    labels[::IGNORED_EVERY] = -100
    return labels


def _head_bytes(rows, hidden, vocab, dtype, teacher: bool):
    """Bytes of x and the weight read (each model's), dx and dweight written, the labels read."""
    size = itemsize(dtype)
    x, weight, labels = rows * hidden * size, hidden * vocab * size, 4 * rows
    models = 2 if teacher else 1
    forward = models * (x + weight) + labels
    return {"forward": forward, "backward": forward + x + weight, "full": forward + x + weight}


def logprobs_case(params, dtype: str) -> Case:
    """``fused_linear_logprobs(x, weight, tokens)`` with weight (H, V); gradients for x and weight under a per-token
    cotangent, as a policy-gradient loss gives. The per-token cotangent makes the backward pass recompute each
    chunk's logits: four matmuls in ``full`` against the floor's three (the XLA baseline keeps the fp32 logits
    instead)."""
    rows, hidden, vocab = params["tokens"], params["hidden"], params["vocab"]

    def make_inputs(key):
        kx, kw, kt = draws.keys(key, 3)
        x = draws.normal(kx, (rows, hidden), dtype)
        weight = draws.normal(kw, (hidden, vocab), dtype, hidden**-0.5)
        return x, weight, draws.labels(kt, rows, vocab)

    matmul = 2 * rows * hidden * vocab
    name = "fused_linear_logprobs"
    return Case(
        name,
        params,
        dtype,
        make_inputs,
        (0, 1),
        {
            LIGER_JAX: kernel_provider(name, temperature=TEMPERATURE),
            XLA: _naive_logprobs,
            LIGER_JAX_XLA: xla_provider(name, temperature=TEMPERATURE),
        },
        _head_bytes(rows, hidden, vocab, dtype, teacher=False),
        {"forward": matmul, "backward": 2 * matmul, "full": 3 * matmul},
        None,  # Liger has no plain per-token log-prob function (its GRPO loss computes them inside)
    )


def _teacher_case(name: str, xla_fn, torch_program_of):
    """A builder for ``name(x, weight, teacher_x, teacher_weight, labels)``, both heads (H, V) with the same H."""

    def build(params, dtype: str) -> Case:
        rows, hidden, vocab = params["tokens"], params["hidden"], params["vocab"]

        def make_inputs(key):
            kx, kw, ktx, ktw, kl = draws.keys(key, 5)
            x = draws.normal(kx, (rows, hidden), dtype)
            weight = draws.normal(kw, (hidden, vocab), dtype, hidden**-0.5)
            teacher_x = draws.normal(ktx, (rows, hidden), dtype)
            teacher_weight = draws.normal(ktw, (hidden, vocab), dtype, hidden**-0.5)
            return x, weight, teacher_x, teacher_weight, _labels(kl, rows, vocab)

        def torch_program():
            # Liger's heads are (V, H); the teacher records no gradient.
            return TorchProgram(
                torch_program_of(),
                lambda: (
                    draws.torch_normal((rows, hidden), dtype),
                    draws.torch_normal((vocab, hidden), dtype, hidden**-0.5),
                    draws.torch_normal((rows, hidden), dtype, grad=False),
                    draws.torch_normal((vocab, hidden), dtype, hidden**-0.5, grad=False),
                    _torch_labels(rows, vocab),
                ),
                (0, 1),
            )

        matmul = 2 * rows * hidden * vocab
        options = {"beta": BETA, "temperature": TEMPERATURE}
        return Case(
            name,
            params,
            dtype,
            make_inputs,
            (0, 1),
            {
                LIGER_JAX: kernel_provider(name, **options),
                XLA: xla_fn,
                LIGER_JAX_XLA: xla_provider(name, **options),
            },
            _head_bytes(rows, hidden, vocab, dtype, teacher=True),
            {"forward": 2 * matmul, "backward": 2 * matmul, "full": 4 * matmul},
            torch_program,
        )

    return build


def _liger_fused_linear_jsd():
    from liger_kernel.transformers.functional import liger_fused_linear_jsd

    def call(x, weight, teacher_x, teacher_weight, labels):
        return liger_fused_linear_jsd(
            x, weight, teacher_x, teacher_weight, labels, jsd_beta=BETA, temperature=TEMPERATURE
        )

    return call


def _liger_distillation():
    from liger_kernel.chunked_loss import LigerFusedLinearJSDLoss

    return LigerFusedLinearJSDLoss(beta=BETA, temperature=TEMPERATURE)


# The memory variant (issue 20: compiled temporaries < 1/8 of one model's fp32 logits, N·V·4/8 = 501 MiB at the
# target shape). With bf16 accumulation the dweight accumulator can be the gradient's own buffer (the CPU compiler
# makes it so), leaving one chunk's [chunk, V] buffers: per logit at most both models' bf16 logits (2 + 2 B), their
# fp32 log-probabilities (4 + 4 B), the fp32 gradient (4 B) and its bf16 rounding (2 B), 18 B (the CPU compiler
# keeps 17). 128 rows × 128256 × 18 B = 282 MiB; 256 rows would be 564 MiB. (The 2026-12-04 H200 rows suggest
# fewer: fused_linear_jsd's 3,014 MiB are the 2 GiB fp32 accumulator and ~7.7 B per logit of 1024-row chunks; the
# chunk sweep shows which sizes fit.) Each chunk re-reads both heads and the accumulator, so small chunks cost time.
MEMORY_CHUNK_ROWS = 128


def _memory_case(params, dtype: str) -> Case:
    """``fused_linear_distillation`` as in the plain case, with ``accum_dtype`` the heads' dtype and
    ``params["chunk"]`` rows per chunk: the least memory, at the cost of ``N / chunk`` passes over both heads."""
    plain_params = {k: v for k, v in params.items() if k != "chunk"}
    plain = _teacher_case("fused_linear_distillation", _naive_distillation, _liger_distillation)(plain_params, dtype)
    options = {"beta": BETA, "temperature": TEMPERATURE, "accum_dtype": dtype, "chunk_size": params["chunk"]}
    return dataclasses.replace(
        plain,
        op="fused_linear_distillation_memory",
        params=params,
        providers={LIGER_JAX: kernel_provider("fused_linear_distillation", **options)},
        torch_program=None,  # Liger's own memory is measured in the plain case's rows
    )


_SHAPES = {
    "targets": [
        ({"tokens": TOKENS, "hidden": HIDDEN, "vocab": VOCAB}, "bfloat16"),
        ({"tokens": SMALL_TOKENS, "hidden": SMALL_HIDDEN, "vocab": SMALL_VOCAB}, "bfloat16"),
    ],
    "sweeps": {
        "tokens": (
            "tokens",
            [
                {"tokens": SMALL_TOKENS, "hidden": SMALL_HIDDEN, "vocab": SMALL_VOCAB},
                *({"tokens": n, "hidden": HIDDEN, "vocab": VOCAB} for n in (2048, 8192)),
            ],
        ),
    },
    "smoke": [
        ({"tokens": 37, "hidden": 32, "vocab": 300}, "float32"),
        ({"tokens": 64, "hidden": 64, "vocab": 512}, "bfloat16"),
    ],
}

OPS = [
    Op("fused_linear_logprobs", logprobs_case, _SHAPES["targets"], _SHAPES["sweeps"], _SHAPES["smoke"]),
    Op(
        "fused_linear_jsd",
        _teacher_case("fused_linear_jsd", _naive_jsd, _liger_fused_linear_jsd),
        _SHAPES["targets"],
        _SHAPES["sweeps"],
        _SHAPES["smoke"],
    ),
    Op(
        "fused_linear_distillation",
        _teacher_case("fused_linear_distillation", _naive_distillation, _liger_distillation),
        _SHAPES["targets"],
        _SHAPES["sweeps"],
        _SHAPES["smoke"],
    ),
    Op(
        "fused_linear_distillation_memory",
        _memory_case,
        [({"tokens": TOKENS, "hidden": HIDDEN, "vocab": VOCAB, "chunk": MEMORY_CHUNK_ROWS}, "bfloat16")],
        {
            "chunk": (
                "chunk",
                [{"tokens": TOKENS, "hidden": HIDDEN, "vocab": VOCAB, "chunk": c} for c in (128, 256, 512, 768, 1024)],
            )
        },
        [
            ({"tokens": 37, "hidden": 32, "vocab": 300, "chunk": 16}, "float32"),
            ({"tokens": 64, "hidden": 64, "vocab": 512, "chunk": 16}, "bfloat16"),
        ],
    ),
]
