"""Mutation testing of the Triton kernels and the ops' backward rules: run by hand, not in CI.

Each mutant is one small change to one file — a number, an operator, a comparison bound, a dropped term or factor,
a swapped ``where`` or ``maximum`` — applied to a copy of the package, against which the file's targeted tests run
(``-x``, with a timeout). A mutant the tests fail on is *killed*; one they pass is a *survivor*: either a hole in the
tests or an equivalent mutant (it computes the same thing), which ``tests/README.md`` lists with the reason.

    python tools/mutation.py --list liger_jax/kernels/glu.py      # the mutants, without running them
    python tools/mutation.py                                      # every target, in TARGETS' order
    python tools/mutation.py liger_jax/kernels/cross_entropy.py --jobs 2 --out /tmp/mutation

Results go to ``OUT/results.jsonl`` (one line per mutant, appended as they finish; a rerun skips the mutants
already there) and ``OUT/report.md`` (the score per file and every survivor). The working tree is never modified.
"""

from __future__ import annotations

import argparse
import ast
import collections
import concurrent.futures
import dataclasses
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclasses.dataclass(frozen=True)
class Target:
    """A file to mutate and the tests that must catch its mutants.

    ``functions`` limits the mutants to those functions (and the functions nested in them); None mutates the whole
    module. ``tests`` are pytest arguments, fastest-killing first (each run stops at the first failure).
    """

    functions: tuple[str, ...] | None
    tests: tuple[str, ...]


_CROSS_ENTROPY_TESTS = (
    "tests/test_cross_entropy_math.py",
    "tests/test_cross_entropy_options.py",
    "tests/test_cross_entropy.py",
    "-k",
    "not xla",
)
_ROW_NORM_TESTS = ("tests/test_norms_math.py",)
_ROPE_TESTS = ("tests/test_rope_math.py", "tests/test_rope_family.py", "tests/test_rope.py", "-k", "not xla")
_NOT_XLA = ("-k", "not xla")
_DIVERGENCE_TESTS = ("tests/test_divergences_math.py", "tests/test_divergences.py")
# In the order they run: files nobody else is rewriting first, the norm kernels last.
TARGETS: dict[str, Target] = {
    "liger_jax/kernels/cross_entropy.py": Target(None, _CROSS_ENTROPY_TESTS),
    "liger_jax/ops/cross_entropy.py": Target(("_cross_entropy_fwd", "_cross_entropy_bwd"), _CROSS_ENTROPY_TESTS),
    "liger_jax/ops/_cross_entropy_rows.py": Target(
        ("count_targets", "reduce_rows", "reduction_grad_scale", "row_grads", "_kernel_row_losses_and_grads"),
        _CROSS_ENTROPY_TESTS,
    ),
    "liger_jax/kernels/glu.py": Target(None, ("tests/test_glu_math.py", "tests/test_glu.py", "-k", "not xla")),
    "liger_jax/ops/glu.py": Target(
        ("_glu_fwd", "_glu_bwd", "_backward_launcher"), ("tests/test_glu_math.py", "tests/test_glu.py", "-k", "not xla")
    ),
    "liger_jax/kernels/rope.py": Target(None, _ROPE_TESTS),
    "liger_jax/ops/rope.py": Target(("_rope_fwd", "_rope_bwd"), _ROPE_TESTS),
    "liger_jax/kernels/rms_norm.py": Target(None, (*_ROW_NORM_TESTS, "tests/test_rms_norm.py", "-k", "not xla")),
    "liger_jax/kernels/layer_norm.py": Target(None, (*_ROW_NORM_TESTS, "tests/test_layer_norm.py", "-k", "not xla")),
    "liger_jax/ops/rms_norm.py": Target(
        ("_rms_norm_fwd", "_rms_norm_bwd", "_backward_launcher"),
        (*_ROW_NORM_TESTS, "tests/test_rms_norm.py", "-k", "not xla"),
    ),
    "liger_jax/ops/layer_norm.py": Target(
        ("_layer_norm_fwd", "_layer_norm_bwd", "_row_sums", "_backward"),
        (*_ROW_NORM_TESTS, "tests/test_layer_norm.py", "-k", "not xla"),
    ),
    "liger_jax/ops/fused_add_rms_norm.py": Target(
        (
            "_fused_add_rms_norm_fwd",
            "_fused_add_rms_norm_bwd",
            "_rms_norm_passing_input_fwd",
            "_rms_norm_passing_input_bwd",
            "_forward",
            "_backward",
        ),
        (*_ROW_NORM_TESTS, "tests/test_fused_add_rms_norm.py", "-k", "not xla"),
    ),
    "liger_jax/kernels/divergence.py": Target(None, _DIVERGENCE_TESTS),
    "liger_jax/kernels/logprobs.py": Target(None, ("tests/test_fused_linear_logprobs.py", *_NOT_XLA)),
    "liger_jax/kernels/distillation.py": Target(None, ("tests/test_fused_linear_distillation.py", *_NOT_XLA)),
    "liger_jax/kernels/softmax.py": Target(None, ("tests/test_softmax.py", "tests/test_activations.py", *_NOT_XLA)),
    "liger_jax/kernels/sparsemax.py": Target(None, ("tests/test_sparsemax.py", "tests/test_activations.py", *_NOT_XLA)),
    "liger_jax/kernels/_row_maps.py": Target(
        None, ("tests/test_softmax.py", "tests/test_sparsemax.py", "tests/test_activations.py", *_NOT_XLA)
    ),
    "liger_jax/kernels/relu_squared.py": Target(None, ("tests/test_relu_squared.py", *_NOT_XLA)),
    "liger_jax/kernels/neighborhood_attention.py": Target(
        None, ("tests/test_fused_neighborhood_attention.py", *_NOT_XLA)
    ),
    "liger_jax/kernels/group_norm.py": Target(None, ("tests/test_group_norm.py", *_NOT_XLA)),
    "liger_jax/kernels/dyt.py": Target(None, ("tests/test_norm_family.py", "-k", "dyt and not xla")),
    "liger_jax/kernels/poly_norm.py": Target(None, ("tests/test_norm_family.py", "-k", "poly and not xla")),
    "liger_jax/kernels/modulated_rms_norm.py": Target(None, ("tests/test_norm_family.py", "-k", "modulat and not xla")),
    "liger_jax/kernels/_rows.py": Target(
        None,
        (
            *_ROW_NORM_TESTS,
            "tests/test_rms_norm.py",
            "tests/test_layer_norm.py",
            "tests/test_fused_add_rms_norm.py",
            "tests/test_norm_family.py",
            "tests/test_sparsemax.py",
            *_NOT_XLA,
        ),
    ),
    "liger_jax/kernels/_elements.py": Target(
        None, ("tests/test_glu_math.py", "tests/test_relu_squared.py", "tests/test_glu.py", *_NOT_XLA)
    ),
    # The backward rules of the ops added since the first targets.
    "liger_jax/ops/_divergence_rows.py": Target(("_reduced_loss_bwd",), _DIVERGENCE_TESTS),
    "liger_jax/ops/kl_div.py": Target(("_kl_div_bwd",), _DIVERGENCE_TESTS),
    "liger_jax/ops/embedding.py": Target(
        ("embedding", "_outside", "_embedding", "_embedding_fwd", "_embedding_bwd", "_sums_by_id"),
        ("tests/test_embedding.py",),
    ),
    "liger_jax/ops/_checks.py": Target(
        ("concrete_values", "check_values"),
        (
            "tests/test_embedding.py",
            "tests/test_cross_entropy.py",
            "tests/test_cross_entropy_options.py",
            "tests/test_fused_linear_logprobs.py",
            "-k",
            "bad or invalid or error or raise or reject or check",
        ),
    ),
    "liger_jax/ops/fused_linear_cross_entropy.py": Target(
        ("_fused_linear_cross_entropy_bwd",), ("tests/test_fused_linear_cross_entropy.py", *_NOT_XLA)
    ),
    "liger_jax/ops/fused_linear_distillation.py": Target(
        ("_distillation_bwd",), ("tests/test_fused_linear_distillation.py", *_NOT_XLA)
    ),
    "liger_jax/ops/fused_linear_logprobs.py": Target(
        ("_fused_linear_logprobs_bwd",), ("tests/test_fused_linear_logprobs.py", *_NOT_XLA)
    ),
    "liger_jax/ops/_sequence_chunks.py": Target(
        ("_group_loss_bwd",), ("tests/test_preference_losses.py", "tests/test_grpo.py", *_NOT_XLA)
    ),
    "liger_jax/ops/_row_maps.py": Target(
        ("_row_map_bwd", "_backward_launcher"),
        ("tests/test_softmax.py", "tests/test_sparsemax.py", "tests/test_activations.py", *_NOT_XLA),
    ),
    "liger_jax/ops/relu_squared.py": Target(
        ("_relu_squared_bwd", "_backward_launcher"),
        ("tests/test_relu_squared.py", "tests/test_activations.py", *_NOT_XLA),
    ),
    "liger_jax/ops/fused_neighborhood_attention.py": Target(
        ("_band_attention_bwd", "_backward"), ("tests/test_fused_neighborhood_attention.py", *_NOT_XLA)
    ),
    "liger_jax/ops/group_norm.py": Target(("_group_norm_bwd", "_backward"), ("tests/test_group_norm.py", *_NOT_XLA)),
    "liger_jax/ops/dyt.py": Target(("_dyt_bwd", "_backward"), ("tests/test_norm_family.py", "-k", "dyt and not xla")),
    "liger_jax/ops/poly_norm.py": Target(
        ("_poly_norm_bwd", "_backward"), ("tests/test_norm_family.py", "-k", "poly and not xla")
    ),
    "liger_jax/ops/modulated_rms_norm.py": Target(
        ("_modulated_rms_norm_bwd",), ("tests/test_norm_family.py", "-k", "modulat and not xla")
    ),
}


