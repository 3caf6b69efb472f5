"""liger_jax for Tunix (``google-tunix``) models and trainers: swap recipes for its model families
(:func:`liger_jax.flax_layers.apply_liger` finds them by the model's classes) and, without ``[B, S, V]`` logits,
:func:`peft_loss_fn`, its PEFT loss, :func:`dpo_loss_fn`, its DPO/ORPO loss, :func:`grpo_loss_fn`, its GRPO
policy loss, and :func:`compute_per_token_logps`, its RL per-token log-probs; :class:`LogitStrategy`, its logit
distillation strategy (without either model's logits when the forward functions are :func:`head_forward_fn`)."""

from liger_jax.integrations.tunix.dpo import dpo_loss_fn
from liger_jax.integrations.tunix.grpo import grpo_loss_fn
from liger_jax.integrations.tunix.logps import compute_per_token_logps
from liger_jax.integrations.tunix.loss import peft_loss_fn

__all__ = [
    "HeadInputs",
    "LogitStrategy",
    "compute_per_token_logps",
    "dpo_loss_fn",
    "grpo_loss_fn",
    "head_forward_fn",
    "peft_loss_fn",
    "token_labels_fn",
]
_DISTILLATION = ("HeadInputs", "LogitStrategy", "head_forward_fn", "token_labels_fn")


def __getattr__(name: str):
    """The distillation names, imported on first use: LogitStrategy subclasses Tunix's, and importing this package
    (as apply_liger does for the recipes) imports no Tunix."""
    if name in _DISTILLATION:
        from liger_jax.integrations.tunix import distillation

        return getattr(distillation, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
