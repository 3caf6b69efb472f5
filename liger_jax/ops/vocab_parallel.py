"""Fused linear cross-entropy across devices: rows over data axes, the vocabulary over tensor-parallel axes.

:func:`sharded_chunks` partitions FLCE's chunk loop (``ops._partitioning``): each device walks the chunks of its
own rows. ``dweight`` and ``dbias`` are partial sums over those rows, summed across the row-sharding axes;
``dx`` and the losses stay row-sharded. When the weight is sharded on its vocabulary axis (Megatron's
tensor-parallel LM head), neither the weight nor the logits are gathered: each device computes its
``[chunk, V / tp]`` slice of the logits and :func:`row_losses_and_grads` combines the rows' softmax across the
axes, as Megatron's vocab-parallel cross-entropy does — the row max by ``pmax``, ``Σ exp``, the target logit
(held by one shard) and ``Σ logits`` (label smoothing) by ``psum``. ``dx`` is then a sum over the vocabulary
shards, added up once after the loop; ``dweight`` and ``dbias`` are the device's own vocabulary slice. "mean"
divides by the number of non-ignored rows of the whole batch: FLCE computes that count (and the per-row
gradient scale) outside the partitioned loop.

The vocab-parallel loss is computed by XLA in fp32 (the Triton cross-entropy kernel needs whole rows); it matches
:func:`liger_jax.cross_entropy`'s numerics and its gradient, with the same conventions: ignored rows give 0, a
label outside ``[0, V)`` a NaN loss with zero gradient.
"""

import functools
import math
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp

from liger_jax.ops._batching import vmap_over_rows
from liger_jax.ops._cross_entropy_rows import LossSettings
from liger_jax.ops._partitioning import partitioned


def sharded_chunks(run_chunks: Callable, plan, has_bias: bool, has_grads: bool) -> Callable:
    """FLCE's chunk loop, partitioned over rows and (collectively) over the vocabulary, and vmap-able.

    Args:
        run_chunks: ``run_chunks(x [N, H], weight, bias, labels [N], grad_scale [N], plan, vocab_axes)`` returning
            FLCE's chunk results ``(loss, z_loss, dx, dweight, dbias)`` (a NamedTuple, None where absent); with
            ``vocab_axes`` the weight (and bias) it gets are that device's vocabulary slice.
        plan: FLCE's static chunk plan (hashable; ``plan.weight_layout`` is ``"hv"`` or ``"vh"``).
        has_bias: whether a bias is passed.
        has_grads: whether ``grad_scale`` is passed (and the gradients come back).

    Returns:
        ``fn(x [..., H], weight, [bias], labels [...], [grad_scale [...]])`` with run_chunks' results (losses
        ``[...]``, dx ``[..., H]``), for any sharding of its operands; ``jax.vmap`` folds a batch into the rows,
        or maps over examples when the gradients are wanted (dweight sums over each example's rows).
    """
    return _sharded_chunks(run_chunks, plan, has_bias, has_grads)


@functools.cache
def _sharded_chunks(run_chunks, plan, has_bias, has_grads):
    weight = "h v" if plan.weight_layout == "hv" else "v h"
    operands = ["... h", weight, *(["v"] if has_bias else []), "...", *(["..."] if has_grads else [])]
    grads = ["... h", weight, *(["v"] if has_bias else [])] if has_grads else []
    rule = f"{', '.join(operands)} -> {', '.join(['...', '...', *grads])}"

    def local(*arrays, axis_names):
        x, weight, *rest = arrays
        bias = rest.pop(0) if has_bias else None
        labels, grad_scale = rest[0], rest[1].reshape(-1) if has_grads else None
        rows = x.reshape(-1, x.shape[-1])
        results = run_chunks(rows, weight, bias, labels.reshape(-1), grad_scale, plan, axis_names.get("v", ()))
        return results._replace(
            loss=results.loss.reshape(labels.shape),
            z_loss=results.z_loss.reshape(labels.shape),
            dx=None if results.dx is None else results.dx.reshape(x.shape),
        )

    # dweight and dbias (results 3 and 4) sum over the rows.
    sharded = partitioned(local, rule, replicated=("h",), collective=("v",), partial_sums=(3, 4) if has_grads else ())
    row_argnums = (0, len(operands) - 2, len(operands) - 1) if has_grads else (0, len(operands) - 1)
    return vmap_over_rows(sharded, row_argnums=row_argnums, reduces_rows=has_grads)


