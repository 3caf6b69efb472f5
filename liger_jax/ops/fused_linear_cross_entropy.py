"""Fused linear cross-entropy: the LM head's matmul and its loss, chunked over rows so N×V logits never exist."""

import dataclasses
import functools
from typing import Literal, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from liger_jax import _manual_axes, runtime
from liger_jax.ops import _checks, _dispatch, vocab_parallel
from liger_jax.ops._cross_entropy_checks import check_labels, loss_settings
from liger_jax.ops._cross_entropy_rows import (
    LossSettings,
    reduce_rows,
    reduced_reference_losses,
    reduction_grad_scale,
    row_losses,
    row_losses_and_grads,
)
from liger_jax.ops.cross_entropy import Reduction, cross_entropy_reference

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


def fused_linear_cross_entropy(
    x: jax.Array,
    weight: jax.Array,
    labels: jax.Array,
    *,
    bias: jax.Array | None = None,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    z_loss_scale: float = 0.0,
    softcap: float | None = None,
    reduction: Reduction = "mean",
    return_z_loss: bool = False,
    weight_layout: WeightLayout = "hv",
    accum_dtype=jnp.float32,
    chunk_size: int | None = None,
    implementation: runtime.Implementation | None = None,
) -> jax.Array | tuple[jax.Array, jax.Array]:
    r"""``cross_entropy(x @ weight + bias, labels)`` without materialising the logits (Liger's FusedLinearCrossEntropy).

    The rows of ``x`` are processed in chunks of ``chunk_size`` under a ``lax.fori_loop`` (compile time does not
    grow with N). For each chunk XLA computes the logits (a ``[chunk, V]`` matmul in the dtype of ``x`` and
    ``weight``, as a Dense layer would), the cross-entropy kernel turns them into per-row losses and, in place,
    their gradient, and XLA immediately consumes that gradient: ``dx`` for the chunk's rows, and ``dweight`` and
    ``dbias`` accumulated in ``accum_dtype``. The backward pass only scales these by the cotangent.

    With ``reduction="none"`` the cotangent differs per row and ``dweight = Σ_rows g_row · x_rowᵀ dlogits_row``
    cannot be rescaled after the sum, so the forward pass computes only the losses and the backward pass recomputes
    the chunk logits with each row's gradient scaled by its cotangent: exact, at the price of a fourth matmul.

    Memory: besides its inputs and outputs, a step holds one chunk's logits (``chunk × V``, overwritten by their
    gradient), the ``dweight`` accumulator (``H × V`` in ``accum_dtype``), ``dx`` (``N × H``) and ``dbias`` — never
    ``N × V``. By default one chunk's logits, and their gradient, each take at most

        ``bound = max(bytes of x, H · V · itemsize(accum_dtype), 64 MiB)``

    (:func:`chunk_logits_bound`; with a sharded input, of each device's rows and vocabulary slice): memory the step
    holds anyway in ``x`` and the accumulator. The chunk is the most rows within that bound, up to 2048 (where
    the per-chunk passes over the weight and the accumulator hide under the matmul flops; larger chunks gain no
    speed), in multiples of 128 rows. The compiled temporaries are then a few times the bound whatever N and V
    are, and below a quarter of the full fp32 logits (``N · V · 4`` bytes) whenever those are at least 64 times
    the bound. A Llama-3-8B head (H=4096, V=128256, bf16) gets 2048 rows (501 MiB of chunk logits); an fp32 head
    of H=256 over V=32768 classes gets 512 rows (the 64 MiB floor). The ``"xla"`` implementation runs the same
    chunked loop with a pure-JAX loss, so CPU and TPU users get the same bound.

    Numerics: loss math as :func:`liger_jax.cross_entropy` (fp32 softmax whatever the dtype); logits and their
    gradient in ``result_type(x, weight)``; ``dweight``/``dbias`` summed over chunks in ``accum_dtype`` (fp32 by
    default; bf16 accumulation drifts, Liger #512) and rounded once to their parameter's dtype. The matmuls follow
    jax's matmul precision like any ``jnp.dot``: fp32 inputs run as TF32 on NVIDIA GPUs unless
    ``jax.default_matmul_precision("highest")`` is set.

    Args:
        x: ``[..., H]`` float32, bfloat16 or float16 (float64 too under ``"xla"``); each leading index is a row.
        weight: ``[H, V]`` for ``weight_layout="hv"`` (a Dense/Linear kernel) or ``[V, H]`` for ``"vh"`` (a tied
            embedding table); neither layout makes a transposed copy.
        labels: ``[...]`` (``x.shape[:-1]``) integers in ``[0, V)`` or ``ignore_index``.
        bias: optional ``[V]`` added to the logits.
        ignore_index, label_smoothing, z_loss_scale, softcap, reduction, return_z_loss: as
            :func:`liger_jax.cross_entropy`.
        weight_layout: ``"hv"`` or ``"vh"``, as above.
        accum_dtype: dtype of the ``dweight``/``dbias`` accumulators. With the weight's own dtype the accumulator
            can be the gradient buffer itself (least memory: no ``H × V`` fp32 temporary).
        chunk_size: rows per chunk (overrides the bound above), or None for the default above.
        implementation: ``"triton"``, ``"interpret"``, ``"xla"`` or None for the default (see
            :mod:`liger_jax.runtime`).

    Returns:
        As :func:`liger_jax.cross_entropy`: the fp32 loss, a scalar or ``[...]`` for ``"none"``, and with
        ``return_z_loss`` the tuple ``(loss, z_loss)``.

    Raises:
        TypeError: x, weight, bias or accum_dtype are not floating point, labels are not integers, or ignore_index
            is not an int.
        ValueError: shapes do not fit together, an unknown weight_layout, chunk_size not a positive int, a
            concrete label out of range, or a loss option out of its domain.

    Example:
        >>> loss = liger_jax.fused_linear_cross_entropy(hidden, lm_head_kernel, labels)
        >>> loss = liger_jax.fused_linear_cross_entropy(hidden, embedding_table, labels, weight_layout="vh")
    """
    implementation = _dispatch.resolve(
        implementation, "fused_linear_cross_entropy", _dispatch.logits_elements(labels, weight, weight_layout)
    )
    settings = loss_settings(
        ignore_index=ignore_index,
        label_smoothing=label_smoothing,
        z_loss_scale=z_loss_scale,
        softcap=softcap,
        reduction=reduction,
        implementation=implementation,
    )
    n_classes = _check_operands(x, weight, bias, weight_layout, implementation)
    check_labels(labels, x.shape[:-1], "the leading axes of x", n_classes, ignore_index)
    if not jnp.issubdtype(jnp.dtype(accum_dtype), jnp.floating):
        raise TypeError(f"accum_dtype must be a floating dtype, got {accum_dtype!r}")
    if chunk_size is not None and (
        isinstance(chunk_size, bool) or not isinstance(chunk_size, (int, np.integer)) or chunk_size < 1
    ):
        raise ValueError(f"chunk_size must be None or a positive int, got {chunk_size!r}")
    if labels.size == 0:  # no rows to chunk: the reference's empty matmul
        loss, z_loss = reduced_reference_losses(
            _logits_reference(x, weight, bias, weight_layout, None), labels, settings
        )
    else:
        logits_dtype = jnp.dtype(jnp.result_type(x.dtype, weight.dtype))
        plan = _ChunkPlan(
            settings=settings,
            weight_layout=weight_layout,
            chunk_rows=None if chunk_size is None else int(chunk_size),
            logits_dtype=logits_dtype,
            accum_dtype=jnp.dtype(accum_dtype),
            x_dtype=x.dtype,
            weight_dtype=weight.dtype,
            bias_dtype=None if bias is None else bias.dtype,
        )
        # Unflattened: merging a sharded sequence axis into the rows would make XLA gather them.
        loss, z_loss = _fused_linear_cross_entropy(x, weight, bias, labels, plan)
    # z_loss is for logging; its gradient flows through loss, which contains it.
    return (loss, jax.lax.stop_gradient(z_loss)) if return_z_loss else loss


