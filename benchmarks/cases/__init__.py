"""Every op's benchmark plan, by name: the case modules, one per op family."""

from __future__ import annotations

from benchmarks.case import Case, Op, Params
from benchmarks.cases import glu, losses, norms, rope

# Suite order: when the time budget runs out, the ops late in this list lose sweep points first.
SUITE_ORDER = (
    "rms_norm",
    "swiglu",
    "apply_rotary_pos_emb",
    "cross_entropy",
    "fused_linear_cross_entropy",
    "layer_norm",
    "fused_add_rms_norm",
    "geglu",
)
_ALL = {op.name: op for op in (*norms.OPS, *rope.OPS, *glu.OPS, *losses.OPS)}
OPS: dict[str, Op] = {name: _ALL[name] for name in SUITE_ORDER}


def build_case(op: str, params: Params, dtype: str) -> Case:
    """The :class:`Case` of ``op`` at ``params`` and ``dtype`` (MissingOpError if liger_jax lacks it)."""
    return OPS[op].build(dict(params), dtype)
