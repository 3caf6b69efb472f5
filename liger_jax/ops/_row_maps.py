"""Row maps differentiated from their output: ``y = f(x)`` over the last axis whose backward needs only ``y`` and
``dy`` (softmax, sparsemax). One custom_vjp serves them: a forward kernel writes y, the only residual, and a backward
kernel reads ``(dy, y)`` and writes dx over dy's buffer."""

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from liger_jax import runtime
from liger_jax.ops import _axis, _checks, _dispatch
from liger_jax.ops._rows import Rows, row_launcher


def along_axis(
    x: jax.Array,
    axis: object,
    implementation: runtime.Implementation | None,
    op: str,
    reference: Callable[..., jax.Array],
    kernels: Callable[[], tuple],
) -> jax.Array:
    """A public row map's argument checks, dispatch and axis handling: ``op`` of ``x`` along ``axis``.

    Args:
        x: the op's input, checked here (rank ≥ 1, floating).
        axis: the op's ``axis`` argument, checked here.
        implementation: the op's ``implementation=`` argument; the size rule's entry is ``op``.
        op: the op's name, as the size rule knows it.
        reference: ``reference(x, axis=...)``, the ``"xla"`` implementation.
        kernels: ``kernels() -> (forward_kernel, backward_kernel)`` for :func:`apply`.

    Returns:
        The map of x along ``axis``, x's shape and dtype.
    """
    _checks.check_min_rank("x", x, 1)
    axis = _axis.normalized_axis("axis", axis, np.ndim(x))
    implementation = _dispatch.resolve(implementation, op, np.size(x), np.shape(x)[axis])
    _checks.check_floating("x", x, implementation)
    if implementation == "xla":
        return reference(x, axis=axis)
    if x.size == 0:
        return jnp.zeros_like(x)
    forward, backward = kernels()
    return _axis.over_last_axis(lambda rows: apply(rows, forward, backward, implementation), x, axis)


def apply(x: jax.Array, forward_kernel, backward_kernel, implementation: runtime.Implementation) -> jax.Array:
    """``forward_kernel``'s map of ``x [..., D]`` (non-empty) over the last axis, differentiable through
    ``backward_kernel``.

    Both kernels are row kernels of the signature in ``liger_jax.ops._rows`` with no constexprs of their own:
    ``forward(x, n_rows, y)`` and ``backward(dy, y, n_rows, dx)``; a forward that also takes PREFETCH and
    TILES_PER_PROGRAM walks row tiles (``_rows.row_launcher``'s ``walks_tiles``). Returns y, ``[..., D]`` in x's
    dtype.
    """
    return _row_map(x, forward_kernel, backward_kernel, implementation)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2, 3))
def _row_map(x, forward_kernel, backward_kernel, implementation):
    return _forward_launcher(forward_kernel, implementation)(x)[0]


def _row_map_fwd(x, forward_kernel, backward_kernel, implementation):
    y = _forward_launcher(forward_kernel, implementation)(x)[0]
    return y, y


def _row_map_bwd(forward_kernel, backward_kernel, implementation, y, dy):
    del forward_kernel
    return _backward_launcher(backward_kernel, implementation)(dy, y)


_row_map.defvjp(_row_map_fwd, _row_map_bwd)


def _forward_launcher(kernel, implementation):
    """``(x,) -> (y,)`` through the kernel, vmap-able and sharded by rows."""
    walks_tiles = "TILES_PER_PROGRAM" in kernel.arg_names
    return row_launcher(kernel, (Rows(),), row_argnums=(0,), implementation=implementation, walks_tiles=walks_tiles)


def _backward_launcher(kernel, implementation):
    """``(dy, y) -> (dx,)`` through the kernel; dx reuses dy's buffer."""
    return row_launcher(kernel, (Rows(),), row_argnums=(0, 1), implementation=implementation, aliases=((0, 0),))
