"""GroupNorm, channels last: reference, Triton launches, custom_vjp."""

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from liger_jax import runtime
from liger_jax.ops import _checks, _dispatch, _tiling
from liger_jax.ops._batching import vmap_over_rows
from liger_jax.ops._partitioning import partitioned
from liger_jax.ops._tiling import cdiv, next_power_of_2

# A program's block of groups spans at least this many channels, so each token's slice of it is one contiguous run
# of at least 128 bytes (bf16): whole cache lines, however few channels a group has.
MIN_BLOCK_CHANNELS = 64
# Tokens are walked in chunks of about this many elements: 64 KB of bf16 per load keeps enough bytes in flight for
# one program per SM. A group block of at most this many elements is read once and kept in registers (one pass); a
# longer one is read twice, the second pass from the end (L2). Measured on the H200 at the target (16 × 4096 tokens
# × 512 channels in 32 groups, bf16 fwd+bwd, benchmarks.row_tiling, 32 warps): 512-token chunks of 64 channels
# 0.257 ms (1.55x XLA), 256 tokens 0.313 ms (1.27x), 128 tokens at 16 warps 0.342 ms.
CHUNK_ELEMENTS = 32768
# 32 elements of a chunk per thread, at least 4 warps, at most 16: the target's 512 × 64 chunks get 16, which beat 32
# on an H100 (bf16 fwd+bwd; ptxas spills a few bytes in the one-launch backward, which the numbers include):
# 0.262 → 0.233 ms at the target, 0.488 → 0.414 at 1024 channels (256 programs), 1.049 → 0.894 at 16384 tokens.
ELEMENTS_PER_WARP = 1024
MAX_WARPS = 16
# Where an input's examples × blocks of groups make at most twice as many programs as the GPU has multiprocessors
# (the target's 16 × 8 = 128; 256 at 1024 channels), sixteen programs share each block's tokens, if each run still
# holds two chunks, and a pass is one ordered launch whose statistics run a wave of programs (the multiprocessors'
# count of items) ahead of its outputs. Its chunks are smaller, SPLIT_CHUNK_ELEMENTS at SPLIT_ELEMENTS_PER_WARP
# (128 tokens × 64 channels, 4 warps): the ordered kernels are latency-bound (ncu, H100, the earlier 512 × 64 chunks
# at 16 warps: one program a multiprocessor at 127-128 registers, 24% of the warps active, 46% of the DRAM peak
# forward), and four 4-warp programs of 120 registers share a multiprocessor. H100, bf16 fwd+bwd, XLA in each run:
# at the target 0.188 ms (2.30x XLA, 60% of the floor; 264 items ahead 0.190-0.193) against 0.205-0.206 (2.09-2.11x)
# with the rule before (4 splits of 512 × 64 chunks at 16 warps, 66 ahead); 16 × 16384 × 512 0.771 (1.42x; 264
# ahead 0.768-0.770) against 0.787-0.792; 16 × 4096 × 1024 0.358 (1.63x; 264 ahead 0.371-0.375) against 0.406
# unsplit; 256 × 64 chunks at 8 warps, 8 splits 0.193-0.194 / 0.780-0.793 / 0.369-0.373; 32-warp programs of the old
# chunks (64 registers) 0.237-0.254 at the target; blocks of 128-512 channels 0.278-0.465. Earlier (H100, the old
# chunks): 0.217 with two splits in two launches a pass, 0.205 with 4 in one ordered launch 66 items ahead (132:
# 0.208, 264: 0.215, every statistics item first: 0.222); without splits 0.233.
RULE_TOKEN_SPLITS = 16
SPLIT_PROGRAMS_PER_SM = 2
SPLIT_LAG_PER_SM = 1
SPLIT_CHUNK_ELEMENTS = 8192
SPLIT_ELEMENTS_PER_WARP = 2048
MIN_SPLIT_CHUNKS = 2
# The widest block of channels the kernels take: a group of more channels runs under implementation="xla".
MAX_BLOCK_CHANNELS = 16384


