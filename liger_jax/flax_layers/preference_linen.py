"""flax.linen LM heads fused with the preference and RL losses (Liger's ``chunked_loss`` modules).

Each module creates the params ``nn.Dense(features)`` would (``kernel [H, features]``, ``bias``; same initialisers
and dtype promotion) and returns ``(loss, aux)`` instead of logits, so a policy's LM head switches in one line and
its checkpoints still load. A head tied to an ``nn.Embed`` passes its table, ``embedding=[features, H]``; a
reference model passes its hidden states and head params (``ref_inputs``, ``ref_kernel`` in the policy head's
layout, ``ref_bias``), which get no gradient::

    loss, aux = FusedLinearDPOLoss(vocab, name="lm_head")(hidden, labels, ref_inputs=h_ref, ref_kernel=k_ref)
"""

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
from flax import linen as nn
from flax.linen import dtypes
from flax.linen.linear import default_kernel_init

from liger_jax import runtime
from liger_jax.ops import _checks
from liger_jax.ops.grpo import fused_linear_grpo
from liger_jax.ops.kto import fused_linear_kto
from liger_jax.ops.preference import (
    DPOLossType,
    fused_linear_cpo,
    fused_linear_dpo,
    fused_linear_orpo,
    fused_linear_simpo,
)


class _FusedLinearLoss(nn.Module):
    """An ``nn.Dense(features)`` head whose output is a loss; subclasses add the loss's options as fields."""

    features: int
    use_bias: bool = True
    dtype: jnp.dtype | None = None
    param_dtype: jnp.dtype = jnp.float32
    kernel_init: nn.initializers.Initializer = default_kernel_init
    bias_init: nn.initializers.Initializer = nn.initializers.zeros_init()
    implementation: runtime.Implementation | None = None

    loss = None  # the functional loss, a staticmethod in each subclass
    takes_reference_model = False

    @nn.compact
    def __call__(
        self,
        inputs: jax.Array,
        *loss_inputs: jax.Array,
        embedding: jax.Array | None = None,
        ref_inputs: jax.Array | None = None,
        ref_kernel: jax.Array | None = None,
        ref_bias: jax.Array | None = None,
        **keyword_inputs: jax.Array,
    ) -> tuple[jax.Array, dict[str, jax.Array]]:
        """The loss of the head on ``inputs [B, S, H]``; ``loss_inputs`` and ``keyword_inputs`` are the loss's
        other arrays (labels, ...).

        Args:
            inputs: ``[B, S, H]`` hidden states.
            loss_inputs, keyword_inputs: as the functional loss takes them after ``x`` and ``weight``.
            embedding: optional tied table ``[features, H]`` to use instead of an own kernel.
            ref_inputs, ref_kernel, ref_bias: a reference model's hidden states and head (``[H_ref, features]``,
                or ``[features, H_ref]`` with ``embedding``), or None.

        Returns:
            ``(loss, aux)`` as the functional loss.
        """
        name = type(self).__name__
        if embedding is None:
            kernel = self.param("kernel", self.kernel_init, (inputs.shape[-1], self.features), self.param_dtype)
            layout = "hv"
        else:
            _checks.check_shape("embedding", embedding, (self.features, inputs.shape[-1]), "[features, H of inputs]")
            kernel, layout = embedding, "vh"
        bias = self.param("bias", self.bias_init, (self.features,), self.param_dtype) if self.use_bias else None
        inputs, kernel, bias = dtypes.promote_dtype(inputs, kernel, bias, dtype=self.dtype)
        if ref_inputs is not None or ref_kernel is not None:
            if not self.takes_reference_model:
                raise ValueError(f"{name}: this loss uses no reference model")
            ref_inputs, ref_kernel, ref_bias = dtypes.promote_dtype(ref_inputs, ref_kernel, ref_bias, dtype=self.dtype)
            keyword_inputs |= {"ref_x": ref_inputs, "ref_weight": ref_kernel, "ref_bias": ref_bias}
        base_fields = {field.name for field in dataclasses.fields(_FusedLinearLoss)}
        options = {
            field.name: getattr(self, field.name)
            for field in dataclasses.fields(self)
            if field.name not in base_fields and field.name not in ("parent", "name")
        }
        loss: Callable = type(self).loss
        return loss(
            inputs,
            kernel,
            *loss_inputs,
            bias=bias,
            weight_layout=layout,
            implementation=self.implementation,
            **keyword_inputs,
            **options,
        )


