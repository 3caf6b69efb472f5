"""An LM head's matmul walked chunk by chunk over rows, so the ``N × V`` logits never exist.

Shared by the fused-linear losses (``fused_linear_cross_entropy``, ``fused_linear_logprobs``, the distillation
losses): the chunk rule (:func:`default_chunk_rows`), the operand checks, the logits reference and the chunk loop
(:func:`run_chunks`). A loss plugs in its per-row math as a :data:`RowMath`: the chunk's logits and row operands
in, per-row values and (when gradients are wanted) the gradient of the chunk's logits out. The loop turns that
gradient into ``dx`` for the chunk's rows and ``dweight``/``dbias`` accumulated over the chunks.
"""

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Literal, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from liger_jax import _manual_axes
from liger_jax.ops import _checks, vocab_parallel

WeightLayout = Literal["hv", "vh"]
WEIGHT_LAYOUTS = ("hv", "vh")

# How the rows are cut into chunks: the one place that decides it (default_chunk_rows).
#
# One chunk's logits (and their gradient, written over them) may take as many bytes as the larger of x and the
# dweight accumulator (H × V in accum_dtype): memory a step holds anyway, so the chunk at most doubles it, and the
# bound grows with the inputs, never with N × V. Liger sizes a chunk by x alone (256 rows at N=8192, H=4096,
# V=128256: 32 passes over a 2 GiB fp32 dweight); the accumulator term keeps a large head's chunks large enough for
# full-speed matmuls, and a small head's small (512 rows at N=4096, H=256, V=32768 fp32, where 2048-row chunks
# kept 514 MiB of temporaries, as much as the N × V fp32 logits).
#
# Below this, a chunk is launch-bound: 64 MiB of logits take ~20 µs per pass at the H200's ~3.4 TB/s and a chunk
# makes ~5 passes (matmul write, loss kernel read and overwrite, dx and dweight matmul reads), against ~10-20 µs of
# fixed cost per chunk (its kernel launches and the loop's step). Only small heads and few rows fall back on it.
MIN_CHUNK_LOGITS_BYTES = 64 * 2**20
# Beyond this, larger chunks only cost memory. Each chunk reads the weight twice (logits, dx) and reads and writes the
# fp32 dweight accumulator once: 8·H·V bytes against the dweight matmul's 2·C·H·V flops, C/4 flop per byte, above
# the H200's ~190 (650 TFLOP/s over 3.4 TB/s) from C ≈ 1024. Measured on the H200 (N=8192, H=4096, V=128256 bf16,
# fwd+bwd): 1024 rows 43.7 ms, 2048 rows 41.8 ms (95% of the matmul floor, XLA's speed), 4096 rows 42.2 ms.
MAX_CHUNK_ROWS = 2048
# Chunks of whole matmul tiles (128 rows on Hopper's tensor-core GEMMs): a partial tile would be computed anyway.
CHUNK_ROW_MULTIPLE = 128

# ``row_math(logits [C, V], *row_operands [C], vocab_axes) -> (values, dlogits)``: ``values`` a tuple of per-row
# arrays ``[C]``, ``dlogits`` ``[C, V]`` (logits.dtype) or None when no gradient is wanted. With ``vocab_axes`` the
# logits are this device's slice of a vocabulary sharded on those mesh axes (slice ``axis_index`` in order).
# Must be hashable (a frozen dataclass with ``__call__``): it keys the compiled loop.
RowMath = Callable[..., tuple[tuple[jax.Array, ...], jax.Array | None]]


def chunk_logits_bound(n_rows: int, hidden: int, n_classes: int, x_dtype, accum_dtype=jnp.float32) -> int:
    """Bytes one chunk's logits (and, separately, their gradient) may take by default for ``x`` ``[n_rows, hidden]``
    and a weight with ``n_classes`` classes: ``max(bytes of x, bytes of the H × V dweight accumulator,
    MIN_CHUNK_LOGITS_BYTES)``. Under sharding, of each device's block of x and slice of the vocabulary."""
    x_bytes = n_rows * hidden * jnp.dtype(x_dtype).itemsize
    accumulator_bytes = hidden * n_classes * jnp.dtype(accum_dtype).itemsize
    return max(x_bytes, accumulator_bytes, MIN_CHUNK_LOGITS_BYTES)


