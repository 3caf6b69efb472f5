"""Launching a row-wise kernel: every ``[..., D]`` operand is a stack of rows, cut into tiles by ``_tiling``.

The kernels this serves share one signature: the array operands, then ``n_rows``, then one pointer per output, then
their own constexprs, ``PREFETCH`` and ``TILES_PER_PROGRAM`` (kernels with a :class:`ColumnSum` output, and those
launched with ``walks_tiles``),
``n_cols``, ``row_stride``, ``BLOCK_ROWS`` and ``BLOCK_D`` (sizes as constexprs: see ``liger_jax.kernels._rows``;
a row longer than BLOCK_D is walked in column blocks).
"""

import dataclasses
import functools
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp

from liger_jax import runtime
from liger_jax.ops import _tiling
from liger_jax.ops._batching import vmap_over_rows
from liger_jax.ops._partitioning import partitioned


@dataclasses.dataclass(frozen=True)
class Rows:
    """An output ``[..., D]`` shaped like operand 0, with the dtype of operand ``like``."""

    like: int = 0


@dataclasses.dataclass(frozen=True)
class RowStats:
    """An fp32 output ``[...]``, one value per row (mean, rstd)."""


@dataclasses.dataclass(frozen=True)
class ColumnSum:
    """An fp32 output ``[D]`` summed over all rows (a weight's gradient; the op casts it to the weight's dtype).

    The kernel writes fp32 partials ``[num_programs, D]``, one row per program, and XLA adds them: deterministic,
    no atomics.
    """


Output = Rows | RowStats | ColumnSum


def row_launcher(
    kernel,
    outputs: tuple[Output, ...],
    *,
    row_argnums: tuple[int, ...],
    implementation: runtime.Implementation,
    aliases: tuple[tuple[int, int], ...] = (),
    shared_sums: int = 0,
    walks_tiles: bool = False,
    **constexprs,
) -> Callable[..., tuple[jax.Array, ...]]:
    """A function of the kernel's array operands that launches ``kernel`` over all rows.

    Args:
        kernel: a ``@triton.jit`` row-wise kernel with the signature in this module's docstring.
        outputs: one spec per output pointer, in order.
        row_argnums: the operands with row axes: operand 0 and the others ``[..., D]`` like it, and per-row
            statistics ``[...]``. The remaining operands (weights ``[D]``) are passed as they are.
        implementation: ``"triton"`` or ``"interpret"``.
        aliases: ``(operand, output)`` pairs whose buffers may be shared (the operand is dead after the call).
        shared_sums: for a kernel that takes COLUMN_SPLITS (after TILES_PER_PROGRAM) and shares each row walked in
            column blocks among that many programs, on the grid ``(COLUMN_SPLITS, programs)`` (see
            ``_tiling.column_splits`` and ``liger_jax.kernels._rows.program_and_split``): how many fp32 sums per row
            the splits share. The kernel then takes, after the outputs' pointers, one zeroed ``[COLUMN_SPLITS,
            n_rows, 2]`` int32 buffer per sum, each (split, row) a 64-bit slot for the sum and its mark (see
            ``liger_jax.kernels._rows.store_split_sum``): scratch the launch drops (one slot each where no row is
            split). 0: the kernel splits no row.
        walks_tiles: whether a kernel without a ColumnSum output takes PREFETCH and TILES_PER_PROGRAM: where
            ``_tiling.row_tiling`` prefetches for it, resident programs walk the row tiles, else one tile a program.
        **constexprs: the kernel's own constexpr settings (epsilon, casting codes, ...).

    Returns:
        ``launch(*operands) -> tuple of outputs`` as the specs describe them, cached per settings and per the
        tiling override in force (``_tiling.overridden``). Operand 0 is ``[..., D]`` (rank ≥ 1, non-empty);
        ``jax.vmap`` of it folds the batch into the rows (or maps over examples when weights are batched or an
        output sums over rows).
    """
    return _row_launcher(
        kernel,
        outputs,
        row_argnums=row_argnums,
        implementation=implementation,
        aliases=aliases,
        shared_sums=shared_sums,
        walks_tiles=walks_tiles,
        override=_tiling.current_override(),
        **constexprs,
    )


