"""Tile addressing shared by the row-wise kernels: a tile is BLOCK_ROWS rows × BLOCK_D columns of a [n_rows, n_cols]
array whose rows are ``row_stride`` elements apart.

A row fits one tile when ``n_cols <= BLOCK_D``. Otherwise a kernel walks it in ``(n_cols + BLOCK_D - 1) // BLOCK_D``
column blocks, the last one partial, in two passes: one for the row statistics, then one that uses them. (The
kernels write that count inside ``range(...)`` rather than naming it: Triton's interpreter turns every assigned
value into a tensor, and ``range`` of a tensor fails there.)

A kernel that sums over rows (a weight's gradient) gives each program fp32 partial sums [n_cols]. The norms' backward
kernels keep them in registers, as [blocks, BLOCK_D], also for rows walked in column blocks: there COLUMN_SPLITS
programs share each row (neighbours in launch order: :func:`program_and_split`), each sums its own :func:`split_blocks`
for the row statistics, stores the sums and reads the other splits' (:func:`store_split_sum`,
:func:`arrived_split_sum`: each sum and its mark in one 64-bit word, one round trip to L2 a poll), then writes dx and
sums the partials of its own blocks only (read again from L1 or L2), so its partials stay within the registers
(``liger_jax.ops._tiling.column_splits`` picks the count). A split whose partner's sums have not arrived after
SPLIT_SUMS_POLLS polls sums the partner's columns itself with the same code, so the value is the same bit for bit and
no program waits on one that is not running (the interpreter runs one at a time). DyT's backward, which needs no row
statistic, adds each row tile's sums to its row of partials in memory instead (:func:`add_to_partial`).

``n_cols`` and ``row_stride`` are constexprs in every row kernel: jax-triton passes int scalars without Triton's
divisibility-by-16 specialisation, and a runtime row stride or column bound leaves Triton unable to prove that a
row starts 16-byte aligned, so every bf16 load and store becomes a 2-byte access (about half of HBM bandwidth).
``n_rows`` may stay a runtime scalar: the row mask is constant along a row and does not split the vectors. A
column block starts at a multiple of the constexpr BLOCK_D, which keeps the alignment provable.
"""

import triton
import triton.language as tl


@triton.jit
def row_block(first_row, BLOCK_ROWS: tl.constexpr):
    """The BLOCK_ROWS row indices from ``first_row``, int64 (rows · D can pass 2^31)."""
    return first_row + tl.arange(0, BLOCK_ROWS).to(tl.int64)


@triton.jit
def tile(rows, first_col, n_rows, n_cols, row_stride, BLOCK_D: tl.constexpr):
    """Column indices [BLOCK_D], offsets [BLOCK_ROWS, BLOCK_D] and the mask of in-bounds elements of the tile of
    ``rows`` [BLOCK_ROWS] from column ``first_col``."""
    cols = first_col + tl.arange(0, BLOCK_D)
    offsets = rows[:, None] * row_stride + cols[None, :]
    mask = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
    return cols, offsets, mask


