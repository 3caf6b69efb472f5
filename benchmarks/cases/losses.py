"""The loss head: cross-entropy over (tokens, vocab) logits, and the fused linear cross-entropy from hidden states.

The ``xla`` baseline is what JAX users write today: ``logits = x @ W`` (FLCE), then
``optax.softmax_cross_entropy_with_integer_labels`` on the logits upcast to fp32 (liger_jax's softmax math is fp32
too), mean over rows. For FLCE, ``liger_jax_xla`` is liger_jax's own chunked pure-JAX path and ``tokamax`` is
``tokamax.linear_softmax_cross_entropy_loss``.
"""

from __future__ import annotations

import dataclasses

from benchmarks import draws, tokamax_provider
from benchmarks.case import Case, Op, TorchProgram, itemsize
from benchmarks.providers import (
    LIGER_JAX,
    LIGER_JAX_XLA,
    TOKAMAX,
    XLA,
    KernelOp,
    kernel_provider,
    liger_op,
    xla_provider,
)

HIDDEN = 4096  # Llama-3-8B
VOCAB = 128256
TOKENS = 8192
SMALL_HIDDEN, SMALL_VOCAB = 768, 32000  # the main job's small preset, at batch 16 × 128 = 2048 tokens


def _optax_loss(logits, labels):
    import jax.numpy as jnp
    import optax

    return optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), labels).mean()


def _naive_linear_loss(x, weight, labels):
    return _optax_loss(x @ weight, labels)


def cross_entropy_case(params, dtype: str) -> Case:
    """``cross_entropy(logits, labels)``, mean.

    Forward reads the logits; backward reads them and writes dlogits. ``full`` counts one read and one write: the
    gradient is known up to the loss's scalar cotangent once the forward has run, so no implementation must read
    the logits twice. As in training, the logits are dead after the loss (``dead_argnums``), so the gradient may
    take over their buffer.
    """
    rows, vocab = params["tokens"], params["vocab"]

    def make_inputs(key):
        kx, kl = draws.keys(key, 2)
        return draws.normal(kx, (rows, vocab), dtype, 2.0), draws.labels(kl, rows, vocab)

    def torch_program():
        from liger_kernel.transformers.functional import liger_cross_entropy

        return TorchProgram(
            liger_cross_entropy,
            lambda: (draws.torch_normal((rows, vocab), dtype, 2.0), draws.torch_labels(rows, vocab)),
            (0,),
        )

    logits = rows * vocab * itemsize(dtype)
    labels = 4 * rows
    return Case(
        "cross_entropy",
        params,
        dtype,
        make_inputs,
        (0,),
        {LIGER_JAX: kernel_provider("cross_entropy"), XLA: _optax_loss},
        {"forward": logits + labels, "backward": 2 * logits + labels, "full": 2 * logits + labels},
        {"forward": 0.0, "backward": 0.0, "full": 0.0},
        torch_program,
        dead_argnums=(0,),  # the logits: an LM head's output, dead once the loss is taken
    )


@dataclasses.dataclass(frozen=True, eq=False)
class _WeightedWithAccuracy(KernelOp):
    """``liger_jax.<name>(*args, labels, ce_weight=w, return_token_accuracy=True)``'s loss (the accuracy is computed
    in the loss pass and dropped), called as ``fn(*args, labels, w)``."""

    def with_implementation(self, implementation):
        op = liger_op(self.name)

        def call(*args):
            *operands, ce_weight = args
            options = {"ce_weight": ce_weight, "return_token_accuracy": True, **self.options}
            return op(*operands, implementation=implementation, **options)[0]

        return call


def cross_entropy_options_case(params, dtype: str) -> Case:
    """:func:`cross_entropy_case` with Liger's options on: class weights and the token accuracy (mean).

    The same bytes as the plain loss plus the ``[V]`` weights: each option must cost no extra pass over the logits.
    """
    plain = cross_entropy_case(params, dtype)
    rows, vocab = params["tokens"], params["vocab"]

    def make_inputs(key):
        kx, kw = draws.keys(key, 2)
        return (*plain.make_inputs(kx), draws.normal(kw, (vocab,), "float32", 0.25, 1.0))

    def torch_program():
        from liger_kernel.transformers.functional import liger_cross_entropy

        def loss(logits, labels, weight):
            return liger_cross_entropy(logits, labels, weight, return_token_accuracy=True).loss

        return TorchProgram(
            loss,
            lambda: (
                draws.torch_normal((rows, vocab), dtype, 2.0),
                draws.torch_labels(rows, vocab),
                draws.torch_normal((vocab,), "float32", 0.25, 1.0, grad=False),
            ),
            (0,),
        )

    weights = 4 * vocab
    name = "cross_entropy"
    return dataclasses.replace(
        plain,
        op="cross_entropy_options",
        make_inputs=make_inputs,
        providers={
            LIGER_JAX: _WeightedWithAccuracy(name, {}),
            LIGER_JAX_XLA: _WeightedWithAccuracy(name, {}).with_implementation("xla"),
        },
        bytes_moved={mode: moved + weights for mode, moved in plain.bytes_moved.items()},
        torch_program=torch_program,
    )


