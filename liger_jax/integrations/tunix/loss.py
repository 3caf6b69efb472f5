"""Tunix's PEFT loss without ``[B, S, V]`` logits: the final hidden states go straight into the fused linear
cross-entropy with the model's LM head (or tied embedding table)."""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from liger_jax import runtime
from liger_jax.ops.fused_linear_cross_entropy import fused_linear_cross_entropy

IGNORE_INDEX = -100


class _Family(NamedTuple):
    """How a Tunix model family ends its forward pass: ``final_norm``, then the head, then its logit softcap."""

    sows_hidden_states: bool  # __call__ takes output_hidden_states=True and sows final_norm's output
    tied: Callable[[Any], bool]  # config -> whether the head is the embedding table (``embedder.decode``)
    softcap: Callable[[Any], float | None]  # model -> the final logit softcap, or None
    head_dtype: Callable[[Any], Any]  # head module -> the dtype it casts x and its weight to, or None


def _none(unused) -> None:
    del unused


# Keyed by the defining module and class name, so that looking a model up imports nothing from Tunix.
_FAMILIES: dict[str, _Family] = {
    "tunix.models.llama3.model.Llama3": _Family(
        sows_hidden_states=False, tied=lambda config: config.weight_tying, softcap=_none, head_dtype=_none
    ),
    "tunix.models.qwen2.model.Qwen2": _Family(
        sows_hidden_states=True,
        tied=lambda config: config.use_tied_embedding,
        softcap=_none,
        head_dtype=lambda head: head.dtype,
    ),
    "tunix.models.qwen3.model.Qwen3": _Family(
        sows_hidden_states=True,
        tied=lambda config: config.use_tied_embedding,
        softcap=_none,
        head_dtype=lambda head: head.dtype,
    ),
    "tunix.models.gemma.model.Gemma": _Family(
        sows_hidden_states=True,
        tied=lambda config: True,
        softcap=lambda model: model.final_logits_softcap,
        head_dtype=_none,
    ),
    "tunix.models.gemma3.model.Gemma3": _Family(
        sows_hidden_states=True, tied=lambda config: True, softcap=_none, head_dtype=_none
    ),
    "tunix.models.gemma4.model.Gemma4": _Family(
        sows_hidden_states=False,
        tied=lambda config: True,
        softcap=lambda model: model.config.final_logit_softcap,
        head_dtype=lambda head: head.config.dtype,
    ),
}


def peft_loss_fn(
    model: nnx.Module,
    input_tokens: jax.Array,
    input_mask: jax.Array,
    positions: jax.Array,
    attention_mask: jax.Array,
    images: jax.Array | None = None,
    implementation: runtime.Implementation | None = None,
) -> jax.Array:
    """Tunix's default PEFT loss, computed without the ``[B, S, V]`` logits: a drop-in for ``PeftTrainer``.

    ``PeftTrainer(model, optimizer, config).with_loss_fn(peft_loss_fn)`` trains on the same loss with the same
    gradients as the trainer's own default: the masked next-token NLL of ``input_tokens[:, 1:]``,
    ``-Σ mask·log softmax(logits)[target] / (Σ mask + 1e-8)`` over the targets ``input_tokens[:, 1:]`` and their
    mask ``input_mask[:, 1:]``. Instead of the model's logits it takes the final hidden states (the output of the
    model's ``final_norm``) and computes the head and the loss with :func:`liger_jax.fused_linear_cross_entropy`:
    the LM head's ``[D, V]`` kernel or the tied ``[V, D]`` embedding table, Gemma's and Gemma4's final logit
    softcap, Qwen's and Gemma4's cast of the head's operands to the model's ``dtype``.

    The hidden states come from the model's own ``__call__``, so a model swapped by
    :func:`liger_jax.flax_layers.apply_liger` or wrapped by qwix's LoRA runs as it does under the default loss. They
    are what the model sows with ``output_hidden_states=True`` (Qwen2, Qwen3, Gemma, Gemma3; collected with
    :func:`flax.nnx.capture`), or, for Llama3 and Gemma4, which have no such flag, what their ``final_norm`` returns
    (recorded by wrapping the norm's class's ``__call__`` for the duration of the call). The model's own head still
    runs on them, but nothing reads its logits: under ``jax.jit`` (as ``PeftTrainer`` runs the loss) XLA removes
    that computation, so the logits never exist; called eagerly, it runs.

    Numerics: as :func:`liger_jax.fused_linear_cross_entropy`: the logits in the head's dtype chunk by chunk, their
    softmax in fp32 (the default loss takes the log-softmax in the logits' dtype: bf16 for a bf16 Llama3, Gemma or
    Gemma3, whose heads return their matmul's dtype; in fp32 the two agree to rounding). ``input_mask`` is read as
    a boolean (Tunix's masks are): a masked-out target is ignored, any other counts once.

    Args:
        model: a Tunix ``Llama3``, ``Qwen2``, ``Qwen3``, ``Gemma``, ``Gemma3`` or ``Gemma4`` (or a subclass, such as
            qwix's LoRA wrapper); LoRA on the LM head itself is not supported (the head's weight is read directly).
        input_tokens: ``[B, S]`` integer tokens in ``[0, V)``.
        input_mask: ``[B, S]`` bool (or 0/1): which tokens are real.
        positions: ``[B, S]`` integer positions, as the model takes them.
        attention_mask: ``[B, S, S]`` bool, as the model takes it.
        images: optional images for Gemma3's vision encoder, passed on to the model as the default loss does.
        implementation: the fused linear cross-entropy's implementation (see :mod:`liger_jax.runtime`), None for the
            default. To pick one inside ``PeftTrainer``, wrap the call in a function of the six arguments above:
            ``nnx.grad`` binds the trainer's keyword arguments to positions and rejects ``functools.partial``.

    Returns:
        The scalar loss: fp32, or the promotion of fp32 with the default float dtype where ``Σ mask + 1e-8`` is
        wider (float64 under ``jax_enable_x64``), as the default loss.

    Raises:
        TypeError: ``model`` is not one of the Tunix families above.
        ValueError: the head's LoRA parameters (``nnx.LoRAParam``) would be skipped.
    """
    family = _family(model)
    weight, layout, head_dtype = lm_head_weight(model, family)
    hidden = _final_hidden_states(model, family, input_tokens, positions, attention_mask, images)
    if head_dtype is not None:
        hidden, weight = hidden.astype(head_dtype), weight.astype(head_dtype)
    target_mask = input_mask[:, 1:]
    labels = jnp.where(target_mask.astype(bool), input_tokens[:, 1:], IGNORE_INDEX)
    # The last position predicts nothing: its label is ignored rather than its hidden state sliced off (a copy).
    labels = jnp.pad(labels, ((0, 0), (0, 1)), constant_values=IGNORE_INDEX)
    total = fused_linear_cross_entropy(
        hidden,
        weight,
        labels,
        ignore_index=IGNORE_INDEX,
        softcap=family.softcap(model),
        reduction="sum",
        weight_layout=layout,
        implementation=implementation,
    )
    return total * (1 / (jnp.sum(target_mask) + 1e-8))