_MASKED_FILL = "the fill value of masked lanes, which no stored result uses"
_LAX_MAP = "a batch that no longer folds into the rows goes through lax.map, one launch per example: the same numbers"
_FLCE_ONLY = (
    "only fused_linear_cross_entropy calls this, on [rows, V] chunks and never under this vmap rule (it batches "
    "examples itself)"
)
_CE = "liger_jax/kernels/cross_entropy.py"
_CE_ROWS = "liger_jax/ops/_cross_entropy_rows.py"
_RMS_NORM = "liger_jax/kernels/rms_norm.py"
_LAYER_NORM = "liger_jax/kernels/layer_norm.py"
_ROWS = "liger_jax/kernels/_rows.py"
_UNMARKED = "_unmarked(polled) + _unmarked(paired)"
_SPLIT_SUMS_POLL = f"while ({_UNMARKED} > 0) & (polls < SPLIT_SUMS_POLLS):"
_ONE_PAST_LOAD = (
    "a load's mask one element wider reads one element past the operand (the interpreter does not fault), for a "
    "column or row masked wherever it is used"
)
_LAYER_NORM_ROW_SUMS = (
    "block_g, block_gn = _row_sums(dy, normed, tl.load(scale_ptr + cols, mask=cols < n_cols, other=0.0))"
)
# Also the context of LayerNorm's first forward pass, whose extra block is no such thing (its count of columns
# goes to zero or below): the tests kill those mutants, and a survivor there would be a hole, not an equivalent.
_EXTRA_BLOCK = "an extra column block of a first pass lies wholly past n_cols, masked off: it adds zeros"
_VMAP_OF_THREE_OPERANDS = "return vmap_over_rows(sharded, row_argnums=(0, 1, 2), reduces_rows=False)"
_ROW_MAPS = "liger_jax/kernels/_row_maps.py"
_SPARSEMAX = "liger_jax/kernels/sparsemax.py"
_ROPE = "liger_jax/kernels/rope.py"
_LOGPROBS = "liger_jax/kernels/logprobs.py"
_DISTILLATION = "liger_jax/kernels/distillation.py"
_NEIGHBORHOOD = "liger_jax/kernels/neighborhood_attention.py"
_UNSTORED_QUERY = "queries past the sequence are never stored: their row sums divide nothing kept"
_CE_TARGET = (
    "target = tl.load(logits_ptr + rows * n_cols + tl.where(in_range, labels, 0), mask=active & in_range, other=0.0)"
)
_CE_TARGET_UNUSED = (
    "a row's target logit counts only when the row is active and its label in range: otherwise its loss and z-loss "
    "are 0 or NaN and its gradient scales 0"
)
_CE_LABEL_WEIGHT = "weight = tl.load(class_weight_ptr + index, mask=active & in_range, other=0.0).to(tl.float32)"
_ONLY_MINUS_INF = "any finite shift works while a row has seen only -inf: exp(-inf - shift) is 0 either way"
_ONE_BLOCK_PATH = "a row of exactly BLOCK_D columns takes the column-block path, which computes the same numbers"
_UNREAD_ARGUMENT = "the update it is passed to never reads its fourth argument (the row maps' common signature)"
_ROW_MAP_EXTRA_BLOCK = (
    "an extra column block of a first pass lies wholly past n_cols: its logits load as -inf (no max, exponential or "
    "support) and its (dy, y) as 0 (nothing added to Σ dy · y, no support)"
)
_SIGN_CODES_LOAD = (
    "codes = tl.load(codes_ptr + row * n_bytes + byte_cols, mask=byte_cols < n_bytes, other=0).to(tl.int32)"
)
_SPARSEMAX_WIDE_SET = "wide = x > (row_max - 1.0)[:, None]"
_SPARSEMAX_NARROW_SET = "narrow = x > (row_max - 0.5)[:, None]"
_SPARSEMAX_FIRST_SETTLED_TEST = "shrinking = _any_shrank(count, count + 1.0, smallest <= tau)"
_SETTLED_SOONER = (
    "only decides whether the pass that found a row's final support also proves it final: without the proof the row "
    "iterates until its support stops shrinking (the loop's other test), one pass more, to the same τ"
)
_START_BELOW_TAU = (
    "the support iteration's start: any nonempty set T of a row's entries gives a τ below the solution, "
    "(Σ_T x - 1) / |T| (an empty one -inf, the larger or smaller of two such τ another), and Michelot's steps from "
    "any τ below the solution rise to the same τ"
)
_ONE_PLANE = (
    "with one table plane (SECTION_T = ROTARY_DIM / 2) every pair a load keeps lies below SECTION_T: the plane "
    "offset is 0 whether or not the plane branch runs"
)
_UNSTORED_PAIRS = (
    "a wider mask on a load of pairs: the extra lanes are pairs from ROTARY_DIM / 2 on or heads past N_HEADS, which "
    "no store writes (read past the operand, where the interpreter does not fault)"
)
_HEAD_PLANES = (
    "a head has no table planes: with cos_rows 0 the plane offset is 0 whatever the sections, and with one section "
    "cos_rows is never read"
)
_ROWS_NOT_LOADED = (
    "rows not loaded (ignored or past n_rows) only need finite arithmetic: their losses and gradient are masked to 0"
)
_UNREAD_BY_TVD = "TVD's terms read neither log_target nor eps (only KL without a log target reads eps)"
_KL_LOG_TARGET = "with log_target the KL terms never read eps; JSD's never do"
_DISTILLATION_EXTRA_BLOCK = (
    "an extra column block lies wholly past n_cols: -inf logits (no max or exponential), no element loaded, none stored"
)
_DYT = "liger_jax/kernels/dyt.py"
_POLY_NORM = "liger_jax/kernels/poly_norm.py"
_MODULATED = "liger_jax/kernels/modulated_rms_norm.py"
_GROUP_NORM = "liger_jax/kernels/group_norm.py"
_FORWARD_MASKED_OR_ZERO_DY = (
    "in the forward a masked lane feeds only the masked store of y; in the backward it meets dy = 0 in every sum "
    "and its dx is not stored"
)
_DEAD_OPERAND_BUFFER = (
    "which dead operand's buffer dx takes (dy's or the other's) is memory only: the kernel reads each element of both "
    "before it writes it"
)
_MEETS_ZERO_DY = (
    "a masked lane or row meets dy = 0 in every sum of the backward (each term carries a factor of dy) and its "
    "gradients are not stored"
)
# Survivors that compute what the original computes: (file, source line, original, replacement) -> why.
EQUIVALENT: dict[tuple[str, str, str, str], str] = {
    (
        _CE,
        "z = tl.load(logits_ptr + offsets, mask=active[:, None] & col_mask, other=0.0).to(tl.float32)",
        "0.0",
        "(1.0)",
    ): ("inactive rows store zeros and masked columns become -inf whatever was loaded"),
    (_CE, 'shift = tl.where(new_max == float("-inf"), 0.0, new_max)', "0.0", "(1.0)"): _ONLY_MINUS_INF,
    (_CE, "if label_smoothing > 0:", "label_smoothing > 0", "(label_smoothing >= 0)"): (
        "without smoothing Σc is summed but never used (the loss skips its term on the same condition)"
    ),
    (
        _CE,
        "if label_smoothing > 0:  # skipped without smoothing: 0 · Σc would be NaN for logits masked to -inf",
        "label_smoothing > 0",
        "(label_smoothing >= 0)",
    ): "without smoothing Σc was not summed (it is 0), so the term subtracted is 0 · 0",
    **{
        (_CE, _CE_TARGET, original, replacement): _CE_TARGET_UNUSED
        for original, replacement in (("0", "(1)"), ("active & in_range", "(active | in_range)"), ("0.0", "(1.0)"))
    },
    **{
        (_CE, "weight = tl.zeros(active.shape, tl.float32) + 1.0", original, replacement): (
            "without HAS_WEIGHT the label weight is never read: the losses and the gradient use it only with weights"
        )
        for original, replacement in (
            ("tl.zeros(active.shape, tl.float32) + 1.0", "(tl.zeros(active.shape, tl.float32) - 1.0)"),
            ("tl.zeros(active.shape, tl.float32) + 1.0", "(tl.zeros(active.shape, tl.float32))"),
            ("tl.zeros(active.shape, tl.float32) + 1.0", "(1.0)"),
            ("1.0", "(2.0)"),
        )
    },
    (_CE, "total += tl.sum(tl.where(col_mask, c, 0.0) * w[None, :], axis=1)", "0.0", "(1.0)"): (
        "a masked column's class weight is 0 (past the row's end) and an inactive row's sum is never used (its loss "
        "is stored as 0)"
    ),
    (_CE, "index = tl.where(in_range, labels, 0)", "0", "(1)"): (
        "the index of rows whose label is out of range, whose load is masked off"
    ),
    **{
        (_CE, _CE_LABEL_WEIGHT, original, replacement): (
            "a row that is ignored or whose label is out of range never uses its label weight: its loss is 0 or NaN "
            "and its gradient scale 0"
        )
        for original, replacement in (("active & in_range", "(active | in_range)"), ("0.0", "(1.0)"))
    },
    (_CE, "z_scale = tl.load(z_grad_scale_ptr + rows, mask=row_exists, other=0.0)", "0.0", "(1.0)"): _MASKED_FILL,
    (_CE, "scale = tl.load(grad_scale_ptr + rows, mask=row_exists, other=0.0)", "0.0", "(1.0)"): _MASKED_FILL,
    (_CE, "tanh = tl.where(col_mask, c / softcap, 0.0)", "0.0", "(1.0)"): _MASKED_FILL,
    (_CE, "lse = tl.load(lse_ptr + rows, mask=row_exists, other=0.0)", "0.0", "(1.0)"): _MASKED_FILL,
    ("liger_jax/ops/glu.py", _VMAP_OF_THREE_OPERANDS, "False", "(True)"): _LAX_MAP,
    **{
        (
            "liger_jax/kernels/glu.py",
            f"{value} = tl.load({operand}_ptr + offsets, mask=mask, other=0.0).to(tl.float32)",
            "0.0",
            "(1.0)",
        ): _MASKED_FILL
        for value, operand in [("g", "gate"), ("u", "up"), ("dout", "dout")]
    },
    ("liger_jax/kernels/glu.py", "GELU_TANH = tl.constexpr(1)", "1", "(2)"): "any code other than SILU's names GeGLU",
    (
        "liger_jax/kernels/divergence.py",
        "scale = tl.load(grad_scale_ptr + rows, mask=row_exists, other=0.0)",
        "0.0",
        "(1.0)",
    ): _MASKED_FILL,
    ("liger_jax/kernels/divergence.py", "TVD = tl.constexpr(2)", "2", "(3)"): (
        "any code other than KL_DIV's and JSD's names TVD"
    ),
    **{
        (
            "liger_jax/kernels/divergence.py",
            f"{value} = tl.load({operand}_ptr + offsets, mask=loaded, other=0.0).to(tl.float32)",
            "0.0",
            "(1.0)",
        ): _MASKED_FILL
        for value, operand in [("x", "input"), ("y", "target")]
    },
    ("liger_jax/ops/glu.py", "input_output_aliases={0: 0},", "0", "(1)"): (
        "dgate over gate's buffer or dup over dout's works as well: each element is read before it is written"
    ),
    **{
        (path, context, "0.0", "(1.0)"): _MASKED_FILL
        for path, contexts in [
            (
                _RMS_NORM,
                [
                    "return offset + tl.load(scale_ptr + cols, mask=cols < n_cols, other=0.0).to(tl.float32)",
                    "dx += tl.load(dsum_ptr + offsets, mask=mask, other=0.0).to(tl.float32)",
                    "dy = tl.load(dy_ptr + offsets, mask=mask, other=0.0)",
                    "x = tl.load(x_ptr + offsets, mask=mask, other=0.0)",
                    "rstd = tl.load(rstd_ptr + rows, mask=rows < n_rows, other=0.0)",
                    # The forward's second pass over column blocks: its masked lanes are never stored.
                    'x = tl.load(normalised_ptr + offsets, mask=mask, other=0.0, eviction_policy="evict_first")',
                ],
            ),
            (
                _LAYER_NORM,
                [
                    "scale = tl.load(scale_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)",
                    "bias = tl.load(bias_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)",
                    "scale = tl.load(scale_ptr + cols, mask=cols < n_cols, other=0.0).to(tl.float32)",
                    "x = tl.load(x_ptr + offsets, mask=mask, other=0.0)",
                    "mean = tl.load(mean_ptr + rows, mask=rows < n_rows, other=0.0)",
                    "rstd = tl.load(rstd_ptr + rows, mask=rows < n_rows, other=0.0)",
                    "return tl.where(mask, (x.to(tl.float32) - mean[:, None]) * rstd[:, None], 0.0)",
                    "normed = _normed(tl.load(x_ptr + offsets, mask=mask, other=0.0), mean, rstd, mask)",
                    _LAYER_NORM_ROW_SUMS,
                    # In the first pass of the backward only: the second sums dy over the rows into dbias.
                    "dy = tl.load(dy_ptr + offsets, mask=mask, other=0.0)",
                ],
            ),
        ]
        for context in contexts
    },
    # Only the second pass's load of x in the forward: the first pass and a row in one tile sum the masked lanes.
    (
        _LAYER_NORM,
        'x = tl.load(x_ptr + offsets, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)',
        "0.0",
        "(1.0)",
    ): _MASKED_FILL,
    **{
        (path, context, bound, f"({bound.replace('<', '<=')})"): _ONE_PAST_LOAD
        for path, context, bound in [
            (
                _RMS_NORM,
                "return offset + tl.load(scale_ptr + cols, mask=cols < n_cols, other=0.0).to(tl.float32)",
                "cols < n_cols",
            ),
            (_RMS_NORM, "rstd = tl.load(rstd_ptr + rows, mask=rows < n_rows, other=0.0)", "rows < n_rows"),
            (_LAYER_NORM, "col_mask = cols < n_cols", "cols < n_cols"),
            (
                _LAYER_NORM,
                "scale = tl.load(scale_ptr + cols, mask=cols < n_cols, other=0.0).to(tl.float32)",
                "cols < n_cols",
            ),
            (_LAYER_NORM, "mean = tl.load(mean_ptr + rows, mask=rows < n_rows, other=0.0)", "rows < n_rows"),
            (_LAYER_NORM, "rstd = tl.load(rstd_ptr + rows, mask=rows < n_rows, other=0.0)", "rows < n_rows"),
            (_LAYER_NORM, _LAYER_NORM_ROW_SUMS, "cols < n_cols"),
        ]
    },
    **{
        (path, "for block in range((n_cols + BLOCK_D - 1) // BLOCK_D):", "n_cols + BLOCK_D - 1", replacement): (
            _EXTRA_BLOCK
        )
        for path in (_RMS_NORM, _LAYER_NORM)
        for replacement in ("(n_cols + BLOCK_D + 1)", "(n_cols + BLOCK_D)")
    },
    **{
        (path, "if n_cols <= BLOCK_D:", "n_cols <= BLOCK_D", "(n_cols < BLOCK_D)"): _ONE_BLOCK_PATH
        for path in (_RMS_NORM, _LAYER_NORM, _ROW_MAPS, _SPARSEMAX)
    },
    **{
        (
            "liger_jax/kernels/rope.py",
            "for head_tile in range((N_HEADS + BLOCK_HEADS - 1) // BLOCK_HEADS):",
            "N_HEADS + BLOCK_HEADS - 1",
            replacement,
        ): ("an extra head tile lies wholly past N_HEADS, masked off")
        for replacement in ["(N_HEADS + BLOCK_HEADS + 1)", "(N_HEADS + BLOCK_HEADS)"]
    },
    **{
        (path, context, "0.0", "(1.0)"): _MASKED_FILL
        for path, contexts in [
            (
                "liger_jax/kernels/relu_squared.py",
                [
                    "relu = tl.maximum(tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32), 0.0)",
                    "dy = tl.load(dy_ptr + offsets, mask=mask, other=0.0).to(tl.float32)",
                ],
            ),
            (
                _ROPE,
                [
                    "x = tl.load(ptr + offsets, mask=row_mask & (features[None, :] < ROTARY_DIM), other=0.0)"
                    ".to(tl.float32)",
                    "x1 = tl.load(ptr + offsets, mask=mask, other=0.0).to(tl.float32)",
                    "x2 = tl.load(ptr + offsets + ROTARY_DIM // 2, mask=mask, other=0.0).to(tl.float32)",
                ],
            ),
            (
                _LOGPROBS,
                [
                    "lse = tl.load(lse_ptr + rows, mask=row_exists, other=0.0)",
                    "entropy = tl.load(entropy_ptr + rows, mask=row_exists, other=0.0)",
                    "h = tl.load(entropy_cotangent_ptr + rows, mask=row_exists, other=0.0)",
                    "log_p = tl.where(col_mask, z - lse[:, None], 0.0)  # masked columns: p = 0 below, and keep "
                    "log_p finite",
                ],
            ),
            (
                _DISTILLATION,
                [
                    "soft_scale = tl.load(soft_scale_ptr + rows, mask=row_exists, other=0.0) * inv_temperature",
                    "hard_scale = tl.load(hard_scale_ptr + rows, mask=row_exists, other=0.0)",
                ],
            ),
        ]
        for context in contexts
    },
    (_ROW_MAPS, "return tl.load(x_ptr + offsets, mask=mask, other=0.0)", "0.0", "(1.0)"): (
        "a masked lane is a column past the row's end, -inf whatever was loaded, or a row past n_rows, finite either "
        "way and never stored"
    ),
    (_ROW_MAPS, "dy = tl.load(dy_ptr + offsets, mask=mask, other=0.0).to(tl.float32)", "0.0", "(1.0)"): (
        "a masked lane's y loads as 0: its dy adds dy · 0 to softmax's Σ dy · y, lies off sparsemax's support "
        "{y > 0}, and its dx is not stored"
    ),
    **{
        (_ROW_MAPS, "for block in range((n_cols + BLOCK_D - 1) // BLOCK_D):", "n_cols + BLOCK_D - 1", replacement): (
            _ROW_MAP_EXTRA_BLOCK
        )
        for replacement in ("(n_cols + BLOCK_D + 1)", "(n_cols + BLOCK_D)")
    },
    (_ROW_MAPS, "a, b = update(a, b, x, 0.0)", "0.0", "(1.0)"): _UNREAD_ARGUMENT,
    (
        _ROW_MAPS,
        "a, b = fold_logit_blocks(x_ptr, rows, a, b, 0.0, n_rows, n_cols, row_stride, BLOCK_D, update)",
        "0.0",
        "(1.0)",
    ): _UNREAD_ARGUMENT,
    ("liger_jax/kernels/softmax.py", 'return tl.where(row_max == float("-inf"), 0.0, row_max)', "0.0", "(1.0)"): (
        _ONLY_MINUS_INF
    ),
    (_SPARSEMAX, "support = x > tau[:, None]", "x > tau[:, None]", "(x >= tau[:, None])"): (
        "an entry equal to τ adds x - τ = 0 to Σ max(x - τ, 0): counted in the support it keeps every step below the "
        "solution, where (Σ_S x - 1) / |S| = τ with it or without it, and y = max(x - τ, 0) is the same"
    ),
    **{
        (_SPARSEMAX, context, original, replacement): _START_BELOW_TAU
        for context, original, replacement in [
            (
                "return tl.maximum(row_max, tl.max(x, axis=1)), unused",
                "tl.maximum(row_max, tl.max(x, axis=1))",
                "(tl.minimum(row_max, tl.max(x, axis=1)))",
            ),
            ("return tl.maximum(row_max, tl.max(x, axis=1)), unused", "tl.max(x, axis=1)", "(tl.min(x, axis=1))"),
            (
                "wide_count, wide_total, narrow_count, narrow_total = _start_sets(x, tl.max(x, axis=1))",
                "tl.max(x, axis=1)",
                "(tl.min(x, axis=1))",
            ),
            *(
                (context, f"x > (row_max - {width})[:, None]", f"(x >= (row_max - {width})[:, None])")
                for context, width in ((_SPARSEMAX_WIDE_SET, "1.0"), (_SPARSEMAX_NARROW_SET, "0.5"))
            ),
            *(
                (context, f"row_max - {width}", replacement)
                for context, width in ((_SPARSEMAX_WIDE_SET, "1.0"), (_SPARSEMAX_NARROW_SET, "0.5"))
                for replacement in (f"(row_max + {width})", "(row_max)")
            ),
            (_SPARSEMAX_WIDE_SET, "1.0", "(2.0)"),
            (_SPARSEMAX_NARROW_SET, "0.5", "(1.0)"),
            (
                "return tl.maximum(_threshold(wide_count, wide_total), _threshold(narrow_count, narrow_total))",
                "tl.maximum(_threshold(wide_count, wide_total), _threshold(narrow_count, narrow_total))",
                "(tl.minimum(_threshold(wide_count, wide_total), _threshold(narrow_count, narrow_total)))",
            ),
        ]
    },
    **{
        (_SPARSEMAX, context, original, replacement): _SETTLED_SOONER
        for context, original, replacement in [
            (
                'statistics = (support.to(tl.float32), tl.where(support, x, 0.0), tl.where(support, x, float("inf")))',
                'tl.where(support, x, float("inf"))',
                "(tl.where(support, float('inf'), x))",
            ),
            ('empty = tl.join(zeros, zeros + float("inf"))', 'zeros + float("inf")', "(zeros - float('inf'))"),
            ('empty = tl.join(zeros, zeros + float("inf"))', 'zeros + float("inf")', "(zeros)"),
        ]
    },
    **{
        (_SPARSEMAX, context, "smallest <= tau", "(smallest < tau)"): (
            "a support whose smallest entry equals the τ it gives is settled too: that entry adds x - τ = 0 to "
            "Σ_S (x - τ) = 1, so τ is the solution with it or without it"
        )
        for context in (_SPARSEMAX_FIRST_SETTLED_TEST, "shrinking = _any_shrank(new_count, count, smallest <= tau)")
    },
    (_SPARSEMAX, _SPARSEMAX_FIRST_SETTLED_TEST, "1.0", "(2.0)"): (
        "any previous size above the first support's lets the first step's test of its smallest entry decide"
    ),
    **{
        (_CE, f"{flag},", flag, f"({flipped})"): (
            "the direction a row's gradient pass walks its vocabulary blocks (AFTER_STATISTICS): the same elements, "
            "each computed from its own logit"
        )
        for flag, flipped in (("True", "False"), ("False", "True"))
    },
    **{
        ("liger_jax/kernels/divergence.py", _SIGN_CODES_LOAD, original, replacement): why
        for original, replacement, why in [
            ("byte_cols < n_bytes", "(byte_cols <= n_bytes)", _ONE_PAST_LOAD),
            ("0", "(1)", _MASKED_FILL),
        ]
    },
    (
        "liger_jax/ops/_divergence_rows.py",
        "rows, n_cols, implementation = gradient.shape[:-1], like.shape[-1], divergence.implementation",
        "-1",
        "(1)",
    ): "the residual ``like`` is always [0, V]: its axis 1 is its last",
    (
        _SPARSEMAX,
        "row_max, _ = fold_logit_blocks(x_ptr, rows, row_max, zeros, 0.0, n_rows, n_cols, row_stride, BLOCK_D, "
        "_add_max)",
        "0.0",
        "(1.0)",
    ): _UNREAD_ARGUMENT,
    **{
        (_SPARSEMAX, "tau = _solution(first_tau, x, x, 0, 0, 0, 0, 1, _tile_support)", original, replacement): (
            "a one-tile row's support is taken in registers: _tile_support never reads the row pointers, sizes, "
            "strides or column block it is passed (the support functions' common signature)"
        )
        for original, replacement in (("0", "(1)"), ("1", "(2)"))
    },
    (
        _SPARSEMAX,
        "tau = _solution(first_tau, 0.0, x_ptr, rows, n_rows, n_cols, row_stride, BLOCK_D, _column_block_support)",
        "0.0",
        "(1.0)",
    ): "a column-block row's support is read from memory: _column_block_support never reads the tile it is passed",
    (_SPARSEMAX, "return _projection(x, tau, 0.0)", "0.0", "(1.0)"): (
        "the projection never reads its third argument (the output signature of the row maps' column-block walk)"
    ),
    (_ROPE, "if SECTION_T < ROTARY_DIM // 2:", "SECTION_T < ROTARY_DIM // 2", "(SECTION_T <= ROTARY_DIM // 2)"): (
        _ONE_PLANE
    ),
    (_ROPE, "if SECTION_T < ROTARY_DIM // 2:", "ROTARY_DIM // 2", "(ROTARY_DIM * 2)"): _ONE_PLANE,
    **{
        (_ROPE, context, original, replacement): _UNSTORED_PAIRS
        for context, original, replacement in [
            (
                "x = tl.load(ptr + offsets, mask=row_mask & (features[None, :] < ROTARY_DIM), other=0.0)"
                ".to(tl.float32)",
                "row_mask & (features[None, :] < ROTARY_DIM)",
                "(row_mask | (features[None, :] < ROTARY_DIM))",
            ),
            (
                "x = tl.load(ptr + offsets, mask=row_mask & (features[None, :] < ROTARY_DIM), other=0.0)"
                ".to(tl.float32)",
                "features[None, :] < ROTARY_DIM",
                "(features[None, :] <= ROTARY_DIM)",
            ),
            (
                "mask = row_mask & (pairs[None, :] < ROTARY_DIM // 2)",
                "row_mask & (pairs[None, :] < ROTARY_DIM // 2)",
                "(row_mask | (pairs[None, :] < ROTARY_DIM // 2))",
            ),
            (
                "mask = row_mask & (pairs[None, :] < ROTARY_DIM // 2)",
                "pairs[None, :] < ROTARY_DIM // 2",
                "(pairs[None, :] <= ROTARY_DIM // 2)",
            ),
            ("mask = row_mask & (pairs[None, :] < ROTARY_DIM // 2)", "ROTARY_DIM // 2", "(ROTARY_DIM * 2)"),
        ]
    },
    **{
        (
            _ROPE,
            "x1, x2 = _load_pairs(x_ptr, head_starts, head_mask, 0, ROTARY_DIM, INTERLEAVED, ROTARY_DIM // 2, 0, "
            "BLOCK_PAIRS)",
            original,
            replacement,
        ): _HEAD_PLANES
        for original, replacement in [("0", "(1)"), ("ROTARY_DIM // 2", "(ROTARY_DIM * 2)"), ("2", "(3)")]
    },
    (_ROPE, "if ROTARY_DIM < HEAD_DIM:", "ROTARY_DIM < HEAD_DIM", "(ROTARY_DIM <= HEAD_DIM)"): (
        "with no feature past ROTARY_DIM the pass-through copy's mask is all false: it copies nothing"
    ),
    (
        _ROPE,
        "table_start = tl.full((1, 1), 0, tl.int64) + (token % cos_rows) * ROTARY_DIM",
        "tl.full((1, 1), 0, tl.int64) + (token % cos_rows) * ROTARY_DIM",
        "(token % cos_rows * ROTARY_DIM)",
    ): "the [1, 1] zeros only shape the table's start: a scalar start broadcasts to the same offsets",
    (_ROPE, "table_mask = tl.full((1, 1), 1, tl.int1)", "1", "(2)"): "any nonzero int1 constant is true",
    (_LOGPROBS, "tokens = tl.load(tokens_ptr + rows, mask=row_exists, other=0).to(tl.int64)", "0", "(1)"): (
        _MASKED_FILL
    ),
    (_LOGPROBS, 'shift = tl.where(new_max == float("-inf"), 0.0, new_max)', "0.0", "(1.0)"): _ONLY_MINUS_INF,
    # The key is also the where's fill, which keeps an out-of-range token's log-prob cotangent out of its gradient:
    # that mutant is killed, only the load's fill (rows past n_rows) survives.
    (
        _LOGPROBS,
        "g = tl.where(in_range, tl.load(logprob_cotangent_ptr + rows, mask=row_exists, other=0.0), 0.0)",
        "0.0",
        "(1.0)",
    ): _MASKED_FILL,
    (_LOGPROBS, "moved = tl.where(running_sum > 0, running_max - shift, 0.0)", "0.0", "(1.0)"): (
        "while nothing was summed the move multiplies running_sum = 0 (and the rescale is exp(-inf) = 0)"
    ),
    (
        _LOGPROBS,
        "centred = tl.where(col_mask, z - shift[:, None], 0.0)  # masked columns: e = 0, and 0 · -inf would be NaN",
        "0.0",
        "(1.0)",
    ): "a masked column's exponential e is 0: any finite fill adds e · fill = 0",
    **{
        (
            _LOGPROBS,
            "target = tl.load(logits_ptr + rows * n_cols + tl.where(in_range, tokens, 0), mask=row_exists & in_range, "
            "other=0)",
            original,
            replacement,
        ): (
            "the target logit of a row past n_rows (never stored) or of a token out of range (its log-prob is NaN "
            "whatever was loaded): its offset, whether it is loaded (past the operand, where the interpreter does "
            "not fault) and its fill"
        )
        for original, replacement in [("0", "(1)"), ("row_exists & in_range", "(row_exists | in_range)")]
    },
    **{
        (
            _DISTILLATION,
            f"{value} = tl.load({operand}_ptr + offsets, mask=loaded, other=0.0).to(tl.float32)",
            "0.0",
            "(1.0)",
        ): (_ROWS_NOT_LOADED)
        for value, operand in [("s", "student"), ("t", "teacher")]
    },
    (_DISTILLATION, "loss, d = _terms(q, tl.exp(log_p), DIVERGENCE, beta, True, 0.0)", "True", "(False)"): (
        _UNREAD_BY_TVD
    ),
    (_DISTILLATION, "loss, d = _terms(q, tl.exp(log_p), DIVERGENCE, beta, True, 0.0)", "0.0", "(1.0)"): _UNREAD_BY_TVD,
    (_DISTILLATION, "loss, d = _terms(log_q, log_p, DIVERGENCE, beta, True, 0.0)", "0.0", "(1.0)"): _KL_LOG_TARGET,
    # The key is also the loss's and the spread's fills, whose mutants are killed: only d's survives.
    (
        _DISTILLATION,
        "return tl.where(loaded, loss, 0.0), tl.where(loaded, d, 0.0), q, tl.where(loaded, spread, 0.0)",
        "0.0",
        "(1.0)",
    ): "d outside the loaded elements only reaches the gradient, which is masked to 0 there before it is stored",
    **{
        (
            _DISTILLATION,
            "for block in range((n_cols + BLOCK_V - 1) // BLOCK_V):",
            "n_cols + BLOCK_V - 1",
            replacement,
        ): (_DISTILLATION_EXTRA_BLOCK)
        for replacement in ("(n_cols + BLOCK_V + 1)", "(n_cols + BLOCK_V)")
    },
    **{
        (_DISTILLATION, context, "0.0", "(1.0)"): (
            "softmax's _add_exponentials (the row maps' update signature) never reads its fourth argument"
        )
        for context in [
            "max_student, sum_student = _add_exponentials(max_student, sum_student, s * inv_temperature, 0.0)",
            "max_teacher, sum_teacher = _add_exponentials(max_teacher, sum_teacher, t * inv_temperature, 0.0)",
            "max_raw, sum_raw = _add_exponentials(max_raw, sum_raw, s, 0.0)",
        ]
    },
    (
        "liger_jax/kernels/divergence.py",
        "SMALLEST_NORMAL = tl.constexpr(1.1754943508222875e-38)",
        "1.1754943508222875e-38",
        "(2.350988701644575e-38)",
    ): (
        "the floor that keeps log m finite: it changes log m only where the mixture m = β·p + (1 - β)·q is under "
        "2.4e-38, in terms weighed by β·p and (1 - β)·q, each at most m, which no fp32 row sum can see"
    ),
    (
        _NEIGHBORHOOD,
        "inside = (keys[None, :] >= 0) & (keys[None, :] < S) & (queries[:, None] < S)",
        "queries[:, None] < S",
        "(queries[:, None] <= S)",
    ): (
        "query S, one past the sequence, is never stored, and in the backward kernels its q and dO load as 0, so "
        "its probabilities multiply zeros in dK and dV"
    ),
    (_NEIGHBORHOOD, 'shift = tl.where(new_max == float("-inf"), 0.0, new_max)', "0.0", "(1.0)"): _ONLY_MINUS_INF,
    (_NEIGHBORHOOD, "row_sum = tl.where(queries < S, row_sum, 1.0)", "queries < S", "(queries <= S)"): (
        _UNSTORED_QUERY
    ),
    (_NEIGHBORHOOD, "row_sum = tl.where(queries < S, row_sum, 1.0)", "1.0", "(2.0)"): _UNSTORED_QUERY,
    (
        _NEIGHBORHOOD,
        "return tl.load(ptr + offsets, mask=(rows >= 0) & (rows < S), other=0.0)",
        "rows < S",
        "(rows <= S)",
    ): (
        "the statistic of row S, one past the sequence (read past the operand, which the interpreter does not "
        "fault on), serves only queries past the sequence, whose scores are -inf"
    ),
    (_NEIGHBORHOOD, "return tl.load(ptr + offsets, mask=(rows >= 0) & (rows < S), other=0.0)", "0.0", "(1.0)"): (
        "the statistics of rows outside the sequence serve only queries past it, whose scores are -inf"
    ),
    (_DYT, "x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)", "0.0", "(1.0)"): (
        _FORWARD_MASKED_OR_ZERO_DY
    ),
    **{
        (_DYT, f"{name} = tl.load({name}_ptr + cols, mask=cols < n_cols, other=0.0).to(tl.float32)", *change): why
        for name in ("gamma", "beta")
        for change, why in (
            (("0.0", "(1.0)"), _FORWARD_MASKED_OR_ZERO_DY),
            (("cols < n_cols", "(cols <= n_cols)"), _ONE_PAST_LOAD),
        )
    },
    **{
        (_DYT, "for block in range((n_cols + BLOCK_D - 1) // BLOCK_D):", "n_cols + BLOCK_D - 1", replacement): (
            _EXTRA_BLOCK
        )
        for replacement in ("(n_cols + BLOCK_D + 1)", "(n_cols + BLOCK_D)")
    },
    (_DYT, "if n_cols <= BLOCK_D:", "n_cols <= BLOCK_D", "(n_cols < BLOCK_D)"): _ONE_BLOCK_PATH,
    (_POLY_NORM, "x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)", "0.0", "(1.0)"): _MEETS_ZERO_DY,
    **{
        (_POLY_NORM, f"rstd{p} = tl.load(rstd{p}_ptr + rows, mask=row_mask, other=0.0)", "0.0", "(1.0)"): (
            _MEETS_ZERO_DY
        )
        for p in (1, 2, 3)
    },
    (_MODULATED, "return tl.load(ptr + offsets, mask=mask, other=0.0).to(tl.float32)", "0.0", "(1.0)"): (
        "a masked lane's modulation scales a y that is not stored, or a dy that is 0"
    ),
    (
        _MODULATED,
        "r = tl.where(mask, _normalized(x, rstd, weight, CASTING).to(x.dtype).to(tl.float32), 0.0)",
        "0.0",
        "(1.0)",
    ): "a masked lane's r goes to a masked store of dscale or meets dy = 0 in Σ dy · r",
    **{
        (path, "if not PREFETCH:", "not PREFETCH", "(PREFETCH)"): (
            "reading the tile and scale again after the row sums only saves registers: the values read are those held"
        )
        for path in (_RMS_NORM, _LAYER_NORM)
    },
    (
        "liger_jax/kernels/_rows.py",
        "previous = tl.load(partial_row_ptr + cols, mask=(cols < n_cols) & accumulate, other=0.0)",
        "cols < n_cols",
        "(cols <= n_cols)",
    ): "the element read one past the row is added to a lane the store masks off: it is never written",
    (
        "liger_jax/kernels/_rows.py",
        'return tl.load(ptr + cols, mask=cols < n_cols, other=0.0, eviction_policy="evict_last")',
        "cols < n_cols",
        "(cols <= n_cols)",
    ): _ONE_PAST_LOAD,
    (
        "liger_jax/kernels/_rows.py",
        'return tl.load(ptr + cols, mask=cols < n_cols, other=0.0, eviction_policy="evict_last")',
        "0.0",
        "(1.0)",
    ): _MEETS_ZERO_DY,
    (
        _GROUP_NORM,
        "return channels, (local < GROUPS_PER_BLOCK * GROUP_SIZE) & (channels < n_channels)",
        "local < GROUPS_PER_BLOCK * GROUP_SIZE",
        "(local <= GROUPS_PER_BLOCK * GROUP_SIZE)",
    ): (
        "the channel one past a block's groups is the next block's first, in no group of this block: this program also "
        "writes it (from zero statistics), and the next block's program, which the interpreter runs after it, writes "
        "it again; on the GPU a race, which no CPU test can order"
    ),
    **{
        (_GROUP_NORM, context, *change): why
        for context, name in [
            (
                "return tl.load(ptr + batch.to(tl.int64) * n_groups + groups, mask=groups < n_groups, other=0.0)",
                "groups < n_groups",
            ),
            (
                "return tl.load(ptr + channels, mask=channels < n_channels, other=0.0).to(tl.float32)",
                "channels < n_channels",
            ),
        ]
        for change, why in [
            ((name, f"({name.replace('<', '<=')})"), _ONE_PAST_LOAD),
            (
                ("0.0", "(1.0)"),
                "a group or channel past the last belongs to no channel the block owns: masked wherever used",
            ),
        ]
    },
    (
        "liger_jax/ops/_row_maps.py",
        "return row_launcher(kernel, (Rows(),), row_argnums=(0, 1), implementation=implementation, aliases=((0, 0),))",
        "0",
        "(1)",
    ): _DEAD_OPERAND_BUFFER,
    (
        "liger_jax/ops/relu_squared.py",
        "return _flat_launch(kernels.relu_squared_bwd, implementation, (dy, x), aliases={0: 0})",
        "0",
        "(1)",
    ): _DEAD_OPERAND_BUFFER,
    **{
        (
            "liger_jax/ops/relu_squared.py",
            'return vmap_over_rows(partitioned(backward, "..., ... -> ..."), row_argnums=(0, 1), reduces_rows=False)',
            *change,
        ): _LAX_MAP
        for change in (("0", "(1)"), ("False", "(True)"))
    },
    **{
        ("liger_jax/ops/fused_neighborhood_attention.py", context, "0", "(1)"): (
            "keys have the queries' shape [batch, S, heads, dim]: either tensor's shape gives the same settings"
        )
        for context in (
            "settings = _launch_settings(band, tensors[0].shape)",
            "like = jax.ShapeDtypeStruct(tensors[0].shape, query.dtype)",
        )
    },
    (
        "liger_jax/ops/fused_neighborhood_attention.py",
        "return vmap_over_rows(sharded, row_argnums=tuple(range(6)), reduces_rows=False)",
        "6",
        "(7)",
    ): "a row argnum past the six operands names none: the rule only asks whether each operand's position is in it",
    (
        "liger_jax/ops/fused_neighborhood_attention.py",
        "return vmap_over_rows(sharded, row_argnums=tuple(range(6)), reduces_rows=False)",
        "False",
        "(True)",
    ): _LAX_MAP,
    **{
        (
            "liger_jax/ops/group_norm.py",
            "partitioned(launch, _BACKWARD_RULE, replicated=_WHOLE), row_argnums=(0, 1, 3, 4), reduces_rows=False",
            *change,
        ): _LAX_MAP
        for change in (("0", "(1)"), ("1", "(2)"), ("3", "(4)"), ("4", "(5)"), ("False", "(True)"))
    },
    **{
        (path, "one_tile=True,", "True", "(False)"): (
            "the backward is built after the forward, whose launcher already refuses a block narrower than the row"
        )
        for path in ("liger_jax/ops/poly_norm.py", "liger_jax/ops/modulated_rms_norm.py")
    },
    **{
        ("liger_jax/ops/modulated_rms_norm.py", "if modulated == x.ndim - 1:", "x.ndim - 1", replacement): (
            "per-token modulation sent down the grouped path is groups of one row: the same sums"
        )
        for replacement in ("(x.ndim + 1)", "(x.ndim)")
    },
    ("liger_jax/ops/modulated_rms_norm.py", "(Rows(), ColumnSum(), Rows(like=3)),", "3", "(4)"): (
        "dscale stored in fp32 (rstd's dtype) instead of scale's is rounded to scale's dtype once afterwards: the same "
        "value"
    ),
    (
        _CE_ROWS,
        "return vmap_over_rows(sharded, row_argnums=_row_argnums(settings, n_rows), reduces_rows=False)",
        "False",
        "(True)",
    ): _LAX_MAP,
    (_CE_ROWS, "operands = (labels, *weighted[:1])", "1", "(2)"): (
        "the operand after the class weights (the z-loss's gradient scale) lands in the rest that _split_weighted "
        "returns, which this launcher discards"
    ),
    (_CE_ROWS, "jax.ShapeDtypeStruct((n_rows, logits.shape[-1]), logits.dtype),", "-1", "(1)"): _FLCE_ONLY,
    **{
        (
            _CE_ROWS,
            "row_argnums = (0, 1, 2, 4) if settings.weighted else (0, 1, 2)",
            original,
            f"({int(original) + 1})",
        ): (_FLCE_ONLY)
        for original in ("0", "1", "2", "4")
    },
    (_CE_ROWS, "return vmap_over_rows(sharded, row_argnums=row_argnums, reduces_rows=False)", "False", "(True)"): (
        _FLCE_ONLY
    ),
    (_GROUP_NORM, "arrived = tl.full((), 0, tl.int32)", "0", "(1)"): (
        "an ordered launch has two splits or more, so a wait that starts from 1 still polls the count at least once"
    ),
    (_GROUP_NORM, "if n_tokens <= BLOCK_S:", "n_tokens <= BLOCK_S", "(n_tokens < BLOCK_S)"): (
        "tokens that exactly fill one chunk take the two-pass path, which computes the same numbers"
    ),
    (
        _GROUP_NORM,
        "x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)",
        "0.0",
        "(1.0)",
    ): _FORWARD_MASKED_OR_ZERO_DY,
    # A chunk past a run's end loads nothing: the moments count it as 0 tokens (``_merged_moments`` clamps the count,
    # which a split's shorter last run needs), the sums add zeros, the stores are masked off.
    **{
        (_GROUP_NORM, context, original, replacement): (
            "an extra chunk lies wholly past its run of tokens, masked off: it adds nothing and stores nothing"
        )
        for context, original, replacement in [
            ("(n_tokens + BLOCK_S - 1) // BLOCK_S,", "n_tokens + BLOCK_S - 1", "(n_tokens + BLOCK_S + 1)"),
            ("(n_tokens + BLOCK_S - 1) // BLOCK_S,", "n_tokens + BLOCK_S - 1", "(n_tokens + BLOCK_S)"),
            ("TOKENS_PER_SPLIT // BLOCK_S,", "TOKENS_PER_SPLIT // BLOCK_S", "(TOKENS_PER_SPLIT * BLOCK_S)"),
        ]
    },
    (
        _GROUP_NORM,
        "offsets, valid = _split_offsets(batch, groups, groups < n_groups, SPLITS, n_groups, SPLIT_BLOCK)",
        "groups < n_groups",
        "(groups <= n_groups)",
    ): _ONE_PAST_LOAD,
    (
        _GROUP_NORM,
        "split_mean = tl.load(split_mean_ptr + offsets, mask=valid, other=0.0, cache_modifier=CACHE)",
        "0.0",
        "(1.0)",
    ): ("a split past the last counts 0 tokens: its mean is weighted by 0 in the mean and in the squares' spread"),
    (_GROUP_NORM, "if split == 0:", "split == 0", "(split != 0)"): (
        "every split of a block merges the same moments into the same mean and rstd: which splits store them "
        "changes no value"
    ),
    (_GROUP_NORM, "if split == 0:", "0", "(1)"): (
        "every split of a block merges the same moments into the same mean and rstd, and every forced split test "
        "has a second split to store them"
    ),
    (
        "liger_jax/ops/embedding.py",
        "sums = jax.ops.segment_sum(rows[order].astype(accum_dtype), slot, ids.size, indices_are_sorted=True)",
        "True",
        "(False)",
    ): "indices_are_sorted is a hint to XLA: the same sums either way",
    ("liger_jax/ops/embedding.py", "first_of_its_id = jnp.diff(sorted_ids, prepend=-1) != 0", "1", "(2)"): (
        "-2 is no id either (the ids are in [0, V] by then): the first sorted id still starts a slot"
    ),
    (_ROWS, "return split_sums_ptr.to(tl.pointer_type(tl.int64), bitcast=True)", "True", "(False)"): (
        "Triton casts a pointer to another pointer type as a bitcast either way"
    ),
    # How long a split polls for a partner's row sums: the interpreter runs the splits one after another, so a
    # partner has stored its sums before the poll or stores them after it, whatever the count; on a GPU a split that
    # stops early sums the partner's columns itself, the same value.
    **{
        (_ROWS, context, original, replacement): "how long a split polls: the same sums, read or recomputed"
        for context, original, replacement in [
            ("polls = 0", "0", "(1)"),
            ("polls += 1", "1", "(2)"),
            (_SPLIT_SUMS_POLL, f"{_UNMARKED} > 0", f"({_UNMARKED} >= 0)"),
            (_SPLIT_SUMS_POLL, _UNMARKED, "(_unmarked(polled) - _unmarked(paired))"),
            (_SPLIT_SUMS_POLL, _UNMARKED, "(_unmarked(polled))"),
            (_SPLIT_SUMS_POLL, _UNMARKED, "(_unmarked(paired))"),
            (_SPLIT_SUMS_POLL, "0", "(1)"),
            (_SPLIT_SUMS_POLL, "polls < SPLIT_SUMS_POLLS", "(polls <= SPLIT_SUMS_POLLS)"),
        ]
    },
    # The exchange at one split (its own sums are the row's), the announcement skipped at two (the partner sums this
    # split's columns itself, the same value).
    **{
        (path, "if COLUMN_SPLITS > 1:", original, replacement): (
            "a split's own sums are the row's at one split; a partner that finds none sums the columns itself"
        )
        for path in (_RMS_NORM, _LAYER_NORM)
        for original, replacement in (("COLUMN_SPLITS > 1", "(COLUMN_SPLITS >= 1)"), ("1", "(2)"))
    },
}