def group_norm(
    x: jax.Array,
    scale: jax.Array | None,
    bias: jax.Array | None,
    *,
    num_groups: int,
    epsilon: float = 1e-5,
    implementation: runtime.Implementation | None = None,
) -> jax.Array:
    r"""Group normalisation, channels last (``flax.nnx.GroupNorm``'s layout; Liger's GroupNorm).

    The channels (last axis, C) are cut into ``num_groups`` groups of ``C / num_groups`` adjacent channels; each
    example (index of the first axis) and group is normalised over all of its positions (the axes between the
    first and the last) and the group's channels:

    .. math::
        y = \frac{x - \mathrm{mean}_{b,g}(x)}{\sqrt{\mathrm{var}_{b,g}(x) + \epsilon}} \cdot \mathrm{scale}_c
            + \mathrm{bias}_c

    Numerics: mean and variance are exact fp32 (per-chunk two-pass moments merged with Chan et al.'s update, never
    E[x²] - E[x]²); the normalisation, scale and bias are fp32 and ``y`` is rounded to ``x.dtype`` once. The
    forward pass saves ``x`` and each (example, group)'s fp32 mean and rstd; the backward pass is fp32, and
    dscale/dbias are summed from fp32 partials per example (and run of tokens; deterministic, no atomics).

    Args:
        x: ``[B, ..., C]`` float32, bfloat16 or float16 (float64 too under ``"xla"``), rank ≥ 2.
        scale: ``[C]`` of any of those float dtypes, or None for no scale; dscale comes back in its dtype.
        bias: ``[C]`` of any of those float dtypes, or None for no bias; dbias comes back in its dtype.
        num_groups: the number of groups, a positive divisor of C.
        epsilon: added to the variance.
        implementation: ``"triton"``, ``"interpret"``, ``"xla"`` or None for the default (see
            :mod:`liger_jax.runtime`).

    Returns:
        ``[B, ..., C]`` array of ``x.dtype``.

    Raises:
        TypeError: x, scale or bias is not floating point, or num_groups is not an int.
        ValueError: x has rank < 2, num_groups does not divide C, scale or bias is not ``(C,)``, or an unknown
            implementation.

    Example:
        >>> y = liger_jax.group_norm(x, scale, bias, num_groups=32)  # x: [batch, height, width, channels]
    """
    implementation = _dispatch.resolve(implementation, "group_norm", np.size(x))
    _checks.check_floating("x", x, implementation)
    _checks.check_min_rank("x", x, 2)
    n_channels = x.shape[-1]
    if not isinstance(num_groups, (int, np.integer)) or isinstance(num_groups, bool):
        raise TypeError(f"num_groups must be an int, got {num_groups!r}")
    if num_groups < 1 or n_channels % num_groups:
        raise ValueError(
            f"num_groups must be a positive divisor of the channels (x.shape[-1]={n_channels}), got {num_groups}"
        )
    for name, weight in (("scale", scale), ("bias", bias)):
        if weight is not None:
            _checks.check_floating(name, weight, implementation)
            _checks.check_shape(name, weight, (n_channels,), "the channels, the last axis of x")
    if implementation == "xla":
        return group_norm_reference(x, scale, bias, num_groups=num_groups, epsilon=epsilon)
    _checks.check_max_cols("a group of x", n_channels // num_groups, MAX_BLOCK_CHANNELS)
    if x.size == 0:
        return jnp.zeros_like(x)
    # A missing weight is its identity: x · 1 and x + 0 are exact in fp32, so the numerics do not change.
    scale = jnp.ones((n_channels,), x.dtype) if scale is None else scale
    bias = jnp.zeros((n_channels,), x.dtype) if bias is None else bias
    tokens = x.reshape(x.shape[0], -1, n_channels)
    return _group_norm(tokens, scale, bias, int(num_groups), float(epsilon), implementation).reshape(x.shape)


def group_norm_reference(
    x: jax.Array, scale: jax.Array | None, bias: jax.Array | None, *, num_groups: int, epsilon: float = 1e-5
) -> jax.Array:
    """GroupNorm in plain jax.numpy: the specification of :func:`group_norm` and its ``"xla"`` implementation.

    Computes in ``promote(x.dtype, float32)`` (float64 inputs stay float64, the tests' exact oracle), the variance
    as the mean of squared deviations, and rounds to ``x.dtype`` at the end. Shapes and dtypes as
    :func:`group_norm`.
    """
    compute = jnp.promote_types(x.dtype, jnp.float32)
    n_channels = x.shape[-1]
    grouped = x.astype(compute).reshape(x.shape[0], -1, num_groups, n_channels // num_groups)
    centred = grouped - jnp.mean(grouped, axis=(1, 3), keepdims=True)
    variance = jnp.mean(centred * centred, axis=(1, 3), keepdims=True)
    y = (centred * jax.lax.rsqrt(variance + epsilon)).reshape(x.shape)
    channel_shape = (1,) * (x.ndim - 1) + (n_channels,)
    if scale is not None:
        y = y * scale.astype(compute).reshape(channel_shape)
    if bias is not None:
        y = y + bias.astype(compute).reshape(channel_shape)
    return y.astype(x.dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5))
def _group_norm(x, scale, bias, num_groups, epsilon, implementation):
    y, _, _ = _forward(num_groups, epsilon, implementation, _tiling.current_override())(x, scale, bias)
    return y


def _group_norm_fwd(x, scale, bias, num_groups, epsilon, implementation):
    y, mean, rstd = _forward(num_groups, epsilon, implementation, _tiling.current_override())(x, scale, bias)
    return y, (x, scale, bias, mean, rstd)


def _group_norm_bwd(num_groups, epsilon, implementation, residuals, dy):
    del epsilon
    x, scale, bias, mean, rstd = residuals
    dx, dscale, dbias = _backward(num_groups, implementation, _tiling.current_override())(dy, x, scale, mean, rstd)
    n_channels = x.shape[-1]
    return (
        dx,
        dscale.reshape(-1, n_channels).sum(axis=0).astype(scale.dtype),
        dbias.reshape(-1, n_channels).sum(axis=0).astype(bias.dtype),
    )


_group_norm.defvjp(_group_norm_fwd, _group_norm_bwd)


@dataclasses.dataclass(frozen=True)
class GroupTiling:
    """How the kernels cut ``[n_batch, n_tokens, n_channels]``: ``token_splits`` programs per example and block of
    ``groups_per_block`` groups (``block_c`` channels, a power of two), each walking its run of
    ``tokens_per_split`` tokens ``block_s`` at a time (``num_stages`` software-pipelining stages). With one split a
    pass is one launch; with more, two, or one whose statistics items run ``split_lag`` items ahead of its output
    items where that is set (``kernels.group_norm``)."""

    groups_per_block: int
    block_c: int
    block_s: int
    num_warps: int
    num_stages: int
    token_splits: int
    tokens_per_split: int
    split_lag: int | None = None

    def grid(self, n_batch: int, num_groups: int) -> tuple[int, int, int]:
        return n_batch, cdiv(num_groups, self.groups_per_block), self.token_splits


def group_tiling(
    n_tokens: int,
    n_channels: int,
    num_groups: int,
    override: _tiling.TilingOverride | None = None,
    *,
    n_batch: int = 1,
) -> GroupTiling:
    """The tiling rule for ``n_batch`` examples: blocks of at least MIN_BLOCK_CHANNELS channels (whole groups, a power
    of two of them), walked in chunks of about CHUNK_ELEMENTS (one chunk, one pass, when all tokens fit); the tokens
    shared among RULE_TOKEN_SPLITS programs where the examples' blocks make at most SPLIT_PROGRAMS_PER_SM times as
    many programs as the GPU has multiprocessors and every run keeps MIN_SPLIT_CHUNKS chunks of SPLIT_CHUNK_ELEMENTS
    (SPLIT_ELEMENTS_PER_WARP a warp), each pass one ordered launch with the statistics SPLIT_LAG_PER_SM times the
    multiprocessors' count of items ahead. Split passes, forced or not, take chunks of SPLIT_CHUNK_ELEMENTS at
    SPLIT_ELEMENTS_PER_WARP.

    ``override`` (``_tiling.overridden``'s) replaces MIN_BLOCK_CHANNELS with its ``block_d``, the tokens per chunk
    with its ``block_rows``, the warps and stages with its own, and the splits with its ``token_splits`` (runs of
    whole chunks; fewer splits where the runs would otherwise leave one empty) and the lag with its ``split_lag``
    (raised to the splits). Forced splits without a forced lag run two launches a pass.
    """
    override = override or _tiling.TilingOverride()
    group_size = n_channels // num_groups
    min_channels = override.block_d or MIN_BLOCK_CHANNELS
    groups_per_block = min(next_power_of_2(cdiv(min_channels, group_size)), next_power_of_2(num_groups))
    block_c = next_power_of_2(groups_per_block * group_size)
    split_chunk_tokens = override.block_rows or max(1, SPLIT_CHUNK_ELEMENTS // block_c)
    splits, lag = override.token_splits, override.split_lag
    if splits is None:
        sms = _tiling.multiprocessor_count()
        few_programs = n_batch * cdiv(num_groups, groups_per_block) <= SPLIT_PROGRAMS_PER_SM * sms
        long_runs = n_tokens >= RULE_TOKEN_SPLITS * MIN_SPLIT_CHUNKS * split_chunk_tokens
        splits = RULE_TOKEN_SPLITS if few_programs and long_runs else 1
        lag = lag or SPLIT_LAG_PER_SM * sms
    if splits > 1:
        chunk_tokens, elements_per_warp = split_chunk_tokens, SPLIT_ELEMENTS_PER_WARP
    else:
        chunk_tokens, elements_per_warp = override.block_rows or max(1, CHUNK_ELEMENTS // block_c), ELEMENTS_PER_WARP
    run = cdiv(n_tokens, splits)
    block_s = min(next_power_of_2(run), chunk_tokens)
    num_warps = override.num_warps or max(4, min(MAX_WARPS, block_s * block_c // elements_per_warp))
    tokens_per_split = cdiv(run, block_s) * block_s
    splits = cdiv(n_tokens, tokens_per_split)
    return GroupTiling(
        groups_per_block,
        block_c,
        block_s,
        num_warps,
        override.num_stages or 1,
        token_splits=splits,
        tokens_per_split=tokens_per_split,
        split_lag=max(lag, splits) if lag and splits > 1 else None,
    )


def _kernel_settings(x: jax.Array, num_groups: int, override) -> tuple[GroupTiling, tuple[int, int, int], dict]:
    """The tiling, the grid and the constexprs every kernel shares for ``x [..., n_tokens, n_channels]``."""
    n_tokens, n_channels = x.shape[-2:]
    n_batch = math.prod(x.shape[:-2])
    tiling = group_tiling(n_tokens, n_channels, num_groups, override, n_batch=n_batch)
    constexprs = {
        "num_warps": tiling.num_warps,
        "num_stages": tiling.num_stages,
        "n_tokens": n_tokens,
        "n_channels": n_channels,
        "n_groups": num_groups,
        "GROUP_SIZE": n_channels // num_groups,
        "GROUPS_PER_BLOCK": tiling.groups_per_block,
        "BLOCK_S": tiling.block_s,
        "BLOCK_C": tiling.block_c,
    }
    return tiling, tiling.grid(n_batch, num_groups), constexprs


def _split_constexprs(tiling: GroupTiling, *, merges: bool) -> dict:
    """The constexprs the split kernels add; a kernel that ``merges`` the splits' results (the second launch of a
    pass) also takes SPLIT_BLOCK, the splits up to a power of two."""
    constexprs = {"SPLITS": tiling.token_splits, "TOKENS_PER_SPLIT": tiling.tokens_per_split}
    return constexprs | ({"SPLIT_BLOCK": next_power_of_2(tiling.token_splits)} if merges else {})


def _ordered_settings(tiling: GroupTiling, grid: tuple[int, int, int], outputs: list) -> dict:
    """``runtime.launch``'s settings for an ordered launch (``kernels.group_norm_ordered_fwd`` / ``_bwd``) of a pass
    whose split launches have ``grid`` and that writes ``outputs``: those out shapes, then its zeroed counters' (the
    tickets, each unit's arrivals), its grid (both launches' programs) and the constexprs it adds to the merging
    launch's."""
    counters = [jax.ShapeDtypeStruct((1,), jnp.int32), jax.ShapeDtypeStruct((grid[0] * grid[1],), jnp.int32)]
    return {
        "out_shape": [*outputs, *counters],
        "zeroed_outputs": tuple(range(len(outputs), len(outputs) + len(counters))),
        "grid": (2 * math.prod(grid),),
        **_split_constexprs(tiling, merges=True),
        "LAG": tiling.split_lag,
    }


# Examples (the leading axes) shard freely; a launch needs each example's tokens and channels whole.
_FORWARD_RULE = "... s c, c, c -> ... s c, ... g, ... g"
_BACKWARD_RULE = "... s c, ... s c, c, ... g, ... g -> ... s c, ... c, ... c"
_WHOLE = ("s", "c", "g")


@functools.cache
def _forward(num_groups: int, epsilon: float, implementation: str, override: _tiling.TilingOverride | None):
    """``(x [..., S, C], scale [C], bias [C]) -> (y [..., S, C] x.dtype, mean [..., G] fp32, rstd [..., G] fp32)``
    through the kernel, tiled as :func:`group_tiling` says with ``override``; sharded over and vmap-able into the
    leading (example) axes."""
    from liger_jax.kernels import group_norm as kernels

    def launch(x, scale, bias):
        tiling, grid, constexprs = _kernel_settings(x, num_groups, override)
        stats = jax.ShapeDtypeStruct((grid[0], num_groups), jnp.float32)
        outputs = [jax.ShapeDtypeStruct(x.shape, x.dtype), stats, stats]
        settings = {"grid": grid, "implementation": implementation, **constexprs}
        split_stats = jax.ShapeDtypeStruct((grid[0], tiling.token_splits, num_groups), jnp.float32)
        if tiling.token_splits == 1:
            y, mean, rstd = runtime.launch(
                kernels.group_norm_fwd, x, scale, bias, out_shape=outputs, eps=epsilon, **settings
            )
        elif tiling.split_lag:
            ordered = _ordered_settings(tiling, grid, [*outputs, split_stats, split_stats])
            y, mean, rstd, *_ = runtime.launch(
                kernels.group_norm_ordered_fwd, x, scale, bias, eps=epsilon, **settings | ordered
            )
        else:
            moments = runtime.launch(
                kernels.group_norm_split_moments,
                x,
                out_shape=[split_stats, split_stats],
                **settings,
                **_split_constexprs(tiling, merges=False),
            )
            y, mean, rstd = runtime.launch(
                kernels.group_norm_split_fwd,
                x,
                scale,
                bias,
                *moments,
                out_shape=outputs,
                eps=epsilon,
                **settings,
                **_split_constexprs(tiling, merges=True),
            )
        lead = x.shape[:-2]
        return y, mean.reshape(*lead, num_groups), rstd.reshape(*lead, num_groups)

    return vmap_over_rows(partitioned(launch, _FORWARD_RULE, replicated=_WHOLE), row_argnums=(0,), reduces_rows=False)


@functools.cache
def _backward(num_groups: int, implementation: str, override: _tiling.TilingOverride | None):
    """``(dy, x, scale, mean, rstd) -> (dx [..., S, C] x.dtype, dscale and dbias per example [..., C] fp32)``."""
    from liger_jax.kernels import group_norm as kernels

    def launch(dy, x, scale, mean, rstd):
        tiling, grid, constexprs = _kernel_settings(x, num_groups, override)
        n_channels = x.shape[-1]
        dx_shape = jax.ShapeDtypeStruct(x.shape, x.dtype)
        settings = {"grid": grid, "implementation": implementation, **constexprs}
        # Each split's per-channel partial sums (one split: the kernel's [n_batch, n_channels] rows).
        partial = jax.ShapeDtypeStruct((grid[0], tiling.token_splits, n_channels), jnp.float32)
        if tiling.token_splits == 1:
            dx, dscale, dbias = runtime.launch(
                kernels.group_norm_bwd, dy, x, scale, mean, rstd, out_shape=[dx_shape, partial, partial], **settings
            )
        elif tiling.split_lag:
            ordered = _ordered_settings(tiling, grid, [dx_shape, partial, partial])
            dx, dscale, dbias, *_ = runtime.launch(
                kernels.group_norm_ordered_bwd, dy, x, scale, mean, rstd, **settings | ordered
            )
        else:
            dscale, dbias = runtime.launch(
                kernels.group_norm_split_sums,
                dy,
                x,
                mean,
                rstd,
                out_shape=[partial, partial],
                **settings,
                **_split_constexprs(tiling, merges=False),
            )
            dx = runtime.launch(
                kernels.group_norm_split_bwd,
                dy,
                x,
                scale,
                mean,
                rstd,
                dscale,
                dbias,
                out_shape=dx_shape,
                **settings,
                **_split_constexprs(tiling, merges=True),
            )
        lead = x.shape[:-2]
        return dx, dscale.sum(axis=1).reshape(*lead, n_channels), dbias.sum(axis=1).reshape(*lead, n_channels)

    return vmap_over_rows(
        partitioned(launch, _BACKWARD_RULE, replicated=_WHOLE), row_argnums=(0, 1, 3, 4), reduces_rows=False
    )
