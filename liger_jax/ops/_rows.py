"""Launching a row-wise kernel: every ``[..., D]`` operand is a stack of rows, cut into tiles by ``_tiling``.

The kernels this serves share one signature: the array operands, then ``n_rows``, then one pointer per output, then
their own constexprs, ``PREFETCH`` and ``TILES_PER_PROGRAM`` (kernels with a :class:`ColumnSum` output; a forward
may take either or both, and then walks row tiles where ``_tiling.row_tiling`` says), ``n_cols``, ``row_stride``,
``BLOCK_ROWS`` and ``BLOCK_D`` (sizes as constexprs: see ``liger_jax.kernels._rows``; a row longer than BLOCK_D is
walked in column blocks).
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
    split_row_sums: int = 0,
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
        split_row_sums: for a kernel that takes COLUMN_SPLITS (after TILES_PER_PROGRAM) and shares each row walked
            in column blocks among that many programs, on the grid ``(COLUMN_SPLITS, programs)`` (see
            ``_tiling.column_splits`` and ``liger_jax.kernels._rows.program_and_split``), how many fp32 sums a row
            has, which its splits combine (``liger_jax.kernels._rows.combine_row_sums``): the kernel takes two
            scratch outputs after the others, the splits' parts of the sums and the arrival counts. 0 for other
            kernels.
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
        split_row_sums=split_row_sums,
        override=_tiling.current_override(),
        **constexprs,
    )


@functools.cache
def _row_launcher(kernel, outputs, *, row_argnums, implementation, aliases, split_row_sums, override, **constexprs):
    """:func:`row_launcher` for one tiling override (None: the rule's tiling)."""
    reduces_rows = any(isinstance(spec, ColumnSum) for spec in outputs)
    walks_tiles = not reduces_rows and "TILES_PER_PROGRAM" in kernel.arg_names
    prefetches = reduces_rows or "PREFETCH" in kernel.arg_names

    def launch(*operands):
        shape = operands[0].shape
        n_cols, n_rows = shape[-1], math.prod(shape[:-1])
        tiling = _tiling.row_tiling(
            n_cols, reduces_rows=reduces_rows, walks_tiles=walks_tiles, prefetches=prefetches, override=override
        )
        splits = 1
        if split_row_sums:
            n_sums = sum(isinstance(spec, ColumnSum) for spec in outputs)
            splits = _tiling.column_splits(n_cols, tiling.block_d, n_sums, override)
        if tiling.walks:
            programs, tiles_per_program = _tiling.reduction_grid(n_rows, tiling, implementation, splits)
        else:
            programs, tiles_per_program = _tiling.cdiv(n_rows, tiling.block_rows), 1
        grid_constexprs = {}
        if prefetches:
            grid_constexprs["PREFETCH"] = tiling.prefetch
        if reduces_rows or walks_tiles:
            grid_constexprs["TILES_PER_PROGRAM"] = tiles_per_program
        scratch, zeroed = [], ()
        if split_row_sums:
            grid_constexprs["COLUMN_SPLITS"] = splits
            scratch = _split_scratch(split_row_sums, splits, programs * tiles_per_program, tiling, n_cols)
            zeroed = (len(outputs) + 1,) if tiling.block_d < n_cols else ()
        flat = [
            _as_rows(operand, len(shape), n_rows, n_cols) if i in row_argnums else operand
            for i, operand in enumerate(operands)
        ]
        results = runtime.launch(
            kernel,
            *flat,
            n_rows,
            out_shape=[_launch_shape(spec, operands, n_rows, n_cols, programs) for spec in outputs] + scratch,
            grid=(splits, programs) if split_row_sums else (programs,),
            implementation=implementation,
            num_warps=tiling.num_warps,
            num_stages=tiling.num_stages,
            input_output_aliases=dict(aliases),
            zeroed_outputs=zeroed,
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


def _split_scratch(
    n_sums: int, splits: int, row_tiles: int, tiling: _tiling.RowTiling, n_cols: int
) -> list[jax.ShapeDtypeStruct]:
    """The scratch a column-split kernel combines its rows' sums in: the splits' fp32 parts, ``n_sums`` a row, and
    an int32 arrival count a row tile, to be zeroed; a single element each, never read, where a row fits one
    tile."""
    if tiling.block_d >= n_cols:
        return [jax.ShapeDtypeStruct((1,), jnp.float32), jax.ShapeDtypeStruct((1,), jnp.int32)]
    return [
        jax.ShapeDtypeStruct((row_tiles * tiling.block_rows * n_sums * splits,), jnp.float32),
        jax.ShapeDtypeStruct((row_tiles,), jnp.int32),
    ]


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
