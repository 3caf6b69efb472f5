"""liger_jax for Tunix (``google-tunix``) models and trainers: swap recipes for its model families
(:func:`liger_jax.flax_layers.apply_liger` finds them by the model's classes) and :func:`peft_loss_fn`, its PEFT
loss without ``[B, S, V]`` logits."""

from liger_jax.integrations.tunix.loss import peft_loss_fn

__all__ = ["peft_loss_fn"]
