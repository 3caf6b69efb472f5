"""Fused linear log-probs: ``log softmax(x W / T)[token]`` (and the entropy) per row without the ``N × V`` logits."""

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from liger_jax import runtime
from liger_jax.ops import _checks, _dispatch, _linear_chunks, _tiling
from liger_jax.ops._batching import vmap_over_rows
from liger_jax.ops._cross_entropy_rows import vocab_tiling
from liger_jax.ops._linear_chunks import ChunkPlan, WeightLayout, check_linear_operands, logits_reference
from liger_jax.ops._partitioning import partitioned


def fused_linear_logprobs(
    x: jax.Array,
    weight: jax.Array,
    tokens: jax.Array,
    *,
    bias: jax.Array | None = None,
    temperature: float = 1.0,
    return_entropy: bool = False,
    weight_layout: WeightLayout = "hv",
    chunk_size: int | None = None,
    implementation: runtime.Implementation | None = None,
) -> jax.Array | tuple[jax.Array, jax.Array]:
    r"""Per-row log-probability of ``tokens`` under ``softmax((x @ weight + bias) / temperature)``, chunked.

    With logits :math:`z = (x W + b) / T` of a row and its token :math:`t`:

    .. math:: \mathrm{logprob} = z_t - \log\sum_j e^{z_j}, \qquad
              \mathrm{entropy} = -\sum_j p_j \log p_j, \quad p = \mathrm{softmax}(z).

    The building block of policy-gradient losses (GRPO, PPO) and of reference-model scoring. The rows are walked
    in chunks exactly as :func:`liger_jax.fused_linear_cross_entropy` walks them (same chunk rule, layouts and
    memory bound; the ``"xla"`` implementation is chunked too): the ``N × V`` logits never exist. The temperature
    divides the logits in fp32 inside the row kernels. The forward pass keeps only the
    rows' lse (and entropy); the backward pass recomputes each chunk's logits and gets their gradient
    ``g · (onehot(t) - p) - h · p · (log p + entropy)`` (``g``, ``h`` the cotangents of logprob and entropy) in
    one pass, then ``dx``, ``dweight`` and ``dbias``: four matmuls per chunk in all.

    Numerics: softmax statistics in fp32 whatever the dtype; logits and their gradient in
    ``result_type(x, weight)``; ``dweight``/``dbias`` accumulated over chunks in fp32 and rounded once to their
    parameter's dtype. A traced token outside ``[0, V)`` gives a NaN log-prob and no log-prob gradient (concrete
    ones raise).

    Args:
        x: ``[..., H]`` float32, bfloat16 or float16 (float64 too under ``"xla"``); each leading index is a row.
        weight: ``[H, V]`` for ``weight_layout="hv"`` (a Dense kernel) or ``[V, H]`` for ``"vh"`` (a tied
            embedding table).
        tokens: ``[...]`` (``x.shape[:-1]``) integers in ``[0, V)``.
        bias: optional ``[V]`` added to the logits before the temperature.
        temperature: finite > 0; the logits are divided by it.
        return_entropy: also return each row's entropy (differentiable too).
        weight_layout: ``"hv"`` or ``"vh"``, as above.
        chunk_size: rows per chunk, or None for :func:`liger_jax.fused_linear_cross_entropy`'s default.
        implementation: ``"triton"``, ``"interpret"``, ``"xla"`` or None for the default (see
            :mod:`liger_jax.runtime`).

    Returns:
        ``logprobs`` ``[...]`` in ``promote(result_type(x, weight), float32)``, or ``(logprobs, entropy)`` with
        ``return_entropy``.

    Raises:
        TypeError: x, weight or bias are not floating point, or tokens are not integers.
        ValueError: shapes do not fit together, an unknown weight_layout, temperature not a finite number > 0,
            chunk_size not a positive int, or a concrete token outside ``[0, V)``.

    Example:
        >>> logps = liger_jax.fused_linear_logprobs(hidden, lm_head_kernel, sampled_tokens, temperature=0.7)
        >>> logps, entropy = liger_jax.fused_linear_logprobs(hidden, embedding, tokens, return_entropy=True,
        ...                                                   weight_layout="vh")
    """
    implementation = _dispatch.resolve(
        implementation, "fused_linear_logprobs", _dispatch.logits_elements(tokens, weight, weight_layout)
    )
    n_classes = check_linear_operands(x, weight, bias, weight_layout, implementation)
    check_tokens("tokens", tokens, x.shape[:-1], "the leading axes of x", n_classes)
    check_temperature(temperature)
    _linear_chunks.check_chunk_size(chunk_size)
    if tokens.size == 0:
        values = fused_linear_logprobs_reference(
            x, weight, tokens, bias=bias, temperature=temperature, return_entropy=True, weight_layout=weight_layout
        )
    else:
        plan = ChunkPlan.for_operands(x, weight, bias, weight_layout, chunk_size)
        values = _fused_linear_logprobs(x, weight, bias, tokens, plan, LogprobRows(implementation, float(temperature)))
    return tuple(values) if return_entropy else values[0]