def fused_linear_cross_entropy_reference(
    x: jax.Array,
    weight: jax.Array,
    labels: jax.Array,
    *,
    bias: jax.Array | None = None,
    weight_layout: WeightLayout = "hv",
    logits_dtype=None,
    **loss_options,
) -> jax.Array | tuple[jax.Array, jax.Array]:
    """Materialises the logits, then :func:`liger_jax.cross_entropy_reference`: the specification (and test
    oracle) of :func:`fused_linear_cross_entropy`, which computes the same without the ``N × V`` logits.

    The logits are ``x @ weight (+ bias)`` in ``result_type(x, weight)``; with ``logits_dtype`` the matmul and the
    bias sum are rounded to it as the chunked path rounds them, with gradients passing straight through the
    rounding (tests give float64 inputs and the dtype under test). ``loss_options`` are
    :func:`liger_jax.cross_entropy`'s keywords; shapes as :func:`fused_linear_cross_entropy`.
    """
    return cross_entropy_reference(
        _logits_reference(x, weight, bias, weight_layout, logits_dtype), labels, **loss_options
    )


def _logits_reference(x, weight, bias, weight_layout, logits_dtype):
    """``[..., V]`` logits in ``result_type(x, weight)``, rounded to ``logits_dtype`` where the chunks round."""
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


