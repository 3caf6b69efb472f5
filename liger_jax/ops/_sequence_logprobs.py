"""What the preference and RL losses share: checked inputs, per-token log-probs of the policy and of a frozen
reference model through the fused LM-head primitive, per-sequence sums and means, and the logit-sum metrics."""

import jax
import jax.numpy as jnp
import numpy as np

from liger_jax import runtime
from liger_jax.ops import _checks, _dispatch
from liger_jax.ops._cross_entropy_checks import check_labels
from liger_jax.ops._linear_chunks import check_linear_operands
from liger_jax.ops.fused_linear_cross_entropy import WEIGHT_LAYOUTS, WeightLayout
from liger_jax.ops.fused_linear_logprobs import fused_linear_logprobs


def check_head(name: str, x: jax.Array, weight: jax.Array, bias: jax.Array | None, weight_layout: str) -> int:
    """Checks hidden states ``[B, S, H]``, an LM head in ``weight_layout`` and its optional bias; returns V.

    ``name`` prefixes the argument names in errors ("" for the policy, "ref_" for the reference model).

    Raises:
        TypeError: x, weight or bias is not floating point.
        ValueError: x is not rank 3, weight is not ``[H, V]``/``[V, H]``, bias is not ``[V]``, or an unknown layout.
    """
    for argument, array in ((f"{name}x", x), (f"{name}weight", weight), (f"{name}bias", bias)):
        if array is not None and not jnp.issubdtype(array.dtype, jnp.floating):
            raise TypeError(f"{argument} must have a floating dtype, got {array.dtype}")
    if x.ndim != 3:
        raise ValueError(f"{name}x must have shape [B, S, H], got {x.shape}")
    _checks.check_choice("weight_layout", weight_layout, WEIGHT_LAYOUTS)
    if weight.ndim != 2:
        raise ValueError(f"{name}weight must have 2 axes ([H, V] or [V, H]), got shape {weight.shape}")
    hidden = x.shape[-1]
    n_classes = weight.shape[1] if weight_layout == "hv" else weight.shape[0]
    expected = (hidden, n_classes) if weight_layout == "hv" else (n_classes, hidden)
    _checks.check_shape(f"{name}weight", weight, expected, f"weight_layout={weight_layout!r} with H={hidden} from x")
    if bias is not None:
        _checks.check_shape(f"{name}bias", bias, (n_classes,), f"the vocabulary axis of {name}weight")
    return n_classes


def check_reference_head(x, weight, ref_x, ref_weight, ref_bias, weight_layout) -> bool:
    """Checks the optional reference model's hidden states and head against the policy's; True when given.

    Raises:
        ValueError: only one of ref_x and ref_weight is given, ref_bias comes without them, ref_x's leading axes
            differ from x's, or ref_weight's vocabulary differs from weight's.
    """
    if (ref_x is None) != (ref_weight is None):
        raise ValueError("ref_x and ref_weight must be given together (the reference model's hidden states and head)")
    if ref_x is None:
        if ref_bias is not None:
            raise ValueError("ref_bias needs ref_x and ref_weight")
        return False
    ref_classes = check_head("ref_", ref_x, ref_weight, ref_bias, weight_layout)
    _checks.check_shape("ref_x", ref_x, x.shape[:2] + ref_x.shape[2:], "the batch and sequence axes of x")
    n_classes = weight.shape[1] if weight_layout == "hv" else weight.shape[0]
    if ref_classes != n_classes:
        raise ValueError(f"ref_weight must have the vocabulary of weight ({n_classes}), got {ref_classes}")
    return True


def check_tokens(name: str, tokens: jax.Array, x: jax.Array, n_classes: int, ignore_index: int | None) -> None:
    """Checks integer tokens ``[B, S]`` against x; concrete values must lie in ``[0, V)`` or be ``ignore_index``."""
    if not jnp.issubdtype(tokens.dtype, jnp.integer):
        raise TypeError(f"{name} must have an integer dtype, got {tokens.dtype}")
    # check_labels names its argument "labels"; an out-of-range message is the same for any name.
    _checks.check_shape(name, tokens, x.shape[:2], "the batch and sequence axes of x")
    check_labels(
        tokens, x.shape[:2], "the batch and sequence axes of x", n_classes, -1 if ignore_index is None else ignore_index
    )


