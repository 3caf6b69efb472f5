"""The sequence-tiled SwiGLU MLP (``liger_jax.flax_layers.*.TiledMLP``): peak memory at long sequences.

The point of tiling is memory: ``python -m benchmarks.peak`` (or the suite's peak rows) shows the backward pass
holding one tile's ``[tokens, intermediate]`` activations instead of all of them; the time rows show what the
recompute costs (a second forward of the MLP, 4/3 of the untiled flops). The liger_jax provider tiles the MLP with
:func:`liger_jax.flax_layers.tiled_mlp.tiled_over_sequence` (Liger's default ``ceil(S / H)`` tiles) around
liger_jax's SwiGLU; XLA's is the same MLP untiled. Liger's torch ``LigerTiledSwiGLUMLP`` differentiates its weights
through ``.grad`` side effects, not as inputs, so it has no torch row.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from benchmarks import draws
from benchmarks.case import Case, Op, itemsize
from benchmarks.providers import LIGER_JAX, XLA, kernel_implementation

# Llama-3-8B's MLP.
HIDDEN, INTERMEDIATE = 4096, 14336


def _shape(seq: int, batch: int = 1) -> dict[str, int]:
    return {"batch": batch, "seq": seq, "hidden": HIDDEN, "intermediate": INTERMEDIATE}


def _mlp(x, w_gate, w_up, w_down, implementation):
    import liger_jax

    return liger_jax.swiglu(x @ w_gate, x @ w_up, implementation=implementation) @ w_down


@dataclasses.dataclass(frozen=True)
class TiledSwiGLU:
    """The liger_jax provider: the MLP tiled over the tokens, its SwiGLU on the kernel implementation."""

    def __call__(self, *args: Any) -> Any:
        return self.with_implementation(kernel_implementation())(*args)

    def with_implementation(self, implementation: str | None):
        """The same call with liger_jax's ``implementation=`` for the SwiGLU."""
        from liger_jax.flax_layers.tiled_mlp import tiled_over_sequence

        def call(x, w_gate, w_up, w_down):
            return tiled_over_sequence(lambda tile: _mlp(tile, w_gate, w_up, w_down, implementation), x)

        return call


def tiled_mlp_case(params, dtype: str) -> Case:
    """``down(swiglu(x @ gate, x @ up))`` on ``[batch, seq, hidden]``, tiled or not; matmul-bound."""
    batch, seq, hidden, intermediate = params["batch"], params["seq"], params["hidden"], params["intermediate"]
    tokens = batch * seq

    def make_inputs(key):
        kx, kg, ku, kd = draws.keys(key, 4)
        return (
            draws.normal(kx, (batch, seq, hidden), dtype),
            draws.normal(kg, (hidden, intermediate), dtype, scale=hidden**-0.5),
            draws.normal(ku, (hidden, intermediate), dtype, scale=hidden**-0.5),
            draws.normal(kd, (intermediate, hidden), dtype, scale=intermediate**-0.5),
        )

    forward_flops = 6 * tokens * hidden * intermediate
    weights = 3 * hidden * intermediate * itemsize(dtype)
    activations = 2 * tokens * hidden * itemsize(dtype)
    return Case(
        "tiled_mlp",
        params,
        dtype,
        make_inputs,
        (0, 1, 2, 3),
        {LIGER_JAX: TiledSwiGLU(), XLA: lambda *args: _mlp(*args, "xla")},
        {
            "forward": weights + activations,
            "backward": 2 * (weights + activations),
            "full": 3 * (weights + activations),
        },
        # Untiled: the forward, then twice its flops backward; tiling adds one more forward (the recompute).
        {"forward": forward_flops, "backward": 2 * forward_flops, "full": 3 * forward_flops},
    )


OPS = [
    Op(
        "tiled_mlp",
        tiled_mlp_case,
        [(_shape(32768), "bfloat16")],
        # The main job's small preset (16 x 128 tokens), then one long sequence growing.
        {"tokens": ("seq", [_shape(128, batch=16), *(_shape(s) for s in (8192, 16384, 32768, 65536))])},
        [({"batch": 1, "seq": 12, "hidden": 4, "intermediate": 16}, "float32")],
    )
]