def fused_linear_logprobs_reference(
    x: jax.Array,
    weight: jax.Array,
    tokens: jax.Array,
    *,
    bias: jax.Array | None = None,
    temperature: float = 1.0,
    return_entropy: bool = False,
    weight_layout: WeightLayout = "hv",
    logits_dtype=None,
) -> jax.Array | tuple[jax.Array, jax.Array]:
    """The specification (and test oracle) of :func:`fused_linear_logprobs`: materialises the logits
    ``x @ weight + bias`` (rounded to ``logits_dtype`` where the chunks round them, when given), divides them by
    the temperature and takes ``log_softmax`` and its entropy in ``promote(dtype, float32)``. A token outside
    ``[0, V)`` gives NaN."""
    logits = logits_reference(x, weight, bias, weight_layout, logits_dtype)
    logits = logits.astype(jnp.promote_types(logits.dtype, jnp.float32)) / temperature
    log_p = jax.nn.log_softmax(logits, axis=-1)
    in_range = (tokens >= 0) & (tokens < logits.shape[-1])
    picked = jnp.take_along_axis(log_p, jnp.where(in_range, tokens, 0)[..., None], axis=-1)[..., 0]
    logprobs = jnp.where(in_range, picked, jnp.nan)
    if not return_entropy:
        return logprobs
    return logprobs, -jnp.sum(jnp.exp(log_p) * log_p, axis=-1)


def check_tokens(name: str, tokens: jax.Array, row_shape, meaning: str, n_classes: int) -> None:
    """Checks integer ``tokens`` of ``row_shape``, and when concrete that each lies in ``[0, n_classes)``.

    Raises:
        TypeError: tokens are not integers.
        ValueError: a wrong shape, or a concrete token out of range.
    """
    if not jnp.issubdtype(tokens.dtype, jnp.integer):
        raise TypeError(f"{name} must have an integer dtype, got {tokens.dtype}")
    _checks.check_shape(name, tokens, row_shape, meaning)
    _checks.check_values(name, tokens, lambda t: (t < 0) | (t >= n_classes), f"be in [0, {n_classes})")


def check_temperature(temperature) -> None:
    """Raises ValueError unless ``temperature`` is a finite number > 0."""
    if isinstance(temperature, bool) or not (math.isfinite(temperature) and temperature > 0):
        raise ValueError(f"temperature must be a finite number > 0, got {temperature!r}")


