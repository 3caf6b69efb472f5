"""Every op's benchmark plan, by name: the case modules, one per op family."""

from __future__ import annotations

import collections
from collections.abc import Sequence

from benchmarks.case import Case, Op, Params
from benchmarks.cases import (
    activations,
    distillation,
    divergences,
    embedding,
    glu,
    losses,
    norm_family,
    norms,
    preference,
    rope,
    score_attention,
    tiled_mlp,
)

# Suite order: when the time budget runs out, the ops late in this list lose sweep points first.
SUITE_ORDER = (
    "rms_norm",
    "swiglu",
    "apply_rotary_pos_emb",
    "cross_entropy",
    "fused_linear_cross_entropy",
    "embedding",
    "layer_norm",
    "fused_add_rms_norm",
    "geglu",
    "gated_linear_unit",
    "group_norm",
    "dyt",
    "poly_norm",
    "modulated_rms_norm",
    "fused_linear_dpo",
    "fused_linear_grpo",
    "softmax",
    "sparsemax",
    "relu_squared",
    "kl_div",
    "jsd",
    "tvd",
    "fused_linear_logprobs",
    "fused_linear_jsd",
    "fused_linear_distillation",
    "fused_linear_distillation_memory",
    "qwen2vl_mrope",
    "llama4_rope",
    "tiled_mlp",
    "cross_entropy_options",
    "fused_linear_cross_entropy_options",
    "multi_token_attention",
    "fused_neighborhood_attention",
)
_ALL = {
    op.name: op
    for op in (
        *norms.OPS,
        *rope.OPS,
        *glu.OPS,
        *losses.OPS,
        *norm_family.OPS,
        *preference.OPS,
        *activations.OPS,
        *divergences.OPS,
        *distillation.OPS,
        *tiled_mlp.OPS,
        *embedding.OPS,
        *score_attention.OPS,
    )
}
OPS: dict[str, Op] = {name: _ALL[name] for name in SUITE_ORDER}


def build_case(op: str, params: Params, dtype: str) -> Case:
    """The :class:`Case` of ``op`` at ``params`` and ``dtype`` (MissingOpError if liger_jax lacks it)."""
    return OPS[op].build(dict(params), dtype)


def sweep_line(axis: str, points: Sequence[Params]) -> dict[str, int]:
    """The params other than ``axis`` that most of a sweep's points share: the line it draws. A sweep may also hold
    points off that line (the token sweeps' small shapes of the main job)."""
    counts = collections.Counter(tuple((k, v) for k, v in p.items() if k != axis) for p in points)
    return dict(counts.most_common(1)[0][0])


def off_line(axis: str, point: Params, line: Params) -> dict[str, int]:
    """The params of ``point`` (other than ``axis``) that differ from the sweep's ``line``; empty on the line."""
    return {k: v for k, v in point.items() if k != axis and line.get(k) != v}