class FusedLinearDPOLoss(_FusedLinearLoss):
    """An LM head fused with DPO (Liger's ``LigerFusedLinearDPOLoss``): ``(inputs, labels, ref_inputs=,
    ref_kernel=, ref_bias=)``. Loss fields as :func:`liger_jax.fused_linear_dpo`."""

    ignore_index: int = -100
    beta: float = 0.1
    alpha: float = 1.0
    compute_nll_loss: bool = False
    average_log_prob: bool = False
    loss_type: DPOLossType = "sigmoid"
    label_smoothing: float = 0.0
    discopop_tau: float = 0.05

    loss = staticmethod(fused_linear_dpo)
    takes_reference_model = True


class FusedLinearORPOLoss(_FusedLinearLoss):
    """An LM head fused with ORPO (Liger's ``LigerFusedLinearORPOLoss``): ``(inputs, labels, nll_target=None)``.
    Loss fields as :func:`liger_jax.fused_linear_orpo`."""

    ignore_index: int = -100
    beta: float = 0.1
    alpha: float = 1.0
    compute_nll_loss: bool = True

    loss = staticmethod(fused_linear_orpo)


class FusedLinearCPOLoss(_FusedLinearLoss):
    """An LM head fused with CPO (Liger's ``LigerFusedLinearCPOLoss``): ``(inputs, labels)``. Loss fields as
    :func:`liger_jax.fused_linear_cpo`."""

    ignore_index: int = -100
    beta: float = 0.1
    alpha: float = 1.0
    label_smoothing: float = 0.0
    compute_nll_loss: bool = True
    average_log_prob: bool = False

    loss = staticmethod(fused_linear_cpo)


class FusedLinearSimPOLoss(_FusedLinearLoss):
    """An LM head fused with SimPO (Liger's ``LigerFusedLinearSimPOLoss``): ``(inputs, labels)``. Loss fields as
    :func:`liger_jax.fused_linear_simpo`."""

    ignore_index: int = -100
    beta: float = 0.1
    alpha: float = 1.0
    gamma: float = 0.5
    label_smoothing: float = 0.0
    compute_nll_loss: bool = True

    loss = staticmethod(fused_linear_simpo)


class FusedLinearKTOLoss(_FusedLinearLoss):
    """An LM head fused with KTO (Liger's ``LigerFusedLinearKTOLoss``): ``(inputs, labels, preference_labels,
    kl=None, ref_inputs=, ref_kernel=, ref_bias=)``. Loss fields as :func:`liger_jax.fused_linear_kto`."""

    ignore_index: int = -100
    beta: float = 0.1
    average_log_prob: bool = False

    loss = staticmethod(fused_linear_kto)
    takes_reference_model = True


class FusedLinearGRPOLoss(_FusedLinearLoss):
    """An LM head fused with the GRPO family (Liger's ``LigerFusedLinearGRPOLoss``): ``(inputs,
    selected_token_ids, attention_mask, advantages, ref_per_token_logps=None, old_per_token_logps=None,
    vllm_is_ratio=None, num_items_in_batch=None, ref_inputs=, ref_kernel=, ref_bias=)``. Loss fields as
    :func:`liger_jax.fused_linear_grpo`."""

    beta: float = 0.04
    epsilon_low: float = 0.2
    epsilon_high: float = 0.2
    loss_type: str = "dapo"
    max_completion_length: int | None = None
    temperature: float = 1.0
    importance_sampling_level: str = "token"
    sapo_temperature_pos: float = 1.0
    sapo_temperature_neg: float = 1.05
    delta: float | None = None
    use_bias_correction_kl: bool = False
    vespo_k_pos: float = 2.0
    vespo_lambda_pos: float = 3.0
    vespo_k_neg: float = 3.0
    vespo_lambda_neg: float = 2.0

    loss = staticmethod(fused_linear_grpo)
    takes_reference_model = True
