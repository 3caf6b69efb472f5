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
# Rows at least this long get a tile each. Measured on the H200 (bf16 fwd+bwd, benchmarks.row_tiling --shape
# hidden=1024): at 1024 columns two-row tiles at 8 warps ran DyT (16384 rows) in 0.227 ms (0.62x XLA) and modulated
# RMSNorm (4 × 4096 rows) in 0.319 ms (1.11x), one-row tiles at 4 warps in 0.078 ms (1.81x) and 0.088 ms (4.06x).
ONE_ROW_TILE_COLS = 1024


def heavy_row_override(n_cols: int, *, reduces_rows: bool, one_tile: bool = False) -> _tiling.TilingOverride:
    """The tiling override in force, with one row per tile from ONE_ROW_TILE_COLS columns and ``num_warps`` set
    (unless the override sets them) so that a tile of rows of ``n_cols`` has ELEMENTS_PER_THREAD elements per thread
    (between MIN_WARPS and ``_tiling.MAX_WARPS`` warps).

    :func:`heavy_row_launcher` builds launchers with it.

    Raises:
        ValueError: ``one_tile`` (a kernel without a column-block path) and an override's ``block_d`` narrower than
            the row.
    """
    override = _tiling.current_override() or _tiling.TilingOverride()
    if one_tile and override.block_d is not None and override.block_d < n_cols:
        raise ValueError(
            f"this kernel keeps a row in one tile: a tiling override's block_d={override.block_d} is narrower than "
            f"its {n_cols} columns"
        )
    block_d = _tiling.row_tiling(n_cols, reduces_rows=reduces_rows, override=override).block_d
    if override.block_rows is None and block_d >= ONE_ROW_TILE_COLS:
        override = dataclasses.replace(override, block_rows=1)
    if override.num_warps is not None:
        return override
    tiling = _tiling.row_tiling(n_cols, reduces_rows=reduces_rows, override=override)
    tile = tiling.block_rows * tiling.block_d
    warps = tile // (THREADS_PER_WARP * ELEMENTS_PER_THREAD)
    return dataclasses.replace(override, num_warps=max(MIN_WARPS, min(_tiling.MAX_WARPS, warps)))


def heavy_row_launcher(kernel, outputs, *, n_cols: int, one_tile: bool = False, **settings):
    """:func:`liger_jax.ops._rows.row_launcher` for rows of ``n_cols`` with :func:`heavy_row_override`'s tiles and
    warps (``one_tile`` for a kernel without a column-block path; ``settings`` as row_launcher's keywords)."""
    reduces_rows = any(isinstance(spec, _rows.ColumnSum) for spec in outputs)
    with _tiling.overridden(heavy_row_override(n_cols, reduces_rows=reduces_rows, one_tile=one_tile)):
        return _rows.row_launcher(kernel, outputs, **settings)
