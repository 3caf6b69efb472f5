"""What one benchmark case is: inputs, the function each provider runs, and the work a mode must do."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

MODES = ("forward", "backward", "full")

Params = Mapping[str, int]


@dataclasses.dataclass(frozen=True)
class TorchProgram:
    """The same case for torch (Liger): a callable, its input tensors, which of them get gradients."""

    fn: Callable[..., Any]
    make_inputs: Callable[[], tuple[Any, ...]]
    diff_argnums: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class Case:
    """One op at one shape and dtype.

    Attributes:
        op: the op's name in ``liger_jax`` (``"rms_norm"``).
        params: the shape, by name (``{"tokens": 16384, "hidden": 4096}``).
        dtype: the activations' dtype name.
        make_inputs: ``make_inputs(key) -> args``, fresh random inputs for one call.
        diff_argnums: which args are differentiated in ``backward`` and ``full``.
        providers: JAX provider name → ``fn(*args)``.
        bytes_moved: mode → the fewest bytes the mode must move through HBM (each input read once, each output
            written once; ``full`` is forward plus backward, as in training where the cotangent arrives later).
        flops: mode → the matmul flops the mode must do (0 for bandwidth-bound ops).
        torch_program: builds the :class:`TorchProgram` for ``liger_torch`` (imports torch lazily), or None.
        dead_argnums: differentiated args that in a training step are temporaries dead after the op (the loss
            head's logits). ``full`` mode donates them and feeds each call's gradients for them to the next call
            as its inputs, so an op may overwrite them in place, as it may in training (and as Liger's torch ops
            do), without the copy a live program input would force.
        cotangent_is_residual: the backward keeps the forward's output as its residual and may write dx over dy
            (softmax, sparsemax). ``full`` mode then draws the cotangent as a separate input, donated, and feeds
            each call's gradient of the first differentiated arg (the output's shape) to the next call as its
            cotangent: with the output itself as the cotangent, dy and the residual would be one buffer, which the
            in-place backward makes XLA copy first; in training dy is the next layer's fresh gradient.
    """

    op: str
    params: Params
    dtype: str
    make_inputs: Callable[[Any], tuple[Any, ...]]
    diff_argnums: tuple[int, ...]
    providers: Mapping[str, Callable[..., Any]]
    bytes_moved: Mapping[str, float]
    flops: Mapping[str, float]
    torch_program: Callable[[], TorchProgram] | None = None
    dead_argnums: tuple[int, ...] = ()
    cotangent_is_residual: bool = False

    @property
    def shape(self) -> str:
        """The shape as ``"tokens=16384,hidden=4096"``."""
        return shape_string(self.params)


@dataclasses.dataclass(frozen=True)
class Op:
    """An op's benchmark plan: how to build a case, and the shapes to run.

    Attributes:
        name: the op's name in ``liger_jax``.
        build: ``build(params, dtype) -> Case``.
        targets: the issues' named shapes, as ``(params, dtype)``.
        sweeps: sweep name (``"tokens"``, ``"hidden"``, ``"vocab"``) → ``(axis, params list)``, run in bf16.
        smoke: tiny ``(params, dtype)`` cases that run every code path on CPU in seconds.
    """

    name: str
    build: Callable[[Params, str], Case]
    targets: Sequence[tuple[Params, str]]
    sweeps: Mapping[str, tuple[str, Sequence[Params]]]
    smoke: Sequence[tuple[Params, str]]


def shape_string(params: Params) -> str:
    """``{"tokens": 8, "hidden": 4}`` → ``"tokens=8,hidden=4"``."""
    return ",".join(f"{name}={value}" for name, value in params.items())


def parse_shape(text: str) -> dict[str, int]:
    """Inverse of :func:`shape_string`."""
    return {name: int(value) for name, value in (item.split("=") for item in text.split(","))}


def itemsize(dtype: str) -> int:
    """Bytes per element of a dtype name."""
    return {"float32": 4, "bfloat16": 2, "float16": 2}[dtype]
