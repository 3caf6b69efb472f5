"""Per-row cross-entropy shared by ``cross_entropy`` and ``fused_linear_cross_entropy``.

Every function here maps logits ``[..., V]`` and integer labels ``[...]`` to per-row fp32 losses (and, on request,
the gradient of ``Σ_rows grad_scale · loss`` with respect to the logits). The reduction over rows ("mean", "sum")
happens outside, in XLA: the number of non-ignored rows is a traced value and cannot be a kernel constant.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp

from liger_jax import runtime
from liger_jax.ops import _tiling
from liger_jax.ops._batching import vmap_over_rows
from liger_jax.ops._partitioning import partitioned

# Vocabulary block on GPUs: 8192 classes per step with 8 warps (32 values per thread). Measured on the H200 at
# (8192, 128256) bf16, the loss pass reads the logits at 102% of the copy bandwidth with it, against 71% with
# Liger's 32768 × 32 warps (fewer, fatter programs whose block-wide reductions stall the loads).
MAX_BLOCK_V = 8192
# The interpreter (CPU tests) runs a block as numpy vectors: small blocks make test vocabularies of a few hundred
# classes span several blocks, so the online softmax and the partial last block are exercised everywhere.
INTERPRETER_MAX_BLOCK_V = 256


@dataclasses.dataclass(frozen=True)
class LossSettings:
    """The static (hashable) settings of a cross-entropy call; see :func:`liger_jax.cross_entropy`."""

    ignore_index: int
    label_smoothing: float
    z_loss_scale: float
    softcap: float | None
    reduction: str
    implementation: str
    weighted: bool = False  # a class-weight operand [V] (Liger's ce_weight) follows the labels
    token_scaling: bool = False  # each row's loss and gradient times its detached p_label (Liger's use_token_scaling)
    return_argmax: bool = False  # the row functions also return each row's argmax (-1 for ignored rows)


@dataclasses.dataclass(frozen=True)
class VocabTiling:
    """How [rows, V] is cut: BLOCK_ROWS rows per program, each row in NUM_V_BLOCKS blocks of BLOCK_V classes."""

    block_rows: int
    block_v: int
    num_v_blocks: int
    num_warps: int


def vocab_tiling(n_cols: int, implementation: str) -> VocabTiling:
    """Tile shape, block count and warps for rows of ``n_cols`` classes."""
    limit = INTERPRETER_MAX_BLOCK_V if implementation == "interpret" else MAX_BLOCK_V
    block_v = min(limit, _tiling.next_power_of_2(n_cols))
    # Short rows share a program so each still moves a few thousand elements (one row per program from 4096 up).
    block_rows = _tiling.rows_per_tile(block_v)
    # 32 values per thread; at least 4 warps so small tiles still fill a scheduler.
    num_warps = max(4, min(32, block_rows * block_v // 1024))
    return VocabTiling(block_rows, block_v, _tiling.cdiv(n_cols, block_v), num_warps)


def reference_row_losses(
    logits: jax.Array, labels: jax.Array, settings: LossSettings, class_weight: jax.Array | None = None
) -> tuple[jax.Array, ...]:
    """Per-row ``(loss, z_loss)`` in plain jax.numpy, computed in ``promote(logits.dtype, float32)``, and with
    ``settings.return_argmax`` each row's int32 argmax of the (softcapped) logits, first on ties, -1 when ignored.

    Ignored rows give 0 and 0; a label outside ``[0, V)`` (other than ``ignore_index``) gives a NaN loss and z_loss
    whose gradient is zero, as the kernels do. ``logits`` ``[..., V]``, ``labels`` ``[...]``, ``class_weight`` ``[V]``
    when ``settings.weighted``; the results ``[...]``.
    """
    compute = jnp.promote_types(logits.dtype, jnp.float32)
    capped = logits.astype(compute)
    if settings.softcap is not None:
        capped = settings.softcap * jnp.tanh(capped / settings.softcap)
    n_cols = logits.shape[-1]
    lse = jax.nn.logsumexp(capped, axis=-1)
    in_range = (labels >= 0) & (labels < n_cols)
    safe_labels = jnp.where(in_range, labels, 0)
    target = jnp.take_along_axis(capped, safe_labels[..., None], axis=-1)[..., 0]
    label_weight = smoothing_sum = None
    if settings.weighted:
        weight = class_weight.astype(compute)
        label_weight = weight[safe_labels]
        if settings.label_smoothing:
            smoothing_sum = jnp.sum(jnp.broadcast_to(weight, capped.shape) * (lse[..., None] - capped), axis=-1)
    elif settings.label_smoothing:
        smoothing_sum = jnp.sum(capped, axis=-1)
    results, _ = losses_from_statistics(lse, target, labels, n_cols, settings, smoothing_sum, label_weight)
    if settings.return_argmax:
        ignored = labels == settings.ignore_index
        results += (jnp.where(ignored, -1, jnp.argmax(capped, axis=-1)).astype(jnp.int32),)
    return results


def losses_from_statistics(
    lse: jax.Array,
    target: jax.Array,
    labels: jax.Array,
    n_classes: int,
    settings: LossSettings,
    smoothing_sum: jax.Array | None = None,
    label_weight: jax.Array | None = None,
) -> tuple[tuple[jax.Array, jax.Array], jax.Array | None]:
    """The cross-entropy's row math from whole rows' statistics, shared by the XLA reference and the
    vocabulary-parallel loss (which all-reduces the statistics first).

    Args:
        lse: each row's logsumexp of the softcapped logits c, fp32 (or wider) ``[...]``.
        target: each row's c at its label (any value where the label is out of range) ``[...]``.
        labels: ``[...]`` integers.
        n_classes: V.
        settings: the loss's options.
        smoothing_sum: with label smoothing, each row's Σ_j c_j, or with class weights Σ_j w_j (lse - c_j); unused
            without smoothing.
        label_weight: with class weights, each row's w_label.

    Returns:
        ``((loss, z_loss), token_scale)``: per row, 0 for ignored rows and NaN for a label outside ``[0, V)``; the
        detached p_label that scaled both with ``settings.token_scaling``, else None.
    """
    smoothing = settings.label_smoothing
    z_loss = settings.z_loss_scale * lse * lse
    if settings.weighted:
        loss = (1.0 - smoothing) * label_weight * (lse - target) + z_loss
        if smoothing:
            loss = loss + smoothing / n_classes * smoothing_sum
    else:
        loss = lse - (1.0 - smoothing) * target + z_loss
        if smoothing:  # skipped without smoothing: 0 · Σc would be NaN for logits masked to -inf
            loss = loss - smoothing / n_classes * smoothing_sum
    token_scale = None
    if settings.token_scaling:
        token_scale = jax.lax.stop_gradient(jnp.exp(target - lse))
        loss, z_loss = loss * token_scale, z_loss * token_scale
    ignored = labels == settings.ignore_index
    in_range = (labels >= 0) & (labels < n_classes)
    losses = tuple(jnp.where(ignored, 0.0, jnp.where(in_range, value, jnp.nan)) for value in (loss, z_loss))
    return losses, token_scale


def count_targets(labels: jax.Array, ignore_index: int) -> jax.Array:
    """Number of rows whose label is not ``ignore_index``, as a float32 scalar."""
    return jnp.sum(labels != ignore_index, dtype=jnp.float32)


def target_weight_total(labels: jax.Array, class_weight: jax.Array, ignore_index: int) -> jax.Array:
    """``Σ class_weight[label]`` over the rows whose label is not ``ignore_index``, float32 (Liger's weighted-mean
    denominator); a label outside ``[0, V)`` counts as class 0."""
    kept = labels != ignore_index
    index = jnp.clip(jnp.where(kept, labels, 0), 0, class_weight.shape[0] - 1)
    return jnp.sum(jnp.where(kept, class_weight.astype(jnp.float32)[index], 0.0))


def reduce_rows(rows: jax.Array, labels: jax.Array, settings: LossSettings) -> jax.Array:
    """Applies ``settings.reduction`` to per-row values: "mean" divides by the non-ignored rows (0 of them → 0)."""
    match settings.reduction:
        case "none":
            return rows
        case "sum":
            return jnp.sum(rows)
        case "mean":
            return jnp.sum(rows) / jnp.maximum(count_targets(labels, settings.ignore_index), 1.0)
        case _:
            raise ValueError(f"reduction must be 'mean', 'sum' or 'none', got {settings.reduction!r}")


def reduce_losses(loss, z_loss, labels, settings: LossSettings, class_weight=None) -> tuple[jax.Array, jax.Array]:
    """Reduced ``(loss, z_loss)`` of per-row values (``loss`` contains ``z_loss``).

    Unweighted, both as :func:`reduce_rows`. With class weights, "mean" is Liger's: the cross-entropy part
    ``loss - z_loss`` divided by :func:`target_weight_total` (a total of 0 gives 0) and the z-loss by the number of
    non-ignored rows.
    """
    if not (settings.weighted and settings.reduction == "mean"):
        return reduce_rows(loss, labels, settings), reduce_rows(z_loss, labels, settings)
    z_reduced = reduce_rows(z_loss, labels, settings)
    return jnp.sum(loss - z_loss) * _weighted_mean_scale(labels, class_weight, settings) + z_reduced, z_reduced


def _weighted_mean_scale(labels, class_weight, settings: LossSettings) -> jax.Array:
    total = target_weight_total(labels, class_weight, settings.ignore_index)
    return jnp.where(total > 0.0, 1.0 / jnp.where(total > 0.0, total, 1.0), 0.0)


def reduction_grad_scale(labels: jax.Array, settings: LossSettings) -> jax.Array:
    """``[...]`` float32: d(reduced loss)/d(row loss) for "mean" and "sum" (rows of ``labels``)."""
    if settings.reduction == "mean":
        scale = 1.0 / jnp.maximum(count_targets(labels, settings.ignore_index), 1.0)
        return jnp.broadcast_to(scale, labels.shape)
    return jnp.ones(labels.shape, jnp.float32)


def reduction_grad_scales(labels, settings: LossSettings, class_weight=None) -> tuple[jax.Array, jax.Array]:
    """``([...], [...])`` float32: d(reduced loss)/d(row cross-entropy part) and d(reduced loss)/d(row z-loss), as
    :func:`reduce_losses` reduces them (equal unless a weighted "mean")."""
    scale = reduction_grad_scale(labels, settings)
    if settings.weighted and settings.reduction == "mean":
        return jnp.broadcast_to(_weighted_mean_scale(labels, class_weight, settings), labels.shape), scale
    return scale, scale


def row_losses(settings: LossSettings):
    """``(logits [..., V], labels [...][, class_weight [V]]) -> (loss [...], z_loss [...][, argmax [...]])``, fp32
    (argmax int32), for ``settings.implementation``; ``class_weight`` exactly when ``settings.weighted``, argmax
    when ``settings.return_argmax``."""
    if settings.implementation == "xla":
        return functools.partial(_reference_row_losses, settings=settings)
    with_lse = row_losses_and_lse(settings)

    def losses(*operands):
        loss, z_loss, _, *argmax = with_lse(*operands)
        return (loss, z_loss, *argmax)

    return losses


def _reference_row_losses(logits, labels, class_weight=None, *, settings):
    return reference_row_losses(logits, labels, settings, class_weight)


def row_losses_and_grads(settings: LossSettings):
    """``(logits [..., V], labels [...], grad_scale [...] fp32[, class_weight [V], z_grad_scale [...]]) -> (dlogits,
    loss, z_loss[, argmax])``; the bracketed operands exactly when ``settings.weighted``.

    ``dlogits`` (logits.dtype) is the gradient of ``Σ_rows grad_scale · (loss - z_loss) + z_grad_scale · z_loss``
    (``grad_scale · loss`` unweighted) with respect to the logits; the losses are fp32. Under a kernel
    implementation ``dlogits`` takes over the logits buffer when it is dead.
    """
    if settings.implementation == "xla":
        return functools.partial(_reference_losses_and_grads, settings=settings)
    return _kernel_row_losses_and_grads(settings)


def _reference_losses_and_grads(logits, labels, grad_scale, class_weight=None, z_grad_scale=None, *, settings):
    def losses(logits):
        loss, z_loss, *argmax = reference_row_losses(logits, labels, settings, class_weight)
        return (loss, z_loss), argmax

    (loss, z_loss), pullback, argmax = jax.vjp(losses, logits, has_aux=True)
    scale = grad_scale.astype(loss.dtype)
    z_scale = jnp.zeros_like(z_loss) if z_grad_scale is None else z_grad_scale.astype(loss.dtype) - scale
    (dlogits,) = pullback((scale, z_scale))
    return (dlogits, loss, z_loss, *argmax)


def _constexprs(settings: LossSettings, tiling: VocabTiling, n_cols: int) -> dict:
    return {
        "n_cols": n_cols,
        "ignore_index": int(settings.ignore_index),
        "label_smoothing": float(settings.label_smoothing),
        "z_loss_scale": float(settings.z_loss_scale),
        "softcap": 0.0 if settings.softcap is None else float(settings.softcap),
        "HAS_WEIGHT": settings.weighted,
        "TOKEN_SCALING": settings.token_scaling,
        "RETURN_ARGMAX": settings.return_argmax,
        "BLOCK_ROWS": tiling.block_rows,
        "BLOCK_V": tiling.block_v,
        "NUM_V_BLOCKS": tiling.num_v_blocks,
    }


def _row_shapes(n_rows: int, count: int) -> tuple[jax.ShapeDtypeStruct, ...]:
    return (jax.ShapeDtypeStruct((n_rows,), jnp.float32),) * count


def _argmax_shape(n_rows: int, settings: LossSettings) -> jax.ShapeDtypeStruct:
    """The argmax output: one int32 per row, or a 1-element placeholder the kernel never writes."""
    return jax.ShapeDtypeStruct((n_rows if settings.return_argmax else 1,), jnp.int32)


def _class_weight_operand(class_weight, settings: LossSettings) -> jax.Array:
    """The class weights as fp32, or a 1-element placeholder the kernels never read."""
    return class_weight.astype(jnp.float32) if settings.weighted else jnp.zeros((1,), jnp.float32)


def _launch_over_rows(kernel, settings: LossSettings, logits, operands, out_shape, **options):
    """``kernel`` over ``logits`` ``[..., V]`` seen as rows and ``operands`` (``[...]`` per-row arrays, flattened
    alike, or 1-D vectors); results of ``out_shape`` (per flattened row, or ``[rows, V]``) come back flat."""
    n_cols = logits.shape[-1]
    rows = logits.reshape(-1, n_cols)
    tiling = vocab_tiling(n_cols, settings.implementation)
    return runtime.launch(
        kernel,
        rows,
        *(operand.reshape(-1) for operand in operands),
        rows.shape[0],
        out_shape=out_shape,
        grid=(_tiling.cdiv(rows.shape[0], tiling.block_rows),),
        implementation=settings.implementation,
        num_warps=tiling.num_warps,
        **options,
        **_constexprs(settings, tiling, n_cols),
    )


def _rule(settings: LossSettings, row_operands: int, results: str) -> str:
    """The sharding rule of a row launcher: logits, labels, [class weight], ``row_operands`` more rows."""
    operands = ["... v", "...", *(["v"] if settings.weighted else []), *["..."] * row_operands]
    return f"{', '.join(operands)} -> {results}"


def _row_argnums(settings: LossSettings, row_operands: int) -> tuple[int, ...]:
    first = 3 if settings.weighted else 2
    return (0, 1, *range(first, first + row_operands))


def _split_weighted(operands, settings: LossSettings):
    """``(labels, class_weight operand, other operands)`` of a row launcher's operands after the logits."""
    labels, *rest = operands
    class_weight = rest.pop(0) if settings.weighted else None
    return labels, _class_weight_operand(class_weight, settings), rest


