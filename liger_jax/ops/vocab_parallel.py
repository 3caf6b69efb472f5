"""Fused linear cross-entropy across devices: rows over data axes, the vocabulary over tensor-parallel axes.

:func:`sharded_chunks` partitions the fused-linear chunk loop (``ops._linear_chunks``) with ``ops._partitioning``:
each device walks the chunks of its own rows. ``dweight`` and ``dbias`` are partial sums over those rows, summed
across the row-sharding axes; ``dx`` and the losses stay row-sharded. When the weight is sharded on its vocabulary
axis (Megatron's tensor-parallel LM head), neither the weight nor the logits are gathered: each device computes its
``[chunk, V / tp]`` slice of the logits and :func:`row_losses_and_grads` combines the rows' softmax across the axes,
as Megatron's vocab-parallel cross-entropy does — the row max by ``pmax``, ``Σ exp``, the target logit (held by one
shard) and ``Σ logits`` (label smoothing) by ``psum``. ``dx`` is then a sum over the vocabulary shards, added up
once after the loop; ``dweight`` and ``dbias`` are the device's own vocabulary slice. "mean" divides by the number
of non-ignored rows of the whole batch: FLCE computes that count (and the per-row gradient scale) outside the
partitioned loop.

Plain :func:`liger_jax.cross_entropy` uses the same row math when its logits are sharded on the vocabulary axis
(``_cross_entropy_rows`` launches it per shard in place of the kernel): the logits stay sharded, only per-row
statistics are all-reduced. Every loss option (class weights, token scaling, the argmax) is combined the same way.

The vocab-parallel loss is computed by XLA in fp32 (the Triton cross-entropy kernel needs whole rows); it matches
:func:`liger_jax.cross_entropy`'s numerics and its gradient, with the same conventions: ignored rows give 0, a
label outside ``[0, V)`` a NaN loss (and z_loss) with zero gradient.
"""

import functools
import math
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp

from liger_jax.ops._batching import vmap_over_rows
from liger_jax.ops._cross_entropy_rows import LossSettings, losses_from_statistics
from liger_jax.ops._partitioning import partitioned


def sharded_chunks(
    run_chunks: Callable,
    plan,
    row_math,
    has_bias: bool,
    n_row_operands: int,
    n_values: int,
    grads: bool,
    teacher_bias: bool | None = None,
    n_vocab_operands: int = 0,
    whole_groups: bool = False,
) -> Callable:
    """A fused-linear chunk loop (``ops._linear_chunks``), partitioned over rows and (collectively) over the
    vocabulary, and vmap-able.

    Args:
        run_chunks: ``run_chunks(x [N, H], weight, bias, row_operands, plan, row_math, n_values, grads,
            vocab_axes)`` returning ``ChunkResults(values, dx, dweight, dbias)`` (None where absent); with
            ``vocab_axes`` the weight (and bias) it gets are that device's vocabulary slice; with a teacher it also
            gets ``teacher=(teacher_x [N, G], teacher_weight, teacher_bias)``, sliced alike.
        plan: the static chunk plan (hashable; ``plan.weight_layout`` is ``"hv"`` or ``"vh"``).
        row_math: the hashable per-row math, passed through to ``run_chunks``.
        has_bias: whether a bias is passed.
        n_row_operands: how many per-row operands ``[...]`` follow x, weight and bias.
        n_values: how many per-row values come back.
        grads: whether the gradients come back too.
        teacher_bias: None without a teacher head; else whether the teacher head has a bias.
        n_vocab_operands: how many ``[V]`` operands (sharded with the vocabulary) follow the per-row operands;
            ``run_chunks`` gets this device's slices as its last argument.
        whole_groups: the last row axis (of x, the teacher's x, the row operands and the values) holds groups of
            rows the row math needs together (whole sequences): it is never sharded.

    Returns:
        ``fn(x [..., H], weight, [bias], [teacher_x [..., G], teacher_weight, [teacher_bias]], *row_operands [...])``
        with run_chunks' results (values ``[...]``, dx ``[..., H]``), for any sharding of its operands; ``jax.vmap``
        folds a batch into the rows, or maps over examples when the gradients are wanted (dweight sums over each
        example's rows).
    """
    return _sharded_chunks(
        run_chunks, plan, row_math, has_bias, n_row_operands, n_values, grads, teacher_bias, n_vocab_operands,
        whole_groups,
    )  # fmt: skip


