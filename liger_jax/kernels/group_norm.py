"""GroupNorm kernels, channels last: y = (x - mean_g) · rstd_g · scale + bias, statistics per example and group.

x is ``[n_batch, n_tokens, n_channels]`` (an example's spatial axes flattened into tokens); group g of an example is
its ``n_tokens × GROUP_SIZE`` block of channels ``[g · GROUP_SIZE, (g + 1) · GROUP_SIZE)``. One program takes one
example and GROUPS_PER_BLOCK adjacent groups: each token's slice of them is one contiguous run of channels (BLOCK_C,
a power of two ≥ GROUPS_PER_BLOCK · GROUP_SIZE, its tail masked), and the program walks the tokens in chunks of
BLOCK_S. Everything is fp32; y and dx are rounded once.

Statistics are exact and stable: each chunk's per-channel mean and centred sum of squares are merged into the running
ones with Chan et al.'s update, then a group's channels (equal counts) are merged the same way. Per-group values are
spread over the channels and back with a ``[GROUPS_PER_BLOCK, BLOCK_C]`` membership mask, so GROUP_SIZE needs not be
a power of two.

When all tokens fit one chunk (``n_tokens <= BLOCK_S``) the block is read once and kept in registers: one pass over
the group's data. Otherwise a second pass walks the chunks from the last one back (the most recently read chunks,
the likeliest to be still in L2, first). The backward's first pass sums dy · x̂ and dy per channel (dscale's and
dbias's per-example partials, and the group sums dx needs), its second writes dx.

With token splits, SPLITS programs share a block of groups, each taking a run of TOKENS_PER_SPLIT tokens, and each
pass is a launch of its own (a program cannot wait for one the GPU has not started): ``group_norm_split_moments``
stores each split's group means and centred sums of squares, ``group_norm_split_fwd`` merges them (Chan et al. again)
and writes its run's y; ``group_norm_split_sums`` stores each split's per-channel sums, ``group_norm_split_bwd`` adds
them and writes its run's dx. The second launches take their programs in reverse order, so the runs the first read
last (the likeliest to be still in L2) come first. Or both launches of a pass become one (``group_norm_ordered_fwd``
and ``group_norm_ordered_bwd``, where the tiling sets a lag): its programs take the two launches' programs as items,
in the order of a ticket each draws from an atomic count (so whatever an item waits for is held by a program already
running); a unit's statistics items run LAG items ahead of its output items, so a run's second read follows its first
while it is likely in L2, and an output item spins until all of its unit's statistics have arrived.
"""

import triton
import triton.language as tl


@triton.jit
def _block_channels(
    block, n_channels: tl.constexpr, GROUP_SIZE: tl.constexpr, GROUPS_PER_BLOCK: tl.constexpr, BLOCK_C: tl.constexpr
):
    """The channel indices [BLOCK_C] of ``block`` and which of them are its own: BLOCK_C is rounded up to a power
    of two (its tail belongs to the next block), and the last block may pass the last channel."""
    local = tl.arange(0, BLOCK_C)
    channels = block * GROUPS_PER_BLOCK * GROUP_SIZE + local
    return channels, (local < GROUPS_PER_BLOCK * GROUP_SIZE) & (channels < n_channels)


@triton.jit
def _chunk(
    batch,
    first_token,
    end_token,
    channels,
    own,
    n_tokens: tl.constexpr,
    n_channels: tl.constexpr,
    BLOCK_S: tl.constexpr,
):
    """Offsets [BLOCK_S, BLOCK_C] (int64) and the in-bounds mask of the chunk of tokens from ``first_token`` (those
    before ``end_token``) of the block's ``channels`` (``own`` as :func:`_block_channels` gives them) in example
    ``batch``."""
    tokens = first_token + tl.arange(0, BLOCK_S)
    offsets = (batch.to(tl.int64) * n_tokens + tokens[:, None]) * n_channels + channels[None, :]
    return offsets, (tokens[:, None] < end_token) & own[None, :]