@dataclasses.dataclass(frozen=True)
class LogprobRows:
    """The chunk loop's row math (``_linear_chunks.RowMath``) for log-probs at ``temperature``.

    Forward (row operands ``tokens``): values ``(logprob, lse, entropy)`` of ``logits / temperature``. Backward
    (row operands ``tokens, lse, entropy, logprob cotangent, entropy cotangent``): the gradient of the raw logits.
    """

    implementation: str
    temperature: float

    def __call__(self, logits, tokens, *grad_operands, vocab_axes=()):
        inv_temperature = 1.0 / self.temperature
        if self.implementation == "xla" or vocab_axes:
            if grad_operands:
                return (), logprob_grads_rows(logits, tokens, *grad_operands, inv_temperature, axes=vocab_axes)
            return logprob_rows(logits, tokens, inv_temperature, axes=vocab_axes), None
        if grad_operands:
            return (), _kernel_grads(self.implementation, inv_temperature)(logits, tokens, *grad_operands)
        return _kernel_rows(self.implementation, inv_temperature)(logits, tokens), None


def logprob_rows(logits, tokens, inv_temperature=1.0, axes=()):
    """Per row ``(logprob, lse, entropy)`` of ``z = logits · inv_temperature`` (the kernels' math in XLA),
    ``logits`` ``[..., V/n]`` with the vocabulary sharded on mesh ``axes`` (slice ``axis_index(axes)``; none:
    whole rows); fp32 (fp64 for fp64 logits)."""
    z = logits.astype(jnp.promote_types(logits.dtype, jnp.float32)) * inv_temperature
    local_classes = z.shape[-1]
    n_classes = local_classes * math.prod(jax.lax.axis_size(axis) for axis in axes)
    row_max = jax.lax.pmax(jnp.max(z, axis=-1), axes)
    e = jnp.exp(z - row_max[..., None])
    total = jax.lax.psum(jnp.sum(e, axis=-1), axes)
    centred_mean = jax.lax.psum(jnp.sum(e * (z - row_max[..., None]), axis=-1), axes) / total
    lse = row_max + jnp.log(total)
    local_token = tokens - jax.lax.axis_index(axes) * local_classes
    held_here = (local_token >= 0) & (local_token < local_classes)
    picked = jnp.take_along_axis(z, jnp.where(held_here, local_token, 0)[..., None], axis=-1)[..., 0]
    target = jax.lax.psum(jnp.where(held_here, picked, 0.0), axes)
    in_range = (tokens >= 0) & (tokens < n_classes)
    return jnp.where(in_range, target - lse, jnp.nan), lse, jnp.log(total) - centred_mean


def logprob_grads_rows(logits, tokens, lse, entropy, cotangent, entropy_cotangent, inv_temperature=1.0, axes=()):
    """``[..., V/n]`` gradient of ``Σ_rows cotangent · logprob + entropy_cotangent · entropy`` with respect to the
    logits, in logits.dtype, from :func:`logprob_rows`' lse and entropy (``kernels/logprobs.py``'s formula in
    XLA); vocabulary sharded as there."""
    z = logits.astype(jnp.promote_types(logits.dtype, jnp.float32)) * inv_temperature
    local_classes = z.shape[-1]
    n_classes = local_classes * math.prod(jax.lax.axis_size(axis) for axis in axes)
    log_p = z - lse[..., None]
    in_range = (tokens >= 0) & (tokens < n_classes)
    g = jnp.where(in_range, cotangent, 0.0).astype(z.dtype)[..., None]
    spread = g + entropy_cotangent.astype(z.dtype)[..., None] * (log_p + entropy[..., None])
    classes = jax.lax.broadcasted_iota(jnp.int32, z.shape, z.ndim - 1) + jax.lax.axis_index(axes) * local_classes
    grad = jnp.where(classes == tokens[..., None], g, 0.0) - jnp.exp(log_p) * spread
    return (grad * inv_temperature).astype(logits.dtype)


