"""Argument checks shared by ``cross_entropy`` and ``fused_linear_cross_entropy``."""

import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from liger_jax.ops import _checks
from liger_jax.ops._cross_entropy_rows import LossSettings

REDUCTIONS = ("mean", "sum", "none")


def loss_settings(
    *,
    ignore_index: int,
    label_smoothing: float,
    z_loss_scale: float,
    softcap: float | None,
    reduction: str,
    implementation: str,
) -> LossSettings:
    """Validates the loss options and returns them as hashable settings.

    Raises:
        TypeError: ignore_index is not an int.
        ValueError: label_smoothing outside [0, 1], z_loss_scale negative or not finite, softcap not positive,
            or an unknown reduction.
    """
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, (int, np.integer)):
        raise TypeError(f"ignore_index must be an int, got {ignore_index!r}")
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"label_smoothing must be in [0, 1], got {label_smoothing!r}")
    if not (math.isfinite(z_loss_scale) and z_loss_scale >= 0.0):
        raise ValueError(f"z_loss_scale must be a finite number >= 0, got {z_loss_scale!r}")
    if softcap is not None and not (math.isfinite(softcap) and softcap > 0.0):
        raise ValueError(f"softcap must be None or a finite number > 0, got {softcap!r}")
    _checks.check_choice("reduction", reduction, REDUCTIONS)
    return LossSettings(
        ignore_index=int(ignore_index),
        label_smoothing=float(label_smoothing),
        z_loss_scale=float(z_loss_scale),
        softcap=None if softcap is None else float(softcap),
        reduction=reduction,
        implementation=implementation,
    )


def check_labels(labels: jax.Array, row_shape: Sequence[int], meaning: str, n_classes: int, ignore_index: int) -> None:
    """Checks dtype and shape of ``labels``, and their values when they are concrete (not traced).

    Raises:
        TypeError: labels are not integers.
        ValueError: labels do not have ``row_shape``, there are no classes, or a concrete label is outside
            ``[0, n_classes)`` without being ``ignore_index``. (A traced out-of-range label gives a NaN loss and a
            zero gradient instead; it never reads out of bounds.)
    """
    if not jnp.issubdtype(labels.dtype, jnp.integer):
        raise TypeError(f"labels must have an integer dtype, got {labels.dtype}")
    _checks.check_shape("labels", labels, row_shape, meaning)
    if n_classes < 1:
        raise ValueError(f"there must be at least one class, got a vocabulary of {n_classes}")
    try:
        values = np.asarray(labels)
    except jax.errors.TracerArrayConversionError:
        return  # traced labels have no values to check
    bad = (values != ignore_index) & ((values < 0) | (values >= n_classes))
    if bad.any():
        index = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ValueError(
            f"labels must be in [0, {n_classes}) or equal ignore_index={ignore_index}; got {values[index]} at index "
            f"{index} ({int(bad.sum())} such labels)"
        )
