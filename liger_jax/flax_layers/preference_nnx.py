"""flax.nnx loss modules for the preference and RL losses fused with an LM head (Liger's ``chunked_loss`` modules).

Each module holds its loss options and no params. It is called with the policy's head (an ``nnx.Linear``, kernel
``[H, V]`` and bias, or a tied ``nnx.Embed``, table ``[V, H]``) and the hidden states the head would read; a
reference model comes as its own head and hidden states (``ref_head``, ``ref_hidden``), which get no gradient::

    loss, aux = FusedLinearDPOLoss(beta=0.1)(model.lm_head, hidden, labels, ref_head=ref.lm_head, ref_hidden=ref_h)
"""

from collections.abc import Callable

import jax
from flax import nnx

from liger_jax import runtime
from liger_jax.ops.grpo import fused_linear_grpo
from liger_jax.ops.kto import fused_linear_kto
from liger_jax.ops.preference import (
    DPOLossType,
    fused_linear_cpo,
    fused_linear_dpo,
    fused_linear_orpo,
    fused_linear_simpo,
)


def head_operands(head: nnx.Linear | nnx.Embed, hidden: jax.Array, module: str):
    """``(hidden, weight, bias, weight_layout)`` of an LM head, promoted to the head's dtype as the head does it.

    Raises:
        TypeError: ``head`` is neither an ``nnx.Linear`` nor an ``nnx.Embed``.
    """
    if isinstance(head, nnx.Linear):
        bias = head.bias[...] if head.bias is not None else None
        hidden, weight, bias = head.promote_dtype((hidden, head.kernel[...], bias), dtype=head.dtype)
        return hidden, weight, bias, "hv"
    if isinstance(head, nnx.Embed):
        hidden, weight = head.promote_dtype((hidden, head.embedding[...]), dtype=head.dtype)
        return hidden, weight, None, "vh"
    raise TypeError(f"{module}: head must be an nnx.Linear or nnx.Embed, got {type(head)}")


class _FusedLinearLoss(nnx.Module):
    """A loss on an LM head's hidden states; subclasses name the loss and its options."""

    loss: Callable  # the functional loss, a staticmethod
    takes_reference_model: bool = False

    def __init__(self, implementation: runtime.Implementation | None, **options):
        for name, value in options.items():
            setattr(self, name, value)
        self.option_names = tuple(options)
        self.implementation = implementation

    def __call__(
        self,
        head: nnx.Linear | nnx.Embed,
        hidden: jax.Array,
        *inputs: jax.Array,
        ref_head: nnx.Linear | nnx.Embed | None = None,
        ref_hidden: jax.Array | None = None,
        **keyword_inputs: jax.Array,
    ) -> tuple[jax.Array, dict[str, jax.Array]]:
        """The loss of ``head`` on ``hidden [B, S, H]``; ``inputs`` and ``keyword_inputs`` are the loss's other
        arrays (labels, ...). Returns ``(loss, aux)`` as the functional loss.

        Raises:
            TypeError: a head is neither an ``nnx.Linear`` nor an ``nnx.Embed``.
            ValueError: a reference model for a loss without one, or only one of ``ref_head`` and ``ref_hidden``.
        """
        name = type(self).__name__
        hidden, weight, bias, layout = head_operands(head, hidden, name)
        if (ref_head is None) != (ref_hidden is None):
            raise ValueError(f"{name}: ref_head and ref_hidden must be given together")
        if ref_head is not None:
            if not self.takes_reference_model:
                raise ValueError(f"{name}: this loss uses no reference model")
            ref_hidden, ref_weight, ref_bias, ref_layout = head_operands(ref_head, ref_hidden, name)
            if ref_layout != layout:
                raise ValueError(f"{name}: ref_head must be the same kind of head as head ({type(head).__name__})")
            keyword_inputs |= {"ref_x": ref_hidden, "ref_weight": ref_weight, "ref_bias": ref_bias}
        options = {option: getattr(self, option) for option in self.option_names}
        return type(self).loss(
            hidden,
            weight,
            *inputs,
            bias=bias,
            weight_layout=layout,
            implementation=self.implementation,
            **keyword_inputs,
            **options,
        )


class FusedLinearDPOLoss(_FusedLinearLoss):
    """DPO on an LM head (Liger's ``LigerFusedLinearDPOLoss``): ``(head, hidden, labels, ref_head=, ref_hidden=)``.

    Options as :func:`liger_jax.fused_linear_dpo`.
    """

    loss = staticmethod(fused_linear_dpo)
    takes_reference_model = True

    def __init__(
        self,
        *,
        ignore_index: int = -100,
        beta: float = 0.1,
        alpha: float = 1.0,
        compute_nll_loss: bool = False,
        average_log_prob: bool = False,
        loss_type: DPOLossType = "sigmoid",
        label_smoothing: float = 0.0,
        discopop_tau: float = 0.05,
        implementation: runtime.Implementation | None = None,
    ):
        super().__init__(implementation, **_arguments(locals()))


