"""The jit training step shared by ``examples/train_llama.py`` and the convergence test (needs optax).

The model is split once into a static graph and array state (``nnx.split``); the step merges them inside
``jax.jit``, so no NNX graph traversal happens per step and the state buffers are donated and updated in place.
State creation and the step are separate functions so that sharding can be layered on: place the
:class:`TrainState` leaves and the batch with the shardings you want, and the step follows them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import nnx


class TrainState(NamedTuple):
    """Everything a step updates: trainable ``params`` (``nnx.Param`` state), the model's other state, and the
    optimizer state. A pytree."""

    params: nnx.State
    rest: nnx.State
    opt_state: optax.OptState


def adamw_cosine(
    learning_rate: float,
    total_steps: int,
    *,
    warmup_steps: int,
    weight_decay: float = 0.1,
    clip_norm: float = 1.0,
) -> optax.GradientTransformation:
    """AdamW (β = 0.9, 0.95) with linear warmup then cosine decay to 10% of the peak, and global-norm clipping.

    Weight decay applies to matrices only (rank ≥ 2), not to norm scales.

    Args:
        learning_rate: the peak learning rate, reached after ``warmup_steps``.
        total_steps: the length of the schedule (≥ 1).
        warmup_steps: linear warmup steps from 0, fewer than ``total_steps``.
        weight_decay: decoupled weight decay.
        clip_norm: gradients are scaled down to this global norm.

    Raises:
        ValueError: a non-positive ``total_steps`` or ``warmup_steps`` outside ``[0, total_steps)``.
    """
    if total_steps < 1 or not 0 <= warmup_steps < total_steps:
        raise ValueError(f"need total_steps ≥ 1 and 0 ≤ warmup_steps < total_steps, got {total_steps}, {warmup_steps}")
    schedule = optax.warmup_cosine_decay_schedule(
        init_value=0.0,
        peak_value=learning_rate,
        warmup_steps=warmup_steps,
        decay_steps=total_steps,
        end_value=learning_rate / 10,
    )
    return optax.chain(
        optax.clip_by_global_norm(clip_norm),
        optax.adamw(
            schedule,
            b1=0.9,
            b2=0.95,
            weight_decay=weight_decay,
            mask=lambda params: jax.tree.map(lambda p: p.ndim >= 2, params),
        ),
    )


def init_train_state(model: nnx.Module, optimizer: optax.GradientTransformation) -> tuple[nnx.GraphDef, TrainState]:
    """Splits ``model`` into its static graph and a :class:`TrainState` with fresh optimizer state.

    Returns:
        ``(graphdef, state)``; ``nnx.merge(graphdef, state.params, state.rest)`` rebuilds the model.
    """
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    return graphdef, TrainState(params, rest, optimizer.init(params))


def make_train_step(
    graphdef: nnx.GraphDef,
    optimizer: optax.GradientTransformation,
    *,
    donate: bool = True,
    loss_fn: Callable[..., jax.Array] | None = None,
):
    """A jitted ``step(state, *batch) -> (state, loss)`` of ``loss_fn(model, *batch)`` for the model of ``graphdef``.

    Args:
        graphdef: from :func:`init_train_state`.
        optimizer: the optax transformation the state was initialised with.
        donate: donate the input state's buffers to the output (the caller must not reuse the old state).
        loss_fn: ``(model, *batch) -> scalar loss``; None: ``model.loss(tokens, labels)``, the batch being
            ``tokens``/``labels`` ``[B, S]`` int32 (the bundled Llama's mean cross-entropy).

    Returns:
        The step; ``loss`` is the loss *before* the update.
    """
    loss_of_model = loss_fn or (lambda model, tokens, labels: model.loss(tokens, labels))

    def step(state: TrainState, *batch: jax.Array) -> tuple[TrainState, jax.Array]:
        def loss_of_params(params: nnx.State) -> jax.Array:
            return loss_of_model(nnx.merge(graphdef, params, state.rest), *batch)

        loss, grads = jax.value_and_grad(loss_of_params)(state.params)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        return TrainState(params, state.rest, opt_state), loss

    return jax.jit(step, donate_argnums=(0,) if donate else ())


def parameter_count(state: TrainState) -> int:
    """Number of trainable scalars in ``state.params``."""
    return sum(int(jnp.size(leaf)) for leaf in jax.tree.leaves(state.params))
