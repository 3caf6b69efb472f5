"""flax.nnx modules backed by liger_jax kernels, drop-in replacements for their flax.nnx namesakes."""

import jax
import jax.numpy as jnp
from flax import nnx

from liger_jax import runtime
from liger_jax.flax_layers import _options
from liger_jax.ops.rms_norm import CastingMode, rms_norm


class RMSNorm(nnx.RMSNorm):
    """``flax.nnx.RMSNorm`` computed by :func:`liger_jax.rms_norm`: same arguments, same ``scale`` param.

    Takes every ``nnx.RMSNorm`` argument, plus ``offset`` (added to ``scale``, 1.0 for Gemma), ``casting_mode``
    (default ``"gemma"``: fp32 throughout, flax's own numerics) and ``implementation``. Inputs and params are
    promoted as flax promotes them, so outputs match ``nnx.RMSNorm`` in dtype and value. Normalising over an axis
    other than the last, ``axis_name``/``axis_index_groups`` and ``mask`` raise ValueError.
    """

    def __init__(
        self,
        num_features: int,
        *,
        offset: float = 0.0,
        casting_mode: CastingMode = "gemma",
        implementation: runtime.Implementation | None = None,
        **flax_options,
    ):
        super().__init__(num_features, **flax_options)
        _options.check_unset("RMSNorm", axis_name=self.axis_name, axis_index_groups=self.axis_index_groups)
        if offset and not self.use_scale:
            raise ValueError("RMSNorm: offset needs use_scale=True (the offset is added to the scale)")
        self.offset = offset
        self.casting_mode = casting_mode
        self.implementation = implementation

    def __call__(self, x: jax.Array, mask: jax.Array | None = None) -> jax.Array:
        """Normalises ``x [..., num_features]``; returns the same shape in flax's promoted dtype."""
        _options.check_unset("RMSNorm", mask=mask)
        _options.check_last_axis("RMSNorm", "reduction_axes", self.reduction_axes, x.ndim)
        _options.check_last_axis("RMSNorm", "feature_axes", self.feature_axes, x.ndim)
        scale = self.scale[...] if self.scale is not None else None
        x, scale = self.promote_dtype((x, scale), dtype=self.dtype)
        if scale is None:
            scale = jnp.ones(x.shape[-1:], x.dtype)
        return rms_norm(
            x,
            scale,
            epsilon=self.epsilon,
            offset=self.offset,
            casting_mode=self.casting_mode,
            implementation=self.implementation,
        )
