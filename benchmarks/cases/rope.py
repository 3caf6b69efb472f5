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
    ({"batch": 1, "seq": 8, "q_heads": 2, "kv_heads": 1, "head_dim": 20, "rotary_dim": 8}, "float32"),
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
    """``apply_rotary_pos_emb(q, k, cos, sin)``: each direction reads q, k, cos, sin once and writes q, k once.

    With ``rotary_dim`` in ``params`` (the "rotary" sweep) only that many leading features of each head rotate
    (partial rotary, Phi / GPT-NeoX); Liger's torch RoPE has no partial rotary, so that sweep has no torch row.
    """
    batch, seq, head_dim = params["batch"], params["seq"], params["head_dim"]
    rotary_dim = params.get("rotary_dim", head_dim)
    q_shape = (batch, seq, params["q_heads"], head_dim)
    k_shape = (batch, seq, params["kv_heads"], head_dim)

    def make_inputs(key):
        import jax.numpy as jnp

        kq, kk = draws.keys(key, 2)
        cos, sin = (table.astype(dtype) for table in _cos_sin(jnp, seq, rotary_dim))
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

    options = {"rotary_dim": rotary_dim} if "rotary_dim" in params else {}
    return Case(
        "apply_rotary_pos_emb",
        params,
        dtype,
        make_inputs,
        (0, 1),
        {
            LIGER_JAX: kernel_provider("apply_rotary_pos_emb", **options),
            XLA: xla_provider("apply_rotary_pos_emb", **options),
        },
        *_rope_traffic(params, dtype, tables=2 * seq * rotary_dim * itemsize(dtype)),
        None if options else torch_program,
    )


def _rope_traffic(params, dtype: str, tables: int) -> tuple[dict[str, float], dict[str, float]]:
    """``(bytes_moved, flops)`` of a RoPE: each direction reads q, k and ``tables`` bytes once and writes q, k."""
    qk = params["batch"] * params["seq"] * (params["q_heads"] + params["kv_heads"]) * params["head_dim"]
    one_way = 2 * qk * itemsize(dtype) + tables
    return {"forward": one_way, "backward": one_way, "full": 2 * one_way}, {
        "forward": 0.0,
        "backward": 0.0,
        "full": 0.0,
    }


# Qwen2-VL-7B's attention: 28 query heads share 4 key/value heads, D = 128.


