"""Multi-token attention (Liger's LigerMultiTokenAttention, https://arxiv.org/abs/2504.00927): a causal softmax of
attention scores, then a 2D convolution over the (query, key) map that mixes heads, then the future zeroed."""

import jax
import jax.numpy as jnp
import numpy as np

from liger_jax import runtime
from liger_jax.ops import _checks, _dispatch
from liger_jax.ops._checks import check_int
from liger_jax.ops._score_maps import causal, check_pair, masked_softmax
from liger_jax.ops.sparsemax import sparsemax

# Liger's fill for future scores before sparsemax: finite, as sparsemax needs, and far below any real score, so it
# never enters the support (the softmax path uses -inf, which gives the same probabilities).
_SPARSE_MASKED_SCORE = -1e9


def multi_token_attention(
    scores: jax.Array,
    kernel: jax.Array,
    bias: jax.Array | None = None,
    *,
    stride: int | tuple[int, int] = 1,
    padding: int | tuple[int, int] = 0,
    dilation: int | tuple[int, int] = 1,
    groups: int = 1,
    sparse: bool = False,
    implementation: runtime.Implementation | None = None,
) -> jax.Array:
    r"""Multi-token attention over attention scores (Liger's ``LigerMultiTokenAttentionFunction``).

    .. math::
        P = \mathrm{softmax}(\mathrm{mask}_{-\infty}(S)), \qquad
        Y = \mathrm{mask}_{0}(\mathrm{conv2d}(P, W) + b)

    where ``mask_{-inf}`` sets the future scores (key index > query index) to -inf before the row softmax (or
    sparsemax when ``sparse``), the convolution runs over the ``[L, L]`` (query, key) map with the heads as its
    channels, and ``mask_0`` zeroes the outputs above the diagonal of the output map (the bias too).

    Layout: scores are ``[B, H, L, L]`` (batch, heads, queries, keys), the layout of the logits
    ``jnp.einsum("bqhd,bkhd->bhqk", q, k)`` that ``jax.nn.dot_product_attention`` forms, and Liger's. The kernel is
    ``[kh, kw, H / groups, H_out]``: ``flax.nnx.Conv``'s layout (HWIO), not torch's ``[H_out, H / groups, kh, kw]``.

    Numerics: the softmax (or sparsemax) is fp32 and its probabilities are rounded to scores' dtype; the
    convolution takes them and the kernel in scores' dtype, accumulates in fp32, adds the bias in fp32 and rounds
    once to scores' dtype. The masked softmax runs on :func:`liger_jax.softmax`'s kernels (``sparse``:
    :func:`liger_jax.sparsemax`'s); the convolution and masks are XLA's. Gradients: future scores get 0; the
    softmax keeps only its output for the backward pass.

    Args:
        scores: ``[B, H, L, L]`` float32, bfloat16 or float16 (float64 too under ``"xla"``).
        kernel: ``[kh, kw, H / groups, H_out]`` float, the convolution's weight.
        bias: ``[H_out]`` float or None.
        stride: the convolution's stride over (queries, keys): an int or a pair, each ≥ 1.
        padding: zeros added on both sides of each map axis: an int or a pair, each ≥ 0.
        dilation: the kernel's dilation: an int or a pair, each ≥ 1.
        groups: channel groups; divides H and H_out.
        sparse: sparsemax instead of softmax (as Liger, float32 scores only; float64 too under ``"xla"``).
        implementation: ``"triton"``, ``"interpret"``, ``"xla"`` or None for the default (see
            :mod:`liger_jax.runtime`).

    Returns:
        ``[B, H_out, L', L']`` in scores' dtype, where ``L' = (L + 2 p - d (k - 1) - 1) // s + 1`` along each map
        axis; the options must give a square map (Liger masks a square map), e.g. ``padding = kernel_size // 2``
        with stride 1 keeps ``L' = L``.

    Raises:
        TypeError: scores, kernel or bias is not floating point; an option is not an int; ``sparse`` with scores
            that are not float32 (float64).
        ValueError: a rank or shape does not match, an option is out of range, or the output map is not square.

    Example:
        >>> scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(q.shape[-1])
        >>> mixed = liger_jax.multi_token_attention(scores, kernel, bias, padding=1)  # kernel [3, 3, H, H]
    """
    options = _checked(scores, kernel, bias, stride, padding, dilation, groups, sparse)
    implementation = _dispatch.resolve(implementation, "multi_token_attention", np.size(scores))
    for name, array in (("scores", scores), ("kernel", kernel), ("bias", bias)):
        if array is not None:
            _checks.check_floating(name, array, implementation)
    if sparse and scores.dtype not in (jnp.float32, jnp.float64):
        raise TypeError(f"scores must be float32 with sparse=True (Liger's sparse path is fp32), got {scores.dtype}")
    return _multi_token_attention(scores, kernel, bias, *options, sparse, implementation)


