"""ReLU² kernels (Primer, Nemotron MLPs): y = max(x, 0)², dx = 2 · max(x, 0) · dy, elementwise over flat arrays of
``n`` elements.

Each program handles BLOCK contiguous elements (see ``liger_jax.kernels.glu``: the same blocks and the same
constexpr ``n``), all math in fp32, one rounding per output. For bf16 and fp16 inputs that is the native result:
the square of such a value and its product with 2 · dy are exact in fp32.
"""

import triton
import triton.language as tl

from liger_jax.kernels._elements import element_block


@triton.jit
def relu_squared_fwd(
    x_ptr,  # [n] x.dtype
    y_ptr,  # [n] x.dtype
    n: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """y = max(x, 0)²."""
    offsets, mask = element_block(n, BLOCK)
    relu = tl.maximum(tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32), 0.0)
    tl.store(y_ptr + offsets, (relu * relu).to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def relu_squared_bwd(
    dy_ptr,  # [n] x.dtype
    x_ptr,  # [n] x.dtype
    dx_ptr,  # [n] x.dtype; may alias dy (each element is read before it is written)
    n: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """dx = 2 · max(x, 0) · dy."""
    offsets, mask = element_block(n, BLOCK)
    dy = tl.load(dy_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    relu = tl.maximum(tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32), 0.0)
    tl.store(dx_ptr + offsets, (2.0 * relu * dy).to(dx_ptr.dtype.element_ty), mask=mask)
