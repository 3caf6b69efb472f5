"""Sequence losses fused with the LM head with their gradient made in the forward pass.

The chunk loop of :mod:`liger_jax.ops._linear_chunks` walks chunks of WHOLE groups of rows (a chosen/rejected
pair, one completion): a loss that is a sum of independent per-group terms, with normalisers known before the loop
(token counts from the masks, the number of pairs), is then known inside each chunk. So each chunk computes its
per-token log-probs (:class:`liger_jax.ops.fused_linear_logprobs.LogprobRows`), the gradient of its groups' loss
terms with respect to them (``jax.grad`` of the loss), the logits' gradient from that (the log-prob gradient rows)
and, right away, ``dx`` and the ``dweight``/``dbias`` contributions: three matmuls per chunk (one more for a frozen
reference model's logits), against four for log-probs first and their gradient in a second pass. The backward
pass only scales the saved gradients by the loss's cotangent, as :func:`liger_jax.fused_linear_cross_entropy` does.

Memory: a chunk holds at least one group, ``R × V`` logits (and as many again for a reference model): a pair of
2048-token sequences is ``4096 × 128256`` bf16 logits, 1 GiB (2 GiB with a reference model's), the gradient
written over the logits. By default a chunk holds as many groups as
:func:`liger_jax.ops._linear_chunks.default_chunk_rows` allows rows (the policy's and the reference's logits
together within its bound), at least one: a Llama-3-8B head (H=4096, V=128256, bf16) takes one such pair per
chunk, or two 1024-token completions.
"""

import dataclasses
import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from liger_jax.ops import _linear_chunks
from liger_jax.ops._linear_chunks import ChunkPlan
from liger_jax.ops.fused_linear_logprobs import LogprobRows

# ``loss(token_logps [G, R], ref_token_logps [G, R] or None, *row_operands [G, R], *group_operands [G]) ->
# scalar``: the loss of G whole groups of R rows, normalised for the whole batch (its normalisers come as operands
# or are static fields), so that the batch's loss is the sum of its chunks'. Hashable (a frozen dataclass): it keys
# the compiled loop.
GroupLoss = Callable[..., jax.Array]


@dataclasses.dataclass(frozen=True)
class GroupLossRows:
    """The chunk loop's row math (``_linear_chunks.RowMath``) over chunks of whole groups of ``group_rows`` rows.

    Row operands: ``tokens`` (in range), then ``loss``'s row operands, then its ``n_group_operands`` group
    operands repeated on each row of their group. Values: the per-token log-probs and, with a reference head (a
    teacher in the chunk loop), the reference's. With ``grads`` also the logits' gradient of ``loss``.
    """

    logprobs: LogprobRows
    group_rows: int
    loss: GroupLoss
    has_reference: bool
    grads: bool
    n_group_operands: int = 0

    def __call__(self, logits, *operands, vocab_axes=()):
        ref_logits = None
        if self.has_reference:
            ref_logits, *operands = operands
        tokens, *loss_operands = operands
        (token_logps, lse, entropy), _ = self.logprobs(logits, tokens, vocab_axes=vocab_axes)
        ref_token_logps = None
        if self.has_reference:
            ref_token_logps = self.logprobs(ref_logits, tokens, vocab_axes=vocab_axes)[0][0]
        values = (token_logps,) + (() if ref_token_logps is None else (ref_token_logps,))
        if not self.grads:
            return values, None

        def grouped(rows):
            return None if rows is None else rows.reshape(-1, self.group_rows)

        row_operands = [grouped(rows) for rows in loss_operands]
        group_operands = [rows[:, 0] for rows in row_operands[len(row_operands) - self.n_group_operands :]]
        row_operands = row_operands[: len(row_operands) - self.n_group_operands]

        def chunk_loss(token_logps):
            return self.loss(token_logps, grouped(ref_token_logps), *row_operands, *group_operands)

        cotangent = jax.grad(chunk_loss)(grouped(token_logps)).reshape(tokens.shape)
        no_entropy = jnp.zeros_like(cotangent)
        _, dlogits = self.logprobs(logits, tokens, lse, entropy, cotangent, no_entropy, vocab_axes=vocab_axes)
        return values, dlogits


