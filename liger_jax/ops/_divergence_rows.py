"""Per-row divergences shared by ``kl_div``, ``jsd`` and ``tvd`` (and the fused linear losses built on them).

A divergence of two ``[..., V]`` operands, ``input`` (what gets the gradient) and ``target`` (what gets none), is a
sum over V of per-element terms; :class:`Divergence` says which terms (the kernels' docstring,
``liger_jax.kernels.divergence``, has the formulas) and which rows are ignored. Everything here maps the operands to
fp32 per-row losses (or per-element terms, ``elementwise``), and on request to ``grad_scale[row] · d(row loss)/dinput``
computed in the same pass, as Liger does. Reductions over rows happen outside, in XLA (the count of non-ignored rows
is a traced value), and so does the scaling by the loss's cotangent in the backward pass (:func:`reduced_loss`),
except TVD's: its forward keeps only the gradient's signs, which :func:`scaled_signs`' kernel decodes and scales.
"""

import dataclasses
import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp

from liger_jax import runtime
from liger_jax.ops import _checks, _tiling
from liger_jax.ops._batching import vmap_over_rows
from liger_jax.ops._partitioning import partitioned

# Vocabulary block on GPUs: each element reads two operands, so 4096 classes per block keep a program's registers at
# cross-entropy's 8192 one-operand block (unmeasured for these kernels until the H200 benchmarks run).
MAX_BLOCK_V = 4096
# The interpreter (CPU tests) runs a block as numpy vectors: small blocks make test vocabularies of a few hundred
# classes span several blocks, the last one partial.
INTERPRETER_MAX_BLOCK_V = 128
_KERNEL_CODES = {"kl_div": 0, "jsd": 1, "tvd": 2}
# The kernel's SIGN_CODES output: 2-bit codes (sign + 1), four a byte.
SIGNS_PER_BYTE = 4
# The sign decoder's columns a program on GPUs (H200, 8192 × 128256 bf16: 0.644 ms at 8192, 0.66 at 2048), and
# at least 16 so that a program reads at least four bytes of codes.
SCALED_SIGNS_BLOCK_V = 8192
MIN_SCALED_SIGNS_BLOCK_V = 16
REDUCTIONS = ("batchmean", "sum", "mean", "none")

# Per-element reference terms: (input, target, divergence) -> [..., V] in the operands' (promoted) dtype.
Terms = Callable[[jax.Array, jax.Array, "Divergence"], jax.Array]


@dataclasses.dataclass(frozen=True)
class Divergence:
    """The static (hashable) settings of a divergence call.

    Attributes:
        kind: ``"kl_div"``, ``"jsd"`` or ``"tvd"``.
        terms: the per-element reference terms in plain jax.numpy (the ``"xla"`` implementation and the oracle).
        implementation: ``"triton"``, ``"interpret"`` or ``"xla"``.
        beta: the JSD's β.
        log_target: whether KL's target holds log-probabilities.
        eps: the floor of KL's target probabilities under the log.
        ignore_index: the label of ignored rows, when ``has_labels``.
        has_labels: whether rows come with labels (else every row counts).
        elementwise: per-element terms (reduction ``"none"`` of kl_div and tvd) rather than per-row sums.
    """

    kind: str
    terms: Terms
    implementation: str
    beta: float = 0.5
    log_target: bool = False
    eps: float = 1e-10
    ignore_index: int = -100
    has_labels: bool = False
    elementwise: bool = False


def check_operands(input_name: str, input, target_name: str, target, implementation: str) -> None:
    """Both operands float (kernel dtypes, or float64 under ``"xla"``), rank ≥ 1, the same shape, V ≥ 1.

    Raises:
        TypeError: an operand is not floating point.
        ValueError: rank 0, different shapes, or no classes.
    """
    _checks.check_floating(input_name, input, implementation)
    _checks.check_floating(target_name, target, implementation)
    _checks.check_min_rank(input_name, input, 1)
    _checks.check_shape(target_name, target, input.shape, f"the shape of {input_name}")
    if input.shape[-1] < 1:
        raise ValueError(f"{input_name} must have at least one class on its last axis, got shape {input.shape}")