@functools.cache
def _sharded_chunks(
    run_chunks, plan, row_math, has_bias, n_row_operands, n_values, grads, teacher_bias, n_vocab, whole_groups=False
):
    rows = "... r" if whole_groups else "..."
    weight = "h v" if plan.weight_layout == "hv" else "v h"
    head = [f"{rows} h", weight, *(["v"] if has_bias else [])]
    teacher = [] if teacher_bias is None else [f"{rows} g", weight.replace("h", "g"), *(["v"] if teacher_bias else [])]
    operands = [*head, *teacher, *[rows] * n_row_operands, *["v"] * n_vocab]
    results = [rows] * n_values + (head if grads else [])
    rule = f"{', '.join(operands)} -> {', '.join(results)}"

    def local(*arrays, axis_names):
        x, weight, *rest = arrays
        bias = rest.pop(0) if has_bias else None
        teacher_head = None
        if teacher_bias is not None:
            teacher_x, teacher_weight = rest.pop(0), rest.pop(0)
            teacher_head = (
                teacher_x.reshape(-1, teacher_x.shape[-1]),
                teacher_weight,
                rest.pop(0) if teacher_bias else None,
            )
        row_shape = x.shape[:-1]
        rows = x.reshape(-1, x.shape[-1])
        vocab_operands = tuple(rest[len(rest) - n_vocab :])
        row_operands = tuple(operand.reshape(-1) for operand in rest[: len(rest) - n_vocab])
        vocab_axes = axis_names.get("v", ())
        extra = (vocab_operands,) if n_vocab else ()
        chunk_results = run_chunks(
            rows, weight, bias, row_operands, plan, row_math, n_values, grads, vocab_axes, teacher_head, *extra
        )
        return chunk_results._replace(
            values=tuple(value.reshape(row_shape) for value in chunk_results.values),
            dx=None if chunk_results.dx is None else chunk_results.dx.reshape(x.shape),
        )

    # dweight and dbias (the results after the values and dx) sum over the rows.
    partial_sums = (n_values + 1, n_values + 2) if grads else ()
    sharded = partitioned(local, rule, replicated=("h", "g", "r"), collective=("v",), partial_sums=partial_sums)
    row_argnums = (0, *([len(head)] if teacher else []), *range(len(head) + len(teacher), len(operands)))
    return vmap_over_rows(sharded, row_argnums=row_argnums, reduces_rows=grads)


def row_losses_and_grads(settings: LossSettings, axes: Sequence[str]) -> Callable:
    """``(logits [..., V/n], labels [...], grad_scale [...][, class_weight [V/n], z_grad_scale [...]]) -> (dlogits,
    loss, z_loss[, argmax])`` with V sharded on ``axes``.

    The interface of ``_cross_entropy_rows.row_losses_and_grads`` for this device's slice of the vocabulary
    (slice ``axis_index(axes)`` of ``n``, in order; the class weights sliced alike); the losses (and argmax) are the
    whole rows' and agree on every shard.
    """
    return functools.partial(_losses_and_grads, settings=settings, axes=tuple(axes))


def row_losses(settings: LossSettings, axes: Sequence[str]) -> Callable:
    """``(logits [..., V/n], labels [...][, class_weight [V/n]]) -> (loss, z_loss[, argmax])``:
    :func:`row_losses_and_grads` without gradients."""
    return functools.partial(_losses, settings=settings, axes=tuple(axes))


def row_losses_and_lse(settings: LossSettings, axes: Sequence[str]) -> Callable:
    """``(logits [..., V/n], labels [...][, class_weight [V/n]]) -> (loss, z_loss, lse[, argmax])``: the interface
    of ``_cross_entropy_rows.row_losses_and_lse`` for this device's slice of the vocabulary."""
    return functools.partial(_losses_and_lse, settings=settings, axes=tuple(axes))


def _losses_and_lse(logits, labels, class_weight=None, *, settings: LossSettings, axes):
    statistics = _row_statistics(logits, labels, settings, axes)
    loss, z_loss, *argmax = _finished_losses(*statistics, labels, class_weight, settings, axes)[0]
    return (loss, z_loss, statistics[1], *argmax)


def _row_statistics(logits, labels, settings: LossSettings, axes):
    """The softcapped fp32 logits and the whole rows' ``lse``, target logit and class count."""
    capped = logits.astype(jnp.promote_types(logits.dtype, jnp.float32))
    if settings.softcap is not None:
        capped = settings.softcap * jnp.tanh(capped / settings.softcap)
    local_classes = logits.shape[-1]
    n_classes = local_classes * math.prod(jax.lax.axis_size(axis) for axis in axes)
    # The shift only keeps exp in range; lse does not depend on it, so no gradient flows through the max.
    row_max = jax.lax.pmax(jax.lax.stop_gradient(jnp.max(capped, axis=-1)), axes)
    lse = row_max + jnp.log(jax.lax.psum(jnp.sum(jnp.exp(capped - row_max[..., None]), axis=-1), axes))
    local_label = labels - jax.lax.axis_index(axes) * local_classes
    held_here = (local_label >= 0) & (local_label < local_classes)
    target = jax.lax.psum(jnp.where(held_here, _pick(capped, local_label, held_here), 0.0), axes)
    return capped, lse, target, held_here, local_label, n_classes


def _pick(values, local_label, held_here):
    """``values[..., local_label]`` where this shard holds the label (index 0 elsewhere)."""
    return jnp.take_along_axis(values, jnp.where(held_here, local_label, 0)[..., None], axis=-1)[..., 0]


