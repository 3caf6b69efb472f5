"""Attention-score ops: multi-token attention over a [B, H, L, L] score map, and neighborhood attention over
[B, S, H, D] queries, keys and values. Floors: the fewest bytes each op's inputs and outputs need, and the matmuls
it must do (multi-token attention's convolution; neighborhood attention's kernel_size keys per query: liger_jax's
kernels take the band in blocks of 64 keys, Liger and XLA the full [S, S] score map).
"""

from __future__ import annotations

from benchmarks import draws
from benchmarks.case import Case, Op, TorchProgram, itemsize
from benchmarks.providers import LIGER_JAX, XLA, kernel_provider, xla_provider

# Liger's benchmark_multi_token_attention.py: B 2, 4 heads in and out, a 3x3 kernel padded to keep L, one group,
# a bias, L up to 2^12; on the H200 the map is taken to L = 8192 (1 GiB per bf16 map).
MTA_TARGET = {"batch": 2, "heads": 4, "length": 8192, "kernel": 3}
MTA_SMOKE = [
    ({"batch": 1, "heads": 2, "length": 13, "kernel": 3}, "float32"),
    ({"batch": 2, "heads": 2, "length": 16, "kernel": 3}, "bfloat16"),
]
# Liger's benchmark_fused_neighborhood_attention.py's largest config: batch 4, hidden 768 in 12 heads of 64, a
# window of 7, seq_len up to 4096 (its score map, which Liger and XLA build, is 1.5 GiB in bf16).
FNA_TARGET = {"batch": 4, "seq": 4096, "heads": 12, "head_dim": 64, "kernel": 7}
FNA_SMOKE = [
    ({"batch": 1, "seq": 13, "heads": 2, "head_dim": 8, "kernel": 3}, "float32"),
    ({"batch": 2, "seq": 16, "heads": 1, "head_dim": 16, "kernel": 5}, "bfloat16"),
]


def multi_token_attention_case(params, dtype: str) -> Case:
    """``multi_token_attention(scores [B, H, L, L], kernel [k, k, H, H], bias [H], padding=k // 2)``.

    Bytes: forward reads the scores and writes the output; backward reads dy and the saved probabilities, writes
    dscores (the kernel and bias are negligible). Flops: the convolution, 2·B·H·L²·k²·H forward, twice that back.
    """
    batch, heads, length, size = params["batch"], params["heads"], params["length"], params["kernel"]
    scores_shape, kernel_shape = (batch, heads, length, length), (size, size, heads, heads)
    options = {"padding": size // 2}

    def make_inputs(key):
        ks, kk, kb = draws.keys(key, 3)
        bound = (size * size * heads) ** -0.5
        return (
            draws.normal(ks, scores_shape, dtype),
            draws.normal(kk, kernel_shape, dtype, bound),
            draws.normal(kb, (heads,), dtype, 0.1),
        )

    def torch_program():
        from liger_kernel.transformers.functional import liger_multi_token_attention

        bound = (size * size * heads) ** -0.5
        return TorchProgram(
            lambda scores, weight, bias: liger_multi_token_attention(scores, weight, bias, 1, size // 2),
            lambda: (
                draws.torch_normal(scores_shape, dtype),
                draws.torch_normal((heads, heads, size, size), dtype, bound),
                draws.torch_normal((heads,), dtype, 0.1),
            ),
            (0, 1, 2),
        )

    score_map = batch * heads * length * length
    conv = 2 * score_map * size * size * heads
    return Case(
        "multi_token_attention",
        params,
        dtype,
        make_inputs,
        (0, 1, 2),
        {
            LIGER_JAX: kernel_provider("multi_token_attention", **options),
            XLA: xla_provider("multi_token_attention", **options),
        },
        {"forward": 2 * score_map * itemsize(dtype), "backward": 3 * score_map * itemsize(dtype)}
        | {"full": 5 * score_map * itemsize(dtype)},
        {"forward": conv, "backward": 2 * conv, "full": 3 * conv},
        torch_program,
    )


def fused_neighborhood_attention_case(params, dtype: str) -> Case:
    """``fused_neighborhood_attention(q, k, v [B, S, H, D], kernel_size=k)``; Liger's torch op gets ``[B, H, S, D]``.

    Bytes: forward reads q, k, v and writes the output; backward reads them, the output and dy, and writes dq, dk,
    dv. Flops: the band's matmuls, q·kᵀ and P·v over kernel_size keys per query (4·B·H·S·k·D) forward, four of
    them backward.
    """
    batch, seq, heads, head_dim = params["batch"], params["seq"], params["heads"], params["head_dim"]
    shape = (batch, seq, heads, head_dim)
    options = {"kernel_size": params["kernel"]}

    def make_inputs(key):
        return tuple(draws.normal(k, shape, dtype) for k in draws.keys(key, 3))

    def torch_program():
        from liger_kernel.transformers.functional import liger_fused_neighborhood_attention

        return TorchProgram(
            lambda q, k, v: liger_fused_neighborhood_attention(q, k, v, params["kernel"]),
            lambda: tuple(draws.torch_normal((batch, heads, seq, head_dim), dtype) for _ in range(3)),
            (0, 1, 2),
        )

    tensor = batch * seq * heads * head_dim * itemsize(dtype)
    matmuls = 4 * batch * heads * seq * params["kernel"] * head_dim
    return Case(
        "fused_neighborhood_attention",
        params,
        dtype,
        make_inputs,
        (0, 1, 2),
        {
            LIGER_JAX: kernel_provider("fused_neighborhood_attention", **options),
            XLA: xla_provider("fused_neighborhood_attention", **options),
        },
        {"forward": 4 * tensor, "backward": 8 * tensor, "full": 12 * tensor},
        {"forward": matmuls, "backward": 2 * matmuls, "full": 3 * matmuls},
        torch_program,
    )


OPS = [
    Op(
        "multi_token_attention",
        multi_token_attention_case,
        [(MTA_TARGET, "bfloat16")],
        {"length": ("length", [{**MTA_TARGET, "length": n} for n in (1024, 2048, 4096, 8192)])},
        MTA_SMOKE,
    ),
    Op(
        "fused_neighborhood_attention",
        fused_neighborhood_attention_case,
        [(FNA_TARGET, "bfloat16")],
        {"seq": ("seq", [{**FNA_TARGET, "seq": n} for n in (1024, 2048, 4096)])},
        FNA_SMOKE,
    ),
]