def check_row_labels(labels, input_shape, ignore_index) -> None:
    """``labels`` None or integers of shape ``input_shape[:-1]``; ``ignore_index`` an int.

    Only ``labels == ignore_index`` is read (which rows count), so label values are not range-checked.

    Raises:
        TypeError: labels are not integers, or ignore_index is not an int.
        ValueError: labels do not have the leading shape of the input.
    """
    _checks.check_int("ignore_index", ignore_index)
    if labels is None:
        return
    if not jnp.issubdtype(labels.dtype, jnp.integer):
        raise TypeError(f"labels must have an integer dtype, got {labels.dtype}")
    _checks.check_shape("labels", labels, input_shape[:-1], "the leading axes of input")


def row_labels(labels: jax.Array | None, input_shape) -> jax.Array:
    """``labels``, or int32 zeros of the rows' shape when there are none (``has_labels=False`` never reads them)."""
    return jnp.zeros(input_shape[:-1], jnp.int32) if labels is None else labels


def counted_rows(labels: jax.Array, divergence: Divergence) -> jax.Array:
    """The number of rows that count (not ignored), a float32 scalar, at least 1 so every normalisation is defined
    (a batch of ignored rows sums to 0 and stays 0)."""
    if divergence.has_labels:
        count = jnp.sum(labels != divergence.ignore_index, dtype=jnp.float32)
    else:
        count = jnp.float32(labels.size)
    return jnp.maximum(count, 1.0)


def reduction_scale(labels: jax.Array, n_cols: int, reduction: str, divergence: Divergence) -> jax.Array:
    """d(reduced loss)/d(row loss), a float32 scalar: Liger's normalisations by the counted rows (``batchmean``)
    and by the counted elements (``mean``); 1 for ``sum`` and ``none``."""
    match reduction:
        case "batchmean":
            return 1.0 / counted_rows(labels, divergence)
        case "mean":
            return 1.0 / (counted_rows(labels, divergence) * n_cols)
        case "sum" | "none":
            return jnp.float32(1.0)
        case _:
            raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")


def reduce(losses: jax.Array, labels: jax.Array, n_cols: int, reduction: str, divergence: Divergence) -> jax.Array:
    """Row losses (or elementwise terms for ``none``) reduced as ``reduction`` says."""
    if reduction == "none":
        return losses
    return jnp.sum(losses) * reduction_scale(labels, n_cols, reduction, divergence).astype(losses.dtype)


def reference_losses(input: jax.Array, target: jax.Array, labels: jax.Array, divergence: Divergence) -> jax.Array:
    """Per-row losses ``[...]`` (per-element terms ``[..., V]`` when ``elementwise``) in plain jax.numpy, computed in
    ``promote(dtypes, float32)``; ignored rows give 0. The target gets no gradient."""
    compute = jnp.promote_types(jnp.promote_types(input.dtype, target.dtype), jnp.float32)
    terms = divergence.terms(input.astype(compute), jax.lax.stop_gradient(target).astype(compute), divergence)
    losses = terms if divergence.elementwise else jnp.sum(terms, axis=-1)
    if not divergence.has_labels:
        return losses
    ignored = labels == divergence.ignore_index
    return jnp.where(ignored[..., None] if divergence.elementwise else ignored, 0.0, losses)


def reduced_reference(input, target, labels, divergence: Divergence, reduction: str) -> jax.Array:
    """:func:`reference_losses` reduced as ``reduction`` says: the ``"xla"`` implementation of a divergence op."""
    return reduce(reference_losses(input, target, labels, divergence), labels, input.shape[-1], reduction, divergence)


def weighted(weight: jax.Array, value: jax.Array) -> jax.Array:
    """``weight · value``, 0 where ``weight`` is 0 (0 · log 0 = 0), without a NaN gradient from a discarded
    infinite ``value``: the reference terms' form of the kernels' convention."""
    zero = weight == 0.0
    return jnp.where(zero, 0.0, weight * jnp.where(zero, 0.0, value))


def row_losses(divergence: Divergence):
    """``(input [..., V], target [..., V], labels [...]) -> losses`` fp32 (``[..., V]`` when ``elementwise``)."""
    if divergence.implementation == "xla":
        return functools.partial(reference_losses, divergence=divergence)
    return _kernel_losses(divergence, _tiling.current_override())