def lm_head_weight(model: nnx.Module, family: _Family) -> tuple[jax.Array, str, Any]:
    """``(weight, weight_layout, dtype)``: the LM head's ``[D, V]`` kernel (``"hv"``) or tied ``[V, D]`` embedding
    table (``"vh"``), and the dtype the head casts its operands to (None: it casts nothing).

    Raises:
        ValueError: the head has LoRA parameters (``nnx.LoRAParam``), which reading its weight would skip.
    """
    head = _head_module(model, family)
    if jax.tree.leaves(nnx.state(head, nnx.LoRAParam)):
        raise ValueError(f"liger_jax reads the LM head's weight directly; LoRA on {type(head).__name__} is unseen")
    tied = head is model.embedder
    weight = head.input_embedding[...] if tied else head.w[...]
    return weight, ("vh" if tied else "hv"), family.head_dtype(head)


def _family(model: nnx.Module) -> _Family:
    """The family of ``model``'s class or its nearest registered base class (qwix subclasses the model's class)."""
    for cls in type(model).__mro__:
        family = _FAMILIES.get(f"{cls.__module__}.{cls.__qualname__}")
        if family is not None:
            return family
    names = ", ".join(name.rsplit(".", 1)[1] for name in _FAMILIES)
    raise TypeError(f"model must be a Tunix {names} model, got {type(model).__module__}.{type(model).__qualname__}")


def _head_module(model: nnx.Module, family: _Family) -> nnx.Module:
    """The module whose weight makes the logits: ``model.embedder`` for a tied head, else ``model.lm_head``."""
    return model.embedder if family.tied(model.config) else model.lm_head


def _final_hidden_states(model, family: _Family, input_tokens, positions, attention_mask, images) -> jax.Array:
    """``[B, S, D]``: what the model's head receives, from the model's own ``__call__`` (see :func:`peft_loss_fn`)."""
    kwargs = {} if images is None else {"images": images}
    if family.sows_hidden_states:
        forward = nnx.capture(model, nnx.Intermediate)
        _, sown = forward(input_tokens, positions, None, attention_mask, output_hidden_states=True, **kwargs)
        return sown["all_hidden_states"].get_value()[-1]
    with _outputs_of(model.final_norm) as outputs:
        model(input_tokens, positions, None, attention_mask, **kwargs)
    return outputs[-1]


_RECORDING_LOCK = threading.RLock()


@contextlib.contextmanager
def _outputs_of(module: nnx.Module) -> Iterator[list]:
    """Collects what ``module`` returns from its calls while the context is open.

    Its class's ``__call__`` is wrapped for that time: the class, not the instance, because Python looks
    ``__call__`` up on the type. Calls of the class's other instances pass through the wrapper untouched, and a lock
    keeps two recordings (two threads tracing) from interleaving their patches. A module swapped by
    :func:`liger_jax.flax_layers.apply_liger` (a subclass that may inherit its ``__call__``) works the same.
    """
    cls = type(module)
    own_call = cls.__dict__.get("__call__")
    call = cls.__call__
    outputs = []

    @functools.wraps(call)
    def recording_call(self, *args, **kwargs):
        output = call(self, *args, **kwargs)
        if self is module:
            outputs.append(output)
        return output

    with _RECORDING_LOCK:
        cls.__call__ = recording_call
        try:
            yield outputs
        finally:
            if own_call is None:
                del cls.__call__
            else:
                cls.__call__ = own_call
