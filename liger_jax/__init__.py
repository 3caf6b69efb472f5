"""liger_jax: Liger's Triton kernels for LLM training, for JAX and Flax.

Every op takes ``implementation=`` ("triton", "interpret" or "xla"; None picks the default, see
:mod:`liger_jax.runtime`).
"""

from liger_jax.ops.rms_norm import rms_norm, rms_norm_reference
from liger_jax.runtime import default_implementation

__version__ = "0.1.0"

__all__ = ["__version__", "default_implementation", "rms_norm", "rms_norm_reference"]