@triton.jit
def _membership(GROUP_SIZE: tl.constexpr, GROUPS_PER_BLOCK: tl.constexpr, BLOCK_C: tl.constexpr):
    """[GROUPS_PER_BLOCK, BLOCK_C]: whether channel c of the block belongs to group j of the block."""
    return (tl.arange(0, BLOCK_C)[None, :] // GROUP_SIZE) == tl.arange(0, GROUPS_PER_BLOCK)[:, None]


@triton.jit
def _block(
    block, n_channels: tl.constexpr, GROUP_SIZE: tl.constexpr, GROUPS_PER_BLOCK: tl.constexpr, BLOCK_C: tl.constexpr
):
    """Block ``block``'s membership mask [GROUPS_PER_BLOCK, BLOCK_C] (see :func:`_membership`), its channel indices
    [BLOCK_C] and which of them are its own (see :func:`_block_channels`)."""
    channels, own = _block_channels(block, n_channels, GROUP_SIZE, GROUPS_PER_BLOCK, BLOCK_C)
    return _membership(GROUP_SIZE, GROUPS_PER_BLOCK, BLOCK_C), channels, own


@triton.jit
def _per_group(values, membership):
    """Σ over each group's channels of per-channel ``values`` [BLOCK_C] fp32: [GROUPS_PER_BLOCK]."""
    return tl.sum(tl.where(membership, values[None, :], 0.0), axis=1)


@triton.jit
def _per_channel(values, membership):
    """Each channel's group's value, from per-group ``values`` [GROUPS_PER_BLOCK]: [BLOCK_C]."""
    return tl.sum(tl.where(membership, values[:, None], 0.0), axis=0)


@triton.jit
def _merged_moments(mean, centred_squares, x, mask, first_token, n_tokens, BLOCK_S: tl.constexpr):
    """Per-channel running fp32 ``mean`` and ``centred_squares`` [BLOCK_C] of a run's tokens before ``first_token``
    (counted from the run's first, which is not past the run's end), merged with the chunk ``x`` [BLOCK_S, BLOCK_C]
    fp32 of a run of ``n_tokens`` (Chan et al.; every earlier chunk is full)."""
    seen = tl.cast(first_token, tl.float32)
    # A chunk past the run's end (a shorter last run) counts 0 and leaves the moments as they are.
    count = tl.cast(tl.maximum(tl.minimum(n_tokens - first_token, BLOCK_S), 0), tl.float32)
    chunk_mean = tl.sum(x, axis=0) / tl.maximum(count, 1.0)
    # Masked tokens would contribute (0 - mean)²: zero them.
    centred = tl.where(mask, x - chunk_mean[None, :], 0.0)
    delta = chunk_mean - mean
    mean += delta * (count / (seen + count))
    centred_squares += tl.sum(centred * centred, axis=0) + delta * delta * (seen * count / (seen + count))
    return mean, centred_squares


@triton.jit
def _group_moments(channel_mean, channel_squares, membership, n_tokens, GROUP_SIZE: tl.constexpr):
    """Each group's fp32 mean and centred sum of squares [GROUPS_PER_BLOCK] from its channels' means and centred
    sums of squares over n_tokens tokens: the channels' counts are equal, so the group mean is their mean and the
    group's centred sum of squares adds n_tokens · (channel mean - group mean)² per channel."""
    mean = _per_group(channel_mean, membership) / GROUP_SIZE
    spread = channel_mean[None, :] - mean[:, None]
    squares = _per_group(channel_squares, membership) + n_tokens * tl.sum(
        tl.where(membership, spread * spread, 0.0), axis=1
    )
    return mean, squares


@triton.jit
def _rstd(centred_squares, eps: tl.constexpr, n_tokens: tl.constexpr, GROUP_SIZE: tl.constexpr):
    """1 / sqrt(variance + eps) of groups of n_tokens · GROUP_SIZE elements with these centred sums of squares."""
    return 1.0 / tl.sqrt(centred_squares / (n_tokens * GROUP_SIZE) + eps)


@triton.jit
def _group_statistics(
    channel_mean, channel_squares, membership, eps: tl.constexpr, n_tokens: tl.constexpr, GROUP_SIZE: tl.constexpr
):
    """Each group's fp32 (mean, rstd) [GROUPS_PER_BLOCK] from its channels' means and centred sums of squares over
    all n_tokens tokens."""
    mean, squares = _group_moments(channel_mean, channel_squares, membership, n_tokens, GROUP_SIZE)
    return mean, _rstd(squares, eps, n_tokens, GROUP_SIZE)


@triton.jit
def _store_group_values(ptr, values, batch, block, n_groups: tl.constexpr, GROUPS_PER_BLOCK: tl.constexpr):
    """Stores per-group ``values`` [GROUPS_PER_BLOCK] at ``ptr[batch, group]`` of a [n_batch, n_groups] array."""
    groups = block * GROUPS_PER_BLOCK + tl.arange(0, GROUPS_PER_BLOCK)
    tl.store(ptr + batch.to(tl.int64) * n_groups + groups, values, mask=groups < n_groups)


@triton.jit
def _load_group_values(ptr, batch, block, n_groups: tl.constexpr, GROUPS_PER_BLOCK: tl.constexpr):
    """Per-group values [GROUPS_PER_BLOCK] fp32 of ``ptr[batch, group]`` (0 past the last group)."""
    groups = block * GROUPS_PER_BLOCK + tl.arange(0, GROUPS_PER_BLOCK)
    return tl.load(ptr + batch.to(tl.int64) * n_groups + groups, mask=groups < n_groups, other=0.0)


@triton.jit
def _load_channels(ptr, channels, n_channels: tl.constexpr):
    """A per-channel param [BLOCK_C] in fp32 (0 past the last channel)."""
    return tl.load(ptr + channels, mask=channels < n_channels, other=0.0).to(tl.float32)


@triton.jit
def _store_y(x, mean, rstd, scale, bias, y_ptr, offsets, mask):
    """Stores y of a chunk ``x`` [BLOCK_S, BLOCK_C] fp32 given per-channel fp32 mean, rstd, scale and bias."""
    y = (x - mean[None, :]) * (rstd * scale)[None, :] + bias[None, :]
    tl.store(y_ptr + offsets, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _run_moments(
    x_ptr,
    batch,
    first_token,
    count,
    channels,
    own,
    n_tokens: tl.constexpr,
    n_channels: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_C: tl.constexpr,
    N_CHUNKS: tl.constexpr,
):
    """Per-channel fp32 mean and centred sum of squares [BLOCK_C] of the ``count`` tokens from ``first_token``, in
    N_CHUNKS chunks (those past ``count`` add nothing)."""
    channel_mean = tl.zeros((BLOCK_C,), dtype=tl.float32)
    channel_squares = tl.zeros((BLOCK_C,), dtype=tl.float32)
    for chunk in range(N_CHUNKS):
        offsets, mask = _chunk(
            batch, first_token + chunk * BLOCK_S, first_token + count, channels, own, n_tokens, n_channels, BLOCK_S
        )
        x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        channel_mean, channel_squares = _merged_moments(
            channel_mean, channel_squares, x, mask, chunk * BLOCK_S, count, BLOCK_S
        )
    return channel_mean, channel_squares


@triton.jit
def _store_run_y(
    x_ptr,
    scale,
    bias,
    y_ptr,
    mean,
    rstd,
    batch,
    first_token,
    count,
    channels,
    own,
    n_tokens: tl.constexpr,
    n_channels: tl.constexpr,
    BLOCK_S: tl.constexpr,
    N_CHUNKS: tl.constexpr,
):
    """Stores y of the ``count`` tokens from ``first_token``, in N_CHUNKS chunks (those past ``count`` store
    nothing) from the last one back (L2), given per-channel fp32 mean, rstd, scale and bias [BLOCK_C]."""
    for step in range(N_CHUNKS):
        start = first_token + (N_CHUNKS - 1 - step) * BLOCK_S
        offsets, mask = _chunk(batch, start, first_token + count, channels, own, n_tokens, n_channels, BLOCK_S)
        x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        _store_y(x, mean, rstd, scale, bias, y_ptr, offsets, mask)


@triton.jit
def group_norm_fwd(
    x_ptr,  # [n_batch, n_tokens, n_channels] x.dtype
    scale_ptr,  # [n_channels] scale.dtype
    bias_ptr,  # [n_channels] bias.dtype
    y_ptr,  # [n_batch, n_tokens, n_channels] x.dtype
    mean_ptr,  # [n_batch, n_groups] fp32
    rstd_ptr,  # [n_batch, n_groups] fp32
    eps: tl.constexpr,
    n_tokens: tl.constexpr,
    n_channels: tl.constexpr,
    n_groups: tl.constexpr,
    GROUP_SIZE: tl.constexpr,
    GROUPS_PER_BLOCK: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """Program (b, k) normalises groups [k · GROUPS_PER_BLOCK, (k + 1) · GROUPS_PER_BLOCK) of example b; it stores
    their y and each group's fp32 mean and rstd."""
    batch, block = tl.program_id(0), tl.program_id(1)
    membership, channels, own = _block(block, n_channels, GROUP_SIZE, GROUPS_PER_BLOCK, BLOCK_C)
    scale, bias = _load_channels(scale_ptr, channels, n_channels), _load_channels(bias_ptr, channels, n_channels)
    if n_tokens <= BLOCK_S:
        offsets, mask = _chunk(batch, 0, n_tokens, channels, own, n_tokens, n_channels, BLOCK_S)
        x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        channel_mean, channel_squares = _merged_moments(
            tl.zeros((BLOCK_C,), dtype=tl.float32),
            tl.zeros((BLOCK_C,), dtype=tl.float32),
            x,
            mask,
            0,
            n_tokens,
            BLOCK_S,
        )
        mean, rstd = _group_statistics(channel_mean, channel_squares, membership, eps, n_tokens, GROUP_SIZE)
        _store_y(x, _per_channel(mean, membership), _per_channel(rstd, membership), scale, bias, y_ptr, offsets, mask)
    else:
        channel_mean, channel_squares = _run_moments(
            x_ptr,
            batch,
            0,
            n_tokens,
            channels,
            own,
            n_tokens,
            n_channels,
            BLOCK_S,
            BLOCK_C,
            (n_tokens + BLOCK_S - 1) // BLOCK_S,
        )
        mean, rstd = _group_statistics(channel_mean, channel_squares, membership, eps, n_tokens, GROUP_SIZE)
        _store_run_y(
            x_ptr,
            scale,
            bias,
            y_ptr,
            _per_channel(mean, membership),
            _per_channel(rstd, membership),
            batch,
            0,
            n_tokens,
            channels,
            own,
            n_tokens,
            n_channels,
            BLOCK_S,
            (n_tokens + BLOCK_S - 1) // BLOCK_S,
        )
    _store_group_values(mean_ptr, mean, batch, block, n_groups, GROUPS_PER_BLOCK)
    _store_group_values(rstd_ptr, rstd, batch, block, n_groups, GROUPS_PER_BLOCK)


@triton.jit
def _split_run(split, n_tokens: tl.constexpr, TOKENS_PER_SPLIT: tl.constexpr):
    """The first token and the token count of split ``split``'s run (the last run may be shorter)."""
    first_token = split * TOKENS_PER_SPLIT
    return first_token, tl.minimum(n_tokens - first_token, TOKENS_PER_SPLIT)


@triton.jit
def _reversed_programs():
    """This program's (batch, block, split) counted from the grid's end: the last program of a launch runs first."""
    return (
        tl.num_programs(0) - 1 - tl.program_id(0),
        tl.num_programs(1) - 1 - tl.program_id(1),
        tl.num_programs(2) - 1 - tl.program_id(2),
    )


@triton.jit
def _split_offsets(batch, columns, own, SPLITS: tl.constexpr, n_columns: tl.constexpr, SPLIT_BLOCK: tl.constexpr):
    """Offsets [SPLIT_BLOCK, len(columns)] (int64) into a [n_batch, SPLITS, n_columns] array of example ``batch``'s
    rows and these ``columns``, and the mask of its splits and ``own`` columns."""
    splits = tl.arange(0, SPLIT_BLOCK)
    offsets = (batch.to(tl.int64) * SPLITS + splits[:, None]) * n_columns + columns[None, :]
    return offsets, (splits[:, None] < SPLITS) & own[None, :]


@triton.jit
def _split_moments_item(
    x_ptr,
    split_mean_ptr,
    split_squares_ptr,
    batch,
    block,
    split,
    n_tokens: tl.constexpr,
    n_channels: tl.constexpr,
    n_groups: tl.constexpr,
    GROUP_SIZE: tl.constexpr,
    GROUPS_PER_BLOCK: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_C: tl.constexpr,
    SPLITS: tl.constexpr,
    TOKENS_PER_SPLIT: tl.constexpr,
):
    """Stores the mean and centred sum of squares of each group of block ``block`` of example ``batch`` over split
    ``split``'s tokens."""
    membership, channels, own = _block(block, n_channels, GROUP_SIZE, GROUPS_PER_BLOCK, BLOCK_C)
    first_token, count = _split_run(split, n_tokens, TOKENS_PER_SPLIT)
    channel_mean, channel_squares = _run_moments(
        x_ptr,
        batch,
        first_token,
        count,
        channels,
        own,
        n_tokens,
        n_channels,
        BLOCK_S,
        BLOCK_C,
        TOKENS_PER_SPLIT // BLOCK_S,
    )
    mean, squares = _group_moments(channel_mean, channel_squares, membership, count, GROUP_SIZE)
    row = batch * SPLITS + split
    _store_group_values(split_mean_ptr, mean, row, block, n_groups, GROUPS_PER_BLOCK)
    _store_group_values(split_squares_ptr, squares, row, block, n_groups, GROUPS_PER_BLOCK)


@triton.jit
def _split_fwd_item(
    x_ptr,
    scale_ptr,
    bias_ptr,
    split_mean_ptr,
    split_squares_ptr,
    y_ptr,
    mean_ptr,
    rstd_ptr,
    batch,
    block,
    split,
    eps: tl.constexpr,
    n_tokens: tl.constexpr,
    n_channels: tl.constexpr,
    n_groups: tl.constexpr,
    GROUP_SIZE: tl.constexpr,
    GROUPS_PER_BLOCK: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_C: tl.constexpr,
    SPLITS: tl.constexpr,
    TOKENS_PER_SPLIT: tl.constexpr,
    SPLIT_BLOCK: tl.constexpr,
    CACHE: tl.constexpr,
):
    """Merges the split moments of block ``block``'s groups of example ``batch`` into each group's mean and rstd
    (split 0 stores them) and writes y of split ``split``'s tokens; the split moments are loaded with the cache
    modifier CACHE."""
    membership, channels, own = _block(block, n_channels, GROUP_SIZE, GROUPS_PER_BLOCK, BLOCK_C)
    groups = block * GROUPS_PER_BLOCK + tl.arange(0, GROUPS_PER_BLOCK)
    offsets, valid = _split_offsets(batch, groups, groups < n_groups, SPLITS, n_groups, SPLIT_BLOCK)
    split_mean = tl.load(split_mean_ptr + offsets, mask=valid, other=0.0, cache_modifier=CACHE)
    split_squares = tl.load(split_squares_ptr + offsets, mask=valid, other=0.0, cache_modifier=CACHE)
    # Chan et al. over the splits: the mean weighted by each split's tokens, the squares with each split's spread.
    first_tokens = tl.arange(0, SPLIT_BLOCK) * TOKENS_PER_SPLIT
    counts = tl.minimum(tl.maximum(n_tokens - first_tokens, 0), TOKENS_PER_SPLIT).to(tl.float32)[:, None]
    mean = tl.sum(counts * split_mean, axis=0) / n_tokens
    spread = split_mean - mean[None, :]
    squares = tl.sum(split_squares + counts * GROUP_SIZE * spread * spread, axis=0)
    rstd = _rstd(squares, eps, n_tokens, GROUP_SIZE)
    scale, bias = _load_channels(scale_ptr, channels, n_channels), _load_channels(bias_ptr, channels, n_channels)
    first_token, count = _split_run(split, n_tokens, TOKENS_PER_SPLIT)
    _store_run_y(
        x_ptr,
        scale,
        bias,
        y_ptr,
        _per_channel(mean, membership),
        _per_channel(rstd, membership),
        batch,
        first_token,
        count,
        channels,
        own,
        n_tokens,
        n_channels,
        BLOCK_S,
        TOKENS_PER_SPLIT // BLOCK_S,
    )
    if split == 0:
        _store_group_values(mean_ptr, mean, batch, block, n_groups, GROUPS_PER_BLOCK)
        _store_group_values(rstd_ptr, rstd, batch, block, n_groups, GROUPS_PER_BLOCK)


@triton.jit
def group_norm_split_moments(
    x_ptr,  # [n_batch, n_tokens, n_channels] x.dtype
    split_mean_ptr,  # [n_batch, SPLITS, n_groups] fp32: each split's group means
    split_squares_ptr,  # [n_batch, SPLITS, n_groups] fp32: each split's centred sums of squares
    n_tokens: tl.constexpr,
    n_channels: tl.constexpr,
    n_groups: tl.constexpr,
    GROUP_SIZE: tl.constexpr,
    GROUPS_PER_BLOCK: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_C: tl.constexpr,
    SPLITS: tl.constexpr,
    TOKENS_PER_SPLIT: tl.constexpr,
):
    """Program (b, k, s) stores the mean and centred sum of squares of each of its groups over split s's tokens."""
    _split_moments_item(
        x_ptr,
        split_mean_ptr,
        split_squares_ptr,
        tl.program_id(0),
        tl.program_id(1),
        tl.program_id(2),
        n_tokens,
        n_channels,
        n_groups,
        GROUP_SIZE,
        GROUPS_PER_BLOCK,
        BLOCK_S,
        BLOCK_C,
        SPLITS,
        TOKENS_PER_SPLIT,
    )


@triton.jit
def group_norm_split_fwd(
    x_ptr,  # [n_batch, n_tokens, n_channels] x.dtype
    scale_ptr,  # [n_channels] scale.dtype
    bias_ptr,  # [n_channels] bias.dtype
    split_mean_ptr,  # [n_batch, SPLITS, n_groups] fp32: group_norm_split_moments'
    split_squares_ptr,  # [n_batch, SPLITS, n_groups] fp32: group_norm_split_moments'
    y_ptr,  # [n_batch, n_tokens, n_channels] x.dtype
    mean_ptr,  # [n_batch, n_groups] fp32
    rstd_ptr,  # [n_batch, n_groups] fp32
    eps: tl.constexpr,
    n_tokens: tl.constexpr,
    n_channels: tl.constexpr,
    n_groups: tl.constexpr,
    GROUP_SIZE: tl.constexpr,
    GROUPS_PER_BLOCK: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_C: tl.constexpr,
    SPLITS: tl.constexpr,
    TOKENS_PER_SPLIT: tl.constexpr,
    SPLIT_BLOCK: tl.constexpr,  # SPLITS up to a power of two
):
    """Program (b, k, s) merges its groups' split moments into each group's mean and rstd (split 0 stores them)
    and writes y of split s's tokens."""
    batch, block, split = _reversed_programs()
    _split_fwd_item(
        x_ptr,
        scale_ptr,
        bias_ptr,
        split_mean_ptr,
        split_squares_ptr,
        y_ptr,
        mean_ptr,
        rstd_ptr,
        batch,
        block,
        split,
        eps,
        n_tokens,
        n_channels,
        n_groups,
        GROUP_SIZE,
        GROUPS_PER_BLOCK,
        BLOCK_S,
        BLOCK_C,
        SPLITS,
        TOKENS_PER_SPLIT,
        SPLIT_BLOCK,
        "",
    )


@triton.jit
def _ticket(tickets_ptr):
    """This program's place in an ordered launch: an atomic count, so every earlier place is held by a program
    already running (whatever the order the GPU starts programs in)."""
    return tl.atomic_add(tickets_ptr, 1, sem="relaxed", scope="gpu")


@triton.jit
def _ordered_item(ticket, SPLITS: tl.constexpr, LAG: tl.constexpr):
    """The item at place ``ticket`` of an ordered launch of 2 · n programs (n statistics items, n output items):
    (is_statistics, unit, split).

    The first LAG places (LAG ≥ SPLITS; all n if fewer) are statistics items 0, 1, …; then statistics item i + LAG
    and output item i alternate; then the output items left. Output item i's unit (i // SPLITS) has its SPLITS
    statistics items among the places before it, the last of them LAG - SPLITS + 1 or more statistics items earlier."""
    n_items = tl.num_programs(0) // 2
    lag = tl.minimum(n_items, LAG)
    paired = ticket - lag
    alternating = (paired >= 0) & (paired < 2 * (n_items - lag))
    is_statistics = (paired < 0) | (alternating & (paired % 2 == 0))
    index = tl.where(
        paired < 0, ticket, tl.where(alternating, tl.where(paired % 2 == 0, lag, 0) + paired // 2, ticket - n_items)
    )
    return is_statistics, index // SPLITS, index % SPLITS


@triton.jit
def _unit_position(unit, n_groups: tl.constexpr, GROUPS_PER_BLOCK: tl.constexpr):
    """(batch, block) of ``unit``, counted as a [n_batch, n_blocks] grid's programs."""
    n_blocks: tl.constexpr = (n_groups + GROUPS_PER_BLOCK - 1) // GROUPS_PER_BLOCK
    return unit // n_blocks, unit % n_blocks


@triton.jit
def _arrive(arrivals_ptr):
    """Counts this program's statistics as stored, after every thread of it has stored its share."""
    tl.debug_barrier()
    tl.atomic_add(arrivals_ptr, 1, sem="release", scope="gpu")


@triton.jit
def _wait_for(arrivals_ptr, SPLITS: tl.constexpr):
    """Spins until SPLITS programs have arrived at ``arrivals_ptr`` (see :func:`_arrive`)."""
    arrived = tl.full((), 0, tl.int32)
    while arrived < SPLITS:
        arrived = tl.atomic_add(arrivals_ptr, 0, sem="acquire", scope="gpu")


@triton.jit
def group_norm_ordered_fwd(
    x_ptr,  # [n_batch, n_tokens, n_channels] x.dtype
    scale_ptr,  # [n_channels] scale.dtype
    bias_ptr,  # [n_channels] bias.dtype
    y_ptr,  # [n_batch, n_tokens, n_channels] x.dtype
    mean_ptr,  # [n_batch, n_groups] fp32
    rstd_ptr,  # [n_batch, n_groups] fp32
    split_mean_ptr,  # [n_batch, SPLITS, n_groups] fp32: each split's group means
    split_squares_ptr,  # [n_batch, SPLITS, n_groups] fp32: each split's centred sums of squares
    tickets_ptr,  # [1] int32, zeroed
    arrivals_ptr,  # [n_batch · n_blocks] int32, zeroed: each unit's statistics items done
    eps: tl.constexpr,
    n_tokens: tl.constexpr,
    n_channels: tl.constexpr,
    n_groups: tl.constexpr,
    GROUP_SIZE: tl.constexpr,
    GROUPS_PER_BLOCK: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_C: tl.constexpr,
    SPLITS: tl.constexpr,
    TOKENS_PER_SPLIT: tl.constexpr,
    SPLIT_BLOCK: tl.constexpr,  # SPLITS up to a power of two
    LAG: tl.constexpr,
):
    """One launch of both passes (grid: 2 · n_batch · n_blocks · SPLITS programs): a statistics item is
    ``group_norm_split_moments``' program, an output item ``group_norm_split_fwd``'s once its unit's statistics have
    all arrived. Items run in :func:`_ordered_item`'s order, so a run's second read follows its first closely
    (L2)."""
    is_statistics, unit, split = _ordered_item(_ticket(tickets_ptr), SPLITS, LAG)
    batch, block = _unit_position(unit, n_groups, GROUPS_PER_BLOCK)
    if is_statistics:
        _split_moments_item(
            x_ptr,
            split_mean_ptr,
            split_squares_ptr,
            batch,
            block,
            split,
            n_tokens,
            n_channels,
            n_groups,
            GROUP_SIZE,
            GROUPS_PER_BLOCK,
            BLOCK_S,
            BLOCK_C,
            SPLITS,
            TOKENS_PER_SPLIT,
        )
        _arrive(arrivals_ptr + unit)
    else:
        _wait_for(arrivals_ptr + unit, SPLITS)
        # Past L1 (.cg): a line of split moments read earlier on this multiprocessor, for another unit, may be stale.
        _split_fwd_item(
            x_ptr,
            scale_ptr,
            bias_ptr,
            split_mean_ptr,
            split_squares_ptr,
            y_ptr,
            mean_ptr,
            rstd_ptr,
            batch,
            block,
            split,
            eps,
            n_tokens,
            n_channels,
            n_groups,
            GROUP_SIZE,
            GROUPS_PER_BLOCK,
            BLOCK_S,
            BLOCK_C,
            SPLITS,
            TOKENS_PER_SPLIT,
            SPLIT_BLOCK,
            ".cg",
        )


@triton.jit
def _store_dx(dy, x, mean, rstd, scale, sum_dy_xhat, sum_dy, dx_ptr, offsets, mask):
    """Stores dx = rstd · (scale · dy - x̂ · mean_g(scale · dy · x̂) - mean_g(scale · dy)) of a chunk (dy and x
    [BLOCK_S, BLOCK_C] fp32); every other argument is per channel [BLOCK_C] fp32, the group means spread over it."""
    x_hat = (x - mean[None, :]) * rstd[None, :]
    dx = rstd[None, :] * (scale[None, :] * dy - x_hat * sum_dy_xhat[None, :] - sum_dy[None, :])
    tl.store(dx_ptr + offsets, dx.to(dx_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _group_means(scale, sum_dy_xhat, sum_dy, membership, count: tl.constexpr):
    """mean_g(scale · dy · x̂) and mean_g(scale · dy) over each group's ``count`` elements, spread over its channels
    [BLOCK_C], from the per-channel sums of dy · x̂ and dy."""
    mean_dy_xhat = _per_channel(_per_group(scale * sum_dy_xhat, membership) / count, membership)
    return mean_dy_xhat, _per_channel(_per_group(scale * sum_dy, membership) / count, membership)


@triton.jit
def _store_partials(dscale_ptr, dbias_ptr, sum_dy_xhat, sum_dy, batch, channels, own, n_channels: tl.constexpr):
    """Stores the block's per-channel Σ dy · x̂ and Σ dy [BLOCK_C] fp32 into row ``batch`` of the partials."""
    partial_offsets = batch.to(tl.int64) * n_channels + channels
    tl.store(dscale_ptr + partial_offsets, sum_dy_xhat, mask=own)
    tl.store(dbias_ptr + partial_offsets, sum_dy, mask=own)


@triton.jit
def _load_chunk(dy_ptr, x_ptr, offsets, mask):
    """dy and x of a chunk in fp32 (0 where masked)."""
    dy = tl.load(dy_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    return dy, x


@triton.jit
def _run_sums(
    dy_ptr,
    x_ptr,
    mean,
    rstd,
    batch,
    first_token,
    count,
    channels,
    own,
    n_tokens: tl.constexpr,
    n_channels: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_C: tl.constexpr,
    N_CHUNKS: tl.constexpr,
):
    """Per-channel fp32 Σ dy · x̂ and Σ dy [BLOCK_C] over the ``count`` tokens from ``first_token``, in N_CHUNKS
    chunks (mean and rstd per channel)."""
    sum_dy_xhat = tl.zeros((BLOCK_C,), dtype=tl.float32)
    sum_dy = tl.zeros((BLOCK_C,), dtype=tl.float32)
    for chunk in range(N_CHUNKS):
        offsets, mask = _chunk(
            batch, first_token + chunk * BLOCK_S, first_token + count, channels, own, n_tokens, n_channels, BLOCK_S
        )
        dy, x = _load_chunk(dy_ptr, x_ptr, offsets, mask)
        sum_dy_xhat += tl.sum(dy * (x - mean[None, :]), axis=0) * rstd
        sum_dy += tl.sum(dy, axis=0)
    return sum_dy_xhat, sum_dy


@triton.jit
def _store_run_dx(
    dy_ptr,
    x_ptr,
    mean,
    rstd,
    scale,
    mean_dy_xhat,
    mean_dy,
    dx_ptr,
    batch,
    first_token,
    count,
    channels,
    own,
    n_tokens: tl.constexpr,
    n_channels: tl.constexpr,
    BLOCK_S: tl.constexpr,
    N_CHUNKS: tl.constexpr,
):
    """Stores dx of the ``count`` tokens from ``first_token``, in N_CHUNKS chunks (those past ``count`` store nothing)
    from the last one back (L2); the other arguments as :func:`_store_dx` takes them."""
    for step in range(N_CHUNKS):
        start = first_token + (N_CHUNKS - 1 - step) * BLOCK_S
        offsets, mask = _chunk(batch, start, first_token + count, channels, own, n_tokens, n_channels, BLOCK_S)
        dy, x = _load_chunk(dy_ptr, x_ptr, offsets, mask)
        _store_dx(dy, x, mean, rstd, scale, mean_dy_xhat, mean_dy, dx_ptr, offsets, mask)


@triton.jit
def _channel_statistics(
    mean_ptr, rstd_ptr, batch, block, membership, n_groups: tl.constexpr, GROUPS_PER_BLOCK: tl.constexpr
):
    """The forward's group mean and rstd of example ``batch``, spread over block ``block``'s channels [BLOCK_C]."""
    mean = _per_channel(_load_group_values(mean_ptr, batch, block, n_groups, GROUPS_PER_BLOCK), membership)
    return mean, _per_channel(_load_group_values(rstd_ptr, batch, block, n_groups, GROUPS_PER_BLOCK), membership)


@triton.jit
def group_norm_bwd(
    dy_ptr,  # [n_batch, n_tokens, n_channels] x.dtype
    x_ptr,  # [n_batch, n_tokens, n_channels] x.dtype
    scale_ptr,  # [n_channels] scale.dtype
    mean_ptr,  # [n_batch, n_groups] fp32
    rstd_ptr,  # [n_batch, n_groups] fp32
    dx_ptr,  # [n_batch, n_tokens, n_channels] x.dtype
    dscale_partial_ptr,  # [n_batch, n_channels] fp32: Σ over the example's tokens of dy · x̂
    dbias_partial_ptr,  # [n_batch, n_channels] fp32: Σ over the example's tokens of dy
    n_tokens: tl.constexpr,
    n_channels: tl.constexpr,
    n_groups: tl.constexpr,
    GROUP_SIZE: tl.constexpr,
    GROUPS_PER_BLOCK: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """Program (b, k) writes dx of its groups of example b (see ``_store_dx``) and their channels' per-example
    partial sums of dscale and dbias (XLA adds the examples: deterministic, no atomics)."""
    batch, block = tl.program_id(0), tl.program_id(1)
    membership, channels, own = _block(block, n_channels, GROUP_SIZE, GROUPS_PER_BLOCK, BLOCK_C)
    scale = _load_channels(scale_ptr, channels, n_channels)
    mean, rstd = _channel_statistics(mean_ptr, rstd_ptr, batch, block, membership, n_groups, GROUPS_PER_BLOCK)
    count = n_tokens * GROUP_SIZE
    if n_tokens <= BLOCK_S:
        # One chunk: read once, kept in registers for dx.
        offsets, mask = _chunk(batch, 0, n_tokens, channels, own, n_tokens, n_channels, BLOCK_S)
        dy, x = _load_chunk(dy_ptr, x_ptr, offsets, mask)
        sum_dy_xhat = tl.sum(dy * (x - mean[None, :]), axis=0) * rstd
        sum_dy = tl.sum(dy, axis=0)
        _store_partials(dscale_partial_ptr, dbias_partial_ptr, sum_dy_xhat, sum_dy, batch, channels, own, n_channels)
        mean_dy_xhat, mean_dy = _group_means(scale, sum_dy_xhat, sum_dy, membership, count)
        _store_dx(dy, x, mean, rstd, scale, mean_dy_xhat, mean_dy, dx_ptr, offsets, mask)
    else:
        sum_dy_xhat, sum_dy = _run_sums(
            dy_ptr,
            x_ptr,
            mean,
            rstd,
            batch,
            0,
            n_tokens,
            channels,
            own,
            n_tokens,
            n_channels,
            BLOCK_S,
            BLOCK_C,
            (n_tokens + BLOCK_S - 1) // BLOCK_S,
        )
        _store_partials(dscale_partial_ptr, dbias_partial_ptr, sum_dy_xhat, sum_dy, batch, channels, own, n_channels)
        mean_dy_xhat, mean_dy = _group_means(scale, sum_dy_xhat, sum_dy, membership, count)
        _store_run_dx(
            dy_ptr,
            x_ptr,
            mean,
            rstd,
            scale,
            mean_dy_xhat,
            mean_dy,
            dx_ptr,
            batch,
            0,
            n_tokens,
            channels,
            own,
            n_tokens,
            n_channels,
            BLOCK_S,
            (n_tokens + BLOCK_S - 1) // BLOCK_S,
        )


@triton.jit
def _split_sums_item(
    dy_ptr,
    x_ptr,
    mean_ptr,
    rstd_ptr,
    dscale_partial_ptr,
    dbias_partial_ptr,
    batch,
    block,
    split,
    n_tokens: tl.constexpr,
    n_channels: tl.constexpr,
    n_groups: tl.constexpr,
    GROUP_SIZE: tl.constexpr,
    GROUPS_PER_BLOCK: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_C: tl.constexpr,
    SPLITS: tl.constexpr,
    TOKENS_PER_SPLIT: tl.constexpr,
):
    """Stores the Σ dy · x̂ and Σ dy of block ``block``'s channels of example ``batch`` over split ``split``'s
    tokens."""
    membership, channels, own = _block(block, n_channels, GROUP_SIZE, GROUPS_PER_BLOCK, BLOCK_C)
    mean, rstd = _channel_statistics(mean_ptr, rstd_ptr, batch, block, membership, n_groups, GROUPS_PER_BLOCK)
    first_token, count = _split_run(split, n_tokens, TOKENS_PER_SPLIT)
    sum_dy_xhat, sum_dy = _run_sums(
        dy_ptr,
        x_ptr,
        mean,
        rstd,
        batch,
        first_token,
        count,
        channels,
        own,
        n_tokens,
        n_channels,
        BLOCK_S,
        BLOCK_C,
        TOKENS_PER_SPLIT // BLOCK_S,
    )
    row = batch * SPLITS + split
    _store_partials(dscale_partial_ptr, dbias_partial_ptr, sum_dy_xhat, sum_dy, row, channels, own, n_channels)


@triton.jit
def _split_bwd_item(
    dy_ptr,
    x_ptr,
    scale_ptr,
    mean_ptr,
    rstd_ptr,
    dscale_partial_ptr,
    dbias_partial_ptr,
    dx_ptr,
    batch,
    block,
    split,
    n_tokens: tl.constexpr,
    n_channels: tl.constexpr,
    n_groups: tl.constexpr,
    GROUP_SIZE: tl.constexpr,
    GROUPS_PER_BLOCK: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_C: tl.constexpr,
    SPLITS: tl.constexpr,
    TOKENS_PER_SPLIT: tl.constexpr,
    SPLIT_BLOCK: tl.constexpr,
    CACHE: tl.constexpr,
):
    """Adds the split sums of block ``block``'s channels of example ``batch`` (loaded with the cache modifier CACHE)
    and writes dx of split ``split``'s tokens (see ``_store_dx``)."""
    membership, channels, own = _block(block, n_channels, GROUP_SIZE, GROUPS_PER_BLOCK, BLOCK_C)
    scale = _load_channels(scale_ptr, channels, n_channels)
    mean, rstd = _channel_statistics(mean_ptr, rstd_ptr, batch, block, membership, n_groups, GROUPS_PER_BLOCK)
    offsets, valid = _split_offsets(batch, channels, own, SPLITS, n_channels, SPLIT_BLOCK)
    sum_dy_xhat = tl.sum(tl.load(dscale_partial_ptr + offsets, mask=valid, other=0.0, cache_modifier=CACHE), axis=0)
    sum_dy = tl.sum(tl.load(dbias_partial_ptr + offsets, mask=valid, other=0.0, cache_modifier=CACHE), axis=0)
    mean_dy_xhat, mean_dy = _group_means(scale, sum_dy_xhat, sum_dy, membership, n_tokens * GROUP_SIZE)
    first_token, count = _split_run(split, n_tokens, TOKENS_PER_SPLIT)
    _store_run_dx(
        dy_ptr,
        x_ptr,
        mean,
        rstd,
        scale,
        mean_dy_xhat,
        mean_dy,
        dx_ptr,
        batch,
        first_token,
        count,
        channels,
        own,
        n_tokens,
        n_channels,
        BLOCK_S,
        TOKENS_PER_SPLIT // BLOCK_S,
    )


@triton.jit
def group_norm_split_sums(
    dy_ptr,  # [n_batch, n_tokens, n_channels] x.dtype
    x_ptr,  # [n_batch, n_tokens, n_channels] x.dtype
    mean_ptr,  # [n_batch, n_groups] fp32
    rstd_ptr,  # [n_batch, n_groups] fp32
    dscale_partial_ptr,  # [n_batch, SPLITS, n_channels] fp32: Σ over the split's tokens of dy · x̂
    dbias_partial_ptr,  # [n_batch, SPLITS, n_channels] fp32: Σ over the split's tokens of dy
    n_tokens: tl.constexpr,
    n_channels: tl.constexpr,
    n_groups: tl.constexpr,
    GROUP_SIZE: tl.constexpr,
    GROUPS_PER_BLOCK: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_C: tl.constexpr,
    SPLITS: tl.constexpr,
    TOKENS_PER_SPLIT: tl.constexpr,
):
    """Program (b, k, s) stores its channels' Σ dy · x̂ and Σ dy over split s's tokens: dscale's and dbias's
    partials (XLA adds them) and the sums dx needs."""
    _split_sums_item(
        dy_ptr,
        x_ptr,
        mean_ptr,
        rstd_ptr,
        dscale_partial_ptr,
        dbias_partial_ptr,
        tl.program_id(0),
        tl.program_id(1),
        tl.program_id(2),
        n_tokens,
        n_channels,
        n_groups,
        GROUP_SIZE,
        GROUPS_PER_BLOCK,
        BLOCK_S,
        BLOCK_C,
        SPLITS,
        TOKENS_PER_SPLIT,
    )


@triton.jit
def group_norm_split_bwd(
    dy_ptr,  # [n_batch, n_tokens, n_channels] x.dtype
    x_ptr,  # [n_batch, n_tokens, n_channels] x.dtype
    scale_ptr,  # [n_channels] scale.dtype
    mean_ptr,  # [n_batch, n_groups] fp32
    rstd_ptr,  # [n_batch, n_groups] fp32
    dscale_partial_ptr,  # [n_batch, SPLITS, n_channels] fp32: group_norm_split_sums'
    dbias_partial_ptr,  # [n_batch, SPLITS, n_channels] fp32: group_norm_split_sums'
    dx_ptr,  # [n_batch, n_tokens, n_channels] x.dtype
    n_tokens: tl.constexpr,
    n_channels: tl.constexpr,
    n_groups: tl.constexpr,
    GROUP_SIZE: tl.constexpr,
    GROUPS_PER_BLOCK: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_C: tl.constexpr,
    SPLITS: tl.constexpr,
    TOKENS_PER_SPLIT: tl.constexpr,
    SPLIT_BLOCK: tl.constexpr,  # SPLITS up to a power of two
):
    """Program (b, k, s) adds its channels' split sums and writes dx of split s's tokens (see ``_store_dx``)."""
    batch, block, split = _reversed_programs()
    _split_bwd_item(
        dy_ptr,
        x_ptr,
        scale_ptr,
        mean_ptr,
        rstd_ptr,
        dscale_partial_ptr,
        dbias_partial_ptr,
        dx_ptr,
        batch,
        block,
        split,
        n_tokens,
        n_channels,
        n_groups,
        GROUP_SIZE,
        GROUPS_PER_BLOCK,
        BLOCK_S,
        BLOCK_C,
        SPLITS,
        TOKENS_PER_SPLIT,
        SPLIT_BLOCK,
        "",
    )


@triton.jit
def group_norm_ordered_bwd(
    dy_ptr,  # [n_batch, n_tokens, n_channels] x.dtype
    x_ptr,  # [n_batch, n_tokens, n_channels] x.dtype
    scale_ptr,  # [n_channels] scale.dtype
    mean_ptr,  # [n_batch, n_groups] fp32
    rstd_ptr,  # [n_batch, n_groups] fp32
    dx_ptr,  # [n_batch, n_tokens, n_channels] x.dtype
    dscale_partial_ptr,  # [n_batch, SPLITS, n_channels] fp32: Σ over the split's tokens of dy · x̂
    dbias_partial_ptr,  # [n_batch, SPLITS, n_channels] fp32: Σ over the split's tokens of dy
    tickets_ptr,  # [1] int32, zeroed
    arrivals_ptr,  # [n_batch · n_blocks] int32, zeroed: each unit's statistics items done
    n_tokens: tl.constexpr,
    n_channels: tl.constexpr,
    n_groups: tl.constexpr,
    GROUP_SIZE: tl.constexpr,
    GROUPS_PER_BLOCK: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_C: tl.constexpr,
    SPLITS: tl.constexpr,
    TOKENS_PER_SPLIT: tl.constexpr,
    SPLIT_BLOCK: tl.constexpr,  # SPLITS up to a power of two
    LAG: tl.constexpr,
):
    """The backward's two passes in one launch, as ``group_norm_ordered_fwd`` runs the forward's: a statistics item
    is ``group_norm_split_sums``' program, an output item ``group_norm_split_bwd``'s."""
    is_statistics, unit, split = _ordered_item(_ticket(tickets_ptr), SPLITS, LAG)
    batch, block = _unit_position(unit, n_groups, GROUPS_PER_BLOCK)
    if is_statistics:
        _split_sums_item(
            dy_ptr,
            x_ptr,
            mean_ptr,
            rstd_ptr,
            dscale_partial_ptr,
            dbias_partial_ptr,
            batch,
            block,
            split,
            n_tokens,
            n_channels,
            n_groups,
            GROUP_SIZE,
            GROUPS_PER_BLOCK,
            BLOCK_S,
            BLOCK_C,
            SPLITS,
            TOKENS_PER_SPLIT,
        )
        _arrive(arrivals_ptr + unit)
    else:
        _wait_for(arrivals_ptr + unit, SPLITS)
        # Past L1 (.cg), as in group_norm_ordered_fwd.
        _split_bwd_item(
            dy_ptr,
            x_ptr,
            scale_ptr,
            mean_ptr,
            rstd_ptr,
            dscale_partial_ptr,
            dbias_partial_ptr,
            dx_ptr,
            batch,
            block,
            split,
            n_tokens,
            n_channels,
            n_groups,
            GROUP_SIZE,
            GROUPS_PER_BLOCK,
            BLOCK_S,
            BLOCK_C,
            SPLITS,
            TOKENS_PER_SPLIT,
            SPLIT_BLOCK,
            ".cg",
        )
