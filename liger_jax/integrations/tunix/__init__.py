"""liger_jax for Tunix (``google-tunix``) models and trainers: swap recipes for its model families
(:func:`liger_jax.flax_layers.apply_liger` finds them by the model's classes) and, without ``[B, S, V]`` logits,
:func:`peft_loss_fn`, its PEFT loss, :func:`dpo_loss_fn`, its DPO/ORPO loss and :func:`grpo_loss_fn`, its GRPO
policy loss."""

from liger_jax.integrations.tunix.dpo import dpo_loss_fn
from liger_jax.integrations.tunix.grpo import grpo_loss_fn
from liger_jax.integrations.tunix.loss import peft_loss_fn

__all__ = ["dpo_loss_fn", "grpo_loss_fn", "peft_loss_fn"]
