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


def reference_row_losses(logits: jax.Array, labels: jax.Array, settings: LossSettings) -> tuple[jax.Array, jax.Array]:
    """Per-row ``(loss, z_loss)`` in plain jax.numpy, computed in ``promote(logits.dtype, float32)``.

    Ignored rows give 0 and 0; a label outside ``[0, V)`` (other than ``ignore_index``) gives a NaN loss whose
    gradient is zero, as the kernels do. ``logits`` ``[..., V]``, ``labels`` ``[...]``; both results ``[...]``.
    """
    compute = jnp.promote_types(logits.dtype, jnp.float32)
    capped = logits.astype(compute)
    if settings.softcap is not None:
        capped = settings.softcap * jnp.tanh(capped / settings.softcap)
    n_cols = logits.shape[-1]
    lse = jax.nn.logsumexp(capped, axis=-1)
    in_range = (labels >= 0) & (labels < n_cols)
    target = jnp.take_along_axis(capped, jnp.where(in_range, labels, 0)[..., None], axis=-1)[..., 0]
    smoothing = settings.label_smoothing
    z_loss = settings.z_loss_scale * lse * lse
    loss = lse - (1.0 - smoothing) * target + z_loss
    if smoothing:  # skipped without smoothing: 0 · Σc would be NaN for logits masked to -inf
        loss = loss - smoothing * jnp.mean(capped, axis=-1)
    ignored = labels == settings.ignore_index
    loss = jnp.where(ignored, 0.0, jnp.where(in_range, loss, jnp.nan))
    return loss, jnp.where(ignored, 0.0, z_loss)


def reduced_reference_losses(logits: jax.Array, labels: jax.Array, settings: LossSettings):
    """``(loss, z_loss)`` of :func:`reference_row_losses`, each reduced as ``settings.reduction`` says."""
    loss, z_loss = reference_row_losses(logits, labels, settings)
    return reduce_rows(loss, labels, settings), reduce_rows(z_loss, labels, settings)


def count_targets(labels: jax.Array, ignore_index: int) -> jax.Array:
    """Number of rows whose label is not ``ignore_index``, as a float32 scalar."""
    return jnp.sum(labels != ignore_index, dtype=jnp.float32)


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


def reduction_grad_scale(labels: jax.Array, settings: LossSettings) -> jax.Array:
    """``[...]`` float32: d(reduced loss)/d(row loss) for "mean" and "sum" (rows of ``labels``)."""
    if settings.reduction == "mean":
        scale = 1.0 / jnp.maximum(count_targets(labels, settings.ignore_index), 1.0)
        return jnp.broadcast_to(scale, labels.shape)
    return jnp.ones(labels.shape, jnp.float32)


def row_losses(settings: LossSettings):
    """``(logits [..., V], labels [...]) -> (loss [...], z_loss [...])``, fp32, for ``settings.implementation``."""
    if settings.implementation == "xla":
        return functools.partial(reference_row_losses, settings=settings)
    with_lse = row_losses_and_lse(settings)
    return lambda logits, labels: with_lse(logits, labels)[:2]


def row_losses_and_grads(settings: LossSettings):
    """``(logits [..., V], labels [...], grad_scale [...] fp32) -> (dlogits, loss, z_loss)``.

    ``dlogits`` (logits.dtype) is the gradient of ``Σ_rows grad_scale · loss`` with respect to the logits; the
    losses are fp32. Under a kernel implementation ``dlogits`` takes over the logits buffer when it is dead.
    """
    if settings.implementation == "xla":
        return functools.partial(_reference_losses_and_grads, settings=settings)
    return _kernel_row_losses_and_grads(settings)


def _reference_losses_and_grads(logits, labels, grad_scale, settings):
    (loss, z_loss), pullback = jax.vjp(lambda logits: reference_row_losses(logits, labels, settings), logits)
    (dlogits,) = pullback((grad_scale.astype(loss.dtype), jnp.zeros_like(z_loss)))
    return dlogits, loss, z_loss


def _constexprs(settings: LossSettings, tiling: VocabTiling, n_cols: int) -> dict:
    return {
        "n_cols": n_cols,
        "ignore_index": int(settings.ignore_index),
        "label_smoothing": float(settings.label_smoothing),
        "z_loss_scale": float(settings.z_loss_scale),
        "softcap": 0.0 if settings.softcap is None else float(settings.softcap),
        "BLOCK_ROWS": tiling.block_rows,
        "BLOCK_V": tiling.block_v,
        "NUM_V_BLOCKS": tiling.num_v_blocks,
    }


