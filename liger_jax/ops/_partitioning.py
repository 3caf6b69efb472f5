"""Kernel launches under SPMD: a ``custom_partitioning`` rule from an einsum-like description of the launcher.

A kernel launch is opaque to XLA: under ``jit`` with sharded operands XLA would gather them onto every device
("Involuntary full rematerialization") and run the whole launch there. :func:`partitioned` tells XLA which axes a
launcher maps through unchanged, so each device launches the kernel on its own block and the results keep the
operands' sharding.

The rule names every axis of every operand and result, einsum-style: ``"... d, d -> ... d, ..."`` is RMSNorm's
forward (``x [..., D], scale [D] -> y [..., D], rstd [...]``), where ``...`` stands for the leading (row) axes
and may appear at the front of any tensor (the same number of axes in each). A factor may be sharded on any mesh
axes unless it is ``replicated`` (a feature axis each launch needs whole: an operand sharded on it is gathered
first, never silently misread). A result that lacks a factor is the same on every device along that factor's mesh
axes (rstd lacks D; RoPE's k lacks q's heads), unless it is one of the ``partial_sums``: then it holds this shard's
partial sums over the factors it lacks (dscale lacks the rows), summed across their mesh axes in at least fp32.
A ``collective`` factor may be sharded too, but the launcher combines across it itself (vocabulary-parallel
cross-entropy): it is called with ``axis_names={factor: mesh axes}`` and nothing is summed for it.

Three ways in, one per kind of mesh axis:

* Automatic axes (``jit`` with ``AxisType.Auto``, or no mesh): a ``jax.experimental.custom_partitioning`` op with
  a Shardy ``sharding_rule`` for propagation and a ``partition`` callback that picks the shardings (from the
  operands') and lowers the per-shard launch; ``infer_sharding_from_operands`` serves the GSPMD partitioner.
* Explicit axes (``AxisType.Explicit``, shardings in the types): the shardings are known while tracing, so the
  launch is a ``jax.shard_map`` with the same rule; a result shaped like an operand gets that operand's sharding.
* Manual axes (inside the user's ``jax.shard_map``, every mesh axis manual): the launcher is inlined and runs on the
  local block. With ``check_vma=True`` a result of partial sums is summed across the axes it varies over but its
  own operands do not, so a replicated ``scale`` gets the whole dscale (``custom_vjp`` requires the cotangent of
  an invariant primal to be invariant); with ``check_vma=False`` no axis is known and partials stay per device,
  as the XLA reference's would. A shard_map over only some mesh axes is not supported: the interpreter's custom
  call, like ``jax.pure_callback``, needs every axis manual.

On one device the custom_partitioning op lowers to the launcher itself: the same code path, no partitioner.

It composes with the rest of an op this way: ``jax.custom_vjp`` stays outside (its forward and backward call
partitioned launchers); ``ops._batching.vmap_over_rows`` goes outside too, ``vmap_over_rows(partitioned(...))``,
as custom_partitioning has no batching rule and the custom_vmap calls it unbatched; the interpreter runs kernels
in a host custom call (:mod:`liger_jax._host_call`), because ``jax.pure_callback`` cannot be called from the
per-shard program a partitioned op compiles to.
"""

import dataclasses
import functools
import math
from collections.abc import Callable, Collection, Sequence

import jax
import jax.numpy as jnp
from jax.experimental.custom_partitioning import ArrayMapping, SdyShardingRule, custom_partitioning
from jax.sharding import NamedSharding, PartitionSpec

from liger_jax import _manual_axes

_ELLIPSIS = "..."


