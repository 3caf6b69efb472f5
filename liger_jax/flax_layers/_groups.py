"""GroupNorm's Flax options as the kernels read them: the group count, and the statistics the kernels compute."""

from liger_jax.flax_layers import _options


def check_group_normalization(module: str, layer, ndim: int, mask) -> None:
    """Raises ValueError for a flax GroupNorm's options that :func:`liger_jax.group_norm` does not compute.

    The kernels normalise each example (axis 0) over all its other axes, per group of channels (the last axis):
    flax's default ``reduction_axes``. Other reduction axes, cross-device statistics (``axis_name``,
    ``axis_index_groups``), a ``mask`` and linen's ``force_float32_reductions=False`` raise.

    Args:
        module: the layer's class name, for the message.
        layer: the nnx or linen layer; its flax options are read from it.
        ndim: the rank of the input.
        mask: the ``mask`` argument of the call.
    """
    _options.check_local_statistics(module, layer, mask)
    if ndim < 2:
        raise ValueError(f"{module}: the input needs a batch axis and a channel axis, got rank {ndim}")
    if layer.reduction_axes is not None:
        axes = (layer.reduction_axes,) if isinstance(layer.reduction_axes, int) else tuple(layer.reduction_axes)
        if sorted(axis % ndim for axis in axes) != list(range(1, ndim)):
            raise ValueError(
                f"{module}: liger_jax normalises over every axis but the first (flax's default), got "
                f"reduction_axes={layer.reduction_axes!r} for a rank-{ndim} input; use the flax module for others"
            )


def group_count(module: str, num_groups: int | None, group_size: int | None, channels: int) -> int:
    """The number of groups flax's GroupNorm takes from exactly one of ``num_groups`` and ``group_size``.

    Raises:
        ValueError: both or neither are given, or ``group_size`` does not divide ``channels``.
    """
    if (num_groups is None) == (group_size is None):
        raise ValueError(f"{module}: give exactly one of num_groups and group_size (num_groups=None to use group_size)")
    if group_size is None:
        return num_groups
    if group_size < 1 or channels % group_size:
        raise ValueError(f"{module}: group_size={group_size} must divide the {channels} channels")
    return channels // group_size
