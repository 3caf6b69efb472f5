"""ReLU²: reference, Triton launches, custom_vjp."""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from liger_jax import runtime
from liger_jax.ops import _checks, _dispatch, _tiling
from liger_jax.ops._batching import vmap_over_rows
from liger_jax.ops._partitioning import partitioned

# Launch heuristics: as the GLU kernels (see liger_jax.ops.glu), 4096 contiguous elements per program at 8 warps.
_BLOCK = 4096
_NUM_WARPS = 8


def relu_squared(x: jax.Array, *, implementation: runtime.Implementation | None = None) -> jax.Array:
    r"""The squared ReLU activation of Primer and Nemotron MLPs, elementwise (Liger's ReLUSquared).

    .. math::
        y = \max(x, 0)^2, \qquad \frac{dy}{dx} = 2 \max(x, 0)

    Numerics: computed in fp32 and rounded once to ``x.dtype`` (for bf16 and fp16 inputs, the native result). The
    backward pass saves only x and computes ``dx = 2 · max(x, 0) · dy`` in one pass over ``(dy, x)``; dx comes back
    in ``x.dtype``.

    Args:
        x: any shape, float32, bfloat16 or float16 (float64 too under ``"xla"``).
        implementation: ``"triton"``, ``"interpret"``, ``"xla"`` or None for the default (see
            :mod:`liger_jax.runtime`).

    Returns:
        An array of x's shape and dtype.

    Raises:
        TypeError: x is not floating point.

    Example:
        >>> hidden = liger_jax.relu_squared(x @ w_up) @ w_down
    """
    implementation = _dispatch.resolve(implementation, "relu_squared", np.size(x))
    _checks.check_floating("x", x, implementation)
    if implementation == "xla":
        return relu_squared_reference(x)
    if x.size == 0:
        return jnp.zeros_like(x)
    return _relu_squared(x, implementation)


def relu_squared_reference(x: jax.Array) -> jax.Array:
    """ReLU² in plain jax.numpy: the specification of :func:`relu_squared` and its ``"xla"`` implementation.

    Computed in ``promote(x.dtype, float32)`` (float64 inputs stay float64) and rounded to x's dtype.
    """
    relu = jax.nn.relu(x.astype(jnp.promote_types(x.dtype, jnp.float32)))
    return (relu * relu).astype(x.dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def _relu_squared(x, implementation):
    return _forward_launcher(implementation)(x)


def _relu_squared_fwd(x, implementation):
    return _forward_launcher(implementation)(x), x


def _relu_squared_bwd(implementation, x, dy):
    return (_backward_launcher(implementation)(dy, x),)


_relu_squared.defvjp(_relu_squared_fwd, _relu_squared_bwd)


def _flat_launch(kernel, implementation, operands, aliases=None):
    """``kernel`` over the flattened ``operands`` (all of operand 0's shape): one output of operand 0's shape and
    dtype, which may reuse the buffers ``aliases`` names (as ``runtime.launch``'s ``input_output_aliases``)."""
    n = operands[0].size
    out = runtime.launch(
        kernel,
        *(operand.reshape(n) for operand in operands),
        out_shape=jax.ShapeDtypeStruct((n,), operands[0].dtype),
        grid=(_tiling.cdiv(n, _BLOCK),),
        implementation=implementation,
        num_warps=_NUM_WARPS,
        n=n,
        input_output_aliases=aliases,
        BLOCK=_BLOCK,
    )
    return out.reshape(operands[0].shape)


@functools.cache
def _forward_launcher(implementation):
    """``x -> max(x, 0)²`` through the kernel, any shape, vmap-able; every axis may be sharded."""
    from liger_jax.kernels import relu_squared as kernels

    def forward(x):
        return _flat_launch(kernels.relu_squared_fwd, implementation, (x,))

    return vmap_over_rows(partitioned(forward, "... -> ..."), row_argnums=(0,), reduces_rows=False)


@functools.cache
def _backward_launcher(implementation):
    """``(dy, x) -> dx`` through the kernel; dx reuses dy's buffer; every axis may be sharded."""
    from liger_jax.kernels import relu_squared as kernels

    def backward(dy, x):
        return _flat_launch(kernels.relu_squared_bwd, implementation, (dy, x), aliases={0: 0})

    return vmap_over_rows(partitioned(backward, "..., ... -> ..."), row_argnums=(0, 1), reduces_rows=False)
