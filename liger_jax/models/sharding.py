"""Data, fully-sharded data and tensor parallelism for :mod:`liger_jax.models.llama` on a device mesh.

A mesh is written ``"dp=4,tp=2"``: axis names from :data:`AXES`; it takes the first devices (size product) of the
machine.

* ``dp`` (data parallel): the batch is split over it, parameters are replicated.
* ``fsdp`` (fully sharded data parallel): the batch is split over it too, and every matrix is sharded on its
  non-tensor-parallel axis (the embedding on its vocabulary, with tp: sharding its hidden axis would shard the
  activations' features, which XLA can then only undo by a full rematerialisation); XLA gathers each weight where
  it is used and reduce-scatters its gradient.
* ``tp`` (tensor parallel, Megatron): attention and MLP input projections are column-parallel (output features,
  i.e. heads and the MLP width, split), their output projections row-parallel (input features split), and the
  vocabulary of the embedding and LM head is split: the fused linear cross-entropy then runs vocab-parallel
  (:mod:`liger_jax.ops.vocab_parallel`), never gathering the head or the logits.

Norm scales and anything not named below stay replicated; an axis whose size does not divide a dimension (for the
attention projections: the number of heads) leaves that dimension whole. The optimizer's moments take the sharding
of their parameter (they share its path). Axes are ``AxisType.Auto``: XLA propagates the shardings through the
model and the liger kernels keep them.

Example:
    >>> mesh = make_mesh("dp=2,fsdp=2,tp=2")
    >>> state = shard_train_state(state, mesh, config)
    >>> tokens = jax.device_put(tokens, batch_sharding(mesh))
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from liger_jax.models.llama import LlamaConfig

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
    """The mesh ``spec`` describes (see :func:`parse_mesh`) over the first of ``devices`` (default: all), axes Auto.

    Raises:
        ValueError: a bad spec, or more devices than there are.
    """
    axes = parse_mesh(spec)
    devices = list(jax.devices() if devices is None else devices)
    if math.prod(axes.values()) > len(devices):
        raise ValueError(f"mesh {spec!r} needs {math.prod(axes.values())} devices, there are {len(devices)}")
    grid = np.asarray(devices[: math.prod(axes.values())]).reshape(tuple(axes.values()))
    return Mesh(grid, tuple(axes), axis_types=(AxisType.Auto,) * len(axes))


def parameter_spec(path: Sequence[str], shape: Sequence[int], mesh: Mesh, config: LlamaConfig) -> PartitionSpec:
    """The PartitionSpec of the array at ``path`` (its pytree key names) with ``shape``, following the rules above."""
    names = [name for name in path if name != "value"]
    owner, leaf = (names[-2], names[-1]) if len(names) >= 2 else (None, names[-1] if names else None)
    match leaf, len(shape):
        case "embedding", 2:  # [V, H]
            axes = (("tp", "fsdp"), None)
        case "kernel", 2 if owner in _COLUMN_PARALLEL:
            axes = ("fsdp", "tp")
        case "kernel", 2 if owner in _ROW_PARALLEL:
            axes = ("tp", "fsdp")
        case "bias", 1 if owner in _COLUMN_PARALLEL:
            axes = ("tp",)
        case _:
            axes = (None,) * len(shape)
    # Heads are split whole: the tensor-parallel axis of an attention projection must divide its head count.
    heads = {"q_proj": config.num_heads, "o_proj": config.num_heads}.get(owner, config.num_kv_heads)
    if owner in {"q_proj", "k_proj", "v_proj", "o_proj"} and heads % mesh.shape.get("tp", 1):
        axes = tuple(None if axis == "tp" else axis for axis in axes)
    return PartitionSpec(*(_axis_if_it_divides(axis, size, mesh) for axis, size in zip(axes, shape, strict=True)))


def _axis_if_it_divides(axis: str | tuple[str, ...] | None, size: int, mesh: Mesh) -> str | tuple[str, ...] | None:
    """The mesh axes among ``axis`` that this mesh has (of size > 1), if together they divide ``size``."""
    axes = tuple(a for a in ((axis,) if isinstance(axis, str) else axis or ()) if mesh.shape.get(a, 1) > 1)
    if not axes or size % math.prod(mesh.shape[a] for a in axes):
        return None
    return axes[0] if len(axes) == 1 else axes


def shard_train_state(state, mesh: Mesh, config: LlamaConfig):
    """``state`` (any pytree of arrays, e.g. a ``TrainState``) of the model of ``config`` placed on ``mesh`` by
    :func:`parameter_spec`."""

    def place(path, leaf):
        names = [_key_name(key) for key in path]
        return jax.device_put(leaf, NamedSharding(mesh, parameter_spec(names, np.shape(leaf), mesh, config)))

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
