"""A Gated DeltaNet layer's output norm as one Triton kernel, compiled ahead of time into the engine's op library.

``rmsnorm(o) * weight * silu(z)`` over each head's ``width`` values, in float32 from the gated delta rule's float16
output ``o`` and the ``z`` projection's bfloat16 product, rounded once to bfloat16 for the out projection: what the bf16
graphs spell as a cast of each to float32, ONNX Runtime's ``GatedRMSNorm`` (``activation="silu"``) and a cast of its
result (``s1omni.export.output_norms`` rewrites them to the library's ``GatedOutputNorm``). Each program normalizes
``ROWS`` heads of a token at once, ``BLOCK`` (the power of two at or above ``width``) columns each.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def gated_output_norm_kernel(o, z, weight, out, rows, width, epsilon, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    columns = tl.arange(0, BLOCK)
    inside = (row < rows)[:, None] & (columns < width)[None, :]
    at = row[:, None] * width + columns[None, :]
    x = tl.load(o + at, mask=inside, other=0.0).to(tl.float32)
    inverse = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / width + epsilon)
    scale = tl.load(weight + columns, mask=columns < width, other=0.0)
    gate = tl.load(z + at, mask=inside, other=0.0).to(tl.float32)
    tl.store(out + at, (x * inverse[:, None] * scale[None, :] * (gate * tl.sigmoid(gate))).to(tl.bfloat16), mask=inside)