def partitioned(
    fn: Callable,
    rule: str | Callable[..., str],
    *,
    replicated: Collection[str] = (),
    collective: Collection[str] = (),
    partial_sums: Collection[int] = (),
) -> Callable:
    """Gives a kernel-launching function a sharding rule, so it runs shard by shard under ``jit``.

    Args:
        fn: ``fn(*arrays) -> array or pytree of arrays``, static settings closed over. Each result block must
            follow from the blocks of the operands it depends on, and depend on none sharded along a factor it
            lacks, unless it is a partial sum. With ``collective`` factors it is called as
            ``fn(*arrays, axis_names=...)``.
        rule: ``"operand, operand, ... -> result, ..."``, each a space-separated list of factor names, one per
            axis; ``...`` at the front of a tensor stands for any number of leading axes. Or a function of the
            operands returning that string, for launchers whose operands' roles depend on their ranks.
        replicated: factors each launch needs whole (feature axes): never sharded.
        collective: factors that may be sharded and that ``fn`` combines across itself: ``axis_names`` maps each
            one to the mesh axes sharding it in this launch (absent when it is whole).
        partial_sums: positions (in the flattened results) of results that sum over the factors they lack.

    Returns:
        A function of the same arrays and results, each result sharded as the factors it has are.
    """
    replicated, collective, partial_sums = frozenset(replicated), frozenset(collective), frozenset(partial_sums)

    @functools.cache
    def for_rule(rule: str, n_leading: int) -> tuple[_Layout, custom_partitioning]:
        layout = _Layout.expand(*_parse(rule), n_leading, replicated, collective, partial_sums)
        op = custom_partitioning(functools.partial(_local, fn, layout))
        op.def_partition(
            partition=functools.partial(_partition, fn, layout),
            infer_sharding_from_operands=functools.partial(_infer_result_shardings, layout),
            sharding_rule=layout.sharding_rule(),
        )
        return layout, op

    def launch(*arrays):
        rule_now = rule(*arrays) if callable(rule) else rule
        layout, op = for_rule(rule_now, _leading_axes(_parse(rule_now)[0], arrays, rule_now))
        mesh = _explicit_mesh(arrays)
        return op(*arrays) if mesh is None else _shard_mapped(fn, layout, mesh, arrays)

    return launch


@functools.cache
def _parse(rule: str) -> tuple[tuple[tuple[str, ...], ...], tuple[tuple[str, ...], ...]]:
    """``"... d, d -> ... d, ..."`` -> ``((("...", "d"), ("d",)), (("...", "d"), ("...",)))``."""
    lhs, arrow, rhs = rule.partition("->")
    if not arrow:
        raise ValueError(f"rule {rule!r} needs '->' between operands and results")
    sides = tuple(tuple(tuple(tensor.split()) for tensor in side.split(",")) for side in (lhs, rhs))
    for tensor in sides[0] + sides[1]:
        if _ELLIPSIS in tensor[1:]:
            raise ValueError(f"rule {rule!r}: '...' may only stand at the front of a tensor")
        if len(set(tensor)) != len(tensor):
            raise ValueError(f"rule {rule!r}: a factor appears twice in one tensor")
    return sides


def _leading_axes(operands, arrays, rule: str) -> int:
    """The number of axes ``...`` stands for, the same in every operand that has it."""
    if len(operands) != len(arrays):
        raise TypeError(f"rule {rule!r} has {len(operands)} operands, got {len(arrays)} arrays")
    counts = set()
    for tensor, array in zip(operands, arrays, strict=True):
        if tensor[:1] == (_ELLIPSIS,):
            counts.add(array.ndim - len(tensor) + 1)
        elif array.ndim != len(tensor):
            raise ValueError(f"rule {rule!r}: operand {' '.join(tensor)!r} needs rank {len(tensor)}, got {array.shape}")
    if len(counts) > 1 or min(counts, default=0) < 0:
        raise ValueError(f"rule {rule!r}: '...' must stand for the same number of axes in every operand")
    return counts.pop() if counts else 0