def check_positive(name: str, value: float) -> None:
    """Raises ValueError unless ``value`` is a finite number > 0."""
    if not (np.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")


def token_logprobs(
    x: jax.Array,
    weight: jax.Array,
    tokens: jax.Array,
    mask: jax.Array | None,
    *,
    bias: jax.Array | None,
    temperature: float,
    weight_layout: WeightLayout,
    implementation: runtime.Implementation | None,
) -> jax.Array:
    """``log softmax(x @ weight / T + bias / T)[token]`` per position, ``[B, S]`` float32 (float64 for float64 x),
    zero where ``mask`` is False; tokens under a False mask are read as 0 (any class would do)."""
    if mask is not None:
        tokens = jnp.where(mask, tokens, 0)
    logps = fused_linear_logprobs(
        x,
        weight,
        tokens,
        bias=bias,
        temperature=temperature,
        weight_layout=weight_layout,
        implementation=implementation,
    )
    logps = logps.astype(jnp.promote_types(logps.dtype, jnp.float32))
    return logps if mask is None else jnp.where(mask, logps, 0.0)


def reference_token_logprobs(x, weight, tokens, mask, **options) -> jax.Array:
    """:func:`token_logprobs` of a frozen reference model: its inputs get no gradient, and none is computed."""
    x, weight, bias = jax.lax.stop_gradient((x, weight, options.pop("bias")))
    return jax.lax.stop_gradient(token_logprobs(x, weight, tokens, mask, bias=bias, **options))


def sequence_logprobs(token_logps: jax.Array, mask: jax.Array, average: bool) -> jax.Array:
    """``[B]`` sums of the masked per-token log-probs, or with ``average`` their means over the unmasked tokens
    (0 for a sequence with none, where Liger divides 0 by 0)."""
    total = jnp.sum(token_logps, axis=-1)
    if not average:
        return total
    return total / jnp.maximum(jnp.sum(mask, axis=-1), 1).astype(total.dtype)


def sequence_logit_sums(x: jax.Array, weight: jax.Array, bias: jax.Array | None, weight_layout: str) -> jax.Array:
    """``[B]`` sums of every logit ``x @ weight + bias`` of each sequence (all positions, all classes, as Liger's
    logit metrics count them), without the logits: ``Σ_v logit_v = x · Σ_v weight_v + Σ_v bias_v``. No gradient."""
    x, weight, bias = jax.lax.stop_gradient((x, weight, bias))
    dtype = jnp.promote_types(jnp.result_type(x.dtype, weight.dtype), jnp.float32)
    weight_row_sums = jnp.sum(weight.astype(dtype), axis=1 if weight_layout == "hv" else 0)
    per_position = x.astype(dtype) @ weight_row_sums
    if bias is not None:
        per_position = per_position + jnp.sum(bias.astype(dtype))
    return jnp.sum(per_position, axis=-1)


def labelled_sequence_logprobs(
    x,
    weight,
    labels,
    *,
    bias,
    ref_x,
    ref_weight,
    ref_bias,
    ignore_index,
    average_log_prob,
    weight_layout,
    implementation,
):
    """Checks the inputs of a loss over labelled sequences and returns their log-probs.

    Args: as :func:`liger_jax.ops.preference.paired_logps`.

    Returns:
        ``(token_logps [B, S], mask [B, S], logps [B], ref_logps [B] or None)``: per-token log-probs (0 where the
        label is ``ignore_index``, where ``mask`` is False), per-sequence sums or means, and the reference model's
        (no gradient).
    """
    ignore_index, has_reference = check_labelled_inputs(
        x, weight, labels, bias, ref_x, ref_weight, ref_bias, ignore_index, weight_layout
    )
    options = dict(temperature=1.0, weight_layout=weight_layout, implementation=implementation)
    mask = labels != ignore_index
    token_logps = token_logprobs(x, weight, labels, mask, bias=bias, **options)
    logps = sequence_logprobs(token_logps, mask, average_log_prob)
    ref_logps = None
    if has_reference:
        ref_token_logps = reference_token_logprobs(ref_x, ref_weight, labels, mask, bias=ref_bias, **options)
        ref_logps = sequence_logprobs(ref_token_logps, mask, average_log_prob)
    return token_logps, mask, logps, ref_logps


def check_labelled_inputs(x, weight, labels, bias, ref_x, ref_weight, ref_bias, ignore_index, weight_layout):
    """Checks a loss's labelled sequences, head and optional reference head; returns ``(ignore_index as an int,
    whether a reference head is given)``. Raises as :func:`check_head`, :func:`check_tokens` and
    :func:`check_reference_head`."""
    n_classes = check_head("", x, weight, bias, weight_layout)
    ignore_index = _checks.check_int("ignore_index", ignore_index)
    check_tokens("labels", labels, x, n_classes, ignore_index)
    return ignore_index, check_reference_head(x, weight, ref_x, ref_weight, ref_bias, weight_layout)


def fused_implementation(implementation, x, weight, bias, tokens, weight_layout, reference=None) -> str:
    """The implementation :func:`liger_jax.fused_linear_logprobs` would resolve for these operands, after its
    operand checks on the policy's head and the reference head ``(ref_x, ref_weight, ref_bias)`` when given."""
    implementation = _dispatch.resolve(
        implementation, "fused_linear_logprobs", _dispatch.logits_elements(tokens, weight, weight_layout)
    )
    check_linear_operands(x, weight, bias, weight_layout, implementation)
    if reference is not None:
        check_linear_operands(*reference, weight_layout, implementation, names=("ref_x", "ref_weight", "ref_bias"))
    return implementation


def masked(token_logps: jax.Array, mask: jax.Array) -> jax.Array:
    """``token_logps`` with 0 where ``mask`` is False (or 0), the gradient there 0 too."""
    return jnp.where(mask != 0, token_logps, 0.0)
