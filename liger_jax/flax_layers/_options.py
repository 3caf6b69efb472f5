"""Checks that a Flax module's options are ones the kernels compute exactly, so a drop-in never silently differs;
and the cross-entropy options the nnx and linen loss modules hold, gathered for the ops."""

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


def check_local_statistics(module: str, layer, mask=None) -> None:
    """Raises ValueError for a flax normalisation layer's statistics that no kernel computes: across devices
    (``axis_name``, ``axis_index_groups``), under a ``mask`` (the call's argument), and linen's
    ``force_float32_reductions=False`` (the kernels always reduce in fp32)."""
    check_unset(module, mask=mask, axis_name=layer.axis_name, axis_index_groups=layer.axis_index_groups)
    if not getattr(layer, "force_float32_reductions", True):
        raise ValueError(f"{module}: the liger_jax kernel always reduces in fp32 (force_float32_reductions=True)")


def check_normalization(module: str, layer, ndim: int, mask) -> None:
    """Raises ValueError for a flax normalisation layer's options that the row kernels do not compute.

    Those are statistics over an axis other than the last (``reduction_axes``, ``feature_axes``) and those of
    :func:`check_local_statistics`.

    Args:
        module: the layer's class name, for the message.
        layer: the nnx or linen layer; its flax options are read from it.
        ndim: the rank of the input.
        mask: the ``mask`` argument of the call.
    """
    check_local_statistics(module, layer, mask)
    check_last_axis(module, "reduction_axes", layer.reduction_axes, ndim)
    check_last_axis(module, "feature_axes", layer.feature_axes, ndim)


def check_offset(module: str, offset: float, use_scale: bool) -> None:
    """Raises ValueError for an RMSNorm ``offset`` without a ``scale`` to add it to."""
    if offset and not use_scale:
        raise ValueError(f"{module}: offset needs use_scale=True (the offset is added to the scale)")


LOSS_OPTION_NAMES = (
    "ignore_index",
    "label_smoothing",
    "z_loss_scale",
    "softcap",
    "reduction",
    "return_z_loss",
    "use_token_scaling",
    "return_token_accuracy",
    "return_predicted_tokens",
)


def loss_options(module) -> dict:
    """The :func:`liger_jax.cross_entropy` options (and ``implementation``) held as attributes of ``module``."""
    return {name: getattr(module, name) for name in LOSS_OPTION_NAMES} | {"implementation": module.implementation}