@dataclasses.dataclass(frozen=True)
class Mutant:
    """One change: the source bytes ``[start, end)`` of ``path`` replaced by ``replacement``."""

    path: str
    source_hash: str  # of the file mutated: results of an older version are not reused
    line: int
    start: int
    end: int
    context: str  # the source line, stripped
    original: str
    replacement: str
    kind: str

    @property
    def key(self) -> str:
        return f"{self.path}:{self.source_hash}:{self.start}:{self.end}:{self.replacement}"

    @property
    def equivalence(self) -> str | None:
        """Why this mutant computes what the original does, when EQUIVALENT says it does."""
        return EQUIVALENT.get((self.path, self.context, self.original, self.replacement))

    def apply(self, source: bytes) -> bytes:
        return source[: self.start] + self.replacement.encode() + source[self.end :]


_SWAPPED_OPERATORS = {
    ast.Add: ast.Sub,
    ast.Sub: ast.Add,
    ast.Mult: ast.Div,
    ast.Div: ast.Mult,
    ast.FloorDiv: ast.Mult,
    ast.Pow: ast.Mult,
    ast.BitAnd: ast.BitOr,
    ast.BitOr: ast.BitAnd,
}
_SHIFTED_BOUNDS = {
    ast.Lt: ast.LtE,
    ast.LtE: ast.Lt,
    ast.Gt: ast.GtE,
    ast.GtE: ast.Gt,
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
}
_SWAPPED_CALLS = {"maximum": "minimum", "minimum": "maximum", "max": "min", "min": "max"}
_ARRAY_MODULES = {"tl", "jnp", "np", "jax.numpy"}
_INDEXING = {"program_id", "arange"}