@triton.jit
def reversed_block(step, n_cols: tl.constexpr, BLOCK_D: tl.constexpr):
    """The first column of the block that a row's second pass visits at ``step``: the last block first, so the
    blocks the first pass read most recently, the likeliest to be still in L2, are read again soonest. For a split
    of the row, ``n_cols`` is its own blocks' width and the column counts from the split's first."""
    return ((n_cols + BLOCK_D - 1) // BLOCK_D - 1 - step) * BLOCK_D


@triton.jit
def second_pass_block(step, split_first_col, OWN_BLOCKS: tl.constexpr, BLOCK_D: tl.constexpr, FORWARDS: tl.constexpr):
    """The first column of the block that a split's second pass over its OWN_BLOCKS blocks from ``split_first_col``
    visits at ``step``: :func:`reversed_block`'s, or with FORWARDS (a first pass a whole row tile earlier, so every
    block equally recent) the blocks in order."""
    if FORWARDS:
        first_col = split_first_col + step * BLOCK_D
    else:
        first_col = split_first_col + reversed_block(step, OWN_BLOCKS * BLOCK_D, BLOCK_D)
    return first_col


@triton.jit
def next_row_tile(row_tile, tile_index, n_rows, TILES_PER_PROGRAM: tl.constexpr, BLOCK_ROWS: tl.constexpr):
    """``(has_next, rows, rows_bound)`` of the row tile after ``row_tile``, the program's ``tile_index``-th: whether
    the program walks one, its rows, and the row bound its loads are masked by (0 where it walks none, so they load
    nothing)."""
    has_next = tile_index + 1 < TILES_PER_PROGRAM
    rows = row_block((row_tile + 1) * BLOCK_ROWS, BLOCK_ROWS)
    return has_next, rows, tl.where(has_next, n_rows, 0)


# Row sums of several fp32 tiles as one reduction of their stack (the stacked axes stay within each thread): one
# exchange between the warps, and its barriers, rather than one per sum (ptxas, sm_90: PolyNorm's 8 → 2 barriers
# forward, 11 → 2 backward, at D = 4096).
@triton.jit
def row_sums2(u0, u1):
    """Σ over axis 1 of two [BLOCK_ROWS, BLOCK_D] fp32 tiles, each [BLOCK_ROWS], in one reduction."""
    return tl.split(tl.sum(tl.join(u0, u1), axis=1))


@triton.jit
def row_sums4(u0, u1, u2, u3):
    """Σ over axis 1 of four [BLOCK_ROWS, BLOCK_D] fp32 tiles, each [BLOCK_ROWS], in one reduction."""
    low, high = tl.split(tl.sum(tl.join(tl.join(u0, u1), tl.join(u2, u3)), axis=1))
    s0, s1 = tl.split(low)
    s2, s3 = tl.split(high)
    return s0, s1, s2, s3


@triton.jit
def add_to_partial(partial_row_ptr, cols, n_cols, values, accumulate):
    """Stores ``values`` [BLOCK_D] fp32 into a program's row of partial sums at ``cols``, added to what is there
    when ``accumulate`` (a program's first row tile starts its sums; an unwritten partial is garbage)."""
    previous = tl.load(partial_row_ptr + cols, mask=(cols < n_cols) & accumulate, other=0.0)
    tl.store(partial_row_ptr + cols, previous + values, mask=cols < n_cols)


@triton.jit
def load_tile_again(ptr, offsets, mask):
    """A tile of ``ptr`` (0 where masked) loaded a second time in a row tile, after a reduction over its rows.

    A tile just read is still in L1 (at worst in L2): reading it again costs no HBM traffic and less than keeping it
    in registers across the reduction alongside a program's partial sums, which spills. Marked evict-first, its
    last use; the hint also keeps Triton from merging this load with the first one (which would keep that live).
    """
    return tl.load(ptr + offsets, mask=mask, other=0.0, eviction_policy="evict_first")


@triton.jit
def load_weights_again(ptr, cols, n_cols):
    """Weights [BLOCK_D] at ``cols`` (0 past ``n_cols``) loaded a second time in a row tile, as
    :func:`load_tile_again`; marked evict-last, as every row tile reads them."""
    return tl.load(ptr + cols, mask=cols < n_cols, other=0.0, eviction_policy="evict_last")


@triton.constexpr_function
def split_blocks(n_cols, block_d, column_splits):
    """How many column blocks of ``block_d`` each of a row's ``column_splits`` programs owns (the last split's may
    pass the row's end)."""
    blocks = (n_cols + block_d - 1) // block_d
    return (blocks + column_splits - 1) // column_splits


@triton.constexpr_function
def partial_blocks(n_cols, block_d, column_splits):
    """The blocks of a split's partial sums in registers, [partial_blocks, block_d]: :func:`split_blocks` rounded up
    to a power of two (tl.arange's shapes); the blocks past the split's own are never stored."""
    return triton.next_power_of_2(split_blocks(n_cols, block_d, column_splits))


@triton.jit
def program_and_split():
    """``(program, split)`` of a kernel launched on the grid ``(COLUMN_SPLITS, programs)``: the splits of a row are
    neighbours in launch order, so they run at the same time and all but one read the whole row in their first
    pass from L2."""
    return tl.program_id(1).to(tl.int64), tl.program_id(0)


# How many times a split polls for the others' row sums of a tile before it sums their columns itself: the splits of
# a row run side by side, so the others' sums are usually stored by the time a split has its own; a split whose
# partner is not running (or a program of the interpreter, which runs one program at a time) stops waiting.
SPLIT_SUMS_POLLS = tl.constexpr(64)


@triton.jit
def _slots(split_sums_ptr):
    """``split_sums`` [COLUMN_SPLITS, n_rows] as 64-bit slots (the launch passes them as int32 pairs, zeroed)."""
    return split_sums_ptr.to(tl.pointer_type(tl.int64), bitcast=True)


@triton.jit
def store_split_sum(split_sums_ptr, split, rows, n_rows, value):
    """Stores a split's row sums ``value`` [BLOCK_ROWS] fp32 of ``rows`` into its row ``split`` of ``split_sums``
    [COLUMN_SPLITS, n_rows] 64-bit slots, zeroed by the launch: each slot holds the sum's bits above a mark (1) in
    one 64-bit store, so a split that reads the mark reads the sum, with no fence and no flag apart."""
    bits = value.to(tl.int32, bitcast=True).to(tl.int64)
    tl.store(_slots(split_sums_ptr) + split * n_rows + rows, (bits << 32) | 1, mask=rows < n_rows)


@triton.jit
def _poll_split_sum(split_sums_ptr, split, rows, n_rows):
    """``split``'s slots [BLOCK_ROWS] int64 of ``rows`` as they stand in L2 (an atomic read: never a stale line of L1
    nor a load hoisted out of the polling loop); the rows past ``n_rows`` read as marked zeros."""
    inside = rows < n_rows
    addresses = _slots(split_sums_ptr) + split * n_rows + rows
    polled = tl.atomic_or(addresses, tl.zeros(addresses.shape, tl.int64), mask=inside, sem="relaxed", scope="gpu")
    return tl.where(inside, polled, 1)


@triton.jit
def _unmarked(polled):
    """How many of the slots ``polled`` are not yet marked."""
    return tl.sum(1 - (polled & 1))


@triton.jit
def _split_sum(polled):
    """The fp32 sums [BLOCK_ROWS] of the marked slots ``polled``."""
    return (polled >> 32).to(tl.int32).to(tl.float32, bitcast=True)


@triton.jit
def _poll_paired_split_sums(split_sums_ptr, paired_sums_ptr, split, rows, n_rows):
    """``split``'s slots of ``rows`` in ``split_sums`` and in ``paired_sums`` (see :func:`_poll_split_sum`), both
    polls in flight together; the first slots twice where ``paired_sums_ptr`` is None."""
    polled = _poll_split_sum(split_sums_ptr, split, rows, n_rows)
    paired = polled
    if paired_sums_ptr is not None:
        paired = _poll_split_sum(paired_sums_ptr, split, rows, n_rows)
    return polled, paired


@triton.jit
def arrived_split_sum(split_sums_ptr, paired_sums_ptr, split, rows, n_rows):
    """``(arrived, sums, paired sums)``: ``split``'s row sums [BLOCK_ROWS] fp32 of ``rows`` from ``split_sums`` and
    ``paired_sums`` (a second sum of the same splits, polled in the same round trips; None for none, which returns
    the first sums twice), polled until every row's slot is marked in both (see :func:`store_split_sum`) or
    SPLIT_SUMS_POLLS polls have passed; ``arrived`` (a scalar) says which."""
    polled, paired = _poll_paired_split_sums(split_sums_ptr, paired_sums_ptr, split, rows, n_rows)
    polls = 0
    while (_unmarked(polled) + _unmarked(paired) > 0) & (polls < SPLIT_SUMS_POLLS):
        polled, paired = _poll_paired_split_sums(split_sums_ptr, paired_sums_ptr, split, rows, n_rows)
        polls += 1
    return _unmarked(polled) + _unmarked(paired) == 0, _split_sum(polled), _split_sum(paired)


@triton.jit
def add_to_block(partials, first_col, values, BLOCK_D: tl.constexpr):
    """``partials`` [blocks, BLOCK_D] fp32 with ``values`` [BLOCK_D] added to the block from column ``first_col``
    (a register tensor cannot be indexed by a loop variable: a mask picks the block, the others get + 0, exact)."""
    block_cols = tl.arange(0, partials.shape[0]) * BLOCK_D
    return partials + tl.where(block_cols[:, None] == first_col, values[None, :], 0.0)


@triton.jit
def store_blocks(partial_row_ptr, partials, first_col, n_cols, OWN_BLOCKS: tl.constexpr, BLOCK_D: tl.constexpr):
    """Stores the first OWN_BLOCKS of ``partials`` [blocks, BLOCK_D] fp32, block b at column first_col + b · BLOCK_D
    (those before ``n_cols``), into a program's row of partial sums."""
    local = tl.arange(0, partials.shape[0])[:, None] * BLOCK_D + tl.arange(0, BLOCK_D)[None, :]
    mask = (local < OWN_BLOCKS * BLOCK_D) & (first_col + local < n_cols)
    tl.store(partial_row_ptr + first_col + local, partials, mask=mask)
