"""Checks that a Flax module's options are ones the kernels compute exactly, so a drop-in never silently differs."""

from collections.abc import Sequence


def check_last_axis(module: str, argument: str, axes: int | Sequence[int], ndim: int) -> None:
    """Raises ValueError unless ``axes`` names exactly the last of ``ndim`` axes (the kernels' feature axis)."""
    as_tuple = (axes,) if isinstance(axes, int) else tuple(axes)
    if tuple(axis % ndim for axis in as_tuple) != (ndim - 1,):
        raise ValueError(
            f"{module}: liger_jax kernels normalise over the last axis only, got {argument}={axes!r} for a "
            f"rank-{ndim} input; use the flax module for other axes"
        )


def check_unset(module: str, **options) -> None:
    """Raises ValueError for any option that is not None (cross-device statistics, masks: not in the kernels)."""
    for argument, value in options.items():
        if value is not None:
            raise ValueError(f"{module}: {argument}={value!r} is not supported by the liger_jax kernel")
