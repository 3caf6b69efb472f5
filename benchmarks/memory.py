"""Memory: what XLA's compiled module says it needs, and the peak a device allocator saw."""

from __future__ import annotations

from typing import Any


def compiled_memory(compiled: Any) -> dict[str, int | None]:
    """Bytes from a ``jax.stages.Compiled``'s memory analysis: temporaries, arguments, outputs, aliased outputs.

    ``temp_bytes`` is the scratch the module allocates on top of its arguments and outputs (on GPU, one buffer
    for the whole program); the keys are None where the backend gives no analysis.
    """
    analysis = compiled.memory_analysis()
    if isinstance(analysis, (list, tuple)):
        analysis = analysis[0] if analysis else None
    fields = {
        "temp_bytes": "temp_size_in_bytes",
        "arg_bytes": "argument_size_in_bytes",
        "out_bytes": "output_size_in_bytes",
        "alias_bytes": "alias_size_in_bytes",
    }
    return {key: None if analysis is None else int(getattr(analysis, name)) for key, name in fields.items()}


def footprint_bytes(memory: dict[str, int | None]) -> int | None:
    """Device bytes a compiled program needs, from :func:`compiled_memory`'s fields: arguments + outputs − donated
    (aliased) + temporaries; None where the backend gives no analysis."""
    parts = [memory.get(k) for k in ("arg_bytes", "out_bytes", "alias_bytes", "temp_bytes")]
    if None in parts:
        return None
    arg, out, alias, temp = parts
    return arg + out - alias + temp


def jax_memory_stats() -> dict[str, int]:
    """The first device's allocator statistics (empty on backends that keep none, such as CPU)."""
    import jax

    return jax.devices()[0].memory_stats() or {}


def tree_bytes(tree: Any) -> int:
    """Total bytes of the arrays (JAX, abstract ``jax.ShapeDtypeStruct`` or torch) among a pytree's leaves."""
    import math

    import jax

    total = 0
    for leaf in jax.tree.leaves(tree):
        if hasattr(leaf, "nbytes"):
            total += int(leaf.nbytes)
        elif hasattr(leaf, "element_size"):  # a torch tensor
            total += leaf.element_size() * leaf.numel()
        elif isinstance(leaf, jax.ShapeDtypeStruct):
            total += math.prod(leaf.shape) * leaf.dtype.itemsize
    return total