def row_losses_and_grads(divergence: Divergence):
    """``(input, target, labels, grad_scale [...] fp32) -> (losses, dinput)``.

    ``dinput`` (input.dtype) is ``grad_scale[row] · d(row loss)/dinput``, 0 on ignored rows: the gradient of
    ``Σ grad_scale · losses`` (of each element's term times its row's scale, when ``elementwise``), rounded once.
    """
    if divergence.implementation == "xla":
        return functools.partial(_reference_losses_and_grads, divergence=divergence)
    return _kernel_losses_and_grads(divergence, _tiling.current_override())


def _reference_losses_and_grads(input, target, labels, grad_scale, divergence):
    losses, pullback = jax.vjp(lambda input: reference_losses(input, target, labels, divergence), input)
    scale = grad_scale[..., None] if divergence.elementwise else grad_scale
    (dinput,) = pullback(jnp.broadcast_to(scale.astype(losses.dtype), losses.shape))
    return losses, dinput


def _loss_shape(n_rows: int, n_cols: int, divergence: Divergence) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct((n_rows, n_cols) if divergence.elementwise else (n_rows,), jnp.float32)


def block_tiling(n_cols: int, implementation: str, override: _tiling.TilingOverride | None = None) -> _tiling.RowTiling:
    """How the divergence kernel cuts rows of ``n_cols`` classes: BLOCK_ROWS rows per program, walked in vocabulary
    blocks of ``block_d`` (BLOCK_V). ``override`` (``_tiling.overridden``'s) forces the vocabulary block (its
    block_d), the rows per program, the warps and the stages."""
    override = override or _tiling.TilingOverride()
    limit = INTERPRETER_MAX_BLOCK_V if implementation == "interpret" else MAX_BLOCK_V
    # At least one byte of sign codes (SIGNS_PER_BYTE columns) a block.
    block_v = max(SIGNS_PER_BYTE, min(override.block_d or limit, _tiling.next_power_of_2(n_cols)))
    # Short rows share a program so each still moves a few thousand elements.
    block_rows = override.block_rows or _tiling.rows_per_tile(block_v)
    # 32 fp32 values per thread per operand, at least 4 warps.
    num_warps = override.num_warps or max(4, min(32, block_rows * block_v // 1024))
    return _tiling.RowTiling(block_rows, block_v, num_warps, num_stages=override.num_stages or 1)


def _launch(divergence: Divergence, override, input, target, labels, grad_scale=None, sign_codes=False):
    """The divergence kernel over ``input``/``target`` ``[..., V]`` seen as rows, ``labels`` ``[...]`` flattened alike:
    ``losses``; or ``(losses, dinput)`` when ``grad_scale`` ``[...]`` is given (the kernel's WITH_GRAD; dinput in
    input's dtype); or, ``sign_codes``, ``(losses, codes [..., ceil(V / 4)] uint8)`` (the kernel's SIGN_CODES).
    Tiled as :func:`block_tiling` says with ``override``."""
    from liger_jax.kernels import divergence as kernels

    n_rows, n_cols = labels.size, input.shape[-1]
    tiling = block_tiling(n_cols, divergence.implementation, override)
    with_grad = grad_scale is not None
    # Without WITH_GRAD, grad_scale is a one-element placeholder the kernel never reads; so is dinput without either.
    if with_grad:
        dinput = jax.ShapeDtypeStruct((n_rows, n_cols), input.dtype)
    elif sign_codes:
        dinput = jax.ShapeDtypeStruct((n_rows, _tiling.cdiv(n_cols, SIGNS_PER_BYTE)), jnp.uint8)
    else:
        dinput = jax.ShapeDtypeStruct((1,), input.dtype)
    outputs = runtime.launch(
        kernels.divergence,
        input.reshape(n_rows, n_cols),
        target.reshape(n_rows, n_cols),
        labels.reshape(n_rows),
        grad_scale.reshape(n_rows).astype(jnp.float32) if with_grad else jnp.zeros((1,), jnp.float32),
        n_rows,
        out_shape=(_loss_shape(n_rows, n_cols, divergence), dinput),
        grid=(_tiling.cdiv(n_rows, tiling.block_rows),),
        implementation=divergence.implementation,
        num_warps=tiling.num_warps,
        num_stages=tiling.num_stages,
        n_cols=n_cols,
        ignore_index=int(divergence.ignore_index),
        DIVERGENCE=_KERNEL_CODES[divergence.kind],
        beta=float(divergence.beta),
        log_target=bool(divergence.log_target),
        eps=float(divergence.eps),
        HAS_LABELS=divergence.has_labels,
        ELEMENTWISE=divergence.elementwise,
        WITH_GRAD=with_grad,
        SIGN_CODES=sign_codes,
        BLOCK_ROWS=tiling.block_rows,
        BLOCK_V=tiling.block_d,
        NUM_V_BLOCKS=_tiling.cdiv(n_cols, tiling.block_d),
    )
    loss = outputs[0].reshape(input.shape if divergence.elementwise else labels.shape)
    if sign_codes:
        return loss, outputs[1].reshape(*input.shape[:-1], -1)
    return (loss, outputs[1].reshape(input.shape)) if with_grad else loss


def _loss_factors(divergence: Divergence) -> str:
    return "... v" if divergence.elementwise else "..."


@functools.cache
def _kernel_losses(divergence: Divergence, override: _tiling.TilingOverride | None):
    def losses(input, target, labels):
        return _launch(divergence, override, input, target, labels)

    # Rows shard freely; each launch needs its rows whole.
    sharded = partitioned(losses, f"... v, ... v, ... -> {_loss_factors(divergence)}", replicated=("v",))
    return vmap_over_rows(sharded, row_argnums=(0, 1, 2), reduces_rows=False)


@functools.cache
def _kernel_losses_and_grads(divergence: Divergence, override: _tiling.TilingOverride | None):
    def losses_and_grads(input, target, labels, grad_scale):
        return _launch(divergence, override, input, target, labels, grad_scale)

    rule = f"... v, ... v, ..., ... -> {_loss_factors(divergence)}, ... v"
    sharded = partitioned(losses_and_grads, rule, replicated=("v",))
    return vmap_over_rows(sharded, row_argnums=(0, 1, 2, 3), reduces_rows=False)


@functools.cache
def _kernel_losses_and_sign_codes(divergence: Divergence, override: _tiling.TilingOverride | None):
    def losses_and_codes(input, target, labels):
        return _launch(divergence, override, input, target, labels, sign_codes=True)

    rule = f"... v, ... v, ... -> {_loss_factors(divergence)}, ... c"
    sharded = partitioned(losses_and_codes, rule, replicated=("v", "c"))
    return vmap_over_rows(sharded, row_argnums=(0, 1, 2), reduces_rows=False)


def row_losses_and_sign_codes(divergence: Divergence):
    """``(input, target, labels) -> (losses, codes)`` under a kernel implementation.

    ``codes`` ``[..., ceil(V / 4)]`` uint8 holds ``sign(d row loss / dinput) + 1`` (0, 1 or 2) of each element in 2
    bits, column 4k + j of a row in bits 2j..2j+1 of its byte k; :func:`scaled_signs` reads them back. A quarter of
    the bytes of an int8 sign: TVD's residual, whose gradient is ±½ or 0 times a scale.
    """
    return _kernel_losses_and_sign_codes(divergence, _tiling.current_override())


def scaled_signs(
    codes: jax.Array, scale: jax.Array, n_cols: int, dtype, implementation: str, cotangent: jax.Array | None = None
) -> jax.Array:
    """``scale[row] · sign`` ``[..., n_cols]`` in ``dtype``, each sign (-1, 0 or 1) read from
    :func:`row_losses_and_sign_codes`' ``codes`` ``[..., ceil(n_cols / 4)]``; ``scale`` ``[...]`` fp32. With a
    ``cotangent`` ``[..., n_cols]`` each element is also multiplied by its own (in fp32, rounded once). One kernel:
    a read of the codes (and the cotangent), a write of the result (an XLA fusion of the same decode ran at half the
    H200's bandwidth)."""
    launcher = _scaled_signs_launcher(n_cols, jnp.dtype(dtype), implementation, cotangent is not None)
    return launcher(codes, scale) if cotangent is None else launcher(codes, scale, cotangent)


@functools.cache
def _scaled_signs_launcher(n_cols: int, dtype, implementation: str, per_element: bool):
    from liger_jax.kernels import divergence as kernels

    limit = INTERPRETER_MAX_BLOCK_V if implementation == "interpret" else SCALED_SIGNS_BLOCK_V
    block_v = max(MIN_SCALED_SIGNS_BLOCK_V, min(limit, _tiling.next_power_of_2(n_cols)))

    def launch(codes, scale, *cotangent):
        rows, n_rows = scale.shape, scale.size
        row_scale = scale.reshape(n_rows).astype(jnp.float32)
        result = runtime.launch(
            kernels.scaled_signs,
            codes.reshape(n_rows, codes.shape[-1]),
            row_scale,
            cotangent[0].reshape(n_rows, n_cols) if per_element else row_scale,
            out_shape=jax.ShapeDtypeStruct((n_rows, n_cols), dtype),
            grid=(n_rows, _tiling.cdiv(n_cols, block_v)),
            implementation=implementation,
            num_warps=max(1, min(8, block_v // 1024)),
            n_cols=n_cols,
            BLOCK_V=block_v,
            PER_ELEMENT=per_element,
        )
        return result.reshape(*rows, n_cols)

    rule = "... c, ..., ... v -> ... v" if per_element else "... c, ... -> ... v"
    sharded = partitioned(launch, rule, replicated=("c", "v"))
    return vmap_over_rows(sharded, row_argnums=(0, 1, 2) if per_element else (0, 1), reduces_rows=False)


def reduced_loss(input, target, labels, divergence: Divergence, reduction: str) -> jax.Array:
    """The reduced divergence, differentiable in ``input``: its gradient is computed with the loss in one pass
    (Liger's scheme) and scaled by the cotangent in the backward pass; ``target`` and ``labels`` get none."""
    if input.size == 0:
        return reduced_reference(input, target, labels, divergence, reduction)
    return _reduced_loss(input, target, labels, divergence, reduction)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _reduced_loss(input, target, labels, divergence, reduction):
    losses = row_losses(divergence)(input, target, labels)
    return reduce(losses, labels, input.shape[-1], reduction, divergence)


def _reduced_loss_fwd(input, target, labels, divergence, reduction):
    scale = reduction_scale(labels, input.shape[-1], reduction, divergence)
    # The residual is the gradient (or, for TVD, its sign's codes and the factor that scales them), and a zero-size
    # array of the gradient's dtype and class count.
    if divergence.kind == "tvd":
        # TVD's gradient is ±1/2 or 0 times the scale: the forward keeps its sign in 2 bits (an eighth of the bytes of
        # a bf16 gradient, written once and read back once) and the backward scales it.
        factor = 0.5 * scale
        losses, gradient = row_losses_and_sign_codes(divergence)(input, target, labels)
    else:
        losses, gradient = row_losses_and_grads(divergence)(
            input, target, labels, jnp.broadcast_to(scale, labels.shape)
        )
        factor = None
    residuals = (gradient, factor, jnp.zeros((0, input.shape[-1]), input.dtype))
    return reduce(losses, labels, input.shape[-1], reduction, divergence), residuals


def _reduced_loss_bwd(divergence, reduction, residuals, cotangent):
    del reduction
    gradient, factor, like = residuals
    if divergence.kind != "tvd":
        return (cotangent.astype(jnp.float32) * gradient.astype(jnp.float32)).astype(like.dtype), None, None
    rows, n_cols, implementation = gradient.shape[:-1], like.shape[-1], divergence.implementation
    if divergence.elementwise:
        dinput = scaled_signs(gradient, jnp.broadcast_to(factor, rows), n_cols, like.dtype, implementation, cotangent)
    else:
        row_scale = jnp.broadcast_to(cotangent.astype(jnp.float32) * factor, rows)
        dinput = scaled_signs(gradient, row_scale, n_cols, like.dtype, implementation)
    return dinput, None, None


_reduced_loss.defvjp(_reduced_loss_fwd, _reduced_loss_bwd)
