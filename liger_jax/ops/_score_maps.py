"""What the attention-score ops share (multi-token and neighborhood attention): int-or-pair option checks, and a row
softmax of scores where a mask keeps them, run on :func:`liger_jax.softmax`'s kernels."""

import jax
import jax.numpy as jnp

from liger_jax import runtime
from liger_jax.ops._checks import check_int
from liger_jax.ops.softmax import softmax


def check_pair(name: str, value: object, minimum: int) -> tuple[int, int]:
    """``value`` as ``(rows, cols)``: one int for both, or a pair of ints, each at least ``minimum`` (as torch's
    ``_pair``); raises TypeError or ValueError naming ``name`` otherwise."""
    if isinstance(value, (tuple, list)):
        if len(value) != 2:
            raise ValueError(f"{name} must be an int or a pair of ints, got {value!r}")
        return check_int(f"{name}[0]", value[0], minimum), check_int(f"{name}[1]", value[1], minimum)
    both = check_int(name, value, minimum)
    return both, both


def masked_softmax(scores: jax.Array, keep: jax.Array, implementation: runtime.Implementation) -> jax.Array:
    """``softmax`` over the last axis of ``scores`` where ``keep`` holds, probability 0 (and gradient 0) elsewhere.

    Args:
        scores: ``[..., Q, K]`` float scores.
        keep: bool of scores' rank (size-1 leading axes), true where a score takes part; each row must keep at
            least one.
        implementation: a resolved implementation, passed on to :func:`liger_jax.softmax`.

    Returns:
        ``[..., Q, K]`` probabilities in scores' dtype.
    """
    return softmax(jnp.where(keep, scores, -jnp.inf), implementation=implementation)


def causal(length: int, rank: int) -> jax.Array:
    """``[1, ..., 1, length, length]`` bool of ``rank`` axes, true on and below the diagonal: key ≤ query."""
    keep = jnp.arange(length)[None, :] <= jnp.arange(length)[:, None]
    return keep.reshape((1,) * (rank - 2) + keep.shape)