def _changes(node: ast.AST) -> Iterator[tuple[str, ast.AST | str]]:
    """``(kind, replacement)`` for each mutation of ``node``: a new node, or source text for a statement."""
    match node:
        case ast.Constant(value=bool(value)):
            yield "constant", ast.Constant(not value)
        case ast.Constant(value=int(value)):
            yield "constant", ast.Constant(value + 1)
        case ast.Constant(value=float(value)):
            yield "constant", ast.Constant(1.0 if value == 0.0 else 2.0 * value)
        case ast.BinOp(left=left, op=op, right=right):
            if type(op) in _SWAPPED_OPERATORS:
                yield "operator", ast.BinOp(left, _SWAPPED_OPERATORS[type(op)](), right)
            if isinstance(op, (ast.Add, ast.Sub, ast.Mult, ast.Div)):
                yield "dropped term", left
            if isinstance(op, (ast.Add, ast.Mult)):
                yield "dropped term", right
            if isinstance(op, ast.Div) and not isinstance(right, ast.Constant):
                yield "denominator", ast.BinOp(left, op, ast.BinOp(right, ast.Add(), ast.Constant(1)))
        case ast.AugAssign(target=target, op=op, value=value) if type(op) in _SWAPPED_OPERATORS:
            yield "operator", ast.unparse(ast.AugAssign(target, _SWAPPED_OPERATORS[type(op)](), value))
            yield "dropped term", "pass"
        case ast.Compare(left=left, ops=[op], comparators=comparators) if type(op) in _SHIFTED_BOUNDS:
            yield "bound", ast.Compare(left, [_SHIFTED_BOUNDS[type(op)]()], comparators)
        case ast.UnaryOp(op=ast.USub() | ast.Not(), operand=operand):
            yield "dropped sign", operand
        case ast.BoolOp(op=op, values=values):
            yield "operator", ast.BoolOp(ast.Or() if isinstance(op, ast.And) else ast.And(), values)
        case ast.Call(func=ast.Attribute(value=module, attr=name) as func, args=args, keywords=keywords):
            if name in _SWAPPED_CALLS and ast.unparse(module) in _ARRAY_MODULES:
                swapped = ast.Attribute(module, _SWAPPED_CALLS[name], func.ctx)
                yield "call", ast.Call(swapped, args, keywords)
            if name == "where" and len(args) == 3:
                yield "call", ast.Call(func, [args[0], args[2], args[1]], keywords)


