"""Sequence-tiled MLP with recompute (Liger's ``LigerTiledSwiGLUMLP``/``apply_tiled_mlp``, DeepSpeed's TiledMLP).

An MLP's intermediate activations (``[tokens, intermediate]``, 3-4x the hidden width for gate, up and their product)
dominate activation memory at long sequences. Tiling the sequence and checkpointing each tile keeps only one tile's
intermediates alive: the forward pass runs tile by tile and saves nothing but its input, the backward pass
recomputes each tile's forward just before its backward. Outputs and gradients are those of the wrapped MLP, which
must map each token independently (any gated MLP does).

:func:`tiled_over_sequence` is the transform; :class:`NNXTiledMLP` and :class:`LinenTiledMLP` wrap a module with it
and are exported as ``TiledMLP`` by :mod:`liger_jax.flax_layers.nnx` and :mod:`liger_jax.flax_layers.linen`.
"""

import math
import numbers
from collections.abc import Callable

import jax
import jax.numpy as jnp
from flax import linen as nn
from flax import nnx


def tiled_over_sequence(
    fn: Callable[[jax.Array], jax.Array], x: jax.Array, *, num_shards: int | None = None
) -> jax.Array:
    """``fn(x)`` computed over ``num_shards`` tiles of x's sequence axis, each tile under ``jax.checkpoint``.

    The sequence (axis -2) is cut into tiles of ``ceil(S / num_shards)`` positions, all of the batch in each (as
    Liger's ``torch.chunk(x, num_shards, dim=-2)``, so a batch sharded across devices stays sharded); the full tiles
    run in one ``lax.map`` and a shorter last tile, if any, on its own. In the backward pass each tile's forward is
    recomputed, so at most one tile's intermediates are alive at a time.

    Args:
        fn: maps ``[..., n, H]`` to ``[..., n, H_out]``, each token independently (an MLP); a pure function (any
            params it closes over are differentiated through it).
        x: ``[..., S, H]``, at least rank 2.
        num_shards: how many tiles; None for Liger's default ``ceil(S / H)``. At most S are used.

    Returns:
        ``fn(x)``: ``[..., S, H_out]``.

    Raises:
        ValueError: x has fewer than 2 axes, or num_shards is not a positive int.
    """
    if x.ndim < 2:
        raise ValueError(f"x must have shape (..., seq, hidden), got {x.shape}")
    if num_shards is None:
        num_shards = math.ceil(x.shape[-2] / x.shape[-1])
    if not isinstance(num_shards, numbers.Integral) or num_shards < 1:
        raise ValueError(f"num_shards must be a positive int or None, got {num_shards!r}")
    *leading, seq, hidden = x.shape
    if seq == 0:
        return fn(x)
    tile = math.ceil(seq / min(int(num_shards), seq))
    n_full = seq // tile
    # Recomputes the tile's forward in the backward pass: only its input is saved.
    one_tile = jax.checkpoint(fn)
    tiles = jnp.moveaxis(x[..., : n_full * tile, :].reshape(*leading, n_full, tile, hidden), -3, 0)
    full = jax.lax.map(one_tile, tiles)
    out = jnp.moveaxis(full, 0, -3).reshape(*leading, n_full * tile, full.shape[-1])
    if n_full * tile < seq:
        out = jnp.concatenate([out, one_tile(x[..., n_full * tile :, :])], axis=-2)
    return out


class NNXTiledMLP(nnx.Module):
    """An ``nnx`` MLP computed tile by tile over the sequence with recompute (Liger's ``LigerTiledSwiGLUMLP``).

    ``NNXTiledMLP(mlp)(x)`` equals ``mlp(x)`` in value and gradient, with one tile's intermediates alive at a time
    (see :func:`tiled_over_sequence`). Exported as :class:`liger_jax.flax_layers.nnx.TiledMLP`. The params stay
    ``mlp``'s, under the attribute ``mlp``. The wrapped module must map tokens independently and must not update its
    own state when called (no batch statistics, no dropout RNG streams): each tile runs on a copy of its variables.

    Args:
        mlp: any ``nnx.Module`` mapping ``[..., H]`` to ``[..., H_out]`` token by token (:class:`SwiGLUMLP`,
            :class:`GEGLUMLP`, a model's own MLP).
        num_shards: tiles over the tokens; None for Liger's default ``ceil(S / H)``.

    Example:
        >>> mlp = TiledMLP(SwiGLUMLP(4096, 14336, rngs=nnx.Rngs(0)), num_shards=8)
    """

    def __init__(self, mlp: nnx.Module, *, num_shards: int | None = None):
        self.mlp = mlp
        self.num_shards = num_shards

    def __call__(self, x: jax.Array) -> jax.Array:
        """``mlp(x)`` for ``x [..., S, H]``, tiled over the tokens."""
        graphdef, state = nnx.split(self.mlp)
        return tiled_over_sequence(lambda tile: nnx.merge(graphdef, state)(tile), x, num_shards=self.num_shards)


class LinenTiledMLP(nn.Module):
    """A ``linen`` MLP computed tile by tile over the sequence with recompute; the linen twin of
    :class:`NNXTiledMLP`, exported as :class:`liger_jax.flax_layers.linen.TiledMLP`.

    The params are ``mlp``'s, under the name ``mlp``; ``init`` runs ``mlp`` untiled to create them.

    Attributes:
        mlp: any linen module mapping ``[..., H]`` to ``[..., H_out]`` token by token, without mutable collections.
        num_shards: tiles over the tokens; None for Liger's default ``ceil(S / H)``.
    """

    mlp: nn.Module
    num_shards: int | None = None

    def __call__(self, x: jax.Array) -> jax.Array:
        """``mlp(x)`` for ``x [..., S, H]``, tiled over the tokens."""
        if self.is_initializing():
            return self.mlp(x)
        variables, unbound = self.mlp.variables, self.mlp.clone(parent=None)
        return tiled_over_sequence(lambda tile: unbound.apply(variables, tile), x, num_shards=self.num_shards)
