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
    weighted: bool = False,
    token_scaling: bool = False,
    return_argmax: bool = False,
) -> LossSettings:
    """Validates the loss options and returns them as hashable settings.

    Raises:
        TypeError: ignore_index is not an int, or a flag is not a bool.
        ValueError: label_smoothing outside [0, 1], z_loss_scale negative or not finite, softcap not positive,
            or an unknown reduction.
    """
    _checks.check_int("ignore_index", ignore_index)
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"label_smoothing must be in [0, 1], got {label_smoothing!r}")
    if not (math.isfinite(z_loss_scale) and z_loss_scale >= 0.0):
        raise ValueError(f"z_loss_scale must be a finite number >= 0, got {z_loss_scale!r}")
    if softcap is not None and not (math.isfinite(softcap) and softcap > 0.0):
        raise ValueError(f"softcap must be None or a finite number > 0, got {softcap!r}")
    _checks.check_choice("reduction", reduction, REDUCTIONS)
    check_flags(use_token_scaling=token_scaling)
    return LossSettings(
        ignore_index=int(ignore_index),
        label_smoothing=float(label_smoothing),
        z_loss_scale=float(z_loss_scale),
        softcap=None if softcap is None else float(softcap),
        reduction=reduction,
        implementation=implementation,
        weighted=weighted,
        token_scaling=token_scaling,
        return_argmax=return_argmax,
    )


def check_flags(**flags) -> None:
    """Raises TypeError for a ``return_*`` option that is not a bool (Liger asserts the same)."""
    for name, flag in flags.items():
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be True or False, got {flag!r}")


def check_class_weight(ce_weight, n_classes: int, implementation: str) -> None:
    """Checks Liger's ``ce_weight``: None, or a floating ``[V]`` of finite weights ``>= 0`` (values when concrete).

    Raises:
        TypeError: ce_weight is not a floating-point array.
        ValueError: ce_weight is not ``[V]``, or a concrete weight is negative or not finite.
    """
    if ce_weight is None:
        return
    _checks.check_floating("ce_weight", ce_weight, implementation)
    _checks.check_shape("ce_weight", ce_weight, (n_classes,), "the number of classes")
    _checks.check_values(
        "ce_weight", ce_weight, lambda w: ~np.isfinite(w) | (w < 0), "be finite and >= 0", dtype=np.float64
    )


def check_labels(labels: jax.Array, row_shape: Sequence[int], meaning: str, n_classes: int, ignore_index: int) -> None:
    """Checks dtype and shape of ``labels``, and their values when they are concrete (not traced).

    Raises:
        TypeError: labels are not integers.
        ValueError: labels do not have ``row_shape``, there are no classes, or a concrete label is outside
            ``[0, n_classes)`` without being ``ignore_index``. (A traced out-of-range label gives a NaN loss and
            z_loss and a zero gradient instead; it never reads out of bounds.)
    """
    if not jnp.issubdtype(labels.dtype, jnp.integer):
        raise TypeError(f"labels must have an integer dtype, got {labels.dtype}")
    _checks.check_shape("labels", labels, row_shape, meaning)
    if n_classes < 1:
        raise ValueError(f"there must be at least one class, got a vocabulary of {n_classes}")
    _checks.check_values(
        "labels",
        labels,
        lambda y: (y != ignore_index) & ((y < 0) | (y >= n_classes)),
        f"be in [0, {n_classes}) or equal ignore_index={ignore_index}",
    )
