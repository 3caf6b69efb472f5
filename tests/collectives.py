"""What the sharding tests share: meshes of the host devices and the collectives a compiled program runs."""

import dataclasses
import math
import re

import jax
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec

# `%name = <shape or tuple of shapes> <collective>(` in compiled HLO text; async collectives end in -start.
_COLLECTIVE = re.compile(
    r"=\s+(\([^=]*?\)|\S+)\s+(all-gather|all-reduce|all-to-all|collective-permute|reduce-scatter)(?:-start)?\("
)
_ARRAY = re.compile(r"\b(pred|[su](?:8|16|32|64)|bf16|f16|f32|f64)\[([\d,]*)\]")
_ITEMSIZE = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "bf16": 2, "f16": 2, "s32": 4, "u32": 4, "f32": 4}
_ITEMSIZE |= {"s64": 8, "u64": 8, "f64": 8}


@dataclasses.dataclass(frozen=True)
class Collective:
    """One collective of a compiled program: its kind and the bytes of its result on one device."""

    kind: str
    bytes: int


def collectives(hlo_text: str) -> list[Collective]:
    """The collectives in ``compiled.as_text()``, counted the way TransformerEngine's tests count them."""
    found = []
    for match in _COLLECTIVE.finditer(hlo_text):
        arrays = _ARRAY.findall(match.group(1))
        size = sum(_ITEMSIZE[dtype] * math.prod(int(d) for d in dims.split(",") if d) for dtype, dims in arrays)
        found.append(Collective(match.group(2), size))
    return found


def compiled_collectives(jitted, *args) -> list[Collective]:
    """The collectives ``jitted`` (a ``jax.jit`` function) runs on ``args``."""
    return collectives(jitted.lower(*args).compile().as_text())


def assert_only_small_all_reduces(found: list[Collective], limit_bytes: int) -> None:
    """No all-gather, all-to-all, permute or reduce-scatter, and every all-reduce moves at most ``limit_bytes``."""
    moved = [c for c in found if c.kind != "all-reduce" or c.bytes > limit_bytes]
    assert not moved, f"collectives beyond all-reduces of ≤ {limit_bytes} bytes: {moved}"


def mesh(shape: tuple[int, ...], names: tuple[str, ...], axis_type=AxisType.Auto) -> jax.sharding.Mesh:
    """A mesh of the first ``prod(shape)`` devices; skips the test where there are fewer."""
    if len(jax.devices()) < math.prod(shape):
        pytest.skip(f"needs {math.prod(shape)} devices, have {len(jax.devices())}")
    return jax.make_mesh(shape, names, axis_types=(axis_type,) * len(shape), devices=jax.devices()[: math.prod(shape)])


def place(array, mesh_, *spec) -> jax.Array:
    """``array`` on ``mesh_`` with ``PartitionSpec(*spec)``."""
    return jax.device_put(array, NamedSharding(mesh_, PartitionSpec(*spec)))


def nbytes(*arrays) -> int:
    """Total bytes of ``arrays`` (ignoring None)."""
    return sum(np.asarray(a).nbytes for a in arrays if a is not None)