def chunk_logits_bound(n_rows: int, hidden: int, n_classes: int, x_dtype, accum_dtype=jnp.float32) -> int:
    """Bytes one chunk's logits (and, separately, their gradient) may take by default for ``x`` ``[n_rows, hidden]``
    and a weight with ``n_classes`` classes: ``max(bytes of x, bytes of the H × V dweight accumulator,
    MIN_CHUNK_LOGITS_BYTES)``. Under sharding, of each device's block of x and slice of the vocabulary."""
    x_bytes = n_rows * hidden * jnp.dtype(x_dtype).itemsize
    accumulator_bytes = hidden * n_classes * jnp.dtype(accum_dtype).itemsize
    return max(x_bytes, accumulator_bytes, MIN_CHUNK_LOGITS_BYTES)


def default_chunk_rows(n_rows: int, hidden: int, n_classes: int, x_dtype, logits_dtype, accum_dtype=jnp.float32) -> int:
    """Rows per chunk when ``chunk_size`` is None: as many as keep the chunk's ``logits_dtype`` logits within
    :func:`chunk_logits_bound`, at most MAX_CHUNK_ROWS and ``n_rows``, whole CHUNK_ROW_MULTIPLEs from there up."""
    bound = chunk_logits_bound(n_rows, hidden, n_classes, x_dtype, accum_dtype)
    rows = min(MAX_CHUNK_ROWS, bound // (n_classes * jnp.dtype(logits_dtype).itemsize))
    if rows >= CHUNK_ROW_MULTIPLE:
        rows -= rows % CHUNK_ROW_MULTIPLE
    return max(1, min(rows, n_rows))


def _rounded(value: jax.Array, dtype) -> jax.Array:
    """``value`` rounded to ``dtype`` and back; the gradient passes straight through the rounding."""
    return value + jax.lax.stop_gradient(value.astype(dtype).astype(value.dtype) - value)


def _check_operands(x, weight, bias, weight_layout, implementation) -> int:
    """Checks x, weight and bias; returns the number of classes V."""
    _checks.check_floating("x", x, implementation)
    _checks.check_floating("weight", weight, implementation)
    _checks.check_min_rank("x", x, 1)
    _checks.check_choice("weight_layout", weight_layout, WEIGHT_LAYOUTS)
    if weight.ndim != 2:
        raise ValueError(f"weight must have 2 axes ([H, V] or [V, H]), got shape {weight.shape}")
    hidden = x.shape[-1]
    n_classes = weight.shape[1] if weight_layout == "hv" else weight.shape[0]
    expected = (hidden, n_classes) if weight_layout == "hv" else (n_classes, hidden)
    _checks.check_shape("weight", weight, expected, f"weight_layout={weight_layout!r} with H={hidden} from x")
    if bias is not None:
        _checks.check_floating("bias", bias, implementation)
        _checks.check_shape("bias", bias, (n_classes,), "the vocabulary axis of weight")
    return n_classes


@dataclasses.dataclass(frozen=True)
class _ChunkPlan:
    """Static description of one fused call: loss settings, layout, chunking and the dtypes involved."""

    settings: LossSettings
    weight_layout: str
    chunk_rows: int | None  # None: default_chunk_rows of each device's block
    logits_dtype: np.dtype
    accum_dtype: np.dtype
    x_dtype: np.dtype
    weight_dtype: np.dtype
    bias_dtype: np.dtype | None


class _ChunkResults(NamedTuple):
    """What the chunk loop produces: per-row losses, and with gradients dx, the dweight and dbias accumulators."""

    loss: jax.Array
    z_loss: jax.Array
    dx: jax.Array | None = None
    dweight: jax.Array | None = None
    dbias: jax.Array | None = None


def _run_chunks(x, weight, bias, labels, grad_scale, plan: _ChunkPlan) -> _ChunkResults:
    """:func:`_run_local_chunks` on each device's rows and vocabulary slice, for any sharding (ops.vocab_parallel)."""
    sharded = vocab_parallel.sharded_chunks(_run_local_chunks, plan, bias is not None, grad_scale is not None)
    return sharded(*(a for a in (x, weight, bias, labels, grad_scale) if a is not None))


def _run_local_chunks(x, weight, bias, labels, grad_scale, plan: _ChunkPlan, vocab_axes=()) -> _ChunkResults:
    """Walks the rows of ``x`` [N, H] chunk by chunk; with ``grad_scale`` [N] also the gradients of
    ``Σ_rows grad_scale · loss`` (dx in x.dtype, dweight and dbias in the accumulator dtype). With ``vocab_axes``
    the weight and bias are this device's slice of a vocabulary sharded on those mesh axes."""
    losses, losses_and_grads = row_losses(plan.settings), row_losses_and_grads(plan.settings)
    if vocab_axes:
        losses = vocab_parallel.row_losses(plan.settings, vocab_axes)
        losses_and_grads = vocab_parallel.row_losses_and_grads(plan.settings, vocab_axes)
    n_rows = x.shape[0]
    loss_dtype = jnp.promote_types(plan.logits_dtype, jnp.float32)
    results = _ChunkResults(loss=jnp.zeros(n_rows, loss_dtype), z_loss=jnp.zeros(n_rows, loss_dtype))
    if grad_scale is not None:
        grad_scale = grad_scale.astype(loss_dtype)
        results = results._replace(
            dx=jnp.zeros_like(x),
            dweight=jnp.zeros(weight.shape, plan.accum_dtype),
            dbias=None if bias is None else jnp.zeros(bias.shape, plan.accum_dtype),
        )
    # Inside shard_map (check_vma) the loop carries vary over every manual axis an operand varies over.
    varying = _manual_axes.union_of([a for a in (x, weight, bias, labels, grad_scale) if a is not None])
    results = jax.tree.map(lambda buffer: _manual_axes.cast_to_varying(buffer, varying), results)
    weight = weight.astype(plan.logits_dtype)
    bias = None if bias is None else bias.astype(plan.logits_dtype)

    def step(start, size, results: _ChunkResults) -> _ChunkResults:
        def rows_of(array):
            return jax.lax.dynamic_slice_in_dim(array, start, size)

        def write_rows(buffer, update):
            return jax.lax.dynamic_update_slice_in_dim(buffer, update.astype(buffer.dtype), start, 0)

        x_chunk = rows_of(x).astype(plan.logits_dtype)
        logits = _logits(x_chunk, weight, bias, plan.weight_layout)
        if grad_scale is None:
            loss, z_loss = losses(logits, rows_of(labels))
        else:
            dlogits, loss, z_loss = losses_and_grads(logits, rows_of(labels), rows_of(grad_scale))
            dx, dweight, dbias = _chunk_grads(x_chunk, weight, dlogits, plan)
            results = results._replace(
                dx=write_rows(results.dx, dx),
                dweight=results.dweight + dweight,
                dbias=None if bias is None else results.dbias + dbias,
            )
        return results._replace(loss=write_rows(results.loss, loss), z_loss=write_rows(results.z_loss, z_loss))

    # Each device sizes its chunks from its own block; its rows may be fewer than an explicit chunk_size.
    n_classes = weight.shape[1 if plan.weight_layout == "hv" else 0]
    chunk_rows = min(
        plan.chunk_rows
        or default_chunk_rows(n_rows, x.shape[1], n_classes, x.dtype, plan.logits_dtype, plan.accum_dtype),
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


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _fused_linear_cross_entropy(x, weight, bias, labels, plan):
    """``(x [..., H], weight, bias, labels [...]) -> (loss, z_loss)`` reduced; without differentiation only losses."""
    results = _run_chunks(x, weight, bias, labels, None, plan)
    return _reduced(results, labels, plan.settings)


def _fused_linear_cross_entropy_fwd(x, weight, bias, labels, plan):
    if plan.settings.reduction == "none":
        # Per-row cotangents: the backward pass recomputes the chunks (see fused_linear_cross_entropy).
        results = _run_chunks(x, weight, bias, labels, None, plan)
        return _reduced(results, labels, plan.settings), (x, weight, bias, labels)
    results = _run_chunks(x, weight, bias, labels, reduction_grad_scale(labels, plan.settings), plan)
    return _reduced(results, labels, plan.settings), (results.dx, results.dweight, results.dbias, labels)


def _fused_linear_cross_entropy_bwd(plan, residuals, cotangents):
    loss_cotangent, _ = cotangents  # z_loss leaves through stop_gradient: its cotangent is zero
    if plan.settings.reduction == "none":
        x, weight, bias, labels = residuals
        results = _run_chunks(x, weight, bias, labels, loss_cotangent, plan)
        dx, dweight, dbias = results.dx, results.dweight, results.dbias
    else:
        dx, dweight, dbias, labels = residuals
        dx = (dx * loss_cotangent).astype(plan.x_dtype)
        dweight = dweight * loss_cotangent
        dbias = None if dbias is None else dbias * loss_cotangent
    dweight = dweight.astype(plan.weight_dtype)
    dbias = None if dbias is None else dbias.astype(plan.bias_dtype)
    return dx, dweight, dbias, np.zeros(labels.shape, jax.dtypes.float0)


_fused_linear_cross_entropy.defvjp(_fused_linear_cross_entropy_fwd, _fused_linear_cross_entropy_bwd)


def _reduced(results: _ChunkResults, labels, settings: LossSettings):
    return reduce_rows(results.loss, labels, settings), reduce_rows(results.z_loss, labels, settings)