def multi_token_attention_reference(
    scores: jax.Array,
    kernel: jax.Array,
    bias: jax.Array | None = None,
    *,
    stride: int | tuple[int, int] = 1,
    padding: int | tuple[int, int] = 0,
    dilation: int | tuple[int, int] = 1,
    groups: int = 1,
    sparse: bool = False,
) -> jax.Array:
    """Multi-token attention in plain jax.numpy: :func:`multi_token_attention`'s ``"xla"`` implementation (the
    masked softmax by :func:`liger_jax.softmax_reference`, gradients by autodiff)."""
    return multi_token_attention(
        scores,
        kernel,
        bias,
        stride=stride,
        padding=padding,
        dilation=dilation,
        groups=groups,
        sparse=sparse,
        implementation="xla",
    )


def _multi_token_attention(scores, kernel, bias, stride, padding, dilation, groups, sparse, implementation):
    keep = causal(scores.shape[-1], scores.ndim)
    if sparse:
        masked = jnp.where(keep, scores, jnp.asarray(_SPARSE_MASKED_SCORE, scores.dtype))
        probabilities = sparsemax(masked, implementation=implementation)
    else:
        probabilities = masked_softmax(scores, keep, implementation)
    compute = jnp.promote_types(scores.dtype, jnp.float32)
    mixed = jax.lax.conv_general_dilated(
        probabilities,
        kernel.astype(scores.dtype),
        window_strides=stride,
        padding=[(padding[0], padding[0]), (padding[1], padding[1])],
        rhs_dilation=dilation,
        dimension_numbers=("NCHW", "HWIO", "NCHW"),
        feature_group_count=groups,
        preferred_element_type=compute,
    )
    if bias is not None:
        mixed = mixed + bias.astype(compute)[None, :, None, None]
    return jnp.where(causal(mixed.shape[-1], mixed.ndim), mixed, 0.0).astype(scores.dtype)


def _checked(scores, kernel, bias, stride, padding, dilation, groups, sparse):
    """The options as ``(stride, padding, dilation, groups)`` pairs and int, after every shape and option check."""
    if scores.ndim != 4 or scores.shape[-1] != scores.shape[-2]:
        raise ValueError(f"scores must be [batch, heads, L, L] (a square score map per head), got {scores.shape}")
    if kernel.ndim != 4:
        raise ValueError(f"kernel must be [kh, kw, heads / groups, out_heads] (HWIO), got shape {kernel.shape}")
    stride = check_pair("stride", stride, 1)
    padding = check_pair("padding", padding, 0)
    dilation = check_pair("dilation", dilation, 1)
    groups = check_int("groups", groups, 1)
    if not isinstance(sparse, bool):
        raise TypeError(f"sparse must be a bool, got {sparse!r}")
    heads, out_heads = scores.shape[1], kernel.shape[3]
    if heads % groups or out_heads % groups:
        raise ValueError(f"groups={groups} must divide the heads of scores ({heads}) and of kernel ({out_heads})")
    if kernel.shape[2] * groups != heads:
        raise ValueError(
            f"kernel's input axis must be heads / groups = {heads // groups} (scores {scores.shape}, "
            f"groups={groups}), got kernel shape {kernel.shape}"
        )
    if bias is not None:
        _checks.check_shape("bias", bias, (out_heads,), "one per output head, kernel.shape[3]")
    out_map = [
        (scores.shape[2 + axis] + 2 * padding[axis] - dilation[axis] * (kernel.shape[axis] - 1) - 1) // stride[axis] + 1
        for axis in (0, 1)
    ]
    if out_map[0] != out_map[1] or out_map[0] < 1:
        raise ValueError(
            f"the convolution maps the {scores.shape[-1]}x{scores.shape[-1]} scores to {out_map[0]}x{out_map[1]}: "
            "kernel, stride, padding and dilation must give a non-empty square map (Liger masks a square map)"
        )
    return stride, padding, dilation, groups