class FusedLinearORPOLoss(_FusedLinearLoss):
    """ORPO on an LM head (Liger's ``LigerFusedLinearORPOLoss``): ``(head, hidden, labels, nll_target=None)``.

    Options as :func:`liger_jax.fused_linear_orpo`.
    """

    loss = staticmethod(fused_linear_orpo)

    def __init__(
        self,
        *,
        ignore_index: int = -100,
        beta: float = 0.1,
        alpha: float = 1.0,
        compute_nll_loss: bool = True,
        implementation: runtime.Implementation | None = None,
    ):
        super().__init__(implementation, **_arguments(locals()))


class FusedLinearCPOLoss(_FusedLinearLoss):
    """CPO on an LM head (Liger's ``LigerFusedLinearCPOLoss``): ``(head, hidden, labels)``.

    Options as :func:`liger_jax.fused_linear_cpo`.
    """

    loss = staticmethod(fused_linear_cpo)

    def __init__(
        self,
        *,
        ignore_index: int = -100,
        beta: float = 0.1,
        alpha: float = 1.0,
        label_smoothing: float = 0.0,
        compute_nll_loss: bool = True,
        average_log_prob: bool = False,
        implementation: runtime.Implementation | None = None,
    ):
        super().__init__(implementation, **_arguments(locals()))


class FusedLinearSimPOLoss(_FusedLinearLoss):
    """SimPO on an LM head (Liger's ``LigerFusedLinearSimPOLoss``): ``(head, hidden, labels)``.

    Options as :func:`liger_jax.fused_linear_simpo`.
    """

    loss = staticmethod(fused_linear_simpo)

    def __init__(
        self,
        *,
        ignore_index: int = -100,
        beta: float = 0.1,
        alpha: float = 1.0,
        gamma: float = 0.5,
        label_smoothing: float = 0.0,
        compute_nll_loss: bool = True,
        implementation: runtime.Implementation | None = None,
    ):
        super().__init__(implementation, **_arguments(locals()))


class FusedLinearKTOLoss(_FusedLinearLoss):
    """KTO on an LM head (Liger's ``LigerFusedLinearKTOLoss``):
    ``(head, hidden, labels, preference_labels, kl=None, ref_head=, ref_hidden=)``.

    Options as :func:`liger_jax.fused_linear_kto`.
    """

    loss = staticmethod(fused_linear_kto)
    takes_reference_model = True

    def __init__(
        self,
        *,
        ignore_index: int = -100,
        beta: float = 0.1,
        average_log_prob: bool = False,
        implementation: runtime.Implementation | None = None,
    ):
        super().__init__(implementation, **_arguments(locals()))


class FusedLinearGRPOLoss(_FusedLinearLoss):
    """The GRPO family on an LM head (Liger's ``LigerFusedLinearGRPOLoss``): ``(head, hidden, selected_token_ids,
    attention_mask, advantages, ref_per_token_logps=None, old_per_token_logps=None, vllm_is_ratio=None,
    num_items_in_batch=None, ref_head=, ref_hidden=)``.

    Options as :func:`liger_jax.fused_linear_grpo`.
    """

    loss = staticmethod(fused_linear_grpo)
    takes_reference_model = True

    def __init__(
        self,
        *,
        beta: float = 0.04,
        epsilon_low: float = 0.2,
        epsilon_high: float = 0.2,
        loss_type: str = "dapo",
        max_completion_length: int | None = None,
        temperature: float = 1.0,
        importance_sampling_level: str = "token",
        sapo_temperature_pos: float = 1.0,
        sapo_temperature_neg: float = 1.05,
        delta: float | None = None,
        use_bias_correction_kl: bool = False,
        vespo_k_pos: float = 2.0,
        vespo_lambda_pos: float = 3.0,
        vespo_k_neg: float = 3.0,
        vespo_lambda_neg: float = 2.0,
        implementation: runtime.Implementation | None = None,
    ):
        super().__init__(implementation, **_arguments(locals()))


def _arguments(local_names: dict) -> dict:
    """A subclass ``__init__``'s keyword options from its ``locals()``."""
    return {name: value for name, value in local_names.items() if name not in ("self", "__class__", "implementation")}
