"""Gated linear units, SwiGLU and GeGLU: references, Triton launches, custom_vjp."""

import functools
from collections.abc import Callable
from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np

from liger_jax import runtime
from liger_jax.ops import _checks, _dispatch, _tiling
from liger_jax.ops._batching import vmap_over_rows
from liger_jax.ops._partitioning import partitioned

Activation = Literal["silu", "gelu_tanh"]
# The kernels' ACTIVATION constexpr for each activation, by the name of its code in liger_jax.kernels.glu.
_ACTIVATION_CODES = {"silu": "SILU", "gelu_tanh": "GELU_TANH"}

# Launch heuristics. 4096 contiguous elements per program at 8 warps is 16 per thread: two 128-bit loads of bf16
# per operand, enough bytes in flight per program to stream at HBM speed, and few programs to schedule.
_BLOCK = 4096
_NUM_WARPS = 8


def swiglu(gate: jax.Array, up: jax.Array, *, implementation: runtime.Implementation | None = None) -> jax.Array:
    r"""The SwiGLU gate of Llama-style MLPs, elementwise (Liger's SwiGLU).

    .. math::
        \mathrm{out} = \mathrm{silu}(\mathrm{gate}) \cdot \mathrm{up}, \quad \mathrm{silu}(g) = g \, \sigma(g)

    Numerics: silu and the product are computed in fp32 and rounded once to the input dtype. The backward pass
    saves only gate and up and recomputes silu in one pass over ``(dout, gate, up)``; dgate and dup come back
    in the input dtype.

    Args:
        gate: any shape, float32, bfloat16 or float16 (float64 too under ``"xla"``); usually ``x @ W_gate``.
        up: the same shape and dtype; usually ``x @ W_up``.
        implementation: ``"triton"``, ``"interpret"``, ``"xla"`` or None for the default (see
            :mod:`liger_jax.runtime`).

    Returns:
        An array of gate's shape and dtype.

    Raises:
        TypeError: gate or up is not floating point, or their dtypes differ.
        ValueError: their shapes differ.

    Example:
        >>> hidden = liger_jax.swiglu(x @ w_gate, x @ w_up) @ w_down
    """
    return _gated(gate, up, "silu", implementation)


def geglu(gate: jax.Array, up: jax.Array, *, implementation: runtime.Implementation | None = None) -> jax.Array:
    r"""The GeGLU gate of Gemma-style MLPs with the tanh approximation of GELU, elementwise (Liger's GeGLU).

    .. math::
        \mathrm{out} = \mathrm{gelu}(\mathrm{gate}) \cdot \mathrm{up}, \quad
        \mathrm{gelu}(g) = \tfrac{1}{2} g \left(1 + \tanh\left(\sqrt{2/\pi}\,(g + 0.044715\,g^3)\right)\right)

    which is ``jax.nn.gelu(gate, approximate=True) * up``. Numerics, arguments, returns and errors as
    :func:`swiglu`.
    """
    return _gated(gate, up, "gelu_tanh", implementation)


def swiglu_reference(gate: jax.Array, up: jax.Array) -> jax.Array:
    """SwiGLU in plain jax.numpy: the specification of :func:`swiglu` and its ``"xla"`` implementation.

    Computed in ``promote(gate.dtype, float32)`` (float64 inputs stay float64) and rounded to gate's dtype.
    """
    return _reference(gate, up, jax.nn.silu)


def geglu_reference(gate: jax.Array, up: jax.Array) -> jax.Array:
    """GeGLU in plain jax.numpy: the specification of :func:`geglu` and its ``"xla"`` implementation.

    Computed in ``promote(gate.dtype, float32)`` (float64 inputs stay float64) and rounded to gate's dtype.
    """
    return _reference(gate, up, functools.partial(jax.nn.gelu, approximate=True))


def _reference(gate: jax.Array, up: jax.Array, activation: Callable[[jax.Array], jax.Array]) -> jax.Array:
    compute = jnp.promote_types(gate.dtype, jnp.float32)
    return (activation(gate.astype(compute)) * up.astype(compute)).astype(gate.dtype)


_REFERENCES = {"silu": swiglu_reference, "gelu_tanh": geglu_reference}
_OP_NAMES = {"silu": "swiglu", "gelu_tanh": "geglu"}  # as the size rule knows them


def _gated(gate, up, activation: Activation, implementation):
    implementation = _dispatch.resolve(implementation, _OP_NAMES[activation], np.size(gate))
    _checks.check_floating("gate", gate, implementation)
    _checks.check_floating("up", up, implementation)
    _checks.check_shape("up", up, gate.shape, "gate's shape")
    _checks.check_dtype("up", up, gate.dtype, "gate's dtype")
    if implementation == "xla":
        return _REFERENCES[activation](gate, up)
    if gate.size == 0:
        return jnp.zeros_like(gate)
    return _glu(gate, up, activation, implementation)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _glu(gate, up, activation, implementation):
    return _forward_launcher(activation, implementation)(gate, up)


def _glu_fwd(gate, up, activation, implementation):
    return _forward_launcher(activation, implementation)(gate, up), (gate, up)


def _glu_bwd(activation, implementation, residuals, dout):
    gate, up = residuals
    return _backward_launcher(activation, implementation)(dout, gate, up)


_glu.defvjp(_glu_fwd, _glu_bwd)


@functools.cache
def _forward_launcher(activation, implementation):
    """``(gate, up) -> act(gate) · up`` through the kernel, any shape, vmap-able."""
    from liger_jax.kernels import glu as kernels

    def forward(gate, up):
        n = gate.size
        out = runtime.launch(
            kernels.glu_fwd,
            gate.reshape(n),
            up.reshape(n),
            out_shape=jax.ShapeDtypeStruct((n,), gate.dtype),
            grid=(_tiling.cdiv(n, _BLOCK),),
            implementation=implementation,
            num_warps=_NUM_WARPS,
            n=n,
            ACTIVATION=getattr(kernels, _ACTIVATION_CODES[activation]).value,
            BLOCK=_BLOCK,
        )
        return out.reshape(gate.shape)

    return vmap_over_rows(partitioned(forward, "..., ... -> ..."), row_argnums=(0, 1), reduces_rows=False)


@functools.cache
def _backward_launcher(activation, implementation):
    """``(dout, gate, up) -> (dgate, dup)`` through the kernel in one pass; dgate reuses dout's buffer."""
    from liger_jax.kernels import glu as kernels

    def backward(dout, gate, up):
        n = gate.size
        dgate, dup = runtime.launch(
            kernels.glu_bwd,
            dout.reshape(n),
            gate.reshape(n),
            up.reshape(n),
            out_shape=(jax.ShapeDtypeStruct((n,), gate.dtype), jax.ShapeDtypeStruct((n,), up.dtype)),
            grid=(_tiling.cdiv(n, _BLOCK),),
            implementation=implementation,
            num_warps=_NUM_WARPS,
            input_output_aliases={0: 0},
            n=n,
            ACTIVATION=getattr(kernels, _ACTIVATION_CODES[activation]).value,
            BLOCK=_BLOCK,
        )
        return dgate.reshape(gate.shape), dup.reshape(up.shape)

    sharded = partitioned(backward, "..., ..., ... -> ..., ...")  # elementwise: every axis may be sharded
    return vmap_over_rows(sharded, row_argnums=(0, 1, 2), reduces_rows=False)
