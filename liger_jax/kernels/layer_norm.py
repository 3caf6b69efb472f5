"""LayerNorm kernels: y = (x - mean) · rstd · scale + bias, rstd = 1 / sqrt(var + eps), over the last axis.

The rows are the flattened leading axes of x; each row has ``n_cols`` elements and rows are ``row_stride``
elements apart. Everything is computed in fp32 and y is rounded once, to y's dtype. The variance is never
E[x²] - E[x]² (cancellation): a row that fits one tile gets two exact passes over registers, mean then
mean((x - mean)²); a longer row, walked in column blocks (see ``liger_jax.kernels._rows``), gets each block's mean
and centred sum of squares exactly and merges them with Chan et al.'s pairwise update, then a second pass
normalises block by block. The backward likewise: one pass for the row sums (each of a row's splits its own columns,
the splits sharing their sums), one for dx (for long rows, the row sums may come from a kernel of their own,
``layer_norm_bwd_row_sums``).
"""

import triton
import triton.language as tl

from liger_jax.kernels._rows import (
    add_to_block,
    arrived_split_sum,
    load_tile_again,
    load_weights_again,
    next_row_tile,
    partial_blocks,
    program_and_split,
    reversed_block,
    row_block,
    second_pass_block,
    split_blocks,
    store_blocks,
    store_split_sum,
    tile,
)


