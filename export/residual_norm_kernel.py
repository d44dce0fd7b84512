"""A residual add and the RMSNorm after it as one Triton kernel, compiled ahead of time into the engine's op library.

``sum = residual + addend`` and ``norm(sum) * weight`` rounded once to bfloat16, of float32 ``residual`` and
``weight`` and a bfloat16 ``addend`` (the mixer's or the MLP's GEMM product): what the bf16 graphs spell as a cast
of the product to float32, ``Add``, ``SimplifiedLayerNormalization`` (float32 statistics) and a cast of its result
for the next GEMMs (``s1omni.export.residual_norms`` rewrites them to the library's ``ResidualRmsNorm``). Each
program normalizes one row of ``width`` columns, ``BLOCK`` (the power of two at or above it) at once.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def residual_rms_norm_kernel(residual, addend, weight, normalized, total, width, epsilon, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    columns = tl.arange(0, BLOCK)
    inside = columns < width
    at = row * width + columns
    x = tl.load(residual + at, mask=inside, other=0.0) + tl.load(addend + at, mask=inside, other=0.0).to(tl.float32)
    tl.store(total + at, x, mask=inside)
    inverse = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / width + epsilon)
    scale = tl.load(weight + columns, mask=inside, other=0.0)
    tl.store(normalized + at, (x * inverse * scale).to(tl.bfloat16), mask=inside)