@dataclasses.dataclass(frozen=True)
class _Layout:
    """The rule at one rank: each operand's and result's factor per axis, and the special factors."""

    operands: tuple[tuple[str, ...], ...]
    results: tuple[tuple[str, ...], ...]
    replicated: frozenset[str]
    collective: frozenset[str]
    partial_sums: frozenset[int]

    @classmethod
    def expand(cls, operands, results, n_leading: int, replicated, collective, partial_sums) -> "_Layout":
        leading = tuple(f"ellipsis{i}" for i in range(n_leading))

        def expanded(tensor):
            return leading + tensor[1:] if tensor[:1] == (_ELLIPSIS,) else tensor

        operands, results = tuple(map(expanded, operands)), tuple(map(expanded, results))
        return cls(operands, results, replicated, collective, partial_sums)

    def summed_factors(self, result: int) -> frozenset[str]:
        """The operand factors that result ``result`` holds partial sums over (none unless it is a partial sum)."""
        if result not in self.partial_sums:
            return frozenset()
        operand_factors = {f for tensor in self.operands for f in tensor}
        return frozenset(operand_factors - self.replicated - self.collective - set(self.results[result]))

    def sharding_rule(self) -> SdyShardingRule:
        """The Shardy rule: factors absent from every result are reductions, ``replicated`` need replication."""
        # Shardy numbers factors in order of appearance and wants each special set in that order.
        factors = list(dict.fromkeys(f for tensor in self.operands + self.results for f in tensor))
        reductions = set().union(*self.operands) - set().union(*self.results) - self.replicated - self.collective
        return SdyShardingRule(
            operand_mappings=tuple(ArrayMapping(*tensor) for tensor in self.operands),
            result_mappings=tuple(ArrayMapping(*tensor) for tensor in self.results),
            reduction_factors=tuple(f for f in factors if f in reductions),
            need_replication_factors=tuple(f for f in factors if f in self.replicated),
        )

    def mesh_axes(self, mesh, operand_shapes) -> dict[str, tuple[str, ...]]:
        """Mesh axes per factor, taken from the first operand sharded on it.

        A mesh axis that already shards another factor of a tensor the factor is in (any factor, for a collective
        one: its combining must not mix blocks of other factors) is dropped from its axes, and the operand is
        gathered along it (FSDP's weight gather). A factor stays whole when what is left does not divide its size
        evenly (padding would enter the partial sums).
        """
        assigned: dict[str, tuple[str, ...]] = {}
        for tensor, shape in zip(self.operands, operand_shapes, strict=True):
            for factor, axes, size in zip(tensor, _dim_axes(shape), shape.shape, strict=True):
                if factor in self.replicated or factor in assigned:
                    continue
                axes = tuple(axis for axis in axes if axis not in self._taken(factor, assigned))
                if axes and size % math.prod(mesh.shape[axis] for axis in axes) == 0:
                    assigned[factor] = axes
        return assigned

    def _taken(self, factor: str, assigned) -> set[str]:
        """The mesh axes ``factor`` may not be sharded on, given the factors already ``assigned``."""
        if factor in self.collective:
            return set().union(*assigned.values())
        neighbours = {f for tensor in self.operands + self.results if factor in tensor for f in tensor}
        return set().union(*(axes for f, axes in assigned.items() if f in neighbours or f in self.collective))

    def shardings(self, mesh, tensors, assigned) -> list[NamedSharding]:
        """The NamedSharding of each tensor (a tuple of factor names) under ``assigned``."""
        return [NamedSharding(mesh, PartitionSpec(*(assigned.get(f) for f in tensor))) for tensor in tensors]

    def axis_names(self, assigned) -> dict[str, tuple[str, ...]]:
        """``fn``'s ``axis_names``: the mesh axes of each sharded collective factor."""
        return {f: axes for f, axes in assigned.items() if f in self.collective}


def _dim_axes(shape: jax.ShapeDtypeStruct) -> list[tuple[str, ...]]:
    """The mesh axes sharding each axis of ``shape``; none when its sharding is not a NamedSharding."""
    sharding = shape.sharding
    if not isinstance(sharding, NamedSharding):
        return [()] * len(shape.shape)
    spec = tuple(sharding.spec) + (None,) * (len(shape.shape) - len(sharding.spec))
    return [() if entry is None else (entry,) if isinstance(entry, str) else tuple(entry) for entry in spec]


def _call(fn, layout: _Layout, axis_names, arrays):
    return fn(*arrays, axis_names=axis_names) if layout.collective else fn(*arrays)


def _partition(fn, layout: _Layout, mesh, arg_shapes, result_shape):
    """custom_partitioning's ``partition``: the shardings every operand and result take, and the per-shard launch."""
    assigned = layout.mesh_axes(mesh, arg_shapes)
    result_shardings = jax.tree.unflatten(
        jax.tree.structure(result_shape), layout.shardings(mesh, layout.results, assigned)
    )
    return (
        mesh,
        _per_shard(fn, layout, assigned),
        result_shardings,
        tuple(layout.shardings(mesh, layout.operands, assigned)),
    )