def default_chunk_rows(
    n_rows: int, hidden: int, n_classes: int, x_dtype, logits_dtype, accum_dtype=jnp.float32, logit_bytes=None
) -> int:
    """Rows per chunk when ``chunk_size`` is None: the rows split into as few chunks as keep each chunk's
    ``logits_dtype`` logits (or ``logit_bytes`` per logit, for a loss that holds several ``[chunk, V]`` buffers at
    once) within :func:`chunk_logits_bound` and at most MAX_CHUNK_ROWS rows, the chunks as even as whole
    CHUNK_ROW_MULTIPLEs allow (2048 rows that may take 1536 a chunk run as 1024 + 1024, not 1536 + 512)."""
    bound = chunk_logits_bound(n_rows, hidden, n_classes, x_dtype, accum_dtype)
    largest = min(MAX_CHUNK_ROWS, bound // (n_classes * (logit_bytes or jnp.dtype(logits_dtype).itemsize)))
    if largest >= CHUNK_ROW_MULTIPLE:
        largest -= largest % CHUNK_ROW_MULTIPLE
    largest = max(1, min(largest, n_rows))
    even = -(-n_rows // -(-n_rows // largest))
    if largest >= CHUNK_ROW_MULTIPLE:
        even = -(-even // CHUNK_ROW_MULTIPLE) * CHUNK_ROW_MULTIPLE
    return even


def check_linear_operands(x, weight, bias, weight_layout, implementation, names=("x", "weight", "bias")) -> int:
    """Checks x ``[..., H]``, weight (``[H, V]`` or ``[V, H]``) and bias ``[V]``; returns the number of classes V.

    ``names`` are the arguments' names in error messages (``("student_x", "student_weight", ...)``).
    """
    x_name, weight_name, bias_name = names
    _checks.check_floating(x_name, x, implementation)
    _checks.check_floating(weight_name, weight, implementation)
    _checks.check_min_rank(x_name, x, 1)
    _checks.check_choice("weight_layout", weight_layout, WEIGHT_LAYOUTS)
    if weight.ndim != 2:
        raise ValueError(f"{weight_name} must have 2 axes ([H, V] or [V, H]), got shape {weight.shape}")
    hidden = x.shape[-1]
    n_classes = weight.shape[1] if weight_layout == "hv" else weight.shape[0]
    expected = (hidden, n_classes) if weight_layout == "hv" else (n_classes, hidden)
    _checks.check_shape(weight_name, weight, expected, f"weight_layout={weight_layout!r} with H={hidden} from {x_name}")
    if bias is not None:
        _checks.check_floating(bias_name, bias, implementation)
        _checks.check_shape(bias_name, bias, (n_classes,), f"the vocabulary axis of {weight_name}")
    return n_classes


def check_accum_dtype(accum_dtype) -> None:
    """Raises TypeError unless ``accum_dtype`` is a floating dtype."""
    if not jnp.issubdtype(jnp.dtype(accum_dtype), jnp.floating):
        raise TypeError(f"accum_dtype must be a floating dtype, got {accum_dtype!r}")


def check_chunk_size(chunk_size) -> None:
    """Raises ValueError unless ``chunk_size`` is None or a positive int."""
    if chunk_size is not None and (
        isinstance(chunk_size, bool) or not isinstance(chunk_size, (int, np.integer)) or chunk_size < 1
    ):
        raise ValueError(f"chunk_size must be None or a positive int, got {chunk_size!r}")


def logits_reference(x, weight, bias, weight_layout, logits_dtype=None):
    """``[..., V]`` logits ``x @ weight (+ bias)`` in ``result_type(x, weight)``; with ``logits_dtype`` the matmul
    and the bias sum are rounded to it as the chunks round them, and so is the logits' gradient."""
    dtype = jnp.result_type(x.dtype, weight.dtype)
    contracting = 0 if weight_layout == "hv" else 1
    logits = jax.lax.dot_general(x.astype(dtype), weight.astype(dtype), (((x.ndim - 1,), (contracting,)), ((), ())))
    if logits_dtype is not None:
        logits = _rounded(logits, logits_dtype)
    if bias is not None:
        logits = logits + bias.astype(dtype).reshape((1,) * (logits.ndim - 1) + bias.shape)
        if logits_dtype is not None:
            logits = _rounded(logits, logits_dtype)
    return logits


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def _rounded(value: jax.Array, dtype) -> jax.Array:
    """``value`` rounded to ``dtype`` and back; its cotangent is rounded alike, as the chunks store the logits'
    gradient in the logits' dtype."""
    return value.astype(dtype).astype(value.dtype)


def _rounded_fwd(value, dtype):
    return _rounded(value, dtype), None


def _rounded_bwd(dtype, _, cotangent):
    return (cotangent.astype(dtype).astype(cotangent.dtype),)


_rounded.defvjp(_rounded_fwd, _rounded_bwd)


@dataclasses.dataclass(frozen=True)
class ChunkPlan:
    """Static description of one fused call's matmuls: layout, chunking and the dtypes involved."""

    weight_layout: str
    chunk_rows: int | None  # None: default_chunk_rows of each device's block
    logits_dtype: np.dtype
    accum_dtype: np.dtype
    x_dtype: np.dtype
    weight_dtype: np.dtype
    bias_dtype: np.dtype | None
    logit_bytes: int | None = None  # bytes a chunk holds per logit when it sizes chunks; None: the logits' itemsize
    sharded_logit_bytes: int | None = None  # the same with the vocabulary sharded; None: logit_bytes

    @classmethod
    def for_operands(
        cls,
        x,
        weight,
        bias,
        weight_layout,
        chunk_size=None,
        accum_dtype=jnp.float32,
        logit_bytes=None,
        sharded_logit_bytes=None,
    ):
        """The plan for these operands: logits in ``result_type(x, weight)``."""
        return cls(
            weight_layout=weight_layout,
            chunk_rows=None if chunk_size is None else int(chunk_size),
            logits_dtype=jnp.dtype(jnp.result_type(x.dtype, weight.dtype)),
            accum_dtype=jnp.dtype(accum_dtype),
            x_dtype=x.dtype,
            weight_dtype=weight.dtype,
            bias_dtype=None if bias is None else bias.dtype,
            logit_bytes=logit_bytes,
            sharded_logit_bytes=sharded_logit_bytes,
        )

    def parameter_grads(self, dweight, dbias):
        """The accumulated ``dweight``/``dbias`` rounded to their parameters' dtypes."""
        return dweight.astype(self.weight_dtype), None if dbias is None else dbias.astype(self.bias_dtype)


class ChunkResults(NamedTuple):
    """What the chunk loop produces: per-row values, and with gradients dx, the dweight and dbias accumulators."""

    values: tuple[jax.Array, ...]
    dx: jax.Array | None = None
    dweight: jax.Array | None = None
    dbias: jax.Array | None = None


def run_chunks(
    x,
    weight,
    bias,
    row_operands: Sequence[jax.Array],
    plan: ChunkPlan,
    row_math: RowMath,
    n_values: int,
    grads: bool,
    teacher: tuple | None = None,
    vocab_operands: Sequence[jax.Array] = (),
    whole_groups: bool = False,
) -> ChunkResults:
    """The chunk loop on each device's rows and vocabulary slice, for any sharding (``ops.vocab_parallel``).

    Args:
        x: ``[..., H]``.
        weight, bias: the head, as ``plan`` describes it (bias may be None).
        row_operands: arrays ``[...]`` (``x.shape[:-1]``) handed chunk by chunk to ``row_math``.
        plan: the static plan.
        row_math: the per-row math (see :data:`RowMath`).
        n_values: how many per-row values ``row_math`` returns.
        grads: whether ``row_math`` returns a logits gradient, and dx, dweight and dbias are wanted.
        teacher: None, or a second head ``(teacher_x [..., G], teacher_weight, teacher_bias or None)`` in the same
            layout and vocabulary, frozen (no gradient): each chunk's teacher logits, in
            ``result_type(teacher_x, teacher_weight)``, go to ``row_math`` right after the chunk's logits.
        vocab_operands: arrays ``[V]`` (sharded with the vocabulary) handed whole to ``row_math`` as the keyword
            ``vocab_operands`` (only when there are any).
        whole_groups: x's last row axis (``x [..., R, H]``, row operands ``[..., R]``) holds groups of ``R`` rows
            ``row_math`` needs together: it is never sharded, and ``plan.chunk_rows`` must be a multiple of ``R``.

    Returns:
        :class:`ChunkResults`: ``values`` ``[...]`` each in ``promote(logits dtype, float32)``; dx ``[..., H]`` in
        x's dtype; dweight and dbias summed over the rows in ``plan.accum_dtype``.
    """
    teacher_bias = None if teacher is None else teacher[2] is not None
    sharded = vocab_parallel.sharded_chunks(
        _run_local_chunks,
        plan,
        row_math,
        bias is not None,
        len(row_operands),
        n_values,
        grads,
        teacher_bias,
        len(vocab_operands),
        whole_groups,
    )
    heads = (x, weight, bias) + (() if teacher is None else tuple(teacher))
    return sharded(*(a for a in heads if a is not None), *row_operands, *vocab_operands)


def _run_local_chunks(
    x,
    weight,
    bias,
    row_operands,
    plan: ChunkPlan,
    row_math,
    n_values,
    grads,
    vocab_axes=(),
    teacher=None,
    vocab_operands=(),
):
    """Walks the rows of ``x`` [N, H] chunk by chunk (:func:`run_chunks` on one device's block)."""
    n_rows = x.shape[0]
    value_dtype = jnp.promote_types(plan.logits_dtype, jnp.float32)
    results = ChunkResults(values=tuple(jnp.zeros(n_rows, value_dtype) for _ in range(n_values)))
    if grads:
        results = results._replace(
            dx=jnp.zeros_like(x),
            dweight=jnp.zeros(weight.shape, plan.accum_dtype),
            dbias=None if bias is None else jnp.zeros(bias.shape, plan.accum_dtype),
        )
    # Inside shard_map (check_vma) the loop carries vary over every manual axis an operand varies over.
    teacher = teacher or ()
    varying = _manual_axes.union_of(
        [a for a in (x, weight, bias, *teacher, *row_operands, *vocab_operands) if a is not None]
    )
    results = jax.tree.map(lambda buffer: _manual_axes.cast_to_varying(buffer, varying), results)
    weight = weight.astype(plan.logits_dtype)
    bias = None if bias is None else bias.astype(plan.logits_dtype)
    if teacher:
        teacher_x, teacher_weight, teacher_bias = teacher
        teacher_dtype = jnp.result_type(teacher_x.dtype, teacher_weight.dtype)
        teacher_weight = teacher_weight.astype(teacher_dtype)
        teacher_bias = None if teacher_bias is None else teacher_bias.astype(teacher_dtype)

    def step(start, size, results: ChunkResults) -> ChunkResults:
        def rows_of(array):
            return jax.lax.dynamic_slice_in_dim(array, start, size)

        def write_rows(buffer, update):
            return jax.lax.dynamic_update_slice_in_dim(buffer, update.astype(buffer.dtype), start, 0)

        x_chunk = rows_of(x).astype(plan.logits_dtype)
        logits = (_logits(x_chunk, weight, bias, plan.weight_layout),)
        if teacher:
            teacher_chunk = rows_of(teacher_x).astype(teacher_dtype)
            logits += (_logits(teacher_chunk, teacher_weight, teacher_bias, plan.weight_layout),)
        extra = {"vocab_operands": tuple(vocab_operands)} if vocab_operands else {}
        values, dlogits = row_math(*logits, *map(rows_of, row_operands), vocab_axes=vocab_axes, **extra)
        results = results._replace(values=tuple(map(write_rows, results.values, values)))
        if grads:
            dx, dweight, dbias = _chunk_grads(x_chunk, weight, dlogits, plan)
            results = results._replace(
                dx=write_rows(results.dx, dx),
                dweight=results.dweight + dweight,
                dbias=None if bias is None else results.dbias + dbias,
            )
        return results

    # Each device sizes its chunks from its own block; its rows may be fewer than an explicit chunk_size.
    n_classes = weight.shape[1 if plan.weight_layout == "hv" else 0]
    logit_bytes = (vocab_axes and plan.sharded_logit_bytes) or plan.logit_bytes
    chunk_rows = min(
        plan.chunk_rows
        or default_chunk_rows(n_rows, x.shape[1], n_classes, x.dtype, plan.logits_dtype, plan.accum_dtype, logit_bytes),
        n_rows,
    )
    full_chunks, remainder = divmod(n_rows, chunk_rows)
    results = jax.lax.fori_loop(0, full_chunks, lambda i, results: step(i * chunk_rows, chunk_rows, results), results)
    if remainder:
        results = step(full_chunks * chunk_rows, remainder, results)
    if vocab_axes and results.dx is not None:  # each vocabulary slice contributed its part of dx
        dx = jax.lax.psum(results.dx.astype(jnp.promote_types(x.dtype, jnp.float32)), vocab_axes)
        results = results._replace(dx=dx.astype(x.dtype))
    return results


def _logits(x_chunk, weight, bias, weight_layout):
    """``[C, V]`` logits of a chunk in the logits dtype; the "vh" weight is contracted on its H axis in place."""
    contracting = 0 if weight_layout == "hv" else 1
    logits = jax.lax.dot_general(
        x_chunk, weight, (((1,), (contracting,)), ((), ())), preferred_element_type=x_chunk.dtype
    )
    return logits if bias is None else logits + bias[None, :]


def _chunk_grads(x_chunk, weight, dlogits, plan):
    """``(dx [C, H], dweight, dbias [V])`` of one chunk from its logit gradient, dweight in weight's layout."""
    vocab_axis = 1 if plan.weight_layout == "hv" else 0
    no_batch = ((), ())
    dx = jax.lax.dot_general(dlogits, weight, (((1,), (vocab_axis,)), no_batch), preferred_element_type=dlogits.dtype)
    if plan.weight_layout == "hv":
        dweight = jax.lax.dot_general(
            x_chunk, dlogits, (((0,), (0,)), no_batch), preferred_element_type=plan.accum_dtype
        )
    else:
        dweight = jax.lax.dot_general(
            dlogits, x_chunk, (((0,), (0,)), no_batch), preferred_element_type=plan.accum_dtype
        )
    dbias = None if plan.bias_dtype is None else jnp.sum(dlogits, axis=0, dtype=plan.accum_dtype)
    return dx, dweight, dbias
