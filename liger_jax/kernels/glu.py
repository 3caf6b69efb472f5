"""Gated linear unit kernels: out = act(gate) · up, elementwise over flat arrays of ``n`` elements.

ACTIVATION picks act: SILU (SwiGLU) or GELU_TANH (GeGLU, the tanh approximation of GELU). Both are written with
one sigmoid, 1 / (1 + exp(-z)), which the GPU and Triton's interpreter evaluate alike:

    silu(g)      = g · σ(g)
    gelu_tanh(g) = g · σ(2u), u = √(2/π) · (g + 0.044715 g³)    (0.5 · (1 + tanh(u)) = σ(2u))

Each program handles BLOCK contiguous elements, all math in fp32, one rounding per output. The element count ``n``
is a constexpr: with a runtime bound Triton cannot vectorise the masked loads (see ``liger_jax.kernels._rows``).
"""

import triton
import triton.language as tl

from liger_jax.kernels._elements import element_block

# The ACTIVATION constexpr; liger_jax.ops.glu maps its activation names onto these codes.
SILU = tl.constexpr(0)
GELU_TANH = tl.constexpr(1)

_SQRT_2_OVER_PI = tl.constexpr(0.7978845608028654)
_GELU_CUBIC = tl.constexpr(0.044715)


@triton.jit
def _activation(g, ACTIVATION: tl.constexpr):
    """``(act(g), act'(g))`` of an fp32 tile."""
    if ACTIVATION == GELU_TANH:
        # d/dg σ(2u) = σ(2u) · (1 - σ(2u)) · 2u'. Tiles lead every product with a constexpr: Triton 3.9's
        # interpreter keeps ``constexpr * tile`` wrapped in a constexpr, which its builtins (tl.sigmoid) reject.
        s = tl.sigmoid((g + g * g * g * _GELU_CUBIC) * (2.0 * _SQRT_2_OVER_PI))
        slope = s + g * s * (1.0 - s) * ((g * g * (3.0 * _GELU_CUBIC) + 1.0) * (2.0 * _SQRT_2_OVER_PI))
    else:
        s = tl.sigmoid(g)
        slope = s * (1.0 + g * (1.0 - s))
    return g * s, slope


@triton.jit
def glu_fwd(
    gate_ptr,  # [n] gate.dtype
    up_ptr,  # [n] gate.dtype
    out_ptr,  # [n] gate.dtype
    n: tl.constexpr,
    ACTIVATION: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """out = act(gate) · up."""
    offsets, mask = element_block(n, BLOCK)
    g = tl.load(gate_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(up_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    act, _ = _activation(g, ACTIVATION)
    tl.store(out_ptr + offsets, (act * u).to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def glu_bwd(
    dout_ptr,  # [n] gate.dtype
    gate_ptr,  # [n] gate.dtype
    up_ptr,  # [n] gate.dtype
    dgate_ptr,  # [n] gate.dtype; may alias dout (each element is read before it is written)
    dup_ptr,  # [n] gate.dtype
    n: tl.constexpr,
    ACTIVATION: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """dgate = dout · up · act'(gate) and dup = dout · act(gate), the activation recomputed from gate."""
    offsets, mask = element_block(n, BLOCK)
    dout = tl.load(dout_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(gate_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(up_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    act, slope = _activation(g, ACTIVATION)
    tl.store(dgate_ptr + offsets, (dout * u * slope).to(dgate_ptr.dtype.element_ty), mask=mask)
    tl.store(dup_ptr + offsets, (dout * act).to(dup_ptr.dtype.element_ty), mask=mask)
