"""Rotary position embedding on (batch, seq, heads, head_dim) queries and keys, GQA."""

from __future__ import annotations

from benchmarks import draws
from benchmarks.case import Case, Op, TorchProgram, itemsize
from benchmarks.providers import LIGER_JAX, XLA, kernel_provider, xla_provider

HEAD_DIM = 128
GQA_GROUP = 4  # Llama-3-8B: 32 query heads share 8 key/value heads


def _shape(batch: int, seq: int, q_heads: int) -> dict[str, int]:
    return {"batch": batch, "seq": seq, "q_heads": q_heads, "kv_heads": q_heads // GQA_GROUP, "head_dim": HEAD_DIM}


# The main job's small preset at batch 16 × 128: launch-bound.
SMALL = {"batch": 16, "seq": 128, "q_heads": 12, "kv_heads": 4, "head_dim": 64}
SWEEPS = {
    "tokens": ("seq", [SMALL, *(_shape(4, s, 32) for s in (1024, 2048, 4096, 8192))]),
    "hidden": ("q_heads", [_shape(4, 4096, h) for h in (8, 16, 32, 64)]),
}
SMOKE = [
    ({"batch": 2, "seq": 8, "q_heads": 4, "kv_heads": 2, "head_dim": 16}, "float32"),
    ({"batch": 1, "seq": 16, "q_heads": 4, "kv_heads": 1, "head_dim": 32}, "bfloat16"),
]


def _cos_sin(xp, seq: int, head_dim: int):
    """Rotate-half tables of shape (seq, head_dim) in fp32 for positions 0..seq-1, base 10000.

    ``xp`` is ``jax.numpy`` or ``torch``: both spell these calls the same.
    """
    inverse_frequency = 1.0 / (10000.0 ** (xp.arange(0, head_dim, 2, dtype=xp.float32) / head_dim))
    angles = xp.arange(seq, dtype=xp.float32)[:, None] * inverse_frequency[None, :]
    angles = xp.concatenate([angles, angles], axis=-1)
    return xp.cos(angles), xp.sin(angles)


def rope_case(params, dtype: str) -> Case:
    """``apply_rotary_pos_emb(q, k, cos, sin)``: each direction reads q, k, cos, sin once and writes q, k once."""
    batch, seq, head_dim = params["batch"], params["seq"], params["head_dim"]
    q_shape = (batch, seq, params["q_heads"], head_dim)
    k_shape = (batch, seq, params["kv_heads"], head_dim)

    def make_inputs(key):
        import jax.numpy as jnp

        kq, kk = draws.keys(key, 2)
        cos, sin = (table.astype(dtype) for table in _cos_sin(jnp, seq, head_dim))
        return draws.normal(kq, q_shape, dtype), draws.normal(kk, k_shape, dtype), cos, sin

    def torch_program():
        import torch
        from liger_kernel.transformers.rope import liger_rotary_pos_emb

        def make_torch_inputs():
            with torch.device("cuda"):
                cos, sin = (table.to(getattr(torch, dtype))[None] for table in _cos_sin(torch, seq, head_dim))
            return draws.torch_normal(q_shape, dtype), draws.torch_normal(k_shape, dtype), cos, sin

        # Liger takes (batch, heads, seq, head_dim) views; transposing our (batch, seq, heads, head_dim) tensors
        # gives exactly the memory layout Liger's own benchmark uses.
        return TorchProgram(
            lambda q, k, cos, sin: liger_rotary_pos_emb(q.transpose(1, 2), k.transpose(1, 2), cos, sin),
            make_torch_inputs,
            (0, 1),
        )

    size = itemsize(dtype)
    qk = batch * seq * (params["q_heads"] + params["kv_heads"]) * head_dim * size
    tables = 2 * seq * head_dim * size
    one_way = 2 * qk + tables
    return Case(
        "apply_rotary_pos_emb",
        params,
        dtype,
        make_inputs,
        (0, 1),
        {LIGER_JAX: kernel_provider("apply_rotary_pos_emb"), XLA: xla_provider("apply_rotary_pos_emb")},
        {"forward": one_way, "backward": one_way, "full": 2 * one_way},
        {"forward": 0.0, "backward": 0.0, "full": 0.0},
        torch_program,
    )


OPS = [Op("apply_rotary_pos_emb", rope_case, [(_shape(4, 4096, 32), "bfloat16")], SWEEPS, SMOKE)]