@functools.cache
def _row_launcher(
    kernel,
    outputs,
    *,
    row_argnums,
    implementation,
    aliases,
    shared_sums,
    walks_tiles,
    override,
    **constexprs,
):
    """:func:`row_launcher` for one tiling override (None: the rule's tiling)."""
    reduces_rows = any(isinstance(spec, ColumnSum) for spec in outputs)

    def launch(*operands):
        shape = operands[0].shape
        n_cols, n_rows = shape[-1], math.prod(shape[:-1])
        tiling = _tiling.row_tiling(n_cols, reduces_rows=reduces_rows, walks_tiles=walks_tiles, override=override)
        split = _tiling.SplitLaunch.unsplit(tiling)
        if shared_sums:
            n_sums = sum(isinstance(spec, ColumnSum) for spec in outputs)
            split = _tiling.split_launch(n_cols, tiling, n_sums, override)
            tiling = dataclasses.replace(tiling, programs_per_sm=split.programs_per_sm)
        splits = split.splits
        if reduces_rows or (walks_tiles and tiling.prefetch):
            programs, tiles_per_program = _tiling.reduction_grid(n_rows, tiling, implementation, splits)
        else:
            programs, tiles_per_program = _tiling.cdiv(n_rows, tiling.block_rows), 1
        grid_constexprs = {}
        if reduces_rows or walks_tiles:
            grid_constexprs = {"PREFETCH": tiling.prefetch, "TILES_PER_PROGRAM": tiles_per_program}
        if shared_sums:
            grid_constexprs["COLUMN_SPLITS"] = splits
            grid_constexprs["SUMS_AHEAD"] = split.sums_ahead
        flat = [
            _as_rows(operand, len(shape), n_rows, n_cols) if i in row_argnums else operand
            for i, operand in enumerate(operands)
        ]
        scratch = _shared_sums_scratch(shared_sums, splits, n_rows)
        results = runtime.launch(
            kernel,
            *flat,
            n_rows,
            out_shape=[_launch_shape(spec, operands, n_rows, n_cols, programs) for spec in outputs] + scratch,
            grid=(splits, programs) if shared_sums else (programs,),
            implementation=implementation,
            zeroed_outputs=tuple(range(len(outputs), len(outputs) + shared_sums)) if splits > 1 else (),
            num_warps=split.warps,
            num_stages=tiling.num_stages,
            input_output_aliases=dict(aliases),
            **constexprs,
            **grid_constexprs,
            n_cols=n_cols,
            row_stride=n_cols,
            BLOCK_ROWS=tiling.block_rows,
            BLOCK_D=tiling.block_d,
        )
        results = results[: len(outputs)]
        return tuple(_finished(spec, result, operands) for spec, result in zip(outputs, results, strict=True))

    sharded = partitioned(
        launch,
        functools.partial(_sharding_rule, outputs, row_argnums),
        replicated=("d",),
        partial_sums=[i for i, spec in enumerate(outputs) if isinstance(spec, ColumnSum)],
    )
    return vmap_over_rows(sharded, row_argnums=row_argnums, reduces_rows=reduces_rows)


def _shared_sums_scratch(shared_sums: int, splits: int, n_rows: int) -> list[jax.ShapeDtypeStruct]:
    """The buffers a kernel whose column splits share ``shared_sums`` row sums takes after its outputs: each sum's
    ``[splits, n_rows, 2]`` int32 (to be zeroed), a 64-bit slot per split and row; one slot each where a row is not
    split (the kernel never reads them, and nothing is zeroed)."""
    shape = (splits, n_rows, 2) if splits > 1 else (1, 1, 2)
    return [jax.ShapeDtypeStruct(shape, jnp.int32)] * shared_sums


def _sharding_rule(outputs: tuple[Output, ...], row_argnums: tuple[int, ...], *operands) -> str:
    """The launch as ``ops._partitioning`` reads it: rows shard freely, D stays whole, a ColumnSum sums rows."""
    rank = operands[0].ndim
    names = [
        ("... d" if operand.ndim == rank else "...") if i in row_argnums else ("d" if operand.ndim else "")
        for i, operand in enumerate(operands)
    ]
    results = [{Rows: "... d", RowStats: "...", ColumnSum: "d"}[type(spec)] for spec in outputs]
    return f"{', '.join(names)} -> {', '.join(results)}"


def _as_rows(operand: jax.Array, rank: int, n_rows: int, n_cols: int) -> jax.Array:
    """``[..., D]`` → ``[n_rows, D]`` and ``[...]`` → ``[n_rows]`` (free: XLA arrays are row-major)."""
    return operand.reshape((n_rows, n_cols) if operand.ndim == rank else (n_rows,))


def _launch_shape(spec: Output, operands, n_rows: int, n_cols: int, programs: int) -> jax.ShapeDtypeStruct:
    """The buffer the kernel writes for ``spec``."""
    match spec:
        case Rows(like=like):
            return jax.ShapeDtypeStruct((n_rows, n_cols), operands[like].dtype)
        case RowStats():
            return jax.ShapeDtypeStruct((n_rows,), jnp.float32)
        case ColumnSum():
            return jax.ShapeDtypeStruct((programs, n_cols), jnp.float32)
        case _:
            raise TypeError(f"unknown output spec {spec!r}")


def _finished(spec: Output, result: jax.Array, operands) -> jax.Array:
    """The kernel's buffer for ``spec`` as the op returns it: row axes restored, partials summed."""
    shape = operands[0].shape
    match spec:
        case Rows():
            return result.reshape(shape)
        case RowStats():
            return result.reshape(shape[:-1])
        case ColumnSum():
            return result.sum(axis=0)
        case _:
            raise TypeError(f"unknown output spec {spec!r}")
