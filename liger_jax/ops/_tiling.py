"""Launch heuristics for row-wise kernels, in one place: block shapes, warps and program counts."""

import dataclasses
import functools

import jax

# A row lives in one tile. 64K elements keeps a fp32 row in registers of a 16-warp program (128 per thread).
MAX_FUSED_COLS = 65536
# Rows shorter than this share a program, so each program still moves enough bytes to hide memory latency.
TILE_ELEMENTS = 4096
# The same for the norm kernels, as measured on the H200 (see row_tiling).
ROW_TILE_ELEMENTS = 2048
MAX_BLOCK_ROWS = 64
# Programs per multiprocessor for kernels that reduce across rows: enough resident programs to keep HBM busy,
# few enough that the [num_programs, D] fp32 partials stay a small fraction of the traffic.
PROGRAMS_PER_SM = 4
# The interpreter runs programs one after another; a handful exercises the partial-sum path without the wait.
INTERPRETER_PROGRAMS = 3


def next_power_of_2(n: int) -> int:
    """The smallest power of two ≥ n (≥ 1)."""
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def rows_per_tile(block_cols: int, tile_elements: int = TILE_ELEMENTS) -> int:
    """How many rows of ``block_cols`` share a tile of about ``tile_elements`` (1 to MAX_BLOCK_ROWS)."""
    return max(1, min(MAX_BLOCK_ROWS, tile_elements // block_cols))


def cdiv(a: int, b: int) -> int:
    """Ceiling division of non-negative ints."""
    return -(-a // b)


@dataclasses.dataclass(frozen=True)
class RowTiling:
    """How a [n_rows, n_cols] row-wise kernel is cut: BLOCK_ROWS × BLOCK_D tiles, ``num_warps`` each, and (for
    kernels that sum over rows) ``programs_per_sm`` resident programs walking the tiles."""

    block_rows: int
    block_d: int
    num_warps: int
    programs_per_sm: int = PROGRAMS_PER_SM


def row_tiling(n_cols: int, *, reduces_rows: bool = False) -> RowTiling:
    """Tile shape and warps for rows of ``n_cols`` elements (n_cols ≤ MAX_FUSED_COLS).

    Measured on the H200 (bf16, D = 1024, 4096, 8192; benchmarks/RESULTS.md): 2048-element tiles with 4 warps
    serve the one-pass kernels best up to D = 8192, wider rows need more warps to keep registers per thread low;
    the kernels that walk tiles and sum over rows want 8 warps and 2 programs per SM from D = 4096.
    """
    block_d = next_power_of_2(n_cols)
    block_rows = rows_per_tile(block_d, ROW_TILE_ELEMENTS)
    tile = block_rows * block_d
    num_warps = max(4, min(16, tile // 2048))
    if reduces_rows and block_d >= 4096:
        return RowTiling(block_rows=block_rows, block_d=block_d, num_warps=max(8, num_warps), programs_per_sm=2)
    return RowTiling(block_rows=block_rows, block_d=block_d, num_warps=num_warps)


@functools.cache
def _multiprocessor_count() -> int:
    return int(getattr(jax.devices()[0], "core_count", 0) or 132)


def reduction_grid(n_rows: int, tiling: RowTiling, implementation: str) -> tuple[int, int]:
    """``(programs, tiles_per_program)`` for a kernel whose programs each walk a contiguous run of row tiles and
    emit one partial sum; every program has work, and together they cover all ``n_rows``."""
    if implementation == "interpret":
        limit = INTERPRETER_PROGRAMS
    else:
        limit = tiling.programs_per_sm * _multiprocessor_count()
    tiles = cdiv(n_rows, tiling.block_rows)
    tiles_per_program = cdiv(tiles, max(1, min(tiles, limit)))
    return cdiv(tiles, tiles_per_program), tiles_per_program
