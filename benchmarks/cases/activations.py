"""Activations: softmax and sparsemax over (tokens, cols) rows (attention scores, class logits), and ReLU² over
(tokens, intermediate) MLP activations. Each reads x and writes y forward (2 passes), reads dy and one saved array
(y, or x for ReLU²) and writes dx backward (3 passes)."""

from __future__ import annotations

from benchmarks import draws
from benchmarks.case import Case, Op, TorchProgram, itemsize
from benchmarks.cases import glu
from benchmarks.providers import LIGER_JAX, XLA, kernel_provider, xla_provider

COLS = 4096
TOKENS = 16384
SMALL = {"tokens": 2048, "cols": 768}  # the main job's small preset, batch 16 × 128: launch-bound
ROW_SWEEPS = {
    "tokens": ("tokens", [SMALL, *({"tokens": n, "cols": COLS} for n in (2048, 8192, 16384, 65536))]),
    # 32768: a vocabulary-sized row, the widest the kernels keep in one tile; 65536 walks column blocks.
    "hidden": ("cols", [{"tokens": TOKENS, "cols": d} for d in (1024, 4096, 16384, 32768, 65536)]),
}
ROW_SMOKE = [({"tokens": 37, "cols": 96}, "float32"), ({"tokens": 64, "cols": 128}, "bfloat16")]


def _activation_case(op: str, torch_name: str, width: str, cotangent_is_residual: bool = False):
    """A builder for ``op(x)`` with x of shape ``(tokens, params[width])``; Liger's ``functional.<torch_name>``
    (``cotangent_is_residual`` as :class:`Case`'s)."""

    def build(params, dtype: str) -> Case:
        shape = (params["tokens"], params[width])

        def torch_program():
            from liger_kernel.transformers import functional

            return TorchProgram(getattr(functional, torch_name), lambda: (draws.torch_normal(shape, dtype),), (0,))

        activations = shape[0] * shape[1] * itemsize(dtype)
        return Case(
            op,
            params,
            dtype,
            lambda key: (draws.normal(key, shape, dtype),),
            (0,),
            {LIGER_JAX: kernel_provider(op), XLA: xla_provider(op)},
            {"forward": 2 * activations, "backward": 3 * activations, "full": 5 * activations},
            {"forward": 0.0, "backward": 0.0, "full": 0.0},
            torch_program,
            cotangent_is_residual=cotangent_is_residual,
        )

    return build


ROW_TARGETS = [({"tokens": TOKENS, "cols": COLS}, "bfloat16"), ({"tokens": 4096, "cols": 32768}, "bfloat16")]
OPS = [
    Op(
        "softmax",
        _activation_case("softmax", "liger_softmax", "cols", cotangent_is_residual=True),
        ROW_TARGETS,
        ROW_SWEEPS,
        ROW_SMOKE,
    ),
    Op(
        "sparsemax",
        _activation_case("sparsemax", "liger_sparsemax", "cols", cotangent_is_residual=True),
        ROW_TARGETS,
        ROW_SWEEPS,
        ROW_SMOKE,
    ),
    Op(
        "relu_squared",
        _activation_case("relu_squared", "liger_relu_squared", "intermediate"),
        glu.TARGETS,
        glu.SWEEPS,
        glu.SMOKE,
    ),
]
