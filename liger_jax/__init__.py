"""liger_jax: Liger's Triton kernels for LLM training, for JAX and Flax.

Every op takes ``implementation=`` ("triton", "interpret" or "xla"; None picks the default, see
:mod:`liger_jax.runtime`).
"""

from liger_jax.ops.cross_entropy import cross_entropy, cross_entropy_reference
from liger_jax.ops.dyt import dyt, dyt_reference
from liger_jax.ops.embedding import embedding, embedding_reference
from liger_jax.ops.fused_add_rms_norm import fused_add_rms_norm, fused_add_rms_norm_reference
from liger_jax.ops.fused_linear_cross_entropy import (
    fused_linear_cross_entropy,
    fused_linear_cross_entropy_reference,
)
from liger_jax.ops.fused_linear_distillation import (
    fused_linear_distillation,
    fused_linear_distillation_reference,
)
from liger_jax.ops.fused_linear_jsd import fused_linear_jsd, fused_linear_jsd_reference
from liger_jax.ops.fused_linear_logprobs import fused_linear_logprobs, fused_linear_logprobs_reference
from liger_jax.ops.fused_linear_scaled_cross_entropy import (
    fused_linear_scaled_cross_entropy,
    fused_linear_scaled_cross_entropy_reference,
)
from liger_jax.ops.fused_neighborhood_attention import (
    fused_neighborhood_attention,
    fused_neighborhood_attention_reference,
)
from liger_jax.ops.glu import geglu, geglu_reference, swiglu, swiglu_reference
from liger_jax.ops.group_norm import group_norm, group_norm_reference
from liger_jax.ops.grpo import fused_linear_grpo, grpo_loss_from_logps
from liger_jax.ops.jsd import jsd, jsd_reference
from liger_jax.ops.kl_div import kl_div, kl_div_reference
from liger_jax.ops.kto import fused_linear_kto
from liger_jax.ops.layer_norm import layer_norm, layer_norm_reference
from liger_jax.ops.llama4_rope import llama4_rope, llama4_rope_reference
from liger_jax.ops.modulated_rms_norm import modulated_rms_norm, modulated_rms_norm_reference
from liger_jax.ops.multi_token_attention import multi_token_attention, multi_token_attention_reference
from liger_jax.ops.poly_norm import poly_norm, poly_norm_reference
from liger_jax.ops.preference import fused_linear_cpo, fused_linear_dpo, fused_linear_orpo, fused_linear_simpo
from liger_jax.ops.qwen2vl_mrope import mrope_cos_sin, qwen2vl_mrope, qwen2vl_mrope_reference
from liger_jax.ops.relu_squared import relu_squared, relu_squared_reference
from liger_jax.ops.rms_norm import rms_norm, rms_norm_reference
from liger_jax.ops.rope import apply_rotary_pos_emb, apply_rotary_pos_emb_reference, rope_cos_sin
from liger_jax.ops.softmax import softmax, softmax_reference
from liger_jax.ops.sparsemax import sparsemax, sparsemax_reference
from liger_jax.ops.tvd import tvd, tvd_reference
from liger_jax.runtime import default_implementation

__version__ = "0.1.0"

__all__ = [
    "__version__",
    "apply_rotary_pos_emb",
    "apply_rotary_pos_emb_reference",
    "cross_entropy",
    "cross_entropy_reference",
    "default_implementation",
    "dyt",
    "dyt_reference",
    "embedding",
    "embedding_reference",
    "fused_add_rms_norm",
    "fused_add_rms_norm_reference",
    "fused_linear_cross_entropy",
    "fused_linear_cross_entropy_reference",
    "fused_linear_cpo",
    "fused_linear_dpo",
    "fused_linear_grpo",
    "fused_linear_kto",
    "fused_linear_orpo",
    "fused_linear_simpo",
    "grpo_loss_from_logps",
    "fused_linear_distillation",
    "fused_linear_distillation_reference",
    "fused_linear_jsd",
    "fused_linear_jsd_reference",
    "fused_linear_logprobs",
    "fused_linear_logprobs_reference",
    "fused_linear_scaled_cross_entropy",
    "fused_linear_scaled_cross_entropy_reference",
    "fused_neighborhood_attention",
    "fused_neighborhood_attention_reference",
    "geglu",
    "geglu_reference",
    "group_norm",
    "group_norm_reference",
    "jsd",
    "jsd_reference",
    "kl_div",
    "kl_div_reference",
    "layer_norm",
    "layer_norm_reference",
    "llama4_rope",
    "llama4_rope_reference",
    "mrope_cos_sin",
    "modulated_rms_norm",
    "modulated_rms_norm_reference",
    "multi_token_attention",
    "multi_token_attention_reference",
    "poly_norm",
    "poly_norm_reference",
    "qwen2vl_mrope",
    "qwen2vl_mrope_reference",
    "relu_squared",
    "relu_squared_reference",
    "rms_norm",
    "rms_norm_reference",
    "rope_cos_sin",
    "softmax",
    "softmax_reference",
    "sparsemax",
    "sparsemax_reference",
    "swiglu",
    "swiglu_reference",
    "tvd",
    "tvd_reference",
]
