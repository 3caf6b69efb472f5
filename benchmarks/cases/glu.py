"""Gated activations of the MLP: SwiGLU and GeGLU over (tokens, intermediate) gate and up projections, and the
gated projection ``silu(x @ w_gate) * (x @ w_up)`` whole, which tokamax fuses into one op."""

from __future__ import annotations

from benchmarks import draws, tokamax_provider
from benchmarks.case import Case, Op, TorchProgram, itemsize
from benchmarks.providers import LIGER_JAX, TOKAMAX, XLA, kernel_provider, xla_provider

INTERMEDIATE = 14336  # Llama-3-8B
HIDDEN = 4096
TOKENS = 16384
SMALL = {"tokens": 2048, "intermediate": 2048}  # the main job's small preset, batch 16 × 128: launch-bound
SWEEPS = {
    "tokens": (
        "tokens",
        [SMALL, *({"tokens": n, "intermediate": INTERMEDIATE} for n in (2048, 8192, 16384, 32768))],
    ),
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


def _projections(x, w_gate, w_up):
    """The gate and up projections (XLA's matmuls, or torch's)."""
    return x @ w_gate, x @ w_up


def _projected(swiglu):
    """``fn(x, w_gate, w_up) = swiglu(x @ w_gate, x @ w_up)``."""
    return lambda *args: swiglu(*_projections(*args))


def gated_linear_unit_case(params, dtype: str) -> Case:
    """``silu(x @ w_gate) * (x @ w_up)`` with x (tokens, hidden) and each weight (hidden, intermediate).

    liger_jax: XLA's two matmuls, then liger_jax's SwiGLU kernel; xla: the same matmuls and the pure-JAX SwiGLU
    (XLA fuses it); tokamax: ``tokamax.gated_linear_unit``, which fuses the SwiGLU into its matmul kernel; Liger:
    torch's matmuls, then Liger's SwiGLU. Matmul-bound: 4·N·K·F flops forward (two products), 8·N·K·F backward (dx
    and both weight gradients). Bytes: x and the weights read, the output written; backward reads dout, x and the
    weights, writes their gradients.
    """
    tokens, hidden, intermediate = params["tokens"], params["hidden"], params["intermediate"]
    weight_shape = (hidden, intermediate)

    def make_inputs(key):
        kx, kg, ku = draws.keys(key, 3)
        x = draws.normal(kx, (tokens, hidden), dtype)
        return x, *(draws.normal(k, weight_shape, dtype, hidden**-0.5) for k in (kg, ku))

    def torch_program():
        from liger_kernel.transformers.functional import liger_swiglu

        return TorchProgram(
            _projected(liger_swiglu),
            lambda: (
                draws.torch_normal((tokens, hidden), dtype),
                draws.torch_normal(weight_shape, dtype, hidden**-0.5),
                draws.torch_normal(weight_shape, dtype, hidden**-0.5),
            ),
            (0, 1, 2),
        )

    size = itemsize(dtype)
    x, weights, out = tokens * hidden * size, 2 * hidden * intermediate * size, tokens * intermediate * size
    forward_flops = 4 * tokens * hidden * intermediate
    return Case(
        "gated_linear_unit",
        params,
        dtype,
        make_inputs,
        (0, 1, 2),
        {
            LIGER_JAX: kernel_provider("swiglu", inputs=_projections),
            XLA: _projected(xla_provider("swiglu")),
            TOKAMAX: tokamax_provider.swiglu_projection(dtype),
        },
        {"forward": x + weights + out, "backward": 2 * (x + weights) + out, "full": 3 * (x + weights) + 2 * out},
        {"forward": forward_flops, "backward": 2 * forward_flops, "full": 3 * forward_flops},
        torch_program,
    )


OPS = [
    Op("swiglu", _glu_case("swiglu", "liger_swiglu"), TARGETS, SWEEPS, SMOKE),
    Op("geglu", _glu_case("geglu", "liger_geglu"), TARGETS, SWEEPS, SMOKE),
    # Target only: a comparison with tokamax's fused kernel; the SwiGLU's own sweeps are swiglu's.
    Op(
        "gated_linear_unit",
        gated_linear_unit_case,
        [({"tokens": 8192, "hidden": HIDDEN, "intermediate": INTERMEDIATE}, "bfloat16")],
        {},
        [
            ({"tokens": 37, "hidden": 32, "intermediate": 96}, "float32"),
            ({"tokens": 64, "hidden": 64, "intermediate": 128}, "bfloat16"),
        ],
    ),
]
