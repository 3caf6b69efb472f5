"""Varying manual axes (``jax.shard_map(..., check_vma=True)``) of kernel launches.

Inside ``jax.shard_map`` every value's type says over which manual mesh axes it varies. A kernel launch is a custom
call that drops that part of the type (and XLA's ffi_call wants its operands to agree on it), so
``runtime.launch`` casts its operands to vary over the union of their axes and types its results the same way: a
kernel's outputs vary wherever its inputs do. Outside ``shard_map`` there are no manual axes and nothing changes.
Custom calls also type their results on no mesh at all, which jax 0.11 rejects beside values typed on the context's
mesh (``dynamic_update_slice`` into a buffer made inside ``shard_map``): :func:`on_context_mesh` retypes them.
"""

from collections.abc import Sequence

import jax


def varying_axes(array: jax.Array) -> frozenset:
    """The manual mesh axes ``array`` varies over inside ``jax.shard_map`` (empty elsewhere)."""
    aval = jax.typeof(array)
    manual = getattr(aval, "mat", None)  # jax 0.10 keeps them in ``aval.mat.varying``, earlier versions in ``vma``
    return frozenset(manual.varying if manual is not None else getattr(aval, "vma", ()))


def cast_to_varying(array: jax.Array, axes: frozenset) -> jax.Array:
    """``array`` typed as varying over ``axes`` too (``jax.lax.pcast``; a no-op when it already does)."""
    missing = tuple(sorted(axes - varying_axes(array)))
    if not missing:
        return array
    if hasattr(jax.lax, "pcast"):
        return jax.lax.pcast(array, missing, to="varying")
    return jax.lax.pvary(array, missing)  # jax before pcast


def union_of(arrays: Sequence[jax.Array]) -> frozenset:
    """The manual axes any of ``arrays`` varies over."""
    return frozenset().union(*map(varying_axes, arrays))


def on_context_mesh(array: jax.Array) -> jax.Array:
    """``array`` typed on the abstract mesh of the context (``shard_map``, ``jax.set_mesh``) when it has none.

    Adding a zero of the context's type retypes it; XLA's simplifier removes the addition. Where the array already
    has a mesh, or there is no context mesh, the array comes back unchanged.
    """
    context = jax.sharding.get_abstract_mesh()
    if context.empty or not jax.typeof(array).sharding.mesh.empty:
        return array
    return array + jax.numpy.zeros((), array.dtype)