def _per_shard(fn, layout: _Layout, assigned) -> Callable:
    """The launch on one device's blocks: partial sums summed across the mesh axes of the factors they lack."""
    sums = [
        tuple(a for f in sorted(layout.summed_factors(i)) for a in assigned.get(f, ()))
        for i in range(len(layout.results))
    ]

    def per_shard(*arrays):
        leaves, tree = jax.tree.flatten(_call(fn, layout, layout.axis_names(assigned), arrays))
        return jax.tree.unflatten(tree, [_summed(leaf, axes) for leaf, axes in zip(leaves, sums, strict=True)])

    return per_shard


def _infer_result_shardings(layout: _Layout, mesh, arg_shapes, result_shape):
    """custom_partitioning's ``infer_sharding_from_operands`` (the GSPMD partitioner; Shardy uses the rule)."""
    assigned = layout.mesh_axes(mesh, arg_shapes)
    return jax.tree.unflatten(jax.tree.structure(result_shape), layout.shardings(mesh, layout.results, assigned))


def _summed(value: jax.Array, axes: Sequence[str]) -> jax.Array:
    """``psum`` over ``axes``, accumulated in at least fp32 for floating values."""
    if not axes:
        return value
    if jnp.issubdtype(value.dtype, jnp.floating):
        return jax.lax.psum(value.astype(jnp.promote_types(value.dtype, jnp.float32)), tuple(axes)).astype(value.dtype)
    return jax.lax.psum(value, tuple(axes))


def _explicit_mesh(arrays) -> jax.sharding.AbstractMesh | None:
    """The mesh of operands whose sharding is part of their type (``AxisType.Explicit``), else None."""
    for array in arrays:
        mesh = jax.typeof(array).sharding.mesh
        if jax.sharding.AxisType.Explicit in mesh.axis_types:
            return mesh
    return None


def _shard_mapped(fn, layout: _Layout, mesh, arrays):
    """Explicit sharding: the shardings are known while tracing, so the launch is a ``jax.shard_map`` directly.

    A result shaped like an operand comes back with that operand's sharding (as an elementwise op would), so an
    operand sharded on a replicated factor is gathered for the launch and its result scattered again; custom_vjp
    needs that, as a cotangent must have its primal's type.
    """
    shapes = [jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=jax.typeof(a).sharding) for a in arrays]
    assigned = layout.mesh_axes(mesh, shapes)
    operand_shardings = layout.shardings(mesh, layout.operands, assigned)
    result_specs = [s.spec for s in layout.shardings(mesh, layout.results, assigned)]
    unsharded = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in arrays]
    result_tree = jax.tree.structure(jax.eval_shape(lambda *a: _call(fn, layout, {}, a), *unsharded))
    # The shard_map is never differentiated (custom_vjp is outside), and its sums follow the rule, not the types.
    local = jax.shard_map(
        _per_shard(fn, layout, assigned),
        mesh=mesh,
        in_specs=tuple(s.spec for s in operand_shardings),
        out_specs=jax.tree.unflatten(result_tree, result_specs),
        check_vma=False,
    )
    results = jax.tree.leaves(local(*(jax.reshard(a, s) for a, s in zip(arrays, operand_shardings, strict=True))))
    for i, tensor in enumerate(layout.results):
        like = [jax.typeof(a).sharding for a, operand in zip(arrays, layout.operands, strict=True) if operand == tensor]
        if like and like[0].mesh == mesh and like[0].spec != result_specs[i]:
            results[i] = jax.reshard(results[i], like[0])
    return jax.tree.unflatten(result_tree, results)


def _local(fn, layout: _Layout, *arrays):
    """The launch on whole or local blocks; inside ``jax.shard_map`` partial sums are summed where the types say so.

    It is what runs on one device and inside the user's shard_map; collective factors count as whole there.
    """
    leaves, tree = jax.tree.flatten(_call(fn, layout, {}, arrays))
    for i, leaf in enumerate(leaves):
        if layout.summed_factors(i):
            own = [
                a for a, tensor in zip(arrays, layout.operands, strict=True) if set(tensor) <= set(layout.results[i])
            ]
            partial_over = _manual_axes.varying_axes(leaf) - _manual_axes.union_of(own)
            leaves[i] = _summed(leaf, tuple(sorted(partial_over)))
    return jax.tree.unflatten(tree, leaves)