def _vocab_parallel():
    """``ops.vocab_parallel``, imported when a launch finds its vocabulary sharded (it imports this module)."""
    from liger_jax.ops import vocab_parallel

    return vocab_parallel


def _argmax_result(settings: LossSettings, argmax, labels) -> tuple[jax.Array, ...]:
    return (argmax.reshape(labels.shape),) if settings.return_argmax else ()


@functools.cache
def row_losses_and_lse(settings: LossSettings):
    """Kernel ``(logits [..., V], labels [...][, class_weight [V]]) -> (loss, z_loss, lse[, argmax])``, each
    ``[...]`` fp32 (argmax int32): one read of the logits; ``lse`` (after softcap) is what :func:`row_grads`
    needs."""
    from liger_jax.kernels import cross_entropy as kernels

    def losses(logits, *operands, axis_names):
        if "v" in axis_names:
            return _vocab_parallel().row_losses_and_lse(settings, axis_names["v"])(logits, *operands)
        labels, class_weight, _ = _split_weighted(operands, settings)
        n_rows = labels.size
        out_shape = (*_row_shapes(n_rows, 3), _argmax_shape(n_rows, settings))
        *results, argmax = _launch_over_rows(
            kernels.cross_entropy_loss, settings, logits, (labels, class_weight), out_shape
        )
        return (*(result.reshape(labels.shape) for result in results), *_argmax_result(settings, argmax, labels))

    results = ", ".join(["..."] * (4 if settings.return_argmax else 3))
    # Rows shard; a sharded vocabulary is combined across its shards in XLA (ops.vocab_parallel).
    sharded = partitioned(losses, _rule(settings, 0, results), collective=("v",))
    return vmap_over_rows(sharded, row_argnums=_row_argnums(settings, 0), reduces_rows=False)


