"""The token embedding: a table of (vocab, hidden), fp32 (a mixed-precision model) or bf16 (``table=bfloat16``: a
model trained from a bf16 checkpoint, as Tunix's), rows looked up for (tokens,) ids of a byte-level text (256
distinct ids, each repeated many times, as tokens of real text repeat) and cast to the activations' dtype. XLA's
baseline is flax's order (the table cast whole, its gradient a scatter-add in the activations' dtype); liger_jax
gathers then casts and sums the gradient in fp32, rounded once to the table's dtype. The floor: the forward reads
the rows and writes them cast; the backward reads the cotangent and writes the table's gradient."""

from __future__ import annotations

from benchmarks import draws
from benchmarks.case import Case, Op, itemsize
from benchmarks.providers import LIGER_JAX, XLA, kernel_provider, xla_provider

DISTINCT_IDS = 256
SMALL = {"tokens": 2048, "vocab": 32000, "hidden": 768}  # the main job's small preset, batch 16 × 128
LLAMA3 = {"tokens": 16384, "vocab": 128256, "hidden": 2048}  # Llama-3's vocabulary and the 1b preset's width
TARGETS = [(shape | table, "bfloat16") for table in ({}, {"table": "bfloat16"}) for shape in (SMALL, LLAMA3)]
# Llama-3's shape at other token counts, and the small preset off the line.
SWEEPS = {"tokens": ("tokens", [SMALL, *(LLAMA3 | {"tokens": n} for n in (4096, 16384, 65536))])}
SMOKE = [
    ({"tokens": 37, "vocab": 300, "hidden": 24}, "float32"),
    ({"tokens": 64, "vocab": 500, "hidden": 32}, "bfloat16"),
    ({"tokens": 64, "vocab": 500, "hidden": 32, "table": "bfloat16"}, "bfloat16"),
]


def _build(params, dtype: str) -> Case:
    tokens, vocab, hidden = params["tokens"], params["vocab"], params["hidden"]
    table_dtype = params.get("table", "float32")

    def make_inputs(key):
        table_key, ids_key = draws.keys(key, 2)
        return draws.normal(table_key, (vocab, hidden), table_dtype), draws.labels(ids_key, tokens, DISTINCT_IDS)

    rows = tokens * hidden
    forward = rows * (itemsize(table_dtype) + itemsize(dtype)) + 4 * tokens
    backward = rows * itemsize(dtype) + vocab * hidden * itemsize(table_dtype) + 4 * tokens
    return Case(
        "embedding",
        params,
        dtype,
        make_inputs,
        (0,),
        {LIGER_JAX: kernel_provider("embedding", dtype=dtype), XLA: xla_provider("embedding", dtype=dtype)},
        {"forward": forward, "backward": backward, "full": forward + backward},
        {"forward": 0.0, "backward": 0.0, "full": 0.0},
    )


OPS = [Op("embedding", _build, TARGETS, SWEEPS, SMOKE)]
