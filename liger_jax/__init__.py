"""liger_jax: Liger's Triton kernels for LLM training, for JAX and Flax.

Every op takes ``implementation=`` ("triton", "interpret" or "xla"; None picks the default, see
:mod:`liger_jax.runtime`).
"""

from liger_jax.ops.cross_entropy import cross_entropy, cross_entropy_reference
from liger_jax.ops.fused_add_rms_norm import fused_add_rms_norm, fused_add_rms_norm_reference
from liger_jax.ops.fused_linear_cross_entropy import (
    fused_linear_cross_entropy,
    fused_linear_cross_entropy_reference,
)
from liger_jax.ops.glu import geglu, geglu_reference, swiglu, swiglu_reference
from liger_jax.ops.layer_norm import layer_norm, layer_norm_reference
from liger_jax.ops.rms_norm import rms_norm, rms_norm_reference
from liger_jax.ops.rope import apply_rotary_pos_emb, apply_rotary_pos_emb_reference, rope_cos_sin
from liger_jax.runtime import default_implementation

__version__ = "0.1.0"

__all__ = [
    "__version__",
    "apply_rotary_pos_emb",
    "apply_rotary_pos_emb_reference",
    "cross_entropy",
    "cross_entropy_reference",
    "default_implementation",
    "fused_add_rms_norm",
    "fused_add_rms_norm_reference",
    "fused_linear_cross_entropy",
    "fused_linear_cross_entropy_reference",
    "geglu",
    "geglu_reference",
    "layer_norm",
    "layer_norm_reference",
    "rms_norm",
    "rms_norm_reference",
    "rope_cos_sin",
    "swiglu",
    "swiglu_reference",
]
