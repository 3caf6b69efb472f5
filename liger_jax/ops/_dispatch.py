"""The size rule: where a kernel cannot beat XLA, ``implementation=None`` runs the op's XLA reference instead.

A Triton launch has a fixed cost XLA's own kernels do not pay: XLA fuses an elementwise or row op into its
neighbours and records its kernels into command buffers (CUDA graphs), while each kernel launch is a custom call of
its own. On small operands that fixed cost outweighs what the kernel saves, so when the default would be
``"triton"`` an op whose operand has fewer elements than its entry in :data:`MIN_KERNEL_ELEMENTS` runs ``"xla"``.

Only the automatic choice changes: ``implementation="triton"`` (or ``"interpret"``) still runs the kernel, and
``$LIGER_JAX_IMPLEMENTATION`` still decides for every op. Under Triton's interpreter (the tests) the default is
``"interpret"`` and nothing changes. Sizes are those the op sees: the global operand under ``jit`` (sharded or
not), one example's under ``jax.vmap``.
"""

import numpy as np

from liger_jax import runtime

# Elements of each op's main operand (named below) from which the default picks the Triton kernel on a GPU.
# Measured on the H200 (2026-12-04, benchmarks/launch_profile.py's crossover, bf16 fwd+bwd, FFI launches, kernel
# time / XLA time at sizes 4x apart): rms_norm 1.19x slower at 4.2M elements, 1.25x faster at 16.8M (the row ops
# share its launch pattern); cross_entropy 1.10x slower at 1.0M, even at 4.1M; FLCE 1.10x faster from 4.1M. SwiGLU
# and RoPE timed alone lose to XLA's fusion of forward and backward into one pass, which a model cannot do (the
# forward's output feeds a matmul): their entries come from the model step, where the small preset (2048 tokens)
# ran 1.04x flax with these kernels on XLA and 0.95x with them forced, and the 1b preset gains with them.
MIN_KERNEL_ELEMENTS: dict[str, int] = {
    "rms_norm": 2**24,  # x: rows × D
    "layer_norm": 2**24,  # x: rows × D
    "fused_add_rms_norm": 2**24,  # x: rows × D
    "swiglu": 2**26,  # gate: rows × intermediate
    "geglu": 2**26,  # gate: rows × intermediate
    "rope": 2**23,  # q and k: tokens × (Hq + Hkv) × D
    "cross_entropy": 2**22,  # logits: rows × V
    "fused_linear_cross_entropy": 2**22,  # the logits it never builds: rows × V
    # FLCE's chunk loop and kernel pattern, not measured on their own: FLCE's entry.
    "fused_linear_logprobs": 2**22,  # the logits it never builds: rows × V
    "fused_linear_jsd": 2**22,  # the student's logits it never builds: rows × V
    "fused_linear_distillation": 2**22,  # the student's logits it never builds: rows × V
    # Not measured yet: cross-entropy's threshold, as this reads [rows, V] operands in one pass the same way.
    "jsd": 2**22,  # input: rows × V
    # TVD keeps its gradient's sign in 2 bits and a kernel of its own scales them in the backward (3.25 passes over
    # the operands in a training step, XLA's fusions four): on the H200 (2026-12-05, bf16 fwd+bwd) 1.14-1.35x XLA
    # from 2048 × 32000 (65.5M elements, 1.25x) to 16384 × 128256; below that, cross-entropy's crossover.
    "tvd": 2**22,  # input: rows × V
    # TVD with reduction="none": not by default. Its fp32 per-element losses are an output and the cotangent an
    # fp32 input of the same size, and XLA fuses forward and backward into one pass over all five arrays (14 bytes an
    # element at bf16 operands, the kernels 14.25): on an H100 (2026-12-05, 8192 × 128256 bf16, device busy) 4.85 ms
    # against the kernels' 5.53.
    "tvd_elementwise": 2**62,  # input: rows × V
    # Not by default: XLA's own fusion of KL already makes the fewest passes (the forward reads input and target,
    # the backward reads the target and writes the gradient). Kernel against XLA, bf16 fwd+bwd: 0.97-0.99x on the
    # H200 with tl.log, 1.12x in one run with the approximate log (2026-12-05); swept on an H100 (2026-12-05, 25 ms
    # samples) 0.93-1.00x from 2048 × 32000 to 16384 × 128256.
    "kl_div": 2**62,  # input: rows × V
    # The catalog's sweeps on the H200 (2026-12-04, benchmarks.run --sweep tokens hidden positions channels, bf16
    # fwd+bwd; benchmarks/rows/2026-12-04d/sweeps.jsonl). GroupNorm: 3.78x XLA at 2.1M elements and 1.30x at 8.4M
    # with 512 channels, but 0.82x at 8.4M with 128 channels (16 × 4096 × 128) and 1.03-1.67x from 16.8M.
    "group_norm": 2**24,  # x: batch × positions × channels
    # DyT 1.11-1.65x at 2048 × 768 (1.6M elements) over three runs, 1.7-2.2x at 2048 × 4096. PolyNorm 0.93-1.09x
    # at 2048 × 768 over three runs (break-even; rows/2026-12-04e), 1.6-1.8x at 2048 × 4096 (8.4M).
    "dyt": 2**20,  # x: rows × D
    "poly_norm": 2**21,  # x: rows × D
    # Modulated RMSNorm: not measured under 16.8M (1.05-2.68x from there up to D = 8192): the row norms' entry.
    "modulated_rms_norm": 2**24,  # x: rows × D
    # Softmax 0.94x at 2048 × 768, 2.0x at 2048 × 4096 (8.4M); sparsemax 12.6x at 2048 × 768 (XLA sorts each row).
    "softmax": 2**23,  # x: rows × D
    "sparsemax": 2**20,  # x: rows × D
    # ReLU²: 0.89x at 2048 × 2048 (4.2M), 1.07x at 2048 × 14336 (29M), 1.03-1.09x above.
    "relu_squared": 2**24,  # x: all elements
    # Not measured yet. Multi-token attention launches softmax's kernels over its score map: softmax's entry.
    # Neighborhood attention's band kernels never build the [B, H, S, S] map XLA builds: a guess of 1M elements.
    "multi_token_attention": 2**24,  # scores: batch × heads × L × L
    "fused_neighborhood_attention": 2**20,  # query: batch × S × heads × head_dim
}
# Rows longer than this run XLA by default. From D = 16384 the norms' backward walks each row in column blocks, its
# weight-gradient partials in registers, the row split among neighbouring programs where they would not fit
# (_tiling.column_splits). Measured (2026-12-05, 16384 rows, bf16 fwd+bwd, kernel / XLA) on the H200: RMSNorm 1.29x
# at 32768, 0.97x at 65536; fused add+RMSNorm 1.81x, 1.31x; LayerNorm, whose backward sums two rows of partials,
# 1.27x at 32768, 0.83x at 65536 (on an H100: RMSNorm 1.37x, 1.05x; fused add 1.80x, 1.30x; LayerNorm 1.54x, 1.00x).
# With the forward's 16384-column blocks (2026-12-06, H100, 4096 rows): RMSNorm 1.05x, LayerNorm 0.97x, fused add
# 1.31x at 65536. Then RMSNorm's backward summing a row once and the forward's 32768-column blocks (H100, same day,
# two runs): RMSNorm 1.19-1.20x, LayerNorm 1.00x, fused add 1.34x at 65536; at 131072 0.94-0.95x, 0.61x, 1.03x.
# RMSNorm's limit rises to 65536 on the H100's numbers (the H200's 0.97x predates both changes, which took 12% off
# the H100's step there); LayerNorm's stayed, a tie at 65536. Then LayerNorm's backward summed its rows in a kernel
# of their own (2026-12-07, H100, 4096 rows): 1.48x at 32768, 1.51x at 65536, 1.43x at 131072, and its limit rises
# to 131072. Then the backward's splits of a row shared their row sums (_tiling.SHARED_SUMS_MIN_BLOCKS; same day,
# H100, 4096 rows, one run with the rule before): RMSNorm 1.32x, 1.18x, 1.11x at 32768, 65536, 131072 (0.94x at
# 131072 before), fused add 1.72x, 1.45x, 1.35x (1.01x at 131072 before), LayerNorm 1.54x at 32768; the limits of
# RMSNorm and the fused add rise to 131072.
# DyT (16384 rows) at 32768 columns: 0.71x XLA with the rule's column blocks, 0.85x with the best candidate
# (benchmarks.row_tiling), 1.55x at 16384; modulated RMSNorm (4 × 4096 rows): 1.85x at 8192, 0.67x at 16384.
MAX_KERNEL_COLS: dict[str, int] = {
    "rms_norm": 131072,
    "layer_norm": 131072,
    "fused_add_rms_norm": 131072,
    "dyt": 16384,
    "modulated_rms_norm": 8192,
}

