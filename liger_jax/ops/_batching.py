"""``jax.vmap`` for kernel-launching functions, which XLA cannot batch on its own."""

from collections.abc import Callable, Collection

import jax
import jax.numpy as jnp


def vmap_over_rows(fn: Callable, row_argnums: Collection[int], reduces_rows: bool) -> Callable:
    """Gives ``fn`` a ``jax.vmap`` rule.

    ``fn(*arrays)`` must accept any number of leading (row) axes on the arguments in ``row_argnums``. When only
    those arguments are batched and no output sums over rows, the batch axis simply becomes one more row axis:
    one launch for the whole batch. Otherwise (a batched weight, or an output such as dscale that sums over rows
    and so must stay per example) the batch is walked with ``lax.map``, one launch per example.

    Args:
        fn: the kernel-launching function of arrays only (static settings closed over).
        row_argnums: positions of the arguments whose leading axes are rows.
        reduces_rows: whether some output sums over rows.

    Returns:
        ``fn`` wrapped in ``jax.custom_batching.custom_vmap``; nested vmaps work.
    """
    row_argnums = frozenset(row_argnums)
    batched_fn = jax.custom_batching.custom_vmap(fn)

    @batched_fn.def_vmap
    def rule(axis_size, in_batched, *args):
        batched_positions = {i for i, batched in enumerate(in_batched) if batched}
        if not reduces_rows and batched_positions <= row_argnums:
            folded = [
                arg
                if i in batched_positions or i not in row_argnums
                else jnp.broadcast_to(arg, (axis_size, *arg.shape))
                for i, arg in enumerate(args)
            ]
            out = batched_fn(*folded)
        else:

            def one_example(batched_args):
                merged = list(args)
                for i, arg in zip(sorted(batched_positions), batched_args, strict=True):
                    merged[i] = arg
                return batched_fn(*merged)

            out = jax.lax.map(one_example, [args[i] for i in sorted(batched_positions)])
        return out, jax.tree.map(lambda _: True, out)

    return batched_fn
