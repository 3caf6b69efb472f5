"""RMSNorm kernels: y = x · rstd · (offset + scale), rstd = 1 / sqrt(mean(x²) + eps), over the last axis.

The rows are the flattened leading axes of x; each row has ``n_cols`` elements and rows are ``row_stride``
elements apart. Statistics are always accumulated in fp32. The fused-add kernels normalise s = x + residual
(rounded to x.dtype) and also store s, reading each input once (Liger's FusedAddRMSNorm).

A row that fits one tile (``n_cols <= BLOCK_D``) is loaded once and kept in registers. A longer row is walked in
column blocks twice (see ``liger_jax.kernels._rows``): the forward sums x² (the fused add storing s as it goes) and
then normalises block by block, reading x or s again from L2, where the first pass's cache hints keep it; the
backward sums g · n over the row (each of a row's splits its own columns, the splits sharing their sums) and then writes
dx over its split of the columns, adding each block's dscale into the program's partial sums in registers (see
``liger_jax.kernels._rows``).
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

# The CASTING constexpr; liger_jax.ops.rms_norm maps the casting_mode names onto these codes.
CASTING_NONE = tl.constexpr(0)
CASTING_LLAMA = tl.constexpr(1)
CASTING_GEMMA = tl.constexpr(2)


@triton.jit
def _sum_squares(x):
    """Σ x² over each row of a tile as loaded (x.dtype, 0 where masked), in fp32: [BLOCK_ROWS]."""
    x_f32 = x.to(tl.float32)
    return tl.sum(x_f32 * x_f32, axis=1)


@triton.jit
def _rstd(sum_squares, n_cols: tl.constexpr, eps: tl.constexpr):
    """1 / sqrt(mean(x²) + eps) in fp32 from each row's fp32 sum of squares."""
    return 1.0 / tl.sqrt(sum_squares / n_cols + eps)


@triton.jit
def _load_scale(scale_ptr, cols, n_cols: tl.constexpr, offset: tl.constexpr):
    """offset + scale of the columns ``cols`` [BLOCK_D] in fp32 (``offset`` where masked)."""
    return offset + tl.load(scale_ptr + cols, mask=cols < n_cols, other=0.0).to(tl.float32)


@triton.jit
def _normalized(x, rstd, scale, CASTING: tl.constexpr):
    """y in fp32, still to be rounded to x.dtype, of a tile ``x`` [BLOCK_ROWS, BLOCK_D] as loaded, its rows' fp32
    ``rstd`` [BLOCK_ROWS] and its columns' fp32 ``scale`` [BLOCK_D], which already includes the offset."""
    x_f32 = x.to(tl.float32)
    if CASTING == CASTING_LLAMA:
        # Llama rounds the normalised x to the input dtype before the scale multiplies it.
        normed = (x_f32 * rstd[:, None]).to(x.dtype).to(tl.float32)
        y = normed * scale[None, :]
    elif CASTING == CASTING_GEMMA:
        y = x_f32 * rstd[:, None] * scale[None, :]
    else:
        # Every product rounded to the input dtype, as a model without casts computes it. The fp32 product of two
        # bf16/fp16 values is exact, so rounding it equals the native product (the interpreter has no bf16 math).
        rstd_in = rstd.to(x.dtype).to(tl.float32)
        scale_in = scale.to(x.dtype).to(tl.float32)
        y = (x_f32 * rstd_in[:, None]).to(x.dtype).to(tl.float32) * scale_in[None, :]
    return y


@triton.jit
def _load_input(x_ptr, residual_ptr, offsets, mask, ADD_RESIDUAL: tl.constexpr, EVICTION: tl.constexpr):
    """The tile to normalise: x, or with ADD_RESIDUAL x + residual rounded to x.dtype (0 where masked); loaded with
    the L2 eviction policy EVICTION (``tl.load``'s; "" for none)."""
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0, eviction_policy=EVICTION)
    if ADD_RESIDUAL:
        residual = tl.load(residual_ptr + offsets, mask=mask, other=0.0, eviction_policy=EVICTION)
        # The fp32 sum of two bf16/fp16 values rounds to the same x.dtype value as the native sum.
        x = (x.to(tl.float32) + residual.to(tl.float32)).to(x.dtype)
    return x