@functools.cache
def row_grads(settings: LossSettings):
    """Kernel ``(logits [..., V], labels [...], [class_weight [V]], lse [...], grad_scale [...][, z_grad_scale
    [...]]) -> dlogits [..., V]``; the bracketed operands exactly when ``settings.weighted``.

    ``dlogits`` (logits.dtype) is the gradient of :func:`row_losses_and_grads`, from the ``lse`` of
    :func:`row_losses_and_lse`: one read of the logits and one write, over the logits buffer when it is dead.
    """
    from liger_jax.kernels import cross_entropy as kernels

    def grads(logits, *operands, axis_names):
        if "v" in axis_names:  # recomputes the rows' statistics: small all-reduces, no gathered logits
            labels, *class_weight = operands[: 2 if settings.weighted else 1]
            _, grad_scale, *z_grad_scale = operands[len(class_weight) + 1 :]
            vocab_rows = _vocab_parallel().row_losses_and_grads(settings, axis_names["v"])
            return vocab_rows(logits, labels, grad_scale, *class_weight, *z_grad_scale)[0]
        labels, class_weight, (lse, grad_scale, *z_grad_scale) = _split_weighted(operands, settings)
        grad_scale = grad_scale.astype(jnp.float32)
        z_grad_scale = z_grad_scale[0].astype(jnp.float32) if z_grad_scale else grad_scale
        (dlogits,) = _launch_over_rows(
            kernels.cross_entropy_grad,
            settings,
            logits,
            (labels, class_weight, lse, grad_scale, z_grad_scale),
            (jax.ShapeDtypeStruct((labels.size, logits.shape[-1]), logits.dtype),),
            input_output_aliases={0: 0},  # the gradient overwrites the logits when they are dead
        )
        return dlogits.reshape(logits.shape)

    n_rows = 3 if settings.weighted else 2
    sharded = partitioned(grads, _rule(settings, n_rows, "... v"), collective=("v",))
    return vmap_over_rows(sharded, row_argnums=_row_argnums(settings, n_rows), reduces_rows=False)