def _class_weight_statistics(capped, lse, class_weight, held_here, local_label, axes):
    """``(w_label, W = Σ_j w_j, Σ_j w_j (lse - c_j))`` of whole rows from this shard's slice of the weights."""
    weight = jnp.broadcast_to(class_weight.astype(capped.dtype), capped.shape)
    label_weight = jax.lax.psum(jnp.where(held_here, _pick(weight, local_label, held_here), 0.0), axes)
    weight_total = jax.lax.psum(jnp.sum(class_weight.astype(capped.dtype)), axes)
    smoothed = jax.lax.psum(jnp.sum(weight * (lse[..., None] - capped), axis=-1), axes)
    return label_weight, weight_total, smoothed


def _argmax(capped, labels, settings: LossSettings, axes):
    """Each whole row's first argmax (int32), -1 for ignored rows: the smallest global index holding the max."""
    local_max = jnp.max(capped, axis=-1)
    offset = jax.lax.axis_index(axes) * capped.shape[-1]
    candidate = jnp.where(
        local_max == jax.lax.pmax(local_max, axes), jnp.argmax(capped, axis=-1) + offset, jnp.iinfo(jnp.int32).max
    )
    argmax = jax.lax.pmin(candidate.astype(jnp.int32), axes)
    return jnp.where(labels == settings.ignore_index, -1, argmax)


def _losses(logits, labels, class_weight=None, *, settings: LossSettings, axes):
    statistics = _row_statistics(logits, labels, settings, axes)
    return _finished_losses(*statistics, labels, class_weight, settings, axes)[0]


def _finished_losses(
    capped, lse, target, held_here, local_label, n_classes, labels, class_weight, settings: LossSettings, axes
):
    """``((loss, z_loss[, argmax]), token scale or None, class-weight statistics or None)``."""
    weights = label_weight = smoothing_sum = None
    if settings.weighted:
        weights = _class_weight_statistics(capped, lse, class_weight, held_here, local_label, axes)
        label_weight, _, smoothing_sum = weights
    elif settings.label_smoothing:
        smoothing_sum = jax.lax.psum(jnp.sum(capped, axis=-1), axes)
    values, token_scale = losses_from_statistics(lse, target, labels, n_classes, settings, smoothing_sum, label_weight)
    if settings.return_argmax:
        values += (_argmax(capped, labels, settings, axes),)
    return values, token_scale, weights


def _losses_and_grads(
    logits, labels, grad_scale, class_weight=None, z_grad_scale=None, *, settings: LossSettings, axes
):
    statistics = _row_statistics(logits, labels, settings, axes)
    capped, lse, _, held_here, local_label, n_classes = statistics
    values, token_scale, weights = _finished_losses(*statistics, labels, class_weight, settings, axes)
    # d loss / d capped_j written out: differentiating through psum would count the shards' shared cotangent once
    # per shard.
    probabilities = jnp.exp(capped - lse[..., None])
    smoothing = settings.label_smoothing
    classes = jax.lax.broadcasted_iota(local_label.dtype, capped.shape, capped.ndim - 1)
    is_target = held_here[..., None] & (classes == local_label[..., None])
    in_range = (labels >= 0) & (labels < n_classes)
    dropped = (labels == settings.ignore_index) | ~in_range
    row_scale = jnp.where(dropped, 0.0, grad_scale.astype(capped.dtype))
    if token_scale is not None:
        row_scale = row_scale * token_scale
    if settings.weighted:
        # (1 - s) w_y (p_j - [j = label]) + s / V (W p_j - w_j), and the z-loss's 2 z lse p_j scaled apart.
        label_weight, weight_total, _ = weights
        dcapped = (1.0 - smoothing) * label_weight[..., None] * (probabilities - is_target)
        if smoothing:
            local_weight = jnp.broadcast_to(class_weight.astype(capped.dtype), capped.shape)
            dcapped = dcapped + smoothing / n_classes * (weight_total * probabilities - local_weight)
        z_scale = jnp.where(dropped, 0.0, z_grad_scale.astype(capped.dtype))
        if token_scale is not None:
            z_scale = z_scale * token_scale
        z_part = (2.0 * settings.z_loss_scale * lse * z_scale)[..., None] * probabilities
        dcapped = dcapped * row_scale[..., None] + z_part
        row_scale = jnp.ones_like(row_scale)
    else:
        # p_j (1 + 2 z lse) - (1 - s) [j = label] - s / V.
        dcapped = probabilities * (1.0 + 2.0 * settings.z_loss_scale * lse)[..., None] - smoothing / n_classes
        dcapped = dcapped - (1.0 - smoothing) * is_target
    if settings.softcap is not None:
        dcapped = dcapped * (1.0 - jnp.square(capped / settings.softcap))
    return ((dcapped * row_scale[..., None]).astype(logits.dtype), *values)
