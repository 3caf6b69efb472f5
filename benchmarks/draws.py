"""Random inputs for cases, in JAX and (for liger_torch) in torch. Never zeros: they can time faster than data.

JAX draws are made block by block (``lax.map`` over row blocks of at most ``BLOCK_ELEMENTS``): XLA's random bits
take several times the output's bytes in temporaries, which for a 2 GB weight would be the peak of a
peak-memory measurement; block by block they stay a few tens of MB.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

BLOCK_ELEMENTS = 1 << 22


def _blockwise(key: Any, shape: Sequence[int], draw: Callable[[Any, tuple[int, ...]], Any]) -> Any:
    """``draw(key, block_shape)`` over row blocks of ``shape``, stacked in place into the full array."""
    import jax

    shape = tuple(shape)
    rows, per_row = shape[0], math.prod(shape[1:])
    block = max([d for d in range(1, rows + 1) if rows % d == 0 and d * per_row <= BLOCK_ELEMENTS], default=1)
    blocks = jax.lax.map(lambda k: draw(k, (block, *shape[1:])), jax.random.split(key, rows // block))
    return blocks.reshape(shape)


def normal(key: Any, shape: Sequence[int], dtype: str, scale: float = 1.0, mean: float = 0.0) -> Any:
    """``mean + scale · N(0, 1)`` draws of ``shape`` (rank ≥ 1) in ``dtype``, drawn in fp32."""
    import jax
    import jax.numpy as jnp

    def draw(k, block_shape):
        return (mean + scale * jax.random.normal(k, block_shape, jnp.float32)).astype(dtype)

    return _blockwise(key, shape, draw)


def labels(key: Any, rows: int, vocab: int) -> Any:
    """``rows`` int32 class labels uniform in ``[0, vocab)``."""
    import jax
    import jax.numpy as jnp

    return _blockwise(key, (rows,), lambda k, block_shape: jax.random.randint(k, block_shape, 0, vocab, jnp.int32))


def keys(key: Any, count: int) -> list[Any]:
    """``count`` independent keys from one."""
    import jax

    return list(jax.random.split(key, count))


def torch_normal(shape: Sequence[int], dtype: str, scale: float = 1.0, mean: float = 0.0, grad: bool = True) -> Any:
    """The torch twin of :func:`normal`, on the current CUDA device, a leaf that records gradients if ``grad``."""
    import torch

    values = mean + scale * torch.randn(tuple(shape), device="cuda", dtype=torch.float32)
    return values.to(getattr(torch, dtype)).requires_grad_(grad)


def torch_labels(rows: int, vocab: int) -> Any:
    """The torch twin of :func:`labels` (int64, as torch's losses take)."""
    import torch

    return torch.randint(0, vocab, (rows,), device="cuda", dtype=torch.int64)