def _is_address(node: ast.AST) -> bool:
    """Pointer arithmetic (``x_ptr + offsets``): its mutants read out of bounds rather than compute wrong math."""
    return isinstance(node, ast.BinOp) and any(
        isinstance(side, ast.Name) and side.id.endswith("_ptr") for side in (node.left, node.right)
    )


def _is_indexing(node: ast.AST) -> bool:
    """``tl.program_id(axis)`` and ``tl.arange(start, end)``: the launch's plumbing, not the math."""
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _INDEXING


def _skipped_children(node: ast.AST) -> set[int]:
    """ids of the subtrees never mutated under ``node``: docstrings, annotations, decorators, messages, imports,
    addresses and indexing."""
    skipped: list[ast.AST] = []
    if _is_address(node) or _is_indexing(node):
        skipped.append(node)
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        skipped += node.decorator_list + ([node.returns] if node.returns else [])
        skipped += [arg.annotation for arg in ast.walk(node.args) if isinstance(arg, ast.arg) and arg.annotation]
    if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and ast.get_docstring(node):
        skipped.append(node.body[0])
    if isinstance(node, ast.AnnAssign):
        skipped.append(node.annotation)
    if isinstance(node, (ast.Import, ast.ImportFrom, ast.Raise, ast.Assert, ast.JoinedStr)):
        skipped.append(node)
    return {id(child) for child in skipped}