@triton.jit
def _store_normalized(
    x,
    rstd,
    scale_ptr,
    y_ptr,
    cols,
    offsets,
    mask,
    n_cols: tl.constexpr,
    offset: tl.constexpr,
    CASTING: tl.constexpr,
    EVICTION: tl.constexpr,
):
    """Stores y for the loaded tile ``x`` with its rows' ``rstd``, with the L2 eviction policy EVICTION
    (``tl.store``'s; "" for none)."""
    y = _normalized(x, rstd, _load_scale(scale_ptr, cols, n_cols, offset), CASTING)
    tl.store(y_ptr + offsets, y.to(y_ptr.dtype.element_ty), mask=mask, eviction_policy=EVICTION)


@triton.jit
def _forward(
    x_ptr,
    residual_ptr,
    scale_ptr,
    n_rows,
    y_ptr,
    sum_ptr,
    rstd_ptr,
    eps: tl.constexpr,
    offset: tl.constexpr,
    CASTING: tl.constexpr,
    ADD_RESIDUAL: tl.constexpr,
    n_cols: tl.constexpr,
    row_stride: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """One program normalises BLOCK_ROWS rows, in one tile or in column blocks, and stores y and each row's rstd."""
    rows = row_block(tl.program_id(0).to(tl.int64) * BLOCK_ROWS, BLOCK_ROWS)
    if n_cols <= BLOCK_D:
        cols, offsets, mask = tile(rows, 0, n_rows, n_cols, row_stride, BLOCK_D)
        x = _load_input(x_ptr, residual_ptr, offsets, mask, ADD_RESIDUAL, "")
        rstd = _rstd(_sum_squares(x), n_cols, eps)
        if ADD_RESIDUAL:
            tl.store(sum_ptr + offsets, x, mask=mask)
        _store_normalized(x, rstd, scale_ptr, y_ptr, cols, offsets, mask, n_cols, offset, CASTING, "")
    else:
        # The second pass reads the tile it normalises from L2: x, or s (stored by the first pass, half the bytes
        # of x and the residual). What it reads again is kept in L2 first; what is read or written once, last.
        sum_squares = tl.zeros((BLOCK_ROWS,), dtype=tl.float32)
        for block in range((n_cols + BLOCK_D - 1) // BLOCK_D):
            cols, offsets, mask = tile(rows, block * BLOCK_D, n_rows, n_cols, row_stride, BLOCK_D)
            if ADD_RESIDUAL:
                x = _load_input(x_ptr, residual_ptr, offsets, mask, ADD_RESIDUAL, "evict_first")
                tl.store(sum_ptr + offsets, x, mask=mask, eviction_policy="evict_last")
            else:
                x = _load_input(x_ptr, residual_ptr, offsets, mask, ADD_RESIDUAL, "evict_last")
            sum_squares += _sum_squares(x)
        rstd = _rstd(sum_squares, n_cols, eps)
        normalised_ptr = sum_ptr if ADD_RESIDUAL else x_ptr
        for step in range((n_cols + BLOCK_D - 1) // BLOCK_D):
            first_col = reversed_block(step, n_cols, BLOCK_D)
            cols, offsets, mask = tile(rows, first_col, n_rows, n_cols, row_stride, BLOCK_D)
            x = tl.load(normalised_ptr + offsets, mask=mask, other=0.0, eviction_policy="evict_first")
            _store_normalized(x, rstd, scale_ptr, y_ptr, cols, offsets, mask, n_cols, offset, CASTING, "evict_first")
    tl.store(rstd_ptr + rows, rstd, mask=rows < n_rows)


@triton.jit
def rms_norm_fwd(
    x_ptr,  # [n_rows, n_cols] x.dtype
    scale_ptr,  # [n_cols] scale.dtype
    n_rows,
    y_ptr,  # [n_rows, n_cols] x.dtype
    rstd_ptr,  # [n_rows] fp32
    eps: tl.constexpr,
    offset: tl.constexpr,
    CASTING: tl.constexpr,
    n_cols: tl.constexpr,
    row_stride: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """One program normalises BLOCK_ROWS rows; it stores y and the fp32 rstd of each row."""
    # x_ptr and y_ptr stand in for the residual and the sum, which ADD_RESIDUAL=False never touches.
    _forward(
        x_ptr, x_ptr, scale_ptr, n_rows, y_ptr, y_ptr, rstd_ptr,
        eps, offset, CASTING, False, n_cols, row_stride, BLOCK_ROWS, BLOCK_D,
    )  # fmt: skip


@triton.jit
def fused_add_rms_norm_fwd(
    x_ptr,  # [n_rows, n_cols] x.dtype
    residual_ptr,  # [n_rows, n_cols] x.dtype
    scale_ptr,  # [n_cols] scale.dtype
    n_rows,
    y_ptr,  # [n_rows, n_cols] x.dtype
    sum_ptr,  # [n_rows, n_cols] x.dtype
    rstd_ptr,  # [n_rows] fp32
    eps: tl.constexpr,
    offset: tl.constexpr,
    CASTING: tl.constexpr,
    n_cols: tl.constexpr,
    row_stride: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """s = x + residual, rounded to x.dtype and stored, then y = RMSNorm(s) and its rstd, as ``rms_norm_fwd``."""
    _forward(
        x_ptr, residual_ptr, scale_ptr, n_rows, y_ptr, sum_ptr, rstd_ptr,
        eps, offset, CASTING, True, n_cols, row_stride, BLOCK_ROWS, BLOCK_D,
    )  # fmt: skip


@triton.jit
def _g_normed(dy, x, rstd, scale):
    """g · n of each element of a tile in fp32, with g = dy · scale and n = x · rstd (dy and x as loaded)."""
    return dy.to(tl.float32) * scale[None, :] * (x.to(tl.float32) * rstd[:, None])


@triton.jit
def _sum_g_normed(dy, x, rstd, scale):
    """Σ g · n over each row of a tile in fp32 (see ``_g_normed``)."""
    return tl.sum(_g_normed(dy, x, rstd, scale), axis=1)


@triton.jit
def _gradients(dy, x, rstd, scale, mean_gn, CASTING: tl.constexpr):
    """``(dx, dscale)`` in fp32 of one tile: dx [BLOCK_ROWS, BLOCK_D] and the tile's dscale [BLOCK_D].

    dx = rstd · (g - n · mean(g · n)) with n = x · rstd, g = dy · scale, where ``scale`` [BLOCK_D] fp32 already
    includes the offset; ``dy`` and ``x`` as loaded (x.dtype), ``rstd`` and ``mean_gn`` [BLOCK_ROWS] fp32, all 0
    where masked. dscale multiplies dy by n as the forward rounded it (that is what y's dependence on scale is); dx
    passes straight through the roundings.
    """
    dy = dy.to(tl.float32)
    x_f32 = x.to(tl.float32)
    normed = x_f32 * rstd[:, None]
    dx = rstd[:, None] * (dy * scale[None, :] - normed * mean_gn[:, None])
    if CASTING == CASTING_LLAMA:
        normed = normed.to(x.dtype).to(tl.float32)
    elif CASTING == CASTING_NONE:
        rstd_in = rstd.to(x.dtype).to(tl.float32)
        normed = (x_f32 * rstd_in[:, None]).to(x.dtype).to(tl.float32)
    return dx, tl.sum(dy * normed, axis=0)


@triton.jit
def _store_dx(dx, dsum_ptr, dx_ptr, offsets, mask, ADD_COTANGENT: tl.constexpr):
    """Stores dx, plus with ADD_COTANGENT the cotangent of s read at the same offsets first (so dx may alias it)."""
    if ADD_COTANGENT:
        dx += tl.load(dsum_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    tl.store(dx_ptr + offsets, dx.to(dx_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _load_backward_tile(dy_ptr, x_ptr, rstd_ptr, rows, offsets, mask, n_rows):
    """dy and x of a tile as stored (0 where masked) and its rows' rstd."""
    dy = tl.load(dy_ptr + offsets, mask=mask, other=0.0)
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0)
    rstd = tl.load(rstd_ptr + rows, mask=rows < n_rows, other=0.0)
    return dy, x, rstd


@triton.jit
def _backward_in_tiles(
    dy_ptr,
    dsum_ptr,
    x_ptr,
    scale_ptr,
    rstd_ptr,
    n_rows,
    dx_ptr,
    dscale_partial_ptr,
    offset: tl.constexpr,
    CASTING: tl.constexpr,
    ADD_COTANGENT: tl.constexpr,
    PREFETCH: tl.constexpr,
    TILES_PER_PROGRAM: tl.constexpr,
    n_cols: tl.constexpr,
    row_stride: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """The backward of rows that fit one tile: the program's dscale stays in registers, and so do scale and the tile
    with PREFETCH; without, they are loaded again after the row sums (see ``_rows.load_tile_again``)."""
    pid = program_and_split()[0]
    first_row = pid * TILES_PER_PROGRAM * BLOCK_ROWS
    rows = row_block(first_row, BLOCK_ROWS)
    cols, offsets, mask = tile(rows, 0, n_rows, n_cols, row_stride, BLOCK_D)
    if PREFETCH:
        scale = _load_scale(scale_ptr, cols, n_cols, offset)
    dscale = tl.zeros((BLOCK_D,), dtype=tl.float32)
    if PREFETCH:
        dy, x, rstd = _load_backward_tile(dy_ptr, x_ptr, rstd_ptr, rows, offsets, mask, n_rows)
    for tile_index in range(TILES_PER_PROGRAM):
        if not PREFETCH:
            dy, x, rstd = _load_backward_tile(dy_ptr, x_ptr, rstd_ptr, rows, offsets, mask, n_rows)
        next_rows = row_block(first_row + (tile_index + 1) * BLOCK_ROWS, BLOCK_ROWS)
        _, next_offsets, next_mask = tile(next_rows, 0, n_rows, n_cols, row_stride, BLOCK_D)
        if PREFETCH:
            # The next tile's loads are issued before this tile's arithmetic, so memory latency hides behind it,
            # at the price of a second tile's registers.
            next_dy, next_x, next_rstd = _load_backward_tile(
                dy_ptr, x_ptr, rstd_ptr, next_rows, next_offsets, next_mask, n_rows
            )
        if not PREFETCH:
            scale = _load_scale(scale_ptr, cols, n_cols, offset)
        mean_gn = _sum_g_normed(dy, x, rstd, scale) / n_cols
        if not PREFETCH:
            # A wide tile, scale and dscale would not fit the registers together (ptxas: 164-188 bytes of spills at
            # 16384 columns and 16 warps; none this way).
            dy, x = load_tile_again(dy_ptr, offsets, mask), load_tile_again(x_ptr, offsets, mask)
            scale = offset + load_weights_again(scale_ptr, cols, n_cols).to(tl.float32)
        dx, tile_dscale = _gradients(dy, x, rstd, scale, mean_gn, CASTING)
        _store_dx(dx, dsum_ptr, dx_ptr, offsets, mask, ADD_COTANGENT)
        dscale += tile_dscale
        rows, offsets, mask = next_rows, next_offsets, next_mask
        if PREFETCH:
            dy, x, rstd = next_dy, next_x, next_rstd
    tl.store(dscale_partial_ptr + pid * n_cols + cols, dscale, mask=cols < n_cols)


@triton.jit
def _load_gradient_inputs(dy_ptr, x_ptr, scale_ptr, rows, first_col, n_rows, offset, n_cols, row_stride, BLOCK_D):
    """A column block's dy and x (as loaded), its offsets and mask, and its columns' fp32 scale (with the offset)."""
    cols, offsets, mask = tile(rows, first_col, n_rows, n_cols, row_stride, BLOCK_D)
    dy = tl.load(dy_ptr + offsets, mask=mask, other=0.0)
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0)
    return dy, x, offsets, mask, _load_scale(scale_ptr, cols, n_cols, offset)


@triton.jit
def _split_sum_g_normed(
    dy_ptr,
    x_ptr,
    scale_ptr,
    rstd,
    rows,
    first_col,
    n_rows,
    offset: tl.constexpr,
    N_BLOCKS: tl.constexpr,
    n_cols: tl.constexpr,
    row_stride: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """Σ g · n [BLOCK_ROWS] fp32 of ``rows`` over N_BLOCKS column blocks from ``first_col`` (see ``_g_normed``)."""
    # Summed across the warps once, not once a block: no barrier holds a warp back from its next loads.
    gn = tl.zeros((BLOCK_ROWS, BLOCK_D), dtype=tl.float32)
    for block in range(N_BLOCKS):
        dy, x, _, _, scale = _load_gradient_inputs(
            dy_ptr, x_ptr, scale_ptr, rows, first_col + block * BLOCK_D, n_rows, offset, n_cols, row_stride, BLOCK_D
        )
        gn += _g_normed(dy, x, rstd, scale)
    return tl.sum(gn, axis=1)


@triton.jit
def _with_other_splits(
    own,
    dy_ptr,
    x_ptr,
    scale_ptr,
    split_sums_ptr,
    rstd,
    rows,
    split,
    n_rows,
    offset: tl.constexpr,
    COLUMN_SPLITS: tl.constexpr,
    n_cols: tl.constexpr,
    row_stride: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """Σ g · n [BLOCK_ROWS] fp32 over the whole of ``rows`` from this split's sums over its own columns, ``own``,
    already announced: the other splits' come from theirs, or, where one has not arrived, from their columns summed
    here the same way (the same value; see ``_rows``)."""
    OWN_BLOCKS: tl.constexpr = split_blocks(n_cols, BLOCK_D, COLUMN_SPLITS)
    total = own
    if COLUMN_SPLITS > 1:
        total = tl.zeros((BLOCK_ROWS,), dtype=tl.float32)
        for other in tl.static_range(COLUMN_SPLITS):
            part = own
            if other != split:
                arrived, part, _ = arrived_split_sum(split_sums_ptr, None, other, rows, n_rows)
                if not arrived:
                    part = _split_sum_g_normed(
                        dy_ptr, x_ptr, scale_ptr, rstd, rows, other * OWN_BLOCKS * BLOCK_D, n_rows,
                        offset, OWN_BLOCKS, n_cols, row_stride, BLOCK_ROWS, BLOCK_D,
                    )  # fmt: skip
            total += part
    return total


@triton.jit
def _announce(split_sums_ptr, own, rows, split, n_rows, COLUMN_SPLITS: tl.constexpr):
    """Shares this split's sums ``own`` [BLOCK_ROWS] of ``rows`` with the row's other splits."""
    if COLUMN_SPLITS > 1:
        store_split_sum(split_sums_ptr, split, rows, n_rows, own)


@triton.jit
def _backward_in_column_blocks(
    dy_ptr,
    dsum_ptr,
    x_ptr,
    scale_ptr,
    rstd_ptr,
    n_rows,
    dx_ptr,
    dscale_partial_ptr,
    split_sums_ptr,
    offset: tl.constexpr,
    CASTING: tl.constexpr,
    ADD_COTANGENT: tl.constexpr,
    SUMS_AHEAD: tl.constexpr,
    TILES_PER_PROGRAM: tl.constexpr,
    COLUMN_SPLITS: tl.constexpr,
    n_cols: tl.constexpr,
    row_stride: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """The backward of rows longer than a tile: per row tile, Σ g · n over the row (each split sums its own columns
    and the splits share their sums), then one pass over this program's split of the columns for dx and dscale,
    whose partial sums stay in registers (see ``liger_jax.kernels._rows``). With SUMS_AHEAD, the pass that writes a
    row tile's dx also sums the next row tile's g · n, block by block, so the next tile's loads from HBM are in
    flight beside this one's from L2 and no pass waits on its row sums alone."""
    OWN_BLOCKS: tl.constexpr = split_blocks(n_cols, BLOCK_D, COLUMN_SPLITS)
    pid, split = program_and_split()
    split_first_col = split * OWN_BLOCKS * BLOCK_D
    first_tile = pid * TILES_PER_PROGRAM
    dscale = tl.zeros((partial_blocks(n_cols, BLOCK_D, COLUMN_SPLITS), BLOCK_D), dtype=tl.float32)
    if SUMS_AHEAD:
        rows = row_block(first_tile * BLOCK_ROWS, BLOCK_ROWS)
        rstd = tl.load(rstd_ptr + rows, mask=rows < n_rows, other=0.0)
        own = _split_sum_g_normed(
            dy_ptr, x_ptr, scale_ptr, rstd, rows, split_first_col, n_rows,
            offset, OWN_BLOCKS, n_cols, row_stride, BLOCK_ROWS, BLOCK_D,
        )  # fmt: skip
        _announce(split_sums_ptr, own, rows, split, n_rows, COLUMN_SPLITS)
    for tile_index in range(TILES_PER_PROGRAM):
        row_tile = first_tile + tile_index
        rows = row_block(row_tile * BLOCK_ROWS, BLOCK_ROWS)
        rstd = tl.load(rstd_ptr + rows, mask=rows < n_rows, other=0.0)
        if not SUMS_AHEAD:
            own = _split_sum_g_normed(
                dy_ptr, x_ptr, scale_ptr, rstd, rows, split_first_col, n_rows,
                offset, OWN_BLOCKS, n_cols, row_stride, BLOCK_ROWS, BLOCK_D,
            )  # fmt: skip
            _announce(split_sums_ptr, own, rows, split, n_rows, COLUMN_SPLITS)
        sum_gn = _with_other_splits(
            own, dy_ptr, x_ptr, scale_ptr, split_sums_ptr, rstd, rows, split, n_rows,
            offset, COLUMN_SPLITS, n_cols, row_stride, BLOCK_ROWS, BLOCK_D,
        )  # fmt: skip
        mean_gn = sum_gn / n_cols
        if SUMS_AHEAD:
            has_next, next_rows, next_n_rows = next_row_tile(
                row_tile, tile_index, n_rows, TILES_PER_PROGRAM, BLOCK_ROWS
            )
            next_rstd = tl.load(rstd_ptr + next_rows, mask=next_rows < next_n_rows, other=0.0)
            next_gn = tl.zeros((BLOCK_ROWS, BLOCK_D), dtype=tl.float32)
        for step in range(OWN_BLOCKS):
            first_col = second_pass_block(step, split_first_col, OWN_BLOCKS, BLOCK_D, SUMS_AHEAD)
            dy, x, offsets, mask, scale = _load_gradient_inputs(
                dy_ptr, x_ptr, scale_ptr, rows, first_col, n_rows, offset, n_cols, row_stride, BLOCK_D
            )
            if SUMS_AHEAD:
                next_dy, next_x, _, _, _ = _load_gradient_inputs(
                    dy_ptr, x_ptr, scale_ptr, next_rows, first_col, next_n_rows, offset, n_cols, row_stride, BLOCK_D
                )
                next_gn += _g_normed(next_dy, next_x, next_rstd, scale)
            dx, tile_dscale = _gradients(dy, x, rstd, scale, mean_gn, CASTING)
            _store_dx(dx, dsum_ptr, dx_ptr, offsets, mask, ADD_COTANGENT)
            dscale = add_to_block(dscale, first_col - split_first_col, tile_dscale, BLOCK_D)
        if SUMS_AHEAD:
            own = tl.sum(next_gn, axis=1)
            if has_next:
                _announce(split_sums_ptr, own, next_rows, split, n_rows, COLUMN_SPLITS)
    store_blocks(dscale_partial_ptr + pid * n_cols, dscale, split_first_col, n_cols, OWN_BLOCKS, BLOCK_D)


@triton.jit
def _backward(
    dy_ptr,
    dsum_ptr,
    x_ptr,
    scale_ptr,
    rstd_ptr,
    n_rows,
    dx_ptr,
    dscale_partial_ptr,
    split_sums_ptr,
    offset: tl.constexpr,
    CASTING: tl.constexpr,
    ADD_COTANGENT: tl.constexpr,
    PREFETCH: tl.constexpr,
    SUMS_AHEAD: tl.constexpr,
    TILES_PER_PROGRAM: tl.constexpr,
    COLUMN_SPLITS: tl.constexpr,
    n_cols: tl.constexpr,
    row_stride: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """dx row by row and per-program partial sums of dscale, in one tile per row or in column blocks.

    Program p (split s; see ``_rows.program_and_split``) walks TILES_PER_PROGRAM tiles of BLOCK_ROWS rows from row p ·
    TILES_PER_PROGRAM · BLOCK_ROWS and writes its fp32 partial sum of dy · n into row p of dscale_partial, at the
    columns of split s (of COLUMN_SPLITS: 1 for rows of one tile); XLA adds the partials (deterministic, no atomics).
    """
    if n_cols <= BLOCK_D:
        _backward_in_tiles(
            dy_ptr, dsum_ptr, x_ptr, scale_ptr, rstd_ptr, n_rows, dx_ptr, dscale_partial_ptr,
            offset, CASTING, ADD_COTANGENT, PREFETCH, TILES_PER_PROGRAM, n_cols, row_stride, BLOCK_ROWS, BLOCK_D,
        )  # fmt: skip
    else:
        _backward_in_column_blocks(
            dy_ptr, dsum_ptr, x_ptr, scale_ptr, rstd_ptr, n_rows, dx_ptr, dscale_partial_ptr, split_sums_ptr,
            offset, CASTING, ADD_COTANGENT, SUMS_AHEAD, TILES_PER_PROGRAM, COLUMN_SPLITS, n_cols,
            row_stride, BLOCK_ROWS, BLOCK_D,
        )  # fmt: skip


@triton.jit
def rms_norm_bwd(
    dy_ptr,  # [n_rows, n_cols] x.dtype
    x_ptr,  # [n_rows, n_cols] x.dtype
    scale_ptr,  # [n_cols] scale.dtype
    rstd_ptr,  # [n_rows] fp32
    n_rows,
    dx_ptr,  # [n_rows, n_cols] x.dtype
    dscale_partial_ptr,  # [num_programs, n_cols] fp32
    split_sums_ptr,  # [COLUMN_SPLITS, n_rows, 2] int32, zeroed: each split's Σ g · n over its columns, marked
    offset: tl.constexpr,
    CASTING: tl.constexpr,
    PREFETCH: tl.constexpr,
    SUMS_AHEAD: tl.constexpr,
    TILES_PER_PROGRAM: tl.constexpr,
    COLUMN_SPLITS: tl.constexpr,
    n_cols: tl.constexpr,
    row_stride: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """dx row by row (see ``_gradients``) and per-program partial sums of dscale (see ``_backward``)."""
    # dy_ptr stands in for the cotangent of the sum, which ADD_COTANGENT=False never reads.
    _backward(
        dy_ptr, dy_ptr, x_ptr, scale_ptr, rstd_ptr, n_rows, dx_ptr, dscale_partial_ptr, split_sums_ptr,
        offset, CASTING, False, PREFETCH, SUMS_AHEAD, TILES_PER_PROGRAM, COLUMN_SPLITS, n_cols,
        row_stride, BLOCK_ROWS, BLOCK_D,
    )  # fmt: skip


@triton.jit
def fused_add_rms_norm_bwd(
    dy_ptr,  # [n_rows, n_cols] x.dtype, cotangent of y
    dsum_ptr,  # [n_rows, n_cols] x.dtype, cotangent of s
    sum_ptr,  # [n_rows, n_cols] x.dtype
    scale_ptr,  # [n_cols] scale.dtype
    rstd_ptr,  # [n_rows] fp32
    n_rows,
    ds_ptr,  # [n_rows, n_cols] x.dtype, the cotangent of x and of residual
    dscale_partial_ptr,  # [num_programs, n_cols] fp32
    split_sums_ptr,  # [COLUMN_SPLITS, n_rows, 2] int32, zeroed: each split's Σ g · n over its columns, marked
    offset: tl.constexpr,
    CASTING: tl.constexpr,
    PREFETCH: tl.constexpr,
    SUMS_AHEAD: tl.constexpr,
    TILES_PER_PROGRAM: tl.constexpr,
    COLUMN_SPLITS: tl.constexpr,
    n_cols: tl.constexpr,
    row_stride: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """ds = dsum + RMSNorm's dx at s (x and residual both get ds), and dscale partials as ``rms_norm_bwd``.

    Each element of dsum is read before ds is written at the same offset, so ds may alias dsum.
    """
    _backward(
        dy_ptr, dsum_ptr, sum_ptr, scale_ptr, rstd_ptr, n_rows, ds_ptr, dscale_partial_ptr, split_sums_ptr,
        offset, CASTING, True, PREFETCH, SUMS_AHEAD, TILES_PER_PROGRAM, COLUMN_SPLITS, n_cols,
        row_stride, BLOCK_ROWS, BLOCK_D,
    )  # fmt: skip
