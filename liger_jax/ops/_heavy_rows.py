"""Warps for row kernels that hold several fp32 tensors per tile (DyT's, PolyNorm's and modulated RMSNorm's).

:func:`liger_jax.ops._tiling.row_tiling` gives the RMSNorm/LayerNorm kernels 16-32 elements of a tile per thread.
These kernels get warps by a density of their own (:func:`elements_per_thread`), measured on the H200 (bf16
fwd+bwd, device time of each kernel, one-row tiles at 2-32 warps, D = 1024-16384; RESULTS.md, fifth session):

* DyT: 8 elements a thread (its backward keeps x, dy, tanh and two [D] fp32 column sums live): 32 ran it 1.24x
  slower at D = 4096, and from D = 8192 its backward at 2-4 warps 10-60x slower. On rows of at most 512 columns, 4
  (one-row tiles at 4 warps at 512: below).
* PolyNorm: 32, which ran it 1.08-1.25x faster than 8 at every D from 1024 to 16384.
* modulated RMSNorm: 32 up to D = 8192 (1.11-1.29x faster than 8 at 2048-8192, 6% slower at 1024); past it 8, as
  its grouped backward keeps three [D] fp32 partial sums a program (at D = 16384, 16 warps ran 2.0x slower than 32).
"""

import dataclasses

from liger_jax.ops import _rows, _tiling

THREADS_PER_WARP = 32
MIN_WARPS = 2
# Rows at least this long get a tile each. Measured on the H200 (bf16 fwd+bwd, benchmarks.row_tiling --shape
# hidden=1024): at 1024 columns two-row tiles at 8 warps ran DyT (16384 rows) in 0.227 ms (0.62x XLA) and modulated
# RMSNorm (4 × 4096 rows) in 0.319 ms (1.11x), one-row tiles at 4 warps in 0.078 ms (1.81x) and 0.088 ms (4.06x).
# DyT's rows get a tile each at every length: on an H100 (2026-12-07, 16384 rows, bf16 fwd+bwd) one-row tiles at 4
# warps ran 512 columns in 0.052 ms (1.57x XLA) against 0.180 (0.45x) with the row rule's 4-row tiles at 8 warps, and
# 256 columns in 0.036 (0.89x) against 0.095 (0.34x): its backward's cost is in tiles of several rows.
ONE_ROW_TILE_COLS = {"dyt": 1, "poly_norm": 1024, "modulated_rms_norm": 1024}
# DyT's rows of at most this many columns take NARROW_DYT_ELEMENTS a thread.
NARROW_DYT_COLS = 512
NARROW_DYT_ELEMENTS = 4
# Past this width modulated RMSNorm's backward keeps its partial sums in registers only at the sparse density.
MODULATED_DENSE_MAX_COLS = 8192


def elements_per_thread(op: str, n_cols: int) -> int:
    """How many elements of a tile each thread of ``op``'s kernels holds (``"dyt"``, ``"poly_norm"`` or
    ``"modulated_rms_norm"``) for rows of ``n_cols``."""
    match op:
        case "dyt":
            return NARROW_DYT_ELEMENTS if n_cols <= NARROW_DYT_COLS else 8
        case "poly_norm":
            return 32
        case "modulated_rms_norm":
            return 32 if n_cols <= MODULATED_DENSE_MAX_COLS else 8
        case _:
            raise ValueError(f"no heavy-row density for op {op!r}")


def heavy_row_override(op: str, n_cols: int, *, reduces_rows: bool, one_tile: bool = False) -> _tiling.TilingOverride:
    """The tiling override in force, with one row per tile from ONE_ROW_TILE_COLS[op] columns, no prefetching and
    ``num_warps`` set (unless the override sets them) so that a tile of rows of ``n_cols`` has
    :func:`elements_per_thread` of ``op`` elements per thread (between MIN_WARPS and ``_tiling.MAX_WARPS`` warps).

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
    if override.prefetch is None:
        # Modulated RMSNorm's grouped backward can prefetch (ptxas, sm_90, D = 4096 at its density: 72 bytes of
        # spills at 4 warps, none at 8), yet to be timed on the H200 (benchmarks.row_tiling's "pf" candidates): off
        # unless forced. DyT's and PolyNorm's kernels ignore the flag.
        override = dataclasses.replace(override, prefetch=False)
    block_d = _tiling.row_tiling(n_cols, reduces_rows=reduces_rows, override=override).block_d
    if override.block_rows is None and block_d >= ONE_ROW_TILE_COLS[op]:
        override = dataclasses.replace(override, block_rows=1)
    if override.num_warps is not None:
        return override
    tiling = _tiling.row_tiling(n_cols, reduces_rows=reduces_rows, override=override)
    tile = tiling.block_rows * tiling.block_d
    warps = tile // (THREADS_PER_WARP * elements_per_thread(op, n_cols))
    return dataclasses.replace(override, num_warps=max(MIN_WARPS, min(_tiling.MAX_WARPS, warps)))


def heavy_row_launcher(kernel, outputs, *, op: str, n_cols: int, one_tile: bool = False, **settings):
    """:func:`liger_jax.ops._rows.row_launcher` for ``op``'s rows of ``n_cols`` with :func:`heavy_row_override`'s
    tiles and warps (``one_tile`` for a kernel without a column-block path; ``settings`` as row_launcher's
    keywords)."""
    reduces_rows = any(isinstance(spec, _rows.ColumnSum) for spec in outputs)
    with _tiling.overridden(heavy_row_override(op, n_cols, reduces_rows=reduces_rows, one_tile=one_tile)):
        return _rows.row_launcher(kernel, outputs, **settings)
