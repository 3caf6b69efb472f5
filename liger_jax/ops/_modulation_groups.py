"""Modulated RMSNorm launched for a modulation shared by groups of rows (one per example, or one for all rows).

x is ``[..., R, D]``: groups ``[...]`` of R rows, each group modulated by its row of ``scale`` and ``shift``
``[..., D]``. One launch covers every group: the forward finds each row's modulation row, and the backward gives
each group its own programs, so that each program's partial sums of dscale and dshift belong to one group. (One
launch per group, a ``jax.vmap`` over them, becomes a loop in XLA that copies every group's slice of x and dy in and
its y and dx out: about three times the bytes.) Tiles as ``ops._heavy_rows`` says; the groups and their rows shard
freely.
"""

import functools
import math

import jax
import jax.numpy as jnp

from liger_jax import runtime
from liger_jax.ops import _tiling
from liger_jax.ops._batching import vmap_over_rows
from liger_jax.ops._heavy_rows import heavy_row_override
from liger_jax.ops._partitioning import partitioned

_FORWARD_RULE = "... r d, d, ... d, ... d -> ... r d, ... r"
# dweight sums over everything, dscale and dshift over each group's rows.
_BACKWARD_RULE = "... r d, ... r d, d, ... d, ... r -> ... r d, d, ... d, ... d"


def grouped_forward(implementation: runtime.Implementation, **constexprs):
    """``(x [..., R, D], weight [D], scale [..., D], shift [..., D]) -> (y [..., R, D] x.dtype, rstd [..., R] fp32)``
    through ``modulated_rms_norm_fwd`` with its settings ``constexprs`` (eps, offset, CASTING, HAS_SHIFT), for the
    tiling override in force."""
    return _grouped_forward(implementation, _tiling.current_override(), **constexprs)


def grouped_backward(implementation: runtime.Implementation, **constexprs):
    """``(dy [..., R, D], x [..., R, D], weight [D], scale [..., D], rstd [..., R]) -> (dx [..., R, D] x.dtype,
    dweight [D] fp32, dscale [..., D] fp32, dshift [..., D] fp32)`` through ``modulated_rms_norm_bwd_grouped`` with
    its settings ``constexprs`` (offset, CASTING), for the tiling override in force."""
    return _grouped_backward(implementation, _tiling.current_override(), **constexprs)


def _tiling_for(n_cols: int, override: _tiling.TilingOverride | None, reduces_rows: bool) -> _tiling.RowTiling:
    """``ops._heavy_rows``' tiling of rows of ``n_cols`` under ``override``."""
    with _tiling.overridden(override or _tiling.TilingOverride()):
        heavy = heavy_row_override("modulated_rms_norm", n_cols, reduces_rows=reduces_rows, one_tile=True)
    return _tiling.row_tiling(n_cols, reduces_rows=reduces_rows, override=heavy)


def _launch_settings(tiling: _tiling.RowTiling, n_cols: int) -> dict:
    return {
        "num_warps": tiling.num_warps,
        "num_stages": tiling.num_stages,
        "n_cols": n_cols,
        "row_stride": n_cols,
        "BLOCK_ROWS": tiling.block_rows,
        "BLOCK_D": tiling.block_d,
    }


@functools.cache
def _grouped_forward(implementation, override, **constexprs):
    from liger_jax.kernels import modulated_rms_norm as kernels

    def launch(x, weight, scale, shift):
        rows_per_group, n_cols = x.shape[-2:]
        n_rows = math.prod(x.shape[:-1])
        tiling = _tiling_for(n_cols, override, reduces_rows=False)
        y, rstd = runtime.launch(
            kernels.modulated_rms_norm_fwd,
            x.reshape(n_rows, n_cols),
            weight,
            scale.reshape(-1, n_cols),
            shift.reshape(-1, n_cols),
            n_rows,
            out_shape=[jax.ShapeDtypeStruct((n_rows, n_cols), x.dtype), jax.ShapeDtypeStruct((n_rows,), jnp.float32)],
            grid=(_tiling.cdiv(n_rows, tiling.block_rows),),
            implementation=implementation,
            **constexprs,
            ROWS_PER_MODULATION=rows_per_group,
            **_launch_settings(tiling, n_cols),
        )
        return y.reshape(x.shape), rstd.reshape(x.shape[:-1])

    sharded = partitioned(launch, _FORWARD_RULE, replicated=("d",))
    return vmap_over_rows(sharded, row_argnums=(0, 2, 3), reduces_rows=False)


@functools.cache
def _grouped_backward(implementation, override, **constexprs):
    from liger_jax.kernels import modulated_rms_norm as kernels

    def launch(dy, x, weight, scale, rstd):
        rows_per_group, n_cols = x.shape[-2:]
        groups = math.prod(x.shape[:-2])
        n_rows = groups * rows_per_group
        tiling = _tiling_for(n_cols, override, reduces_rows=True)
        per_group, tiles_per_program = _tiling.reduction_grid(rows_per_group, tiling, implementation, groups)
        partial = jax.ShapeDtypeStruct((groups * per_group, n_cols), jnp.float32)
        dx, dweight, dscale, dshift = runtime.launch(
            kernels.modulated_rms_norm_bwd_grouped,
            dy.reshape(n_rows, n_cols),
            x.reshape(n_rows, n_cols),
            weight,
            scale.reshape(groups, n_cols),
            rstd.reshape(n_rows),
            n_rows,
            out_shape=[jax.ShapeDtypeStruct((n_rows, n_cols), x.dtype), partial, partial, partial],
            grid=(groups * per_group,),
            implementation=implementation,
            **constexprs,
            ROWS_PER_GROUP=rows_per_group,
            PROGRAMS_PER_GROUP=per_group,
            PREFETCH=tiling.prefetch,
            TILES_PER_PROGRAM=tiles_per_program,
            **_launch_settings(tiling, n_cols),
        )

        def per_group_sums(partials):
            return partials.reshape(*x.shape[:-2], per_group, n_cols).sum(axis=-2)

        return dx.reshape(x.shape), dweight.sum(axis=0), per_group_sums(dscale), per_group_sums(dshift)

    sharded = partitioned(launch, _BACKWARD_RULE, replicated=("d",), partial_sums=[1, 2, 3])
    return vmap_over_rows(sharded, row_argnums=(0, 1, 3, 4), reduces_rows=True)