def _row_shapes(n_rows: int, count: int) -> tuple[jax.ShapeDtypeStruct, ...]:
    return (jax.ShapeDtypeStruct((n_rows,), jnp.float32),) * count


def _launch_over_rows(kernel, settings: LossSettings, logits, row_operands, out_shape, **options):
    """``kernel`` over ``logits`` ``[..., V]`` seen as rows and ``row_operands`` ``[...]`` flattened alike; results
    of ``out_shape`` (per flattened row, or ``[rows, V]``) come back flat."""
    n_cols = logits.shape[-1]
    rows = logits.reshape(-1, n_cols)
    tiling = vocab_tiling(n_cols, settings.implementation)
    return runtime.launch(
        kernel,
        rows,
        *(operand.reshape(-1) for operand in row_operands),
        rows.shape[0],
        out_shape=out_shape,
        grid=(_tiling.cdiv(rows.shape[0], tiling.block_rows),),
        implementation=settings.implementation,
        num_warps=tiling.num_warps,
        **options,
        **_constexprs(settings, tiling, n_cols),
    )


@functools.cache
def row_losses_and_lse(settings: LossSettings):
    """Kernel ``(logits [..., V], labels [...]) -> (loss, z_loss, lse)``, each ``[...]`` fp32: one read of the
    logits; ``lse`` (after softcap) is what :func:`row_grads` needs."""
    from liger_jax.kernels import cross_entropy as kernels

    def losses(logits, labels):
        n_rows = labels.size
        results = _launch_over_rows(kernels.cross_entropy_loss, settings, logits, (labels,), _row_shapes(n_rows, 3))
        return tuple(result.reshape(labels.shape) for result in results)

    sharded = partitioned(losses, "... v, ... -> ..., ..., ...", replicated=("v",))  # rows shard, each row whole
    return vmap_over_rows(sharded, row_argnums=(0, 1), reduces_rows=False)


@functools.cache
def row_grads(settings: LossSettings):
    """Kernel ``(logits [..., V], labels [...], lse [...], grad_scale [...]) -> dlogits [..., V]``.

    ``dlogits`` (logits.dtype) is the gradient of ``Σ_rows grad_scale · loss``, from the ``lse`` of
    :func:`row_losses_and_lse`: one read of the logits and one write, over the logits buffer when it is dead.
    """
    from liger_jax.kernels import cross_entropy as kernels

    def grads(logits, labels, lse, grad_scale):
        (dlogits,) = _launch_over_rows(
            kernels.cross_entropy_grad,
            settings,
            logits,
            (labels, lse, grad_scale.astype(jnp.float32)),
            (jax.ShapeDtypeStruct((labels.size, logits.shape[-1]), logits.dtype),),
            input_output_aliases={0: 0},  # the gradient overwrites the logits when they are dead
        )
        return dlogits.reshape(logits.shape)

    sharded = partitioned(grads, "... v, ..., ..., ... -> ... v", replicated=("v",))
    return vmap_over_rows(sharded, row_argnums=(0, 1, 2, 3), reduces_rows=False)


@functools.cache
def _kernel_row_losses_and_grads(settings: LossSettings):
    from liger_jax.kernels import cross_entropy as kernels

    def losses_and_grads(logits, labels, grad_scale):
        n_rows = labels.size
        out_shape = (jax.ShapeDtypeStruct((n_rows, logits.shape[-1]), logits.dtype), *_row_shapes(n_rows, 3))
        dlogits, loss, z_loss, _ = _launch_over_rows(
            kernels.cross_entropy_loss_and_grad,
            settings,
            logits,
            (labels, grad_scale.astype(jnp.float32)),
            out_shape,
            input_output_aliases={0: 0},  # the gradient overwrites the logits when they are dead
        )
        return dlogits.reshape(logits.shape), loss.reshape(labels.shape), z_loss.reshape(labels.shape)

    sharded = partitioned(losses_and_grads, "... v, ..., ... -> ... v, ..., ...", replicated=("v",))
    return vmap_over_rows(sharded, row_argnums=(0, 1, 2), reduces_rows=False)