def _launch(kernel, implementation, inv_temperature, logits, row_operands, out_shape, **options):
    """``kernel`` over ``logits`` ``[..., V]`` as rows and ``row_operands`` ``[...]`` flattened alike."""
    n_cols = logits.shape[-1]
    rows = logits.reshape(-1, n_cols)
    tiling = vocab_tiling(n_cols, implementation)
    return runtime.launch(
        kernel,
        rows,
        *(operand.reshape(-1) for operand in row_operands),
        rows.shape[0],
        out_shape=out_shape,
        grid=(_tiling.cdiv(rows.shape[0], tiling.block_rows),),
        implementation=implementation,
        num_warps=tiling.num_warps,
        n_cols=n_cols,
        inv_temperature=float(inv_temperature),
        BLOCK_ROWS=tiling.block_rows,
        BLOCK_V=tiling.block_v,
        NUM_V_BLOCKS=tiling.num_v_blocks,
        **options,
    )


@functools.cache
def _kernel_rows(implementation: str, inv_temperature: float):
    """Kernel ``(logits [..., V], tokens [...]) -> (logprob, lse, entropy)``, each ``[...]`` fp32."""
    from liger_jax.kernels import logprobs as kernels

    def rows(logits, tokens):
        out_shape = (jax.ShapeDtypeStruct((tokens.size,), jnp.float32),) * 3
        logprob, entropy, lse = _launch(
            kernels.logprobs_and_entropy, implementation, inv_temperature, logits, (tokens,), out_shape
        )
        return tuple(value.reshape(tokens.shape) for value in (logprob, lse, entropy))

    sharded = partitioned(rows, "... v, ... -> ..., ..., ...", replicated=("v",))
    return vmap_over_rows(sharded, row_argnums=(0, 1), reduces_rows=False)


@functools.cache
def _kernel_grads(implementation: str, inv_temperature: float):
    """Kernel ``(logits, tokens, lse, entropy, logprob cotangent, entropy cotangent) -> dlogits [..., V]``."""
    from liger_jax.kernels import logprobs as kernels

    def grads(logits, tokens, lse, entropy, cotangent, entropy_cotangent):
        row_operands = (tokens, lse, entropy, cotangent.astype(jnp.float32), entropy_cotangent.astype(jnp.float32))
        (dlogits,) = _launch(
            kernels.logprobs_and_entropy_grad,
            implementation,
            inv_temperature,
            logits,
            row_operands,
            (jax.ShapeDtypeStruct((tokens.size, logits.shape[-1]), logits.dtype),),
            input_output_aliases={0: 0},  # the gradient overwrites the logits when they are dead
        )
        return dlogits.reshape(logits.shape)

    sharded = partitioned(grads, "... v, ..., ..., ..., ..., ... -> ... v", replicated=("v",))
    return vmap_over_rows(sharded, row_argnums=tuple(range(6)), reduces_rows=False)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def _fused_linear_logprobs(x, weight, bias, tokens, plan: ChunkPlan, rows: LogprobRows):
    """``(logprob, entropy)``, each ``[...]``."""
    return _fused_linear_logprobs_fwd(x, weight, bias, tokens, plan, rows)[0]


def _fused_linear_logprobs_fwd(x, weight, bias, tokens, plan, rows):
    logprob, lse, entropy = _linear_chunks.run_chunks(x, weight, bias, (tokens,), plan, rows, 3, grads=False).values
    return (logprob, entropy), (x, weight, bias, tokens, lse, entropy)


def _fused_linear_logprobs_bwd(plan, rows, residuals, cotangents):
    x, weight, bias, tokens, lse, entropy = residuals
    grad_operands = (tokens, lse, entropy, *cotangents)
    results = _linear_chunks.run_chunks(x, weight, bias, grad_operands, plan, rows, 0, grads=True)
    dweight, dbias = plan.parameter_grads(results.dweight, results.dbias)
    return results.dx, dweight, dbias, np.zeros(tokens.shape, jax.dtypes.float0)


_fused_linear_logprobs.defvjp(_fused_linear_logprobs_fwd, _fused_linear_logprobs_bwd)
