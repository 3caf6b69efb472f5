"""Addressing shared by the elementwise kernels over flat arrays of ``n`` elements (GLUs, ReLU²)."""

import triton
import triton.language as tl


@triton.jit
def element_block(n, BLOCK: tl.constexpr):
    """This program's element offsets (int64: n can pass 2^31) and their in-bounds mask."""
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    return offsets, offsets < n