@triton.jit
def _moments_in_column_blocks(x_ptr, rows, n_rows, n_cols, row_stride, BLOCK_ROWS: tl.constexpr, BLOCK_D: tl.constexpr):
    """Each row's fp32 mean and variance [BLOCK_ROWS], reading the row one column block at a time (kept in L2 for
    the pass that normalises it)."""
    mean = tl.zeros((BLOCK_ROWS,), dtype=tl.float32)
    centred_squares = tl.zeros((BLOCK_ROWS,), dtype=tl.float32)
    for block in range((n_cols + BLOCK_D - 1) // BLOCK_D):
        first_col = block * BLOCK_D
        cols, offsets, mask = tile(rows, first_col, n_rows, n_cols, row_stride, BLOCK_D)
        x = tl.load(x_ptr + offsets, mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
        # Every block before this one is full: `seen` columns are merged already.
        seen = tl.cast(first_col, tl.float32)
        count = tl.cast(tl.minimum(n_cols - first_col, BLOCK_D), tl.float32)
        block_mean = tl.sum(x, axis=1) / count
        centred = tl.where(mask, x - block_mean[:, None], 0.0)
        delta = block_mean - mean
        mean += delta * (count / (seen + count))
        centred_squares += tl.sum(centred * centred, axis=1) + delta * delta * (seen * count / (seen + count))
    return mean, centred_squares / n_cols


@triton.jit
def _store_normalized(
    x, mean, rstd, scale_ptr, bias_ptr, y_ptr, cols, offsets, mask, n_cols: tl.constexpr, EVICTION: tl.constexpr
):
    """Stores y for a tile ``x`` [BLOCK_ROWS, BLOCK_D] in fp32 with its rows' fp32 ``mean`` and ``rstd``, with the
    L2 eviction policy EVICTION (``tl.store``'s; "" for none)."""
    col_mask = cols < n_cols
    scale = tl.load(scale_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
    bias = tl.load(bias_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
    y = (x - mean[:, None]) * rstd[:, None] * scale[None, :] + bias[None, :]
    tl.store(y_ptr + offsets, y.to(y_ptr.dtype.element_ty), mask=mask, eviction_policy=EVICTION)


@triton.jit
def layer_norm_fwd(
    x_ptr,  # [n_rows, n_cols] x.dtype
    scale_ptr,  # [n_cols] scale.dtype
    bias_ptr,  # [n_cols] bias.dtype
    n_rows,
    y_ptr,  # [n_rows, n_cols] x.dtype
    mean_ptr,  # [n_rows] fp32
    rstd_ptr,  # [n_rows] fp32
    eps: tl.constexpr,
    n_cols: tl.constexpr,
    row_stride: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """One program normalises BLOCK_ROWS rows; it stores y and the fp32 mean and rstd of each row."""
    rows = row_block(tl.program_id(0).to(tl.int64) * BLOCK_ROWS, BLOCK_ROWS)
    if n_cols <= BLOCK_D:
        cols, offsets, mask = tile(rows, 0, n_rows, n_cols, row_stride, BLOCK_D)
        x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        mean = tl.sum(x, axis=1) / n_cols
        # Masked columns would contribute (0 - mean)² to the variance: zero them.
        centred = tl.where(mask, x - mean[:, None], 0.0)
        rstd = 1.0 / tl.sqrt(tl.sum(centred * centred, axis=1) / n_cols + eps)
        _store_normalized(x, mean, rstd, scale_ptr, bias_ptr, y_ptr, cols, offsets, mask, n_cols, "")
    else:
        mean, var = _moments_in_column_blocks(x_ptr, rows, n_rows, n_cols, row_stride, BLOCK_ROWS, BLOCK_D)
        rstd = 1.0 / tl.sqrt(var + eps)
        for step in range((n_cols + BLOCK_D - 1) // BLOCK_D):
            first_col = reversed_block(step, n_cols, BLOCK_D)
            cols, offsets, mask = tile(rows, first_col, n_rows, n_cols, row_stride, BLOCK_D)
            # The last read of x, and y written once: first out of L2.
            x = tl.load(x_ptr + offsets, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
            _store_normalized(x, mean, rstd, scale_ptr, bias_ptr, y_ptr, cols, offsets, mask, n_cols, "evict_first")
    tl.store(mean_ptr + rows, mean, mask=rows < n_rows)
    tl.store(rstd_ptr + rows, rstd, mask=rows < n_rows)


@triton.jit
def _normed(x, mean, rstd, mask):
    """n = (x - mean) · rstd in fp32 for a tile ``x`` as loaded, 0 where masked (there x = 0, and x - mean is not)."""
    return tl.where(mask, (x.to(tl.float32) - mean[:, None]) * rstd[:, None], 0.0)


@triton.jit
def _row_sums(dy, normed, scale):
    """Σ g and Σ g · n over each row of a tile in fp32, with g = dy · scale (dy as loaded, ``scale`` fp32)."""
    g = dy.to(tl.float32) * scale[None, :]
    return tl.sum(g, axis=1), tl.sum(g * normed, axis=1)


@triton.jit
def _load_block(dy_ptr, x_ptr, mean, rstd, rows, first_col, n_rows, n_cols, row_stride, BLOCK_D: tl.constexpr):
    """A column block's dy (as loaded) and n = (x - mean) · rstd in fp32, with its columns, offsets and mask."""
    cols, offsets, mask = tile(rows, first_col, n_rows, n_cols, row_stride, BLOCK_D)
    dy = tl.load(dy_ptr + offsets, mask=mask, other=0.0)
    normed = _normed(tl.load(x_ptr + offsets, mask=mask, other=0.0), mean, rstd, mask)
    return dy, normed, cols, offsets, mask


@triton.jit
def _row_sums_in_column_blocks(
    dy_ptr,
    x_ptr,
    scale_ptr,
    mean,
    rstd,
    rows,
    first_col,
    n_rows,
    N_BLOCKS: tl.constexpr,
    n_cols: tl.constexpr,
    row_stride: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """Σ g and Σ g · n [BLOCK_ROWS] fp32 of ``rows`` over N_BLOCKS column blocks from ``first_col``, one block at a
    time."""
    sum_g = tl.zeros((BLOCK_ROWS,), dtype=tl.float32)
    sum_gn = tl.zeros((BLOCK_ROWS,), dtype=tl.float32)
    for block in range(N_BLOCKS):
        dy, normed, cols, _, _ = _load_block(
            dy_ptr, x_ptr, mean, rstd, rows, first_col + block * BLOCK_D, n_rows, n_cols, row_stride, BLOCK_D
        )
        block_g, block_gn = _row_sums(dy, normed, tl.load(scale_ptr + cols, mask=cols < n_cols, other=0.0))
        sum_g += block_g
        sum_gn += block_gn
    return sum_g, sum_gn


@triton.jit
def _with_other_splits(
    own_g,
    own_gn,
    dy_ptr,
    x_ptr,
    scale_ptr,
    split_g_ptr,
    split_gn_ptr,
    mean,
    rstd,
    rows,
    split,
    n_rows,
    COLUMN_SPLITS: tl.constexpr,
    n_cols: tl.constexpr,
    row_stride: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """Σ g and Σ g · n [BLOCK_ROWS] fp32 over the whole of ``rows`` from this split's sums over its own columns,
    already announced: the other splits' come from theirs, or, where one has not arrived, from their columns summed
    here the same way (the same values)."""
    OWN_BLOCKS: tl.constexpr = split_blocks(n_cols, BLOCK_D, COLUMN_SPLITS)
    sum_g, sum_gn = own_g, own_gn
    if COLUMN_SPLITS > 1:
        sum_g = tl.zeros((BLOCK_ROWS,), dtype=tl.float32)
        sum_gn = tl.zeros((BLOCK_ROWS,), dtype=tl.float32)
        for other in tl.static_range(COLUMN_SPLITS):
            part_g, part_gn = own_g, own_gn
            if other != split:
                arrived, part_g, part_gn = arrived_split_sum(split_g_ptr, split_gn_ptr, other, rows, n_rows)
                if not arrived:
                    part_g, part_gn = _row_sums_in_column_blocks(
                        dy_ptr, x_ptr, scale_ptr, mean, rstd, rows, other * OWN_BLOCKS * BLOCK_D, n_rows,
                        OWN_BLOCKS, n_cols, row_stride, BLOCK_ROWS, BLOCK_D,
                    )  # fmt: skip
            sum_g += part_g
            sum_gn += part_gn
    return sum_g, sum_gn


@triton.jit
def _announce(split_g_ptr, split_gn_ptr, own_g, own_gn, rows, split, n_rows, COLUMN_SPLITS: tl.constexpr):
    """Shares this split's sums ``own_g``, ``own_gn`` [BLOCK_ROWS] of ``rows`` with the row's other splits."""
    if COLUMN_SPLITS > 1:
        store_split_sum(split_g_ptr, split, rows, n_rows, own_g)
        store_split_sum(split_gn_ptr, split, rows, n_rows, own_gn)


@triton.jit
def _load_row_stats(mean_ptr, rstd_ptr, rows, n_rows):
    """The mean and rstd [BLOCK_ROWS] fp32 of ``rows`` (0 past ``n_rows``)."""
    mean = tl.load(mean_ptr + rows, mask=rows < n_rows, other=0.0)
    rstd = tl.load(rstd_ptr + rows, mask=rows < n_rows, other=0.0)
    return mean, rstd


@triton.jit
def layer_norm_bwd_row_sums(
    dy_ptr,  # [n_rows, n_cols] x.dtype
    x_ptr,  # [n_rows, n_cols] x.dtype
    scale_ptr,  # [n_cols] scale.dtype
    mean_ptr,  # [n_rows] fp32
    rstd_ptr,  # [n_rows] fp32
    n_rows,
    sum_g_ptr,  # [n_rows] fp32
    sum_gn_ptr,  # [n_rows] fp32
    n_cols: tl.constexpr,
    row_stride: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """One program stores Σ g and Σ g · n of BLOCK_ROWS rows (g = dy · scale, n = (x - mean) · rstd) in fp32: the
    row sums ``layer_norm_bwd`` takes with SUMS_GIVEN."""
    rows = row_block(tl.program_id(0).to(tl.int64) * BLOCK_ROWS, BLOCK_ROWS)
    mean = tl.load(mean_ptr + rows, mask=rows < n_rows, other=0.0)
    rstd = tl.load(rstd_ptr + rows, mask=rows < n_rows, other=0.0)
    sum_g, sum_gn = _row_sums_in_column_blocks(
        dy_ptr, x_ptr, scale_ptr, mean, rstd, rows, 0, n_rows,
        split_blocks(n_cols, BLOCK_D, 1), n_cols, row_stride, BLOCK_ROWS, BLOCK_D,
    )  # fmt: skip
    tl.store(sum_g_ptr + rows, sum_g, mask=rows < n_rows)
    tl.store(sum_gn_ptr + rows, sum_gn, mask=rows < n_rows)


@triton.jit
def _dx(dy, normed, rstd, scale, mean_g, mean_gn):
    """dx = rstd · (g - mean(g) - n · mean(g · n)) in fp32 for one tile."""
    g = dy.to(tl.float32) * scale[None, :]
    return rstd[:, None] * (g - mean_g[:, None] - normed * mean_gn[:, None])


@triton.jit
def _load_backward_tile(dy_ptr, x_ptr, mean_ptr, rstd_ptr, rows, offsets, mask, n_rows):
    """dy and x of a tile as stored (0 where masked) and its rows' mean and rstd."""
    dy = tl.load(dy_ptr + offsets, mask=mask, other=0.0)
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0)
    mean = tl.load(mean_ptr + rows, mask=rows < n_rows, other=0.0)
    rstd = tl.load(rstd_ptr + rows, mask=rows < n_rows, other=0.0)
    return dy, x, mean, rstd


@triton.jit
def _backward_in_tiles(
    dy_ptr,
    x_ptr,
    scale_ptr,
    mean_ptr,
    rstd_ptr,
    n_rows,
    dx_ptr,
    dscale_partial_ptr,
    dbias_partial_ptr,
    PREFETCH: tl.constexpr,
    TILES_PER_PROGRAM: tl.constexpr,
    n_cols: tl.constexpr,
    row_stride: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """The backward of rows that fit one tile: the program's dscale and dbias stay in registers, and so do scale and
    the tile with PREFETCH; without, they are loaded again after the row sums (see ``_rows.load_tile_again``)."""
    pid = program_and_split()[0]
    first_row = pid * TILES_PER_PROGRAM * BLOCK_ROWS
    rows = row_block(first_row, BLOCK_ROWS)
    cols, offsets, mask = tile(rows, 0, n_rows, n_cols, row_stride, BLOCK_D)
    if PREFETCH:
        scale = tl.load(scale_ptr + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
    dscale = tl.zeros((BLOCK_D,), dtype=tl.float32)
    dbias = tl.zeros((BLOCK_D,), dtype=tl.float32)
    if PREFETCH:
        dy, x, mean, rstd = _load_backward_tile(dy_ptr, x_ptr, mean_ptr, rstd_ptr, rows, offsets, mask, n_rows)
    for tile_index in range(TILES_PER_PROGRAM):
        if not PREFETCH:
            dy, x, mean, rstd = _load_backward_tile(dy_ptr, x_ptr, mean_ptr, rstd_ptr, rows, offsets, mask, n_rows)
        next_rows = row_block(first_row + (tile_index + 1) * BLOCK_ROWS, BLOCK_ROWS)
        _, next_offsets, next_mask = tile(next_rows, 0, n_rows, n_cols, row_stride, BLOCK_D)
        if PREFETCH:
            # The next tile's loads are issued before this tile's arithmetic, so memory latency hides behind it,
            # at the price of a second tile's registers.
            next_dy, next_x, next_mean, next_rstd = _load_backward_tile(
                dy_ptr, x_ptr, mean_ptr, rstd_ptr, next_rows, next_offsets, next_mask, n_rows
            )
        if not PREFETCH:
            scale = tl.load(scale_ptr + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
        normed = _normed(x, mean, rstd, mask)
        sum_g, sum_gn = _row_sums(dy, normed, scale)
        if not PREFETCH:
            # A wide tile, scale, dscale and dbias would not fit the registers together (ptxas at 16384 columns and
            # 16 warps: 216-272 bytes of spills; 32-152 this way).
            dy, x = load_tile_again(dy_ptr, offsets, mask), load_tile_again(x_ptr, offsets, mask)
            scale = load_weights_again(scale_ptr, cols, n_cols).to(tl.float32)
            normed = _normed(x, mean, rstd, mask)
        dx = _dx(dy, normed, rstd, scale, sum_g / n_cols, sum_gn / n_cols)
        tl.store(dx_ptr + offsets, dx.to(dx_ptr.dtype.element_ty), mask=mask)
        dy_f32 = dy.to(tl.float32)
        dscale += tl.sum(dy_f32 * normed, axis=0)
        dbias += tl.sum(dy_f32, axis=0)
        rows, offsets, mask = next_rows, next_offsets, next_mask
        if PREFETCH:
            dy, x, mean, rstd = next_dy, next_x, next_mean, next_rstd
    tl.store(dscale_partial_ptr + pid * n_cols + cols, dscale, mask=cols < n_cols)
    tl.store(dbias_partial_ptr + pid * n_cols + cols, dbias, mask=cols < n_cols)


@triton.jit
def _backward_in_column_blocks(
    dy_ptr,
    x_ptr,
    scale_ptr,
    mean_ptr,
    rstd_ptr,
    sum_g_ptr,
    sum_gn_ptr,
    n_rows,
    dx_ptr,
    dscale_partial_ptr,
    dbias_partial_ptr,
    split_g_ptr,
    split_gn_ptr,
    TILES_PER_PROGRAM: tl.constexpr,
    COLUMN_SPLITS: tl.constexpr,
    SUMS_GIVEN: tl.constexpr,
    SUMS_AHEAD: tl.constexpr,
    n_cols: tl.constexpr,
    row_stride: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """The backward of rows longer than a tile: per row tile, Σ g and Σ g · n over the row (each split sums its own
    columns and the splits share their sums; read from sum_g and sum_gn instead with SUMS_GIVEN), then one pass over
    this program's split of the columns for dx, dscale and dbias, whose partial sums stay in registers (see
    ``liger_jax.kernels._rows``). With SUMS_AHEAD (and not SUMS_GIVEN), the pass that writes a row tile's dx also
    sums the next row tile's, block by block, as ``kernels.rms_norm``'s does."""
    OWN_BLOCKS: tl.constexpr = split_blocks(n_cols, BLOCK_D, COLUMN_SPLITS)
    AHEAD: tl.constexpr = SUMS_AHEAD and not SUMS_GIVEN
    pid, split = program_and_split()
    split_first_col = split * OWN_BLOCKS * BLOCK_D
    first_tile = pid * TILES_PER_PROGRAM
    dscale = tl.zeros((partial_blocks(n_cols, BLOCK_D, COLUMN_SPLITS), BLOCK_D), dtype=tl.float32)
    dbias = tl.zeros((partial_blocks(n_cols, BLOCK_D, COLUMN_SPLITS), BLOCK_D), dtype=tl.float32)
    if AHEAD:
        rows = row_block(first_tile * BLOCK_ROWS, BLOCK_ROWS)
        mean, rstd = _load_row_stats(mean_ptr, rstd_ptr, rows, n_rows)
        own_g, own_gn = _row_sums_in_column_blocks(
            dy_ptr, x_ptr, scale_ptr, mean, rstd, rows, split_first_col, n_rows,
            OWN_BLOCKS, n_cols, row_stride, BLOCK_ROWS, BLOCK_D,
        )  # fmt: skip
        _announce(split_g_ptr, split_gn_ptr, own_g, own_gn, rows, split, n_rows, COLUMN_SPLITS)
    for tile_index in range(TILES_PER_PROGRAM):
        row_tile = first_tile + tile_index
        rows = row_block(row_tile * BLOCK_ROWS, BLOCK_ROWS)
        mean, rstd = _load_row_stats(mean_ptr, rstd_ptr, rows, n_rows)
        if SUMS_GIVEN:
            sum_g = tl.load(sum_g_ptr + rows, mask=rows < n_rows, other=0.0)
            sum_gn = tl.load(sum_gn_ptr + rows, mask=rows < n_rows, other=0.0)
        else:
            if not AHEAD:
                own_g, own_gn = _row_sums_in_column_blocks(
                    dy_ptr, x_ptr, scale_ptr, mean, rstd, rows, split_first_col, n_rows,
                    OWN_BLOCKS, n_cols, row_stride, BLOCK_ROWS, BLOCK_D,
                )  # fmt: skip
                _announce(split_g_ptr, split_gn_ptr, own_g, own_gn, rows, split, n_rows, COLUMN_SPLITS)
            sum_g, sum_gn = _with_other_splits(
                own_g, own_gn, dy_ptr, x_ptr, scale_ptr, split_g_ptr, split_gn_ptr, mean, rstd, rows, split,
                n_rows, COLUMN_SPLITS, n_cols, row_stride, BLOCK_ROWS, BLOCK_D,
            )  # fmt: skip
        if AHEAD:
            has_next, next_rows, next_n_rows = next_row_tile(
                row_tile, tile_index, n_rows, TILES_PER_PROGRAM, BLOCK_ROWS
            )
            next_mean, next_rstd = _load_row_stats(mean_ptr, rstd_ptr, next_rows, next_n_rows)
            own_g = tl.zeros((BLOCK_ROWS,), dtype=tl.float32)
            own_gn = tl.zeros((BLOCK_ROWS,), dtype=tl.float32)
        for step in range(OWN_BLOCKS):
            first_col = second_pass_block(step, split_first_col, OWN_BLOCKS, BLOCK_D, AHEAD)
            dy, normed, cols, offsets, mask = _load_block(
                dy_ptr, x_ptr, mean, rstd, rows, first_col, n_rows, n_cols, row_stride, BLOCK_D
            )
            scale = tl.load(scale_ptr + cols, mask=cols < n_cols, other=0.0)
            if AHEAD:
                next_dy, next_normed, _, _, _ = _load_block(
                    dy_ptr, x_ptr, next_mean, next_rstd, next_rows, first_col, next_n_rows, n_cols, row_stride, BLOCK_D
                )
                block_g, block_gn = _row_sums(next_dy, next_normed, scale)
                own_g += block_g
                own_gn += block_gn
            dx = _dx(dy, normed, rstd, scale.to(tl.float32), sum_g / n_cols, sum_gn / n_cols)
            tl.store(dx_ptr + offsets, dx.to(dx_ptr.dtype.element_ty), mask=mask)
            dy_f32 = dy.to(tl.float32)
            dscale = add_to_block(dscale, first_col - split_first_col, tl.sum(dy_f32 * normed, axis=0), BLOCK_D)
            dbias = add_to_block(dbias, first_col - split_first_col, tl.sum(dy_f32, axis=0), BLOCK_D)
        if AHEAD:
            if has_next:
                _announce(split_g_ptr, split_gn_ptr, own_g, own_gn, next_rows, split, n_rows, COLUMN_SPLITS)
    store_blocks(dscale_partial_ptr + pid * n_cols, dscale, split_first_col, n_cols, OWN_BLOCKS, BLOCK_D)
    store_blocks(dbias_partial_ptr + pid * n_cols, dbias, split_first_col, n_cols, OWN_BLOCKS, BLOCK_D)


@triton.jit
def layer_norm_bwd(
    dy_ptr,  # [n_rows, n_cols] x.dtype
    x_ptr,  # [n_rows, n_cols] x.dtype
    scale_ptr,  # [n_cols] scale.dtype
    mean_ptr,  # [n_rows] fp32
    rstd_ptr,  # [n_rows] fp32
    sum_g_ptr,  # [n_rows] fp32, read with SUMS_GIVEN only
    sum_gn_ptr,  # [n_rows] fp32, read with SUMS_GIVEN only
    n_rows,
    dx_ptr,  # [n_rows, n_cols] x.dtype
    dscale_partial_ptr,  # [num_programs, n_cols] fp32
    dbias_partial_ptr,  # [num_programs, n_cols] fp32
    split_g_ptr,  # [COLUMN_SPLITS, n_rows, 2] int32, zeroed: each split's Σ g over its columns, marked
    split_gn_ptr,  # [COLUMN_SPLITS, n_rows, 2] int32, zeroed: each split's Σ g · n over its columns, marked
    SUMS_GIVEN: tl.constexpr,
    PREFETCH: tl.constexpr,
    TILES_PER_PROGRAM: tl.constexpr,
    COLUMN_SPLITS: tl.constexpr,
    SUMS_AHEAD: tl.constexpr,
    n_cols: tl.constexpr,
    row_stride: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """dx = rstd · (g - mean(g) - n · mean(g · n)) with n = (x - mean) · rstd, g = dy · scale, row by row.

    Program p (split s; see ``_rows.program_and_split``) walks TILES_PER_PROGRAM tiles of BLOCK_ROWS rows from row p ·
    TILES_PER_PROGRAM · BLOCK_ROWS and writes its fp32 partial sums of dy · n (dscale) and dy (dbias) into row p of
    the partials, at the columns of split s (of COLUMN_SPLITS: 1 for rows of one tile); XLA adds the partials
    (deterministic, no atomics). Rows walked in column blocks take their Σ g and Σ g · n from sum_g and sum_gn with
    SUMS_GIVEN (``layer_norm_bwd_row_sums``'s), so each split reads only its own columns.
    """
    if n_cols <= BLOCK_D:
        _backward_in_tiles(
            dy_ptr, x_ptr, scale_ptr, mean_ptr, rstd_ptr, n_rows, dx_ptr, dscale_partial_ptr, dbias_partial_ptr,
            PREFETCH, TILES_PER_PROGRAM, n_cols, row_stride, BLOCK_ROWS, BLOCK_D,
        )  # fmt: skip
    else:
        _backward_in_column_blocks(
            dy_ptr, x_ptr, scale_ptr, mean_ptr, rstd_ptr, sum_g_ptr, sum_gn_ptr, n_rows, dx_ptr, dscale_partial_ptr,
            dbias_partial_ptr, split_g_ptr, split_gn_ptr, TILES_PER_PROGRAM, COLUMN_SPLITS, SUMS_GIVEN,
            SUMS_AHEAD, n_cols, row_stride, BLOCK_ROWS, BLOCK_D,
        )  # fmt: skip
