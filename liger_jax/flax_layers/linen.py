"""flax.linen modules backed by liger_jax kernels, drop-in replacements for their flax.linen namesakes."""

import jax
import jax.numpy as jnp
from flax import linen as nn
from flax.linen import dtypes

from liger_jax import runtime
from liger_jax.flax_layers import _options
from liger_jax.ops.rms_norm import CastingMode, rms_norm


class RMSNorm(nn.RMSNorm):
    """``flax.linen.RMSNorm`` computed by :func:`liger_jax.rms_norm`: same fields, same ``scale`` param.

    Adds the fields ``offset`` (added to ``scale``, 1.0 for Gemma), ``casting_mode`` (default ``"gemma"``: fp32
    throughout, flax's own numerics) and ``implementation``. The output dtype is flax's (``dtype``, else the
    promotion of the input and param dtypes). Normalising over an axis other than the last,
    ``axis_name``/``axis_index_groups``, ``mask`` and ``force_float32_reductions=False`` raise ValueError.
    """

    offset: float = 0.0
    casting_mode: CastingMode = "gemma"
    implementation: runtime.Implementation | None = None

    @nn.compact
    def __call__(self, x: jax.Array, *, mask: jax.Array | None = None) -> jax.Array:
        """Normalises ``x [..., D]``; returns the same shape in flax's output dtype."""
        _options.check_unset("RMSNorm", mask=mask, axis_name=self.axis_name, axis_index_groups=self.axis_index_groups)
        _options.check_last_axis("RMSNorm", "reduction_axes", self.reduction_axes, x.ndim)
        _options.check_last_axis("RMSNorm", "feature_axes", self.feature_axes, x.ndim)
        if not self.force_float32_reductions:
            raise ValueError("RMSNorm: the liger_jax kernel always reduces in fp32 (force_float32_reductions=True)")
        if self.offset and not self.use_scale:
            raise ValueError("RMSNorm: offset needs use_scale=True (the offset is added to the scale)")
        if self.use_scale:
            scale = self.param("scale", self.scale_init, x.shape[-1:], self.param_dtype)
        else:
            scale = jnp.ones(x.shape[-1:], self.param_dtype)
        out_dtype = dtypes.canonicalize_dtype(x, scale if self.use_scale else None, dtype=self.dtype)
        y = rms_norm(
            x.astype(jnp.promote_types(x.dtype, out_dtype)),
            scale,
            epsilon=self.epsilon,
            offset=self.offset,
            casting_mode=self.casting_mode,
            implementation=self.implementation,
        )
        return y.astype(out_dtype)
