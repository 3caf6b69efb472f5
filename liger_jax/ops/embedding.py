"""Token embedding: rows of a table, gathered in the table's dtype and cast after, their gradient summed in fp32."""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from liger_jax import runtime
from liger_jax.ops import _checks


def embedding(
    table: jax.Array,
    ids: jax.Array,
    *,
    dtype=None,
    accum_dtype=jnp.float32,
    implementation: runtime.Implementation | None = None,
) -> jax.Array:
    r"""``table[ids]`` cast to ``dtype``: what ``nnx.Embed`` / ``nn.Embed`` compute, at a lower cost in training.

    flax casts the whole ``[V, H]`` table to the compute dtype, then gathers; the gather's gradient is then a
    scatter-add into a ``[V, H]`` table of the compute dtype. In bfloat16 that scatter's additions are
    compare-and-swap loops, which serialise wherever ids repeat, as tokens of real text do: on an H100 the small
    Llama preset's training step on bytes of text spent 1.67 of its 8.1 ms in that scatter. Here the rows are
    gathered from the table as it is stored and only they are cast, and the gradient is summed in ``accum_dtype``
    (fp32 additions are native atomics) and rounded once to the table's dtype: with fp32 params the step kept
    6.5 ms (the scatter out of its costliest kernels). The gradient is also more exact: a row repeated n times
    sums n cotangents in fp32 instead of bf16. A table narrower than ``accum_dtype`` (bf16 params) is not given
    an ``accum_dtype`` copy: the ids are sorted, each distinct id's rows summed in ``accum_dtype``, and each sum
    stored once into the table-sized gradient.

    No Triton kernel: the gather, the sort and the scatters are the whole computation, and XLA emits them; every
    implementation but ``"xla"`` runs them, and ``"xla"`` runs :func:`embedding_reference` (flax's order), as the
    other ops' ``"xla"`` runs their reference. Indices follow ``jnp.take`` (and flax): a negative id counts from
    the end; a traced id past the end gives a NaN row and no gradient.

    Args:
        table: ``[V, H]`` floating point, the embedding table.
        ids: integer array of any shape, ids in ``[-V, V)`` (checked when concrete).
        dtype: the rows' dtype (None: the table's).
        accum_dtype: dtype the gradient is summed in before it is rounded to the table's dtype; promoted with the
            table's (a float64 table sums in float64).
        implementation: ``"triton"``, ``"interpret"``, ``"xla"`` or None for the default (see
            :mod:`liger_jax.runtime`; on a GPU the formulation above).

    Returns:
        ``ids.shape + (H,)`` in ``dtype``.

    Raises:
        TypeError: table is not floating point, ids are not integers, or dtype / accum_dtype are not floating.
        ValueError: table is not 2-D, a concrete id is out of range, or an unknown implementation.

    Example:
        >>> hidden = liger_jax.embedding(params["embedding"], tokens, dtype=jnp.bfloat16)
    """
    implementation = runtime.resolve_implementation(implementation)
    _checks.check_floating("table", table, "xla")
    if table.ndim != 2:
        raise ValueError(f"table must have 2 axes [V, H], got shape {table.shape}")
    ids = jnp.asarray(ids)
    if not jnp.issubdtype(ids.dtype, jnp.integer):
        raise TypeError(f"ids must have an integer dtype, got {ids.dtype}")
    dtype = table.dtype if dtype is None else jnp.dtype(dtype)
    for name, value in (("dtype", dtype), ("accum_dtype", accum_dtype)):
        if not jnp.issubdtype(jnp.dtype(value), jnp.floating):
            raise TypeError(f"{name} must be a floating dtype, got {value!r}")
    n_rows = table.shape[0]
    _checks.check_values(
        "ids", ids, lambda i: _outside(i, n_rows), f"be in [-{n_rows}, {n_rows}) for a table of {n_rows} rows"
    )
    if implementation == "xla":
        return embedding_reference(table, ids, dtype=dtype)
    return _embedding(table, ids, dtype, jnp.promote_types(accum_dtype, table.dtype))


def _outside(ids, n_rows: int):
    """Where ``ids`` (NumPy or JAX integers) leave ``[-n_rows, n_rows)``, the rows ``jnp.take`` reads."""
    return (ids < -n_rows) | (ids >= n_rows)


def embedding_reference(table: jax.Array, ids: jax.Array, *, dtype=None) -> jax.Array:
    """flax's embedding: the table cast to ``dtype``, then ``jnp.take`` of the rows; shapes as :func:`embedding`."""
    return jnp.take(table.astype(table.dtype if dtype is None else dtype), ids, axis=0)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _embedding(table, ids, dtype, accum_dtype):
    return jnp.take(table, ids, axis=0).astype(dtype)


def _embedding_fwd(table, ids, dtype, accum_dtype):
    return _embedding(table, ids, dtype, accum_dtype), (table, ids)


def _embedding_bwd(dtype, accum_dtype, residuals, cotangent):
    table, ids = residuals
    rows, flat_ids = cotangent.reshape(-1, table.shape[1]), ids.reshape(-1)
    if table.dtype == accum_dtype:
        grad = jnp.zeros(table.shape, accum_dtype).at[flat_ids].add(rows.astype(accum_dtype), mode="drop")
    else:
        distinct, sums = _sums_by_id(rows, flat_ids, table.shape[0], accum_dtype)
        grad = jnp.zeros(table.shape, table.dtype).at[distinct].set(sums.astype(table.dtype), mode="drop")
    return grad, np.zeros(ids.shape, jax.dtypes.float0)


def _sums_by_id(rows: jax.Array, ids: jax.Array, n_rows: int, accum_dtype) -> tuple[jax.Array, jax.Array]:
    """The rows ``[N, H]`` of each distinct id of ``ids`` ``[N]`` summed in ``accum_dtype``, so that a table narrower
    than ``accum_dtype`` takes each sum in one store, and no ``[V, H]`` buffer in ``accum_dtype`` is needed.

    Returns:
        ``(distinct, sums)``: ``[N]`` int32, the distinct ids in ``[0, n_rows)`` and then ``n_rows`` (unused slots,
        ids out of range); ``[N, H]`` in ``accum_dtype``, the sum of each slot's rows (zero for unused slots).
    """
    ids = ids.astype(jax.dtypes.canonicalize_dtype(jnp.promote_types(ids.dtype, jnp.int32)))
    ids = jnp.where(_outside(ids, n_rows), n_rows, ids % n_rows).astype(jnp.int32)
    order = jnp.argsort(ids)
    sorted_ids = ids[order]
    first_of_its_id = jnp.diff(sorted_ids, prepend=-1) != 0
    slot = jnp.cumsum(first_of_its_id) - 1  # each sorted id's place among the distinct ones
    sums = jax.ops.segment_sum(rows[order].astype(accum_dtype), slot, ids.size, indices_are_sorted=True)
    return jnp.full(ids.shape, n_rows, jnp.int32).at[slot].set(sorted_ids), sums


_embedding.defvjp(_embedding_fwd, _embedding_bwd)
