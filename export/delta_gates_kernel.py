"""The Gated DeltaNet rule's per-token gates as one Triton kernel, compiled ahead of time into the engine's op library.

From the ``a`` and ``b`` projections' bfloat16 products of a Gated DeltaNet layer, per value head ``h``:

- ``decay = scale[h] * softplus(a + dt_bias[h])`` (the natural log of the token's decay, ``scale = -exp(A_log)``),
  with the softplus taken as ``x`` above ``threshold`` (torch's ``softplus`` threshold, which the export keeps), times
  the token's padding mask where ``has_mask`` (the prefill graph's, float32 ``[B, T, 1]``);
- ``beta = sigmoid(b)``.

In float32 from the widened products, as the graph has it (``s1omni.export.delta_gates`` replaces its casts,
``Add``, ``Softplus``, ``Greater``, ``Where``, ``Mul`` and ``Sigmoid``), but each function in its accurate form:
``softplus(x) = max(x, 0) + log1p(exp(-|x|))`` and ``sigmoid(x)`` as ``1 / (1 + e)`` or ``e / (1 + e)`` with
``e = exp(-|x|)``, libdevice's ``expf``, ``log1pf`` and a rounded division, where ONNX Runtime's CUDA kernels take
``log(exp(x) + 1)`` below zero and ``1 - 1 / (1 + e)`` (``microsoft/onnxruntime:onnxruntime/core/providers/cuda/
activation/activations_impl.cu``, ``OP_Softplus``, ``OP_Sigmoid``), which lose float32 digits to cancellation.
Each program computes ``BLOCK`` consecutive values of the flattened ``[tokens, heads]``.
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra import libdevice


@triton.jit
def delta_gates_kernel(a, b, dt_bias, scale, mask, decay, beta, count, heads, has_mask, threshold, BLOCK: tl.constexpr):
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inside = offsets < count
    head = offsets % heads
    x = tl.load(a + offsets, mask=inside, other=0.0).to(tl.float32) + tl.load(dt_bias + head, mask=inside, other=0.0)
    softplus = tl.maximum(x, 0.0) + libdevice.log1p(libdevice.exp(-tl.abs(x)))
    value = tl.load(scale + head, mask=inside, other=0.0) * tl.where(x > threshold, x, softplus)
    if has_mask:  # the prefill graph's padding mask, a value a token
        value = value * tl.load(mask + offsets // heads, mask=inside, other=0.0)
    tl.store(decay + offsets, value, mask=inside)
    y = tl.load(b + offsets, mask=inside, other=0.0).to(tl.float32)
    e = libdevice.exp(-tl.abs(y))
    tl.store(beta + offsets, libdevice.div_rn(tl.where(y > 0, 1.0, e), 1.0 + e), mask=inside)
