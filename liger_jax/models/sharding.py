"""Data, fully-sharded data and tensor parallelism for :mod:`liger_jax.models.llama` on a device mesh.

A mesh is written ``"dp=4,tp=2"``: axis names from :data:`AXES`, sizes multiplying to the number of devices.

* ``dp`` (data parallel): the batch is split over it, parameters are replicated.
* ``fsdp`` (fully sharded data parallel): the batch is split over it too, and every matrix is sharded on its
  non-tensor-parallel axis; XLA gathers each weight where it is used and reduce-scatters its gradient.
* ``tp`` (tensor parallel, Megatron): attention and MLP input projections are column-parallel (output features,
  i.e. heads and the MLP width, split), their output projections row-parallel (input features split), and the
  vocabulary of the embedding and LM head is split: the fused linear cross-entropy then runs vocab-parallel
  (:mod:`liger_jax.ops.vocab_parallel`), never gathering the head or the logits.

Norm scales and anything not named below stay replicated; an axis whose size does not divide a dimension leaves
that dimension whole. The optimizer's moments take the sharding of their parameter (they share its path). Axes
are ``AxisType.Auto``: XLA propagates the shardings through the model and the liger kernels keep them.

Example:
    >>> mesh = make_mesh("dp=2,fsdp=2,tp=2")
    >>> state = shard_train_state(state, mesh)
    >>> tokens = jax.device_put(tokens, batch_sharding(mesh))
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

AXES = ("dp", "fsdp", "tp")
# Parameter names (the module holding the array) by how tensor parallelism splits them.
_COLUMN_PARALLEL = frozenset({"q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "linear"})  # [in, out]
_ROW_PARALLEL = frozenset({"o_proj", "down_proj"})  # [in, out]


def parse_mesh(spec: str) -> dict[str, int]:
    """``"dp=4,tp=2"`` -> ``{"dp": 4, "tp": 2}``.

    Raises:
        ValueError: an entry not ``name=size``, a name outside :data:`AXES` or repeated, or a size below 1.
    """
    axes: dict[str, int] = {}
    for entry in spec.split(","):
        name, equals, size = entry.strip().partition("=")
        if not equals or not size.strip().isdigit():
            raise ValueError(f"mesh entries are name=size, got {entry!r} in {spec!r}")
        if name not in AXES or name in axes:
            raise ValueError(f"mesh axes are distinct names from {AXES}, got {name!r} in {spec!r}")
        if int(size) < 1:
            raise ValueError(f"mesh axis {name} needs a size of at least 1, got {size} in {spec!r}")
        axes[name] = int(size)
    return axes


def make_mesh(spec: str, devices: Sequence[jax.Device] | None = None) -> Mesh:
    """The mesh ``spec`` describes (see :func:`parse_mesh`) over ``devices`` (default: all), axes Auto.

    Raises:
        ValueError: a bad spec, or sizes whose product is not the number of devices.
    """
    axes = parse_mesh(spec)
    devices = list(jax.devices() if devices is None else devices)
    if math.prod(axes.values()) != len(devices):
        raise ValueError(f"mesh {spec!r} has {math.prod(axes.values())} devices, but there are {len(devices)}")
    grid = np.asarray(devices).reshape(tuple(axes.values()))
    return Mesh(grid, tuple(axes), axis_types=(AxisType.Auto,) * len(axes))


def parameter_spec(path: Sequence[str], shape: Sequence[int], mesh: Mesh) -> PartitionSpec:
    """The PartitionSpec of the array at ``path`` (its pytree key names) with ``shape``, following the rules above."""
    names = [name for name in path if name != "value"]
    owner, leaf = (names[-2], names[-1]) if len(names) >= 2 else (None, names[-1] if names else None)
    match leaf, len(shape):
        case "embedding", 2:  # [V, H]
            axes = ("tp", "fsdp")
        case "kernel", 2 if owner in _COLUMN_PARALLEL:
            axes = ("fsdp", "tp")
        case "kernel", 2 if owner in _ROW_PARALLEL:
            axes = ("tp", "fsdp")
        case "bias", 1 if owner in _COLUMN_PARALLEL:
            axes = ("tp",)
        case _:
            axes = (None,) * len(shape)
    return PartitionSpec(*(_axis_if_it_divides(axis, size, mesh) for axis, size in zip(axes, shape, strict=True)))


def _axis_if_it_divides(axis: str | None, size: int, mesh: Mesh) -> str | None:
    return axis if axis in mesh.shape and size % mesh.shape[axis] == 0 and mesh.shape[axis] > 1 else None


def shard_train_state(state, mesh: Mesh):
    """``state`` (any pytree of arrays, e.g. a ``TrainState``) placed on ``mesh`` by :func:`parameter_spec`."""

    def place(path, leaf):
        names = [_key_name(key) for key in path]
        return jax.device_put(leaf, NamedSharding(mesh, parameter_spec(names, np.shape(leaf), mesh)))

    return jax.tree_util.tree_map_with_path(place, state)


def _key_name(key) -> str:
    for attribute in ("key", "name", "idx"):
        if hasattr(key, attribute):
            return str(getattr(key, attribute))
    return str(key)


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """``[B, S]`` token batches split over the data axes (``dp`` and ``fsdp``), whole along the sequence."""
    data_axes = tuple(axis for axis in ("dp", "fsdp") if axis in mesh.shape)
    return NamedSharding(mesh, PartitionSpec(data_axes or None, None))


def sharded_batches(batches: Iterator[tuple[np.ndarray, ...]], mesh: Mesh) -> Iterator[tuple[jax.Array, ...]]:
    """Each ``(tokens, labels)`` of ``batches`` placed with :func:`batch_sharding`."""
    sharding = batch_sharding(mesh)
    for batch in batches:
        yield tuple(jax.device_put(array, sharding) for array in batch)
