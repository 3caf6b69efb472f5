"""Warps for row kernels that hold several fp32 tensors per tile (DyT's, PolyNorm's and modulated RMSNorm's).

:func:`liger_jax.ops._tiling.row_tiling` gives the RMSNorm/LayerNorm kernels 16-32 elements of a tile per thread.
These kernels keep more of a tile live at once (x, dy, tanh or three powers of x, the modulation, fp32 column sums):
ptxas (sm_90, bf16, Triton 3.6) gives their backward 166-255 registers a thread at that density and spills at
D = 8192 and 16384; at 8 elements a thread they take 54-128 registers and spill nothing up to D = 8192.
"""

import dataclasses

from liger_jax.ops import _rows, _tiling

ELEMENTS_PER_THREAD = 8
THREADS_PER_WARP = 32
MIN_WARPS = 4


def heavy_row_override(n_cols: int, *, reduces_rows: bool) -> _tiling.TilingOverride:
    """The tiling override in force, with ``num_warps`` set (unless it already is) so that a tile of rows of
    ``n_cols`` has ELEMENTS_PER_THREAD elements per thread (between MIN_WARPS and ``_tiling.MAX_WARPS`` warps).

    :func:`heavy_row_launcher` builds launchers with it.
    """
    override = _tiling.current_override() or _tiling.TilingOverride()
    if override.num_warps is not None:
        return override
    tiling = _tiling.row_tiling(n_cols, reduces_rows=reduces_rows, override=override)
    tile = tiling.block_rows * tiling.block_d
    warps = tile // (THREADS_PER_WARP * ELEMENTS_PER_THREAD)
    return dataclasses.replace(override, num_warps=max(MIN_WARPS, min(_tiling.MAX_WARPS, warps)))


def heavy_row_launcher(kernel, outputs, *, n_cols: int, **settings):
    """:func:`liger_jax.ops._rows.row_launcher` for rows of ``n_cols`` with :func:`heavy_row_override`'s warps
    (``settings`` as row_launcher's keywords)."""
    reduces_rows = any(isinstance(spec, _rows.ColumnSum) for spec in outputs)
    with _tiling.overridden(heavy_row_override(n_cols, reduces_rows=reduces_rows)):
        return _rows.row_launcher(kernel, outputs, **settings)
