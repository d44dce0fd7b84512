"""A full-attention layer's q or k head norm and partial rotary embedding as one Triton kernel, compiled ahead of time
into the engine's op library.

Each head of ``width`` values of a ``[B, T, H, D]`` float32 projection is RMS-normalized in float32 (``x * rsqrt(mean(x^2)
+ epsilon) * weight``), its first ``rotary`` values rotated by the token's ``cos`` and ``sin`` (``rotate_half``: the
first half against the negated second, ``y = x * cos + rotate_half(x) * sin``), the rest passed through, and written
head-major, ``[B, H, T, D]``: what the graphs spell as ``SimplifiedLayerNormalization``, ``Transpose``, four ``Slice``,
``Neg``, two ``Concat``, two ``Mul`` and ``Add`` (``s1omni.export.head_rotary`` rewrites them to the library's
``HeadNormRotary``). Compiled without fused multiply-adds, so that the rotation rounds each product and the sum as those
nodes do. Each program computes one head of one token, ``BLOCK`` (the power of two at or above ``width``) values.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def head_norm_rotary_kernel(x, weight, cos, sin, out, heads, tokens, width, rotary, epsilon, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)  # of the [B, T, H] heads, in x's order
    token = row // heads  # of the [B, T] tokens
    columns = tl.arange(0, BLOCK)
    inside = columns < width
    values = tl.load(x + row * width + columns, mask=inside, other=0.0)
    inverse = tl.math.rsqrt(tl.sum(values * values, axis=0) / width + epsilon)
    normed = values * inverse * tl.load(weight + columns, mask=inside, other=0.0)
    half = rotary // 2
    turning = columns < rotary
    partner = tl.where(columns < half, columns + half, columns - half)
    other = tl.load(x + row * width + partner, mask=turning, other=0.0) * inverse * tl.load(weight + partner, mask=turning, other=0.0)
    c = tl.load(cos + token * rotary + columns, mask=turning, other=0.0)
    s = tl.load(sin + token * rotary + columns, mask=turning, other=0.0)
    turned = normed * c + tl.where(columns < half, -other, other) * s
    head = row % heads
    at = ((token // tokens * heads + head) * tokens + token % tokens) * width + columns
    tl.store(out + at, tl.where(turning, turned, normed), mask=inside)