def row_losses_and_grads(settings: LossSettings, axes: Sequence[str]) -> Callable:
    """``(logits [..., V/n], labels [...], grad_scale [...]) -> (dlogits, loss, z_loss)`` with V sharded on ``axes``.

    The interface of ``_cross_entropy_rows.row_losses_and_grads`` for this device's slice of the vocabulary
    (slice ``axis_index(axes)`` of ``n``, in order); the losses are the whole rows' and agree on every shard.
    """
    return functools.partial(_losses_and_grads, settings=settings, axes=tuple(axes))


def row_losses(settings: LossSettings, axes: Sequence[str]) -> Callable:
    """``(logits [..., V/n], labels [...]) -> (loss, z_loss)``: :func:`row_losses_and_grads` without gradients."""
    return functools.partial(_losses, settings=settings, axes=tuple(axes))


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
    picked = jnp.take_along_axis(capped, jnp.where(held_here, local_label, 0)[..., None], axis=-1)[..., 0]
    target = jax.lax.psum(jnp.where(held_here, picked, 0.0), axes)
    return capped, lse, target, held_here, local_label, n_classes


def _losses(logits, labels, settings: LossSettings, axes):
    capped, lse, target, _, _, n_classes = _row_statistics(logits, labels, settings, axes)
    return _finished_losses(capped, lse, target, labels, n_classes, settings, axes)


def _finished_losses(capped, lse, target, labels, n_classes, settings: LossSettings, axes):
    smoothing = settings.label_smoothing
    z_loss = settings.z_loss_scale * lse * lse
    loss = lse - (1.0 - smoothing) * target + z_loss
    if smoothing:
        loss = loss - smoothing * jax.lax.psum(jnp.sum(capped, axis=-1), axes) / n_classes
    ignored = labels == settings.ignore_index
    in_range = (labels >= 0) & (labels < n_classes)
    return jnp.where(ignored, 0.0, jnp.where(in_range, loss, jnp.nan)), jnp.where(ignored, 0.0, z_loss)


def _losses_and_grads(logits, labels, grad_scale, settings: LossSettings, axes):
    capped, lse, target, held_here, local_label, n_classes = _row_statistics(logits, labels, settings, axes)
    loss, z_loss = _finished_losses(capped, lse, target, labels, n_classes, settings, axes)
    # d loss / d capped_j = p_j (1 + 2 z lse) - (1 - s) [j = label] - s / V, written out: differentiating through
    # psum would count the shards' shared cotangent once per shard.
    probabilities = jnp.exp(capped - lse[..., None])
    smoothing = settings.label_smoothing
    dcapped = probabilities * (1.0 + 2.0 * settings.z_loss_scale * lse)[..., None] - smoothing / n_classes
    classes = jax.lax.broadcasted_iota(local_label.dtype, capped.shape, capped.ndim - 1)
    is_target = held_here[..., None] & (classes == local_label[..., None])
    dcapped = dcapped - (1.0 - smoothing) * is_target
    if settings.softcap is not None:
        dcapped = dcapped * (1.0 - jnp.square(capped / settings.softcap))
    in_range = (labels >= 0) & (labels < n_classes)
    row_scale = jnp.where((labels == settings.ignore_index) | ~in_range, 0.0, grad_scale.astype(dcapped.dtype))
    return (dcapped * row_scale[..., None]).astype(logits.dtype), loss, z_loss