def _mutation_sites(tree: ast.Module, functions: tuple[str, ...] | None) -> Iterator[ast.AST]:
    """Every node that may be mutated, in source order."""

    def visit(node: ast.AST, inside: bool) -> Iterator[ast.AST]:
        skipped = _skipped_children(node)
        if id(node) in skipped:
            return
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and functions is not None:
            inside = inside or node.name in functions
        if inside and not isinstance(node, ast.Module):
            yield node
        for child in ast.iter_child_nodes(node):
            if id(child) not in skipped:
                yield from visit(child, inside)

    yield from visit(tree, functions is None)


def mutants(path: str, target: Target) -> list[Mutant]:
    """The mutants of ``path`` (relative to the repository root) that ``target`` asks for."""
    source = (ROOT / path).read_bytes()
    source_hash = hashlib.sha256(source).hexdigest()[:12]
    lines = source.decode().splitlines()
    tree = ast.parse(source)
    line_starts = [0]
    for line in source.splitlines(keepends=True):
        line_starts.append(line_starts[-1] + len(line))
    found: dict[tuple[int, int, str], Mutant] = {}
    for node in _mutation_sites(tree, target.functions):
        if not hasattr(node, "end_col_offset"):
            continue
        start = line_starts[node.lineno - 1] + node.col_offset
        end = line_starts[node.end_lineno - 1] + node.end_col_offset
        original = source[start:end].decode()
        for kind, change in _changes(node):
            replacement = change if isinstance(change, str) else f"({ast.unparse(change)})"
            context = lines[node.lineno - 1].strip()
            original = " ".join(original.split())
            mutant = Mutant(path, source_hash, node.lineno, start, end, context, original, replacement, kind)
            found.setdefault((start, end, replacement), mutant)  # a * a loses either factor alike
    return list(found.values())