def _mrope_section(head_dim: int) -> tuple[int, int, int]:
    """Qwen2-VL's split of the D/2 pairs among t, h, w, (16, 24, 24) at D = 128, scaled to ``head_dim``."""
    temporal = head_dim // 8
    height = (head_dim // 2 - temporal) // 2
    return temporal, height, head_dim // 2 - temporal - height


def _mrope_shape(batch: int, seq: int) -> dict[str, int]:
    return {"batch": batch, "seq": seq, "q_heads": 28, "kv_heads": 4, "head_dim": HEAD_DIM}


def _mrope_tables(xp, batch: int, seq: int, head_dim: int):
    """``[3, B, S, D]`` rotate-half tables of temporal, height and width positions (each its own offset of 0..S-1).

    ``xp`` is ``jax.numpy`` or ``torch``."""
    cos, sin = _cos_sin(xp, seq + 2, head_dim)
    planes = [
        (table[plane : plane + seq][None] + xp.zeros((batch, 1, 1))) for table in (cos, sin) for plane in (0, 1, 2)
    ]
    return xp.stack(planes[:3]), xp.stack(planes[3:])


def mrope_case(params, dtype: str) -> Case:
    """``qwen2vl_mrope(q, k, cos, sin, mrope_section)``: q and k read and written once, one table plane's entries
    read per pair."""
    batch, seq, head_dim = params["batch"], params["seq"], params["head_dim"]
    q_shape = (batch, seq, params["q_heads"], head_dim)
    k_shape = (batch, seq, params["kv_heads"], head_dim)
    mrope_section = _mrope_section(head_dim)

    def make_inputs(key):
        import jax.numpy as jnp

        kq, kk = draws.keys(key, 2)
        cos, sin = (table.astype(dtype) for table in _mrope_tables(jnp, batch, seq, head_dim))
        return draws.normal(kq, q_shape, dtype), draws.normal(kk, k_shape, dtype), cos, sin

    def torch_program():
        import torch
        from liger_kernel.transformers.qwen2vl_mrope import liger_multimodal_rotary_pos_emb

        def make_torch_inputs():
            with torch.device("cuda"):
                cos, sin = (t.to(getattr(torch, dtype)) for t in _mrope_tables(torch, batch, seq, head_dim))
            return draws.torch_normal(q_shape, dtype), draws.torch_normal(k_shape, dtype), cos, sin

        # Liger takes (batch, heads, seq, head_dim) views of (batch, seq, heads, head_dim) tensors, as in its benchmark.
        return TorchProgram(
            lambda q, k, cos, sin: liger_multimodal_rotary_pos_emb(
                q.transpose(1, 2), k.transpose(1, 2), cos, sin, list(mrope_section)
            ),
            make_torch_inputs,
            (0, 1),
        )

    return Case(
        "qwen2vl_mrope",
        params,
        dtype,
        make_inputs,
        (0, 1),
        {
            LIGER_JAX: kernel_provider("qwen2vl_mrope", mrope_section=mrope_section),
            XLA: xla_provider("qwen2vl_mrope", mrope_section=mrope_section),
        },
        *_rope_traffic(params, dtype, tables=2 * batch * seq * head_dim * itemsize(dtype)),
        torch_program,
    )


# Llama 4 Scout's attention: 40 query heads share 8 key/value heads, D = 128.
def _llama4_shape(batch: int, seq: int) -> dict[str, int]:
    return {"batch": batch, "seq": seq, "q_heads": 40, "kv_heads": 8, "head_dim": HEAD_DIM}


def llama4_rope_case(params, dtype: str) -> Case:
    """``llama4_rope(q, k, freqs_cis)``: q and k read and written once, the complex64 ``[S, D/2]`` frequencies read
    once (the floor; liger_jax builds fp32 cos/sin tables from them first)."""
    batch, seq, head_dim = params["batch"], params["seq"], params["head_dim"]
    q_shape = (batch, seq, params["q_heads"], head_dim)
    k_shape = (batch, seq, params["kv_heads"], head_dim)

    def half_tables(xp):
        """``exp(j · position · θ_i)`` as its real and imaginary parts, ``[S, D/2]`` fp32 each."""
        return tuple(table[:, : head_dim // 2] for table in _cos_sin(xp, seq, head_dim))

    def make_inputs(key):
        import jax
        import jax.numpy as jnp

        kq, kk = draws.keys(key, 2)
        freqs_cis = jax.lax.complex(*half_tables(jnp))
        return draws.normal(kq, q_shape, dtype), draws.normal(kk, k_shape, dtype), freqs_cis

    def torch_program():
        import torch
        from liger_kernel.transformers.llama4_rope import liger_llama4_text_rotary_pos_emb

        def make_torch_inputs():
            with torch.device("cuda"):
                freqs_cis = torch.complex(*(table.contiguous() for table in half_tables(torch)))
            return draws.torch_normal(q_shape, dtype), draws.torch_normal(k_shape, dtype), freqs_cis

        return TorchProgram(liger_llama4_text_rotary_pos_emb, make_torch_inputs, (0, 1))

    return Case(
        "llama4_rope",
        params,
        dtype,
        make_inputs,
        (0, 1),
        {LIGER_JAX: kernel_provider("llama4_rope"), XLA: xla_provider("llama4_rope")},
        *_rope_traffic(params, dtype, tables=seq * head_dim // 2 * 8),
        torch_program,
    )


SMALL_FAMILY = {"batch": 1, "seq": 8, "q_heads": 4, "kv_heads": 2, "head_dim": 16}
OPS = [
    Op(
        "apply_rotary_pos_emb",
        rope_case,
        # Partial rotary at a quarter of the head (GPT-NeoX-20B and Gemma 4's global layers rotate 25%).
        [(_shape(4, 4096, 32), "bfloat16"), (_shape(4, 4096, 32) | {"rotary_dim": HEAD_DIM // 4}, "bfloat16")],
        SWEEPS,
        SMOKE,
    ),
    Op(
        "qwen2vl_mrope",
        mrope_case,
        [(_mrope_shape(4, 4096), "bfloat16")],
        {"tokens": ("seq", [_mrope_shape(16, 128), *(_mrope_shape(4, s) for s in (1024, 2048, 4096, 8192))])},
        [(SMALL_FAMILY, "float32")],
    ),
    Op(
        "llama4_rope",
        llama4_rope_case,
        [(_llama4_shape(4, 4096), "bfloat16")],
        {"tokens": ("seq", [_llama4_shape(16, 128), *(_llama4_shape(4, s) for s in (1024, 2048, 4096, 8192))])},
        [(SMALL_FAMILY, "float32")],
    ),
]
