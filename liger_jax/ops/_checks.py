"""Argument checks shared by the ops; each error names the argument, what it got and what it needs."""

from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

KERNEL_DTYPES = (jnp.float32, jnp.bfloat16, jnp.float16)


def check_floating(name: str, array: jax.Array, implementation: str) -> None:
    """Raises TypeError unless ``array`` is float32, bfloat16 or float16 (float64 too on the XLA path)."""
    allowed = KERNEL_DTYPES + ((jnp.float64,) if implementation == "xla" else ())
    if array.dtype not in allowed:
        names = ", ".join(jnp.dtype(d).name for d in allowed)
        raise TypeError(f"{name} must have a float dtype ({names}), got {array.dtype}")


def check_min_rank(name: str, array: jax.Array, min_rank: int) -> None:
    """Raises ValueError when ``array`` has fewer than ``min_rank`` axes."""
    if array.ndim < min_rank:
        raise ValueError(f"{name} must have at least {min_rank} axes, got shape {array.shape}")


def check_shape(name: str, array: jax.Array, expected: Sequence[int], meaning: str) -> None:
    """Raises ValueError unless ``array.shape == expected``; ``meaning`` says where the expectation comes from."""
    if tuple(array.shape) != tuple(expected):
        raise ValueError(f"{name} must have shape {tuple(expected)} ({meaning}), got {tuple(array.shape)}")


def check_dtype(name: str, array: jax.Array, expected, meaning: str) -> None:
    """Raises TypeError unless ``array.dtype == expected``; ``meaning`` says where the expectation comes from."""
    if array.dtype != expected:
        raise TypeError(f"{name} must have dtype {jnp.dtype(expected).name} ({meaning}), got {array.dtype}")


def check_choice(name: str, value: object, choices: Sequence[object]) -> None:
    """Raises ValueError unless ``value`` is one of ``choices``."""
    if value not in choices:
        raise ValueError(f"{name} must be one of {tuple(choices)}, got {value!r}")


def check_max_cols(name: str, n_cols: int, limit: int) -> None:
    """Raises ValueError when a row is longer than a kernel's single-tile limit."""
    if n_cols > limit:
        raise ValueError(
            f"{name} has {n_cols} elements on its last axis; the kernel holds a row in one tile of at most {limit} "
            "elements. Use implementation='xla' for longer rows."
        )


def check_int(name: str, value: object, minimum: int | None = None) -> int:
    """``value`` as an int; raises TypeError unless it is an int (not a bool), ValueError when it is below
    ``minimum`` (when one is given)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {value!r}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be at least {minimum}, got {value}")
    return int(value)


def concrete_values(array: jax.Array, dtype=None) -> np.ndarray | None:
    """``array``'s values as a NumPy array (of ``dtype`` when given), or None when ``array`` is traced."""
    try:
        return np.asarray(array, dtype)
    except jax.errors.TracerArrayConversionError:
        return None


def check_values(
    name: str, array: jax.Array, is_bad: Callable[[np.ndarray], np.ndarray], expectation: str, dtype=None
) -> None:
    """Raises ValueError when ``is_bad(values)`` marks an element of a concrete ``array``, naming the first one and
    the count: ``"{name} must {expectation}; got {value} at index {index} ({count} such)"``. A traced array has no
    values, and passes (each op says what a bad traced value gives)."""
    values = concrete_values(array, dtype)
    if values is None:
        return
    bad = is_bad(values)
    if bad.any():
        index = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ValueError(f"{name} must {expectation}; got {values[index]} at index {index} ({int(bad.sum())} such)")
