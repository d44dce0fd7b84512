"""The MLP's SiLU product as one Triton kernel, compiled ahead of time into the engine's op library.

``silu(gate) * up`` of two bfloat16 GEMM products, computed in float32 and rounded once to bfloat16:
what the bf16 graphs spell as a cast of each product to float32, ``Sigmoid``, two ``Mul`` and a cast
back (``s1omni.export.silu_products`` rewrites them to the library's ``SiluProduct``). The products
are read where they lie, by row stride (the same for both): two tensors, or the two halves of one merged
gate|up product (``--merged-projections``), so a merged build needs no ``Split`` copy of it. Each program computes
``BLOCK`` columns of one row.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def silu_product_kernel(gate, up, out, width, stride, BLOCK: tl.constexpr):
    blocks = tl.cdiv(width, BLOCK)
    program = tl.program_id(0)
    row = (program // blocks).to(tl.int64)
    columns = (program % blocks) * BLOCK + tl.arange(0, BLOCK)
    inside = columns < width
    g = tl.load(gate + row * stride + columns, mask=inside, other=0.0).to(tl.float32)
    u = tl.load(up + row * stride + columns, mask=inside, other=0.0).to(tl.float32)
    product = g * tl.sigmoid(g) * u
    tl.store(out + row * width + columns, product.to(tl.bfloat16), mask=inside)
