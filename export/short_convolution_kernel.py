"""A Gated DeltaNet layer's short convolution and its SiLU as one Triton kernel, compiled ahead of time into the
engine's op library.

``y[b, t, c] = silu(bias[c] + sum_k weight[c, 0, k] * padded[b, t + k, c])`` of a bfloat16 ``[B, T, C]`` input
sequence-major, ``padded`` the ``[B, K-1, C]`` window of the tokens before it (zeros where there is none) followed by
the input, accumulated in float32 tap by tap and rounded once to bfloat16 after the SiLU; and the window after the last
token, the last K-1 rows of ``padded``, copied bit for bit: ONNX Runtime's ``CausalConvWithState`` with
``channels_last=1`` and ``activation="silu"``, which ``--bf16-convolutions`` writes
(``s1omni.export.short_convolutions`` rewrites it to the library's ``ShortConvolution``). ONNX Runtime's kernel takes a
thread per output value and reads each tap's value through the cache, K reads a value, on a grid of one block row per
token (``microsoft/onnxruntime:onnxruntime/contrib_ops/cuda/bert/causal_conv_with_state_impl.cu``): 3.79 ms of the
0.8B's router request, about 8x the time its bytes take (``benchmarks/README.md``).

Each program here computes ``BLOCK_T`` tokens of ``BLOCK_C`` channels of one sequence, contiguous rows of the channel
strip read as 16-byte vectors (the op takes C a multiple of 8), each tap a shifted load of the tile whose overlap the
cache serves. The sum runs in the same order as ONNX Runtime's, fused multiply-adds from the bias, and the SiLU is
its ``x / (1 + exp(-x))`` with an IEEE division (Triton's ``/`` is approximate); Triton's ``exp`` is within a few
float32 ulps of CUDA's ``expf``, far below a bfloat16 step, so the two differ only where a value lies that close to
a rounding boundary. The programs of the last token block write the window after it.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _padded(x, past, row, s, rows, columns, inside, tokens, channels, past_rows, K: tl.constexpr):
    """The padded sequence at input token ``s`` (negative: the past window's row ``K - 1 + s``, zero beyond its
    ``past_rows``), bfloat16, where ``rows``."""
    current = rows & (s >= 0)
    earlier = rows & (s < 0) & (s >= -past_rows)
    at_x = (row * tokens + s)[:, None] * channels + columns[None, :]
    at_past = (row * (K - 1) + K - 1 + s)[:, None] * channels + columns[None, :]
    value = tl.load(x + at_x, mask=current[:, None] & inside[None, :], other=0.0)
    window = tl.load(past + at_past, mask=earlier[:, None] & inside[None, :], other=0.0)
    return tl.where(current[:, None], value, window)


@triton.jit
def short_convolution_kernel(x, weight, bias, past, y, present, tokens, channels, bias_size, past_rows,
                             K: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr):  # fmt: skip
    columns = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    block = tl.program_id(1)
    row = tl.program_id(2).to(tl.int64)
    inside = columns < channels
    t = block * BLOCK_T + tl.arange(0, BLOCK_T)
    rows = t < tokens
    start = tl.load(bias + columns, mask=columns < bias_size, other=0.0).to(tl.float32)  # bias_size: C, or 0 without one
    total = tl.zeros((BLOCK_T, BLOCK_C), tl.float32) + start[None, :]
    for k in tl.static_range(K):
        tap = tl.load(weight + columns * K + k, mask=inside, other=0.0).to(tl.float32)
        value = _padded(x, past, row, t + k - (K - 1), rows, columns, inside, tokens, channels, past_rows, K)
        total = total + tap[None, :] * value.to(tl.float32)
    out = tl.math.div_rn(total, 1.0 + tl.exp(-total))
    tl.store(y + (row * tokens + t)[:, None] * channels + columns[None, :], out.to(tl.bfloat16), mask=rows[:, None] & inside[None, :])
    if block == tl.maximum(tl.cdiv(tokens, BLOCK_T) - 1, 0):  # the window after the last token: its K - 1 rows
        j = tl.arange(0, BLOCK_T)
        last = j < K - 1
        window = _padded(x, past, row, tokens - (K - 1) + j, last, columns, inside, tokens, channels, past_rows, K)
        tl.store(present + (row * (K - 1) + j)[:, None] * channels + columns[None, :], window, mask=last[:, None] & inside[None, :])
