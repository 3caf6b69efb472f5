"""Gated activations of the MLP: SwiGLU and GeGLU over (tokens, intermediate) gate and up projections."""

from __future__ import annotations

from benchmarks import draws
from benchmarks.case import Case, Op, TorchProgram, itemsize
from benchmarks.providers import LIGER_JAX, XLA, kernel_provider, xla_provider

INTERMEDIATE = 14336  # Llama-3-8B
TOKENS = 16384
SWEEPS = {
    "tokens": ("tokens", [{"tokens": n, "intermediate": INTERMEDIATE} for n in (2048, 8192, 16384, 32768)]),
    "hidden": ("intermediate", [{"tokens": TOKENS, "intermediate": i} for i in (4096, 8192, 14336, 28672)]),
}
SMOKE = [({"tokens": 37, "intermediate": 96}, "float32"), ({"tokens": 64, "intermediate": 256}, "bfloat16")]
TARGETS = [({"tokens": TOKENS, "intermediate": INTERMEDIATE}, "bfloat16")]


def _glu_case(op: str, torch_name: str):
    """A builder for ``op(gate, up)``: forward reads gate and up, writes out (3 passes); backward reads dout, gate
    and up, writes dgate and dup (5 passes)."""

    def build(params, dtype: str) -> Case:
        shape = (params["tokens"], params["intermediate"])

        def make_inputs(key):
            kg, ku = draws.keys(key, 2)
            return draws.normal(kg, shape, dtype), draws.normal(ku, shape, dtype)

        def torch_program():
            from liger_kernel.transformers import functional

            return TorchProgram(
                getattr(functional, torch_name),
                lambda: (draws.torch_normal(shape, dtype), draws.torch_normal(shape, dtype)),
                (0, 1),
            )

        activations = shape[0] * shape[1] * itemsize(dtype)
        return Case(
            op,
            params,
            dtype,
            make_inputs,
            (0, 1),
            {LIGER_JAX: kernel_provider(op), XLA: xla_provider(op)},
            {"forward": 3 * activations, "backward": 5 * activations, "full": 8 * activations},
            {"forward": 0.0, "backward": 0.0, "full": 0.0},
            torch_program,
        )

    return build


OPS = [
    Op("swiglu", _glu_case("swiglu", "liger_swiglu"), TARGETS, SWEEPS, SMOKE),
    Op("geglu", _glu_case("geglu", "liger_geglu"), TARGETS, SWEEPS, SMOKE),
]