def group_loss(
    x: jax.Array,
    weight: jax.Array,
    bias: jax.Array | None,
    tokens: jax.Array,
    loss_operands: tuple[jax.Array, ...],
    loss: GroupLoss,
    *,
    group_operands: tuple[jax.Array, ...] = (),
    reference: tuple | None,
    temperature: float,
    weight_layout: str,
    implementation: str,
    groups_per_chunk: int | None,
) -> tuple[jax.Array, jax.Array, jax.Array | None]:
    """The loss of whole groups of rows and its gradient in one chunked pass (see the module docstring).

    Args:
        x: ``[G, R, H]`` hidden states: G groups of R rows each (checked by the caller).
        weight, bias: the LM head in ``weight_layout``, and None or ``[V]``.
        tokens: ``[G, R]`` integers in ``[0, V)``.
        loss_operands: arrays ``[G, R]`` handed to ``loss`` group by group; no gradient.
        loss: the :data:`GroupLoss`.
        group_operands: arrays ``[G]`` (one value per group) handed to ``loss`` after ``loss_operands``; no
            gradient.
        reference: None, or a frozen reference head ``(ref_x [G, R, H_ref], ref_weight, ref_bias or None)``; no
            gradient.
        temperature: divides the logits of both heads.
        weight_layout: ``"hv"`` or ``"vh"``.
        implementation: a resolved implementation.
        groups_per_chunk: groups per chunk, or None for as many as the default chunk rows hold (at least one).

    Returns:
        ``(loss, token_logps [G, R], ref_token_logps [G, R] or None)``: the scalar loss (gradient to x, weight and
        bias) and the per-token log-probs in ``promote(result_type(x, weight), float32)`` (metrics: no gradient).
    """
    if tokens.size == 0:  # no rows to chunk: log-probs of nothing, and no gradient
        token_logps = jnp.zeros(tokens.shape, jnp.promote_types(jnp.result_type(x.dtype, weight.dtype), jnp.float32))
        ref_token_logps = None if reference is None else token_logps
        return loss(token_logps, ref_token_logps, *loss_operands, *group_operands), token_logps, ref_token_logps
    n_groups, group_rows, hidden = x.shape
    n_classes = weight.shape[1 if weight_layout == "hv" else 0]
    plan = ChunkPlan.for_operands(x, weight, bias, weight_layout)
    if groups_per_chunk is None:
        # A reference head's logits live beside the policy's: both count against the bound.
        logit_bytes = (1 + (reference is not None)) * plan.logits_dtype.itemsize
        rows = _linear_chunks.default_chunk_rows(
            n_groups * group_rows, hidden, n_classes, x.dtype, plan.logits_dtype, plan.accum_dtype, logit_bytes
        )
        groups_per_chunk = max(1, rows // group_rows)
    plan = dataclasses.replace(plan, chunk_rows=min(groups_per_chunk, n_groups) * group_rows)
    rows = GroupLossRows(
        LogprobRows(implementation, float(temperature)),
        group_rows,
        loss,
        reference is not None,
        False,
        len(group_operands),
    )
    reference = () if reference is None else tuple(jax.lax.stop_gradient(reference))
    operands = (tuple(loss_operands), tuple(group_operands))
    return _group_loss(x, weight, bias, reference, tokens, operands, plan, rows)


def _run(x, weight, bias, reference, tokens, operands, plan, rows: GroupLossRows):
    loss_operands, group_operands = operands
    repeated = tuple(jnp.broadcast_to(values[:, None], tokens.shape) for values in group_operands)
    return _linear_chunks.run_chunks(
        x, weight, bias, (tokens, *loss_operands, *repeated), plan, rows, 1 + rows.has_reference, rows.grads,
        reference or None, whole_groups=True,
    )  # fmt: skip


def _loss_and_logps(values, operands, rows: GroupLossRows):
    token_logps, *ref = values
    ref_token_logps = ref[0] if ref else None
    loss_operands, group_operands = operands
    return rows.loss(token_logps, ref_token_logps, *loss_operands, *group_operands), token_logps, ref_token_logps


@functools.partial(jax.custom_vjp, nondiff_argnums=(6, 7))
def _group_loss(x, weight, bias, reference, tokens, operands, plan, rows):
    """``(loss, token_logps, ref_token_logps or None)``; only the loss carries a gradient."""
    results = _run(x, weight, bias, reference, tokens, operands, plan, rows)
    return _loss_and_logps(results.values, operands, rows)


def _group_loss_fwd(x, weight, bias, reference, tokens, operands, plan, rows):
    results = _run(x, weight, bias, reference, tokens, operands, plan, dataclasses.replace(rows, grads=True))
    no_grads = jax.tree.map(jnp.zeros_like, (reference, operands))
    residuals = (results.dx, results.dweight, results.dbias, no_grads, tokens.shape)
    return _loss_and_logps(results.values, operands, rows), residuals


def _group_loss_bwd(plan, rows, residuals, cotangents):
    del rows
    dx, dweight, dbias, (no_reference_grads, no_operand_grads), token_shape = residuals
    loss_cotangent = cotangents[0]  # the log-probs are metrics
    dx = (dx * loss_cotangent).astype(plan.x_dtype)
    dweight, dbias = plan.parameter_grads(dweight * loss_cotangent, None if dbias is None else dbias * loss_cotangent)
    return dx, dweight, dbias, no_reference_grads, np.zeros(token_shape, jax.dtypes.float0), no_operand_grads


_group_loss.defvjp(_group_loss_fwd, _group_loss_bwd)