@functools.cache
def _kernel_row_losses_and_grads(settings: LossSettings):
    from liger_jax.kernels import cross_entropy as kernels

    def losses_and_grads(logits, labels, grad_scale, *weighted):
        operands = (labels, *weighted[:1])
        labels, class_weight, _ = _split_weighted(operands, settings)
        grad_scale = grad_scale.astype(jnp.float32)
        z_grad_scale = weighted[1].astype(jnp.float32) if weighted else grad_scale
        n_rows = labels.size
        out_shape = (
            jax.ShapeDtypeStruct((n_rows, logits.shape[-1]), logits.dtype),
            *_row_shapes(n_rows, 3),
            _argmax_shape(n_rows, settings),
        )
        dlogits, loss, z_loss, _, argmax = _launch_over_rows(
            kernels.cross_entropy_loss_and_grad,
            settings,
            logits,
            (labels, class_weight, grad_scale, z_grad_scale),
            out_shape,
            input_output_aliases={0: 0},  # the gradient overwrites the logits when they are dead
        )
        return (
            dlogits.reshape(logits.shape),
            loss.reshape(labels.shape),
            z_loss.reshape(labels.shape),
            *_argmax_result(settings, argmax, labels),
        )

    operands = ["... v", "...", "...", *(["v", "..."] if settings.weighted else [])]
    results = ", ".join(["... v", "...", "...", *(["..."] if settings.return_argmax else [])])
    sharded = partitioned(losses_and_grads, f"{', '.join(operands)} -> {results}", replicated=("v",))
    row_argnums = (0, 1, 2, 4) if settings.weighted else (0, 1, 2)
    return vmap_over_rows(sharded, row_argnums=row_argnums, reduces_rows=False)
