"""The JAX program a mode times: forward, backward (the pullback alone), or full (forward then backward).

Each builder returns ``(body, prepare)``: ``body(*inputs)`` is what is timed and ``prepare(args, key)`` turns one
set of case arguments into its inputs (for ``backward`` that runs the forward, so the pullback's residuals exist).
``prepare`` takes drawn arrays and is cheap, except backward's, which is jitted: the forward it runs fuses.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from benchmarks import draws


def program(
    fn: Callable[..., Any], diff_argnums: Sequence[int], mode: str, *, draw_cotangent: bool = False
) -> tuple[Callable, Callable]:
    """``(body, prepare)`` for ``mode`` in ``("forward", "backward", "full")``, differentiating ``diff_argnums``.

    ``draw_cotangent``: ``full`` mode draws a cotangent for a non-scalar output too, rather than handing the
    forward's output back as one (see ``Case.cotangent_is_residual``).
    """
    match mode:
        case "forward":
            return fn, lambda args, key: tuple(args)
        case "backward":
            return _backward(fn, tuple(diff_argnums))
        case "full":
            return _full(fn, tuple(diff_argnums), draw_cotangent)
        case _:
            raise ValueError(f"mode must be forward, backward or full, got {mode!r}")


def recycling(
    body: Callable[..., Any],
    diff_argnums: Sequence[int],
    dead_argnums: Sequence[int],
    *,
    cotangent_from_gradient: bool = False,
) -> tuple[Callable, Callable]:
    """``(split, run)``: a ``full``-mode ``body`` (drawn cotangent) as a program that returns its next donated inputs.

    ``split(args, cotangent) -> (kept, donated)`` parts one input set: ``donated`` holds the ``dead_argnums`` args
    and the cotangent, ``kept`` the other args (None in the dead places). ``run(kept, donated) -> (donated',
    result)`` runs ``body``; ``donated'`` is the next call's ``donated``: each dead arg replaced by its gradient (same
    shape and dtype) and, with ``cotangent_from_gradient``, the cotangent by the first differentiated arg's gradient
    (the output's shape and dtype). A program that donates only ``donated`` can so run again on its own outputs while
    the kept args stay live inputs, never copied. ``donated'`` comes first among the outputs: JAX gives a donated
    buffer to the first output of its shape, which must be its own replacement. ``result`` holds the forward's
    output and the other gradients, which keeps their computation alive.
    """
    positions = [list(diff_argnums).index(argnum) for argnum in dead_argnums]
    fed_back = {*positions, 0} if cotangent_from_gradient else set(positions)

    def split(args, cotangent):
        kept = tuple(None if argnum in dead_argnums else arg for argnum, arg in enumerate(args))
        return kept, (tuple(args[argnum] for argnum in dead_argnums), cotangent)

    def run(kept, donated):
        dead, cotangent = donated
        args = list(kept)
        for argnum, arg in zip(dead_argnums, dead, strict=True):
            args[argnum] = arg
        out, grads = body(tuple(args), cotangent)
        following = tuple(grads[position] for position in positions)
        result = (out, tuple(grad for position, grad in enumerate(grads) if position not in fed_back))
        return (following, grads[0] if cotangent_from_gradient else cotangent), result

    return split, run


def over_copies(body: Callable[..., Any]) -> Callable[..., list]:
    """``body`` applied to each input copy in turn, inside one program: ``run(*columns)``, column k the list of
    every copy's k-th input (so a jit can donate one input of every copy).

    One call then runs the op once per copy, so host dispatch is paid once per several ops and no copy's inputs
    are still in L2 when it is read. An optimization barrier makes each application wait for the previous one:
    XLA can neither fuse the copies into one wider kernel nor run them concurrently, as in a real model.
    """

    def run(*columns: list) -> list:
        outputs, previous = [], None
        for inputs in zip(*columns, strict=True):
            if previous is not None:
                inputs, previous = jax.lax.optimization_barrier((inputs, previous))
            previous = body(*inputs)
            outputs.append(previous)
        return outputs

    return run


def cotangent_like(fn: Callable[..., Any], args: Sequence[Any], key: Any) -> Any:
    """A cotangent for ``fn(*args)``: ones for scalars (a loss), standard normal draws otherwise."""
    shapes = jax.eval_shape(fn, *args)
    leaves, tree = jax.tree.flatten(shapes)
    keys = jax.random.split(key, len(leaves))
    cotangents = [
        jnp.ones(s.shape, s.dtype) if s.ndim == 0 else draws.normal(k, s.shape, s.dtype)
        for s, k in zip(leaves, keys, strict=True)
    ]
    return jax.tree.unflatten(tree, cotangents)


def _vjp(fn, args, diff_argnums):
    def of_differentiated(*differentiated):
        full = list(args)
        for index, value in zip(diff_argnums, differentiated, strict=True):
            full[index] = value
        return fn(*full)

    return jax.vjp(of_differentiated, *(args[i] for i in diff_argnums))


def _full(fn, diff_argnums, draw_cotangent):
    def body(args, cotangent):
        out, pullback = _vjp(fn, args, diff_argnums)
        # As in training, the cotangent exists only once the forward's output does, so the two passes cannot
        # fuse into one; the residuals stay free, so XLA may still recompute cheap ones in the backward, as it
        # does inside a training step.
        out, cotangent = jax.lax.optimization_barrier((out, cotangent))
        if cotangent is not None:
            return out, pullback(cotangent)
        # The forward's own output stands in for the cotangent: like the cotangent the next layer hands back in
        # training, it is a temporary of this program, dead after the backward, so an op that writes its result
        # over the cotangent pays no copy (a program input would have to be copied first).
        return pullback(out)

    def prepare(args, key):
        scalar = all(leaf.ndim == 0 for leaf in jax.tree.leaves(jax.eval_shape(fn, *args)))
        return tuple(args), cotangent_like(fn, args, key) if scalar or draw_cotangent else None

    return body, prepare


def _backward(fn, diff_argnums):
    def body(pullback, cotangent):
        return pullback(cotangent)

    @jax.jit
    def prepare(args, key):
        return _vjp(fn, tuple(args), diff_argnums)[1], cotangent_like(fn, args, key)

    return body, prepare
