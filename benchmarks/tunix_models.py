"""Tunix's own models in the end-to-end benchmark: ``python -m benchmarks.e2e --models tunix-gemma3-1b ...``.

Each model is Tunix's (``google-tunix``) model class at its published config (random weights), bf16 params and
compute, trained by the same jitted AdamW step as the bundled Llama (``liger_jax.models.training``) on the
inputs Tunix's ``PeftTrainer`` gives its loss: ``input_tokens`` and ``input_mask`` ``[B, S]``, positions and the
causal attention mask built from the mask inside the step, as Tunix's SFT examples build them.

* ``xla``: the model as Tunix builds it, and Tunix's default PEFT loss (the log-softmax of the full ``[B, S, V]``
  logits).
* ``liger_jax``: the same model after :func:`liger_jax.flax_layers.apply_liger` (Tunix's RMSNorm, gated MLP and
  RoPE swapped, as far as liger_jax has recipes for the family) and
  :func:`liger_jax.integrations.tunix.peft_loss_fn` (the loss from the final hidden states, no logits). Where
  liger_jax lacks the loss, the row says so in ``loss_fn`` and the run uses Tunix's loss.

Attention is Tunix's own in both (XLA einsums over the full ``[B, H, S, S]`` scores). Importing this module imports
neither jax nor Tunix: the driver reads :data:`MODELS` for names, time shares and targets.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
from collections.abc import Callable
from typing import Any

from benchmarks.e2e_trial import StepTrial

PREFIX = "tunix-"
PEFT_LOSS_FN = "liger_jax.integrations.tunix.peft_loss_fn"


@dataclasses.dataclass(frozen=True)
class TunixModel:
    """One Tunix model at one config.

    Attributes:
        family: the package under ``tunix.models`` (``llama3``, ``qwen3``, ``gemma3``).
        model_class: the model class in ``tunix.models.<family>.model``.
        preset: the ``ModelConfig`` classmethod giving the published config.
        layers: decoder layers (Tunix unrolls them, so compile time grows with them): the driver's time share.
        bf16_fields: config fields that must say bfloat16 for bf16 params and compute (params Tunix creates in
            fp32 regardless are cast after construction).
        vocab_field: the config field holding the vocabulary size.
        tiny: config overrides for the CPU smoke run; empty for the published config.
        memory_target: the issue's peak-memory ratio (xla over liger, same batch, no remat), or None.
        speedup_target: the issue's tokens/s ratio at each provider's largest batch.
        batch: the same-batch comparison's default batch.
    """

    family: str
    model_class: str
    preset: str
    layers: int
    bf16_fields: tuple[str, ...] = ()
    vocab_field: str = "vocab_size"
    tiny: dict[str, int] = dataclasses.field(default_factory=dict)
    memory_target: float | None = None
    speedup_target: float = 1.1
    batch: int = 8


_TINY = {"num_layers": 2, "embed_dim": 64, "hidden_dim": 96, "num_heads": 4, "head_dim": 16, "num_kv_heads": 2}
# Same batches: Gemma3's where its 2.5x target is judged; 4 for the others, whose Tunix attention keeps an fp32
# [H, S, S] softmax per layer (32 and 16 heads: ~0.5 GB per layer and sequence), so 8 sequences may not fit.
_LLAMA3 = TunixModel("llama3", "Llama3", "llama3p2_1b", 16, batch=4)
_QWEN3 = TunixModel("qwen3", "Qwen3", "qwen3_1p7b", 28, bf16_fields=("dtype", "param_dtype"), batch=4)
_GEMMA3 = TunixModel(
    "gemma3", "Gemma3", "gemma3_1b_pt", 26, bf16_fields=("param_dtype",), vocab_field="num_embed", memory_target=2.5
)
MODELS: dict[str, TunixModel] = {
    "tunix-llama3-1b": _LLAMA3,
    "tunix-qwen3-1.7b": _QWEN3,
    "tunix-gemma3-1b": _GEMMA3,
    "tunix-llama3-tiny": dataclasses.replace(_LLAMA3, layers=2, tiny=_TINY | {"vocab_size": 257}, batch=2),
    "tunix-qwen3-tiny": dataclasses.replace(_QWEN3, layers=2, tiny=_TINY | {"vocab_size": 257}, batch=2),
    "tunix-gemma3-tiny": dataclasses.replace(
        _GEMMA3, layers=2, tiny=_TINY | {"num_embed": 257, "sliding_window_size": 8}, batch=2
    ),
}
SMOKE = {name: name.rsplit("-", 1)[0] + "-tiny" for name, model in MODELS.items() if not model.tiny}


def is_tunix(name: str) -> bool:
    """Whether ``name`` names a Tunix model (else it is a preset of the bundled Llama)."""
    return name.startswith(PREFIX)


def model_spec(name: str) -> TunixModel:
    """The :class:`TunixModel` called ``name``.

    Raises:
        ValueError: ``name`` is not in :data:`MODELS`.
    """
    if name not in MODELS:
        raise ValueError(f"unknown Tunix model {name!r}; choose from {', '.join(MODELS)}")
    return MODELS[name]


def model_config(name: str, remat: bool) -> tuple[Any, Any]:
    """``(the family's model module, its config)`` for ``name``: the published config, bf16, and each decoder layer
    rematerialised (Tunix's ``RematConfig.DECODER``) when ``remat``."""
    import jax.numpy as jnp

    spec = model_spec(name)
    module = importlib.import_module(f"tunix.models.{spec.family}.model")
    config = getattr(module.ModelConfig, spec.preset)()
    remat_config = module.RematConfig.DECODER if remat else module.RematConfig.NONE
    bf16 = dict.fromkeys(spec.bf16_fields, jnp.bfloat16)
    return module, dataclasses.replace(config, **spec.tiny, **bf16, remat_config=remat_config)


def build_model(name: str, remat: bool, seed: int = 0) -> Any:
    """Tunix's model ``name`` with random weights, every floating-point parameter in bfloat16."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    module, config = model_config(name, remat)
    model = getattr(module, model_spec(name).model_class)(config, rngs=nnx.Rngs(seed))

    def bf16(param):
        return param.astype(jnp.bfloat16) if jnp.issubdtype(param.dtype, jnp.floating) else param

    nnx.update(model, jax.tree.map(bf16, nnx.state(model, nnx.Param)))
    return model


def tunix_default_loss() -> Callable[..., Any]:
    """The loss ``PeftTrainer`` trains with unless given another (``PeftTrainer.loss_fn`` after construction).

    Tunix exports no name for it; reading it from the trainer's module spares building a trainer (checkpointing,
    metrics) just to fetch the attribute.
    """
    from tunix.sft import peft_trainer

    return peft_trainer._default_loss_fn


def liger_loss() -> tuple[Callable[..., Any] | None, str]:
    """``(peft_loss_fn with the kernels' implementation bound, its name)``, or ``(None, why not)`` while liger_jax
    has no such function."""
    from benchmarks.providers import kernel_implementation

    module_name, _, attribute = PEFT_LOSS_FN.rpartition(".")
    try:
        loss = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as error:
        return None, f"{PEFT_LOSS_FN} is missing ({type(error).__name__}: {error})"
    implementation = kernel_implementation()

    def peft_loss(model, input_tokens, input_mask, positions, attention_mask):
        return loss(model, input_tokens, input_mask, positions, attention_mask, implementation=implementation)

    return peft_loss, PEFT_LOSS_FN


def step_loss(peft_loss: Callable[..., Any]) -> Callable[..., Any]:
    """``(model, input_tokens, input_mask) -> loss`` for a Tunix PEFT loss: the positions and the causal attention
    mask built from ``input_mask`` as Tunix's SFT examples build them for ``PeftTrainer``."""
    from tunix.sft import utils

    def loss_fn(model, input_tokens, input_mask):
        positions = utils.build_positions_from_mask(input_mask)
        attention_mask = utils.make_causal_attn_mask(input_mask)
        return peft_loss(model, input_tokens, input_mask, positions, attention_mask)

    return loss_fn


def ablated_swaps() -> dict[str, bool]:
    """The swap kinds ``LIGER_JAX_E2E_NO_SWAP`` (comma-separated, e.g. ``rope,swiglu``) turns off, for ablations:
    ``{"rope": False, ...}`` as :func:`liger_jax.flax_layers.apply_liger` takes them."""
    return {kind: False for kind in os.environ.get("LIGER_JAX_E2E_NO_SWAP", "").split(",") if kind}


class TunixTrial(StepTrial):
    """A Tunix model's training step for one provider; the batch is ``(input_tokens int32, input_mask bool)``."""

    def __init__(self, provider: str, name: str, seq: int, precision: str, remat: bool):
        from benchmarks.providers import LIGER_JAX, kernel_implementation
        from liger_jax.flax_layers import apply_liger

        if precision != "bf16":
            raise ValueError(f"Tunix models run with bf16 params and compute only, got precision={precision!r}")
        loss, self.loss_name = liger_loss() if provider == LIGER_JAX else (None, "tunix default")
        if provider == LIGER_JAX and loss is None:
            loss, self.loss_name = tunix_default_loss(), f"tunix default: {self.loss_name}"
        self.swaps: dict[str, int] = {}

        def make_model():
            model = build_model(name, remat)
            if provider == LIGER_JAX:
                self.swaps = apply_liger(model, implementation=kernel_implementation(), **ablated_swaps())
            return model

        spec = model_spec(name)
        _, config = model_config(name, remat)
        super().__init__(make_model, seq, getattr(config, spec.vocab_field), step_loss(loss or tunix_default_loss()))

    def batch_specs(self, batch: int) -> tuple[Any, ...]:
        """Abstract ``(input_tokens, input_mask)`` for ``batch`` sequences."""
        import jax
        import jax.numpy as jnp

        return jax.ShapeDtypeStruct((batch, self.seq), jnp.int32), jax.ShapeDtypeStruct((batch, self.seq), jnp.bool_)

    def draw_batch(self, batch: int) -> tuple[Any, ...]:
        """Random tokens, every position real (no padding)."""
        import jax
        import jax.numpy as jnp

        tokens = jax.random.randint(jax.random.key(batch), (batch, self.seq), 0, self.vocab_size, dtype=jnp.int32)
        return tokens, jnp.ones((batch, self.seq), jnp.bool_)

    def describe(self) -> dict[str, Any]:
        """The loss the step trains and the modules liger swapped (all zero: no recipe for this family yet)."""
        return {"loss_fn": self.loss_name, "swaps": self.swaps}


def e2e_verdicts(rows: list[dict[str, Any]]) -> list[tuple[int, str, str, bool | None]]:
    """Issue 18's goals for each Tunix model among the e2e ``rows`` (no remat): ``(18, goal, measured, met?)``.

    The memory goal (where the model has one) compares the same-batch peaks; the speed goal the largest-batch
    tokens/s. A liger row that ran without ``peft_loss_fn`` judges nothing (met is None), nor does a missing row.
    """
    from benchmarks.providers import LIGER_JAX, XLA

    verdicts = []
    for config in dict.fromkeys(row["config"] for row in rows if is_tunix(row.get("config") or "")):
        spec = model_spec(config)
        ok = [r for r in rows if r.get("config") == config and r.get("status") == "ok" and not r.get("remat")]
        same = {r["provider"]: r for r in ok if r["phase"] == "same_batch" and r.get("peak_bytes")}
        largest = {r["provider"]: r for r in ok if r["phase"] == "max_batch"}
        goals = [] if spec.memory_target is None else [("memory", spec.memory_target, same)]
        for kind, target, found in [*goals, ("speed", spec.speedup_target, largest)]:
            if kind == "memory":
                goal = f"{config}: peak memory ≥ {target}x lower with liger at the same batch"
            else:
                goal = f"{config}: tokens/s ≥ {target}x at each one's largest batch"
            ours, xla = found.get(LIGER_JAX), found.get(XLA)
            if ours is None or xla is None or (kind == "memory" and ours["batch"] != xla["batch"]):
                verdicts.append((18, goal, "not measured", None))
                continue
            if kind == "memory":
                ratio = xla["peak_bytes"] / ours["peak_bytes"]
                measured = f"{ratio:.2f}x lower (batch {ours['batch']})"
            else:
                ratio = ours["tokens_per_s"] / xla["tokens_per_s"]
                measured = f"{ratio:.2f}x (batch {ours['batch']} vs {xla['batch']})"
            if ours.get("loss_fn") != PEFT_LOSS_FN:
                verdicts.append((18, goal, f"{measured}, but liger ran {ours.get('loss_fn')}", None))
            else:
                verdicts.append((18, goal, measured, ratio >= target))
    return verdicts