# Rows shorter than this run XLA by default. DyT on an H100 (2026-12-07, 16384 rows, bf16 fwd+bwd, kernel / XLA):
# 0.89x at 256 columns with its best tiling (one-row tiles at 4 warps; 0.33x with tiles of several rows), 1.57x at
# 512 with the same tiles (``_heavy_rows.ONE_ROW_TILE_COLS``), 1.76x at 768 (2048 rows), 2.02x at 1024.
MIN_KERNEL_COLS: dict[str, int] = {
    "dyt": 512,
}


def resolve(implementation: str | None, op: str, elements: int, cols: int = 0) -> runtime.Implementation:
    """:func:`liger_jax.runtime.resolve_implementation`, then the size rule for ``implementation=None``.

    Args:
        implementation: the op's ``implementation=`` argument.
        op: a key of :data:`MIN_KERNEL_ELEMENTS`.
        elements: the size of the op's main operand, as that table's comments count it.
        cols: the row length of a row op (checked against :data:`MAX_KERNEL_COLS` and :data:`MIN_KERNEL_COLS`); 0
            for the others.

    Returns:
        ``"xla"`` when ``implementation`` is None, ``$LIGER_JAX_IMPLEMENTATION`` is unset, the default is
        ``"triton"`` and ``elements < MIN_KERNEL_ELEMENTS[op]``, ``cols > MAX_KERNEL_COLS[op]`` or
        ``0 < cols < MIN_KERNEL_COLS[op]``; otherwise what ``resolve_implementation`` returns.

    Raises:
        ValueError: as :func:`liger_jax.runtime.resolve_implementation`.
    """
    chosen = runtime.resolve_implementation(implementation)
    automatic = implementation is None and not runtime.implementation_from_environment()
    too_small = elements < MIN_KERNEL_ELEMENTS[op]
    too_wide = cols > MAX_KERNEL_COLS.get(op, cols)
    too_narrow = 0 < cols < MIN_KERNEL_COLS.get(op, 0)
    if automatic and chosen == "triton" and (too_small or too_wide or too_narrow):
        return "xla"
    return chosen


def row_length(x) -> int:
    """The length of ``x``'s rows (its last axis) for :func:`resolve`'s ``cols``; 0 for a scalar (the op's checks
    then reject it)."""
    return np.shape(x)[-1] if np.ndim(x) else 0


def logits_elements(labels, weight, weight_layout: str) -> int:
    """rows × V of the logits :func:`liger_jax.fused_linear_cross_entropy` never builds; 0 for a weight that is not
    rank 2 (the op's checks then reject it)."""
    shape = np.shape(weight)
    if len(shape) != 2:
        return 0
    return int(np.size(labels)) * shape[1 if weight_layout == "hv" else 0]