@dataclasses.dataclass
class Workspace:
    """A private copy of the package and its tests, where one mutant at a time is applied."""

    folder: Path

    @classmethod
    def create(cls) -> Workspace:
        folder = Path(tempfile.mkdtemp(prefix="liger_jax_mutation_"))
        # benchmarks: some tests check that a benchmark case's baselines compute what the ops compute.
        ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "rows", "plots", "out")
        for name in ("liger_jax", "tests", "benchmarks"):
            shutil.copytree(ROOT / name, folder / name, ignore=ignore)
        shutil.copy(ROOT / "pyproject.toml", folder / "pyproject.toml")
        return cls(folder)

    def run_tests(self, tests: tuple[str, ...], timeout: float) -> tuple[str, float, str]:
        """``(outcome, seconds, last output line)``: outcome "passed", "failed" or "timeout"."""
        command = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-o", "addopts=", *tests]
        environment = os.environ | {"PYTHONDONTWRITEBYTECODE": "1"}
        started = time.monotonic()
        try:
            done = subprocess.run(
                command, cwd=self.folder, env=environment, capture_output=True, text=True, timeout=timeout
            )
        except subprocess.TimeoutExpired:
            return "timeout", time.monotonic() - started, ""
        lines = (done.stdout + done.stderr).strip().splitlines()
        return ("passed" if done.returncode == 0 else "failed"), time.monotonic() - started, (lines or [""])[-1]

    def run_mutant(self, mutant: Mutant, tests: tuple[str, ...], timeout: float) -> dict:
        file = self.folder / mutant.path
        original = file.read_bytes()
        file.write_bytes(mutant.apply(original))
        try:
            outcome, seconds, summary = self.run_tests(tests, timeout)
        finally:
            file.write_bytes(original)
        status = {"passed": "survived", "failed": "killed", "timeout": "timeout"}[outcome]
        return (
            dataclasses.asdict(mutant)
            | {"key": mutant.key, "status": status, "seconds": round(seconds, 1)}
            | {"summary": summary}
        )

    def remove(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


def _load(results_path: Path) -> dict[str, dict]:
    if not results_path.exists():
        return {}
    rows = [json.loads(line) for line in results_path.read_text().splitlines() if line.strip()]
    return {row["key"]: row for row in rows}


def report(results: dict[str, dict], paths: list[str]) -> str:
    """The markdown report on the current mutants of ``paths``: counts and score per file, then every survivor.

    A survivor listed in EQUIVALENT counts as equivalent, with its reason. The score is (killed + timeout) over the
    mutants run less the equivalent ones; the raw score over all the mutants run.
    """
    table = [
        "| file | mutants | killed | timeout | equivalent | survived | not run | score | raw score |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    survivors, equivalents, totals = [], [], collections.Counter()
    for path in paths:
        counts = collections.Counter()
        for mutant in mutants(path, TARGETS[path]):
            row = results.get(mutant.key)
            status = "not run" if row is None else row["status"]
            if status == "survived" and mutant.equivalence:
                status = "equivalent"
                equivalents.append(f"- {_describe(mutant)}: {mutant.equivalence}")
            elif status == "survived":
                survivors.append(f"- {_describe(mutant)}")
            counts[status] += 1
        totals += counts
        table.append(_score_row(path, counts))
    table.append(_score_row("all", totals))
    return "\n".join([*table, "", "Survivors:", "", *survivors, "", "Equivalent mutants:", "", *equivalents]) + "\n"


def _describe(mutant: Mutant) -> str:
    return f"{mutant.path}:{mutant.line} ({mutant.kind}) `{mutant.original}` → `{mutant.replacement}`"


def _score_row(name: str, counts: collections.Counter) -> str:
    statuses = ("killed", "timeout", "equivalent", "survived", "not run")
    caught = counts["killed"] + counts["timeout"]
    decided, run = caught + counts["survived"], caught + counts["survived"] + counts["equivalent"]
    scores = [f"{caught / total:.1%}" if total else "–" for total in (decided, run)]
    return f"| {name} | {sum(counts.values())} | " + " | ".join([*(str(counts[s]) for s in statuses), *scores]) + " |"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="*", help="files of TARGETS to mutate (default: all, in TARGETS' order)")
    parser.add_argument("--list", action="store_true", help="print the mutants and exit")
    parser.add_argument("--jobs", type=int, default=1, help="mutants tested at once, each in its own copy")
    parser.add_argument("--timeout", type=float, default=0.0, help="seconds per mutant (default: 3x clean run + 60)")
    parser.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "liger_jax_mutation")
    parser.add_argument("--retest-survivors", action="store_true", help="run the survivors again (new tests)")
    parser.add_argument("--report", action="store_true", help="write OUT/report.md from the results so far")
    args = parser.parse_args(argv)
    paths = args.files or list(TARGETS)
    unknown = [path for path in paths if path not in TARGETS]
    if unknown:
        parser.error(f"not in TARGETS: {unknown}; known: {list(TARGETS)}")
    if args.list:
        for path in paths:
            for mutant in mutants(path, TARGETS[path]):
                print(f"{path}:{mutant.line} ({mutant.kind}) {mutant.original!r} -> {mutant.replacement!r}")
        return 0

    args.out.mkdir(parents=True, exist_ok=True)
    results_path = args.out / "results.jsonl"
    results = _load(results_path)
    workspaces = [] if args.report else [Workspace.create() for _ in range(args.jobs)]
    try:
        for path in paths if workspaces else []:
            target = TARGETS[path]
            todo = [mutant for mutant in mutants(path, target) if _needs_run(mutant, results, args.retest_survivors)]
            if not todo:
                continue
            outcome, seconds, summary = workspaces[0].run_tests(target.tests, timeout=1800)
            if outcome != "passed":
                print(f"{path}: the clean tests do not pass ({summary}); skipped", flush=True)
                continue
            timeout = args.timeout or 3 * seconds + 60
            print(f"{path}: {len(todo)} mutants to run; clean run {seconds:.0f} s, timeout {timeout:.0f} s", flush=True)
            free = list(workspaces)
            with concurrent.futures.ThreadPoolExecutor(len(workspaces)) as pool:
                running = {}
                for mutant in todo:
                    if not free:
                        done, _ = concurrent.futures.wait(running, return_when=concurrent.futures.FIRST_COMPLETED)
                        for future in done:
                            free.append(running.pop(future))
                            _record(future.result(), results, results_path)
                    workspace = free.pop()
                    running[pool.submit(workspace.run_mutant, mutant, target.tests, timeout)] = workspace
                for future in concurrent.futures.as_completed(running):
                    _record(future.result(), results, results_path)
    finally:
        for workspace in workspaces:
            workspace.remove()
    text = report(results, paths)
    (args.out / "report.md").write_text(text)
    print(text)
    return 0


def _needs_run(mutant: Mutant, results: dict[str, dict], retest_survivors: bool) -> bool:
    row = results.get(mutant.key)
    return row is None or (retest_survivors and row["status"] == "survived" and not mutant.equivalence)


def _record(row: dict, results: dict[str, dict], results_path: Path) -> None:
    results[row["key"]] = row
    with results_path.open("a") as file:
        file.write(json.dumps(row) + "\n")
    print(
        f"{row['status']:8} {row['seconds']:6.1f}s {row['path']}:{row['line']} ({row['kind']}) "
        f"{row['original']!r} -> {row['replacement']!r}",
        flush=True,
    )


if __name__ == "__main__":
    sys.exit(main())