def fused_linear_cross_entropy_options_case(params, dtype: str) -> Case:
    """:func:`fused_linear_cross_entropy_case` with class weights and the token accuracy (mean)."""
    plain = fused_linear_cross_entropy_case(params, dtype)
    hidden, vocab = params["hidden"], params["vocab"]
    rows = params["tokens"]

    def make_inputs(key):
        kx, kw = draws.keys(key, 2)
        return (*plain.make_inputs(kx), draws.normal(kw, (vocab,), "float32", 0.25, 1.0))

    def torch_program():
        from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy

        def loss(x, weight, labels, ce_weight):
            return liger_fused_linear_cross_entropy(
                x, weight, labels, ce_weight=ce_weight, return_token_accuracy=True
            ).loss

        return TorchProgram(
            loss,
            lambda: (
                draws.torch_normal((rows, hidden), dtype),
                draws.torch_normal((vocab, hidden), dtype, hidden**-0.5),
                draws.torch_labels(rows, vocab),
                draws.torch_normal((vocab,), "float32", 0.25, 1.0, grad=False),
            ),
            (0, 1),
        )

    name = "fused_linear_cross_entropy"
    return dataclasses.replace(
        plain,
        op="fused_linear_cross_entropy_options",
        make_inputs=make_inputs,
        providers={
            LIGER_JAX: _WeightedWithAccuracy(name, {"weight_layout": "hv"}),
            LIGER_JAX_XLA: _WeightedWithAccuracy(name, {"weight_layout": "hv"}).with_implementation("xla"),
        },
        torch_program=torch_program,
    )


def fused_linear_cross_entropy_case(params, dtype: str) -> Case:
    """``fused_linear_cross_entropy(x, weight, labels)`` with weight (H, V), mean; gradients for x and weight.

    Matmul-bound: 2·N·H·V flops forward, 4·N·H·V backward (dx and dweight). Bytes: x and the weight read, dx and
    dweight written.
    """
    rows, hidden, vocab = params["tokens"], params["hidden"], params["vocab"]

    def make_inputs(key):
        kx, kw, kl = draws.keys(key, 3)
        x = draws.normal(kx, (rows, hidden), dtype)
        weight = draws.normal(kw, (hidden, vocab), dtype, hidden**-0.5)
        return x, weight, draws.labels(kl, rows, vocab)

    def torch_program():
        from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy

        # Liger takes the weight as (V, H), the layout of torch's nn.Linear and of a tied embedding.
        return TorchProgram(
            liger_fused_linear_cross_entropy,
            lambda: (
                draws.torch_normal((rows, hidden), dtype),
                draws.torch_normal((vocab, hidden), dtype, hidden**-0.5),
                draws.torch_labels(rows, vocab),
            ),
            (0, 1),
        )

    size = itemsize(dtype)
    x, weight, labels = rows * hidden * size, hidden * vocab * size, 4 * rows
    matmul = 2 * rows * hidden * vocab
    name = "fused_linear_cross_entropy"
    return Case(
        name,
        params,
        dtype,
        make_inputs,
        (0, 1),
        {
            LIGER_JAX: kernel_provider(name, weight_layout="hv"),
            XLA: _naive_linear_loss,
            LIGER_JAX_XLA: xla_provider(name, weight_layout="hv"),
            TOKAMAX: tokamax_provider.linear_cross_entropy(dtype),
        },
        {"forward": x + weight + labels, "backward": 2 * (x + weight) + labels, "full": 2 * (x + weight) + labels},
        {"forward": matmul, "backward": 2 * matmul, "full": 3 * matmul},
        torch_program,
    )


# Option variants (issue #22): the targets only, against the plain ops' rows.
OPTION_SMOKE = [({"tokens": 37, "vocab": 300}, "float32")]
OPS = [
    Op(
        "cross_entropy",
        cross_entropy_case,
        [({"tokens": TOKENS, "vocab": VOCAB}, "bfloat16")],
        {
            "tokens": (
                "tokens",
                [{"tokens": 2048, "vocab": SMALL_VOCAB}, *({"tokens": n, "vocab": VOCAB} for n in (2048, 8192, 32768))],
            ),
            "vocab": ("vocab", [{"tokens": TOKENS, "vocab": v} for v in (32000, 65536, 128256, 256000)]),
        },
        [({"tokens": 37, "vocab": 300}, "float32"), ({"tokens": 64, "vocab": 512}, "bfloat16")],
    ),
    Op(
        "fused_linear_cross_entropy",
        fused_linear_cross_entropy_case,
        [
            ({"tokens": TOKENS, "hidden": HIDDEN, "vocab": VOCAB}, "bfloat16"),
            ({"tokens": 32768, "hidden": HIDDEN, "vocab": 256000}, "bfloat16"),
        ],
        {
            "tokens": (
                "tokens",
                [
                    {"tokens": 2048, "hidden": SMALL_HIDDEN, "vocab": SMALL_VOCAB},
                    *({"tokens": n, "hidden": HIDDEN, "vocab": VOCAB} for n in (2048, 8192, 32768)),
                ],
            ),
            "vocab": ("vocab", [{"tokens": TOKENS, "hidden": HIDDEN, "vocab": v} for v in (32000, 128256, 256000)]),
        },
        [
            ({"tokens": 37, "hidden": 32, "vocab": 300}, "float32"),
            ({"tokens": 64, "hidden": 64, "vocab": 512}, "bfloat16"),
        ],
    ),
    Op(
        "cross_entropy_options",
        cross_entropy_options_case,
        [({"tokens": TOKENS, "vocab": VOCAB}, "bfloat16")],
        {},
        OPTION_SMOKE,
    ),
    Op(
        "fused_linear_cross_entropy_options",
        fused_linear_cross_entropy_options_case,
        [({"tokens": TOKENS, "hidden": HIDDEN, "vocab": VOCAB}, "bfloat16")],
        {},
        [({"tokens": 37, "hidden": 32, "vocab": 300}, "float32")],
    ),
]
