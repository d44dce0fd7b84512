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

``short_convolution_heads_kernel`` (``ShortConvolutionHeads``, ``s1omni.export.convolution_heads``) computes the same
tile, then what the graph made of it for the gated delta rule: the bfloat16 rounding, the padding mask, q's and k's
heads RMS-normalized (a tile of 256 channels holds whole heads of 128 or fewer, a power of two: a reshape and a sum
per head in registers) and each written to its value heads in a row, and all three cast to float16. Its norm is
``x * rsqrt(mean(x^2) + epsilon) * scale`` in float32 with the approximate ``rsqrt``, as ONNX Runtime's
``SimplifiedLayerNormalization`` computes it, summed in another order: a float16 step apart at most.
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
def _convolved(x, weight, bias, past, row, t, rows, columns, inside, tokens, channels, bias_size, past_rows,
               K: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr):  # fmt: skip
    """The float32 SiLU of the taps' sum at tokens ``t`` of ``columns``, before its rounding."""
    start = tl.load(bias + columns, mask=columns < bias_size, other=0.0).to(tl.float32)  # bias_size: C, or 0 without one
    total = tl.zeros((BLOCK_T, BLOCK_C), tl.float32) + start[None, :]
    for k in tl.static_range(K):
        tap = tl.load(weight + columns * K + k, mask=inside, other=0.0).to(tl.float32)
        value = _padded(x, past, row, t + k - (K - 1), rows, columns, inside, tokens, channels, past_rows, K)
        total = total + tap[None, :] * value.to(tl.float32)
    return tl.math.div_rn(total, 1.0 + tl.exp(-total))


@triton.jit
def _tile(x, weight, bias, past, tokens, channels, bias_size, past_rows, K: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr):
    """This program's tile (channels ``columns``, token block ``block`` of batch row ``row``, and which are in range)
    and its float32 SiLU of the taps' sum."""
    columns = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    block = tl.program_id(1)
    row = tl.program_id(2).to(tl.int64)
    inside = columns < channels
    t = block * BLOCK_T + tl.arange(0, BLOCK_T)
    rows = t < tokens
    out = _convolved(x, weight, bias, past, row, t, rows, columns, inside, tokens, channels, bias_size, past_rows, K, BLOCK_T, BLOCK_C)
    return columns, block, row, inside, t, rows, out


@triton.jit
def _window_after(x, past, present, row, block, columns, inside, tokens, channels, past_rows, K: tl.constexpr, BLOCK_T: tl.constexpr):
    """The last token block's programs write the window after the last token: its K - 1 rows, copied."""
    if block == tl.maximum(tl.cdiv(tokens, BLOCK_T) - 1, 0):
        j = tl.arange(0, BLOCK_T)
        last = j < K - 1
        window = _padded(x, past, row, tokens - (K - 1) + j, last, columns, inside, tokens, channels, past_rows, K)
        tl.store(present + (row * (K - 1) + j)[:, None] * channels + columns[None, :], window, mask=last[:, None] & inside[None, :])


@triton.jit
def short_convolution_kernel(x, weight, bias, past, y, present, tokens, channels, bias_size, past_rows,
                             K: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr):  # fmt: skip
    columns, block, row, inside, t, rows, out = _tile(x, weight, bias, past, tokens, channels, bias_size, past_rows, K, BLOCK_T, BLOCK_C)
    tl.store(y + (row * tokens + t)[:, None] * channels + columns[None, :], out.to(tl.bfloat16), mask=rows[:, None] & inside[None, :])
    _window_after(x, past, present, row, block, columns, inside, tokens, channels, past_rows, K, BLOCK_T)


@triton.jit
def short_convolution_heads_kernel(x, weight, bias, past, mask, q, k, v, present, tokens, channels, bias_size, past_rows, has_mask,
                                   key_heads, scale, epsilon, K: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr,
                                   KEY_SIZE: tl.constexpr, REPEAT: tl.constexpr):  # fmt: skip
    """The convolution as ``short_convolution_kernel`` computes it, rounded to bfloat16, times the token's padding mask
    (float32, where ``has_mask``), then parted into the gated delta rule's float16 inputs: q (the first
    ``key_heads * KEY_SIZE`` channels) and k (the next as many), each head of ``KEY_SIZE`` RMS-normalized in float32
    (``x * rsqrt(mean(x^2) + epsilon) * scale``) and written to ``REPEAT`` consecutive value heads, and v (the rest)."""
    columns, block, row, inside, t, rows, out = _tile(x, weight, bias, past, tokens, channels, bias_size, past_rows, K, BLOCK_T, BLOCK_C)
    value = out.to(tl.bfloat16).to(tl.float32)
    if has_mask:
        value = value * tl.load(mask + row * tokens + t, mask=rows, other=0.0)[:, None]
    squares = tl.reshape(value * value, (BLOCK_T, BLOCK_C // KEY_SIZE, KEY_SIZE))
    inverse = tl.math.rsqrt(tl.sum(squares, axis=2) / KEY_SIZE + epsilon)
    normalized = tl.reshape(tl.reshape(value, (BLOCK_T, BLOCK_C // KEY_SIZE, KEY_SIZE)) * inverse[:, :, None], (BLOCK_T, BLOCK_C)) * scale
    key_width = key_heads * KEY_SIZE
    is_q = columns < key_width
    is_k = (columns >= key_width) & (columns < 2 * key_width)
    within = tl.where(is_q, columns, columns - key_width)  # the column within q or k
    head_rows = (row * tokens + t)[:, None] * (key_width * REPEAT)
    written = rows[:, None] & inside[None, :]
    for j in tl.static_range(REPEAT):
        # runs of KEY_SIZE contiguous columns from multiples of it (a head): said, as Triton cannot see it through // and %
        heads_at = tl.max_contiguous(tl.multiple_of((within // KEY_SIZE * REPEAT + j) * KEY_SIZE + within % KEY_SIZE, KEY_SIZE), KEY_SIZE)
        at = head_rows + heads_at[None, :]
        tl.store(q + at, normalized.to(tl.float16), mask=written & is_q[None, :])
        tl.store(k + at, normalized.to(tl.float16), mask=written & is_k[None, :])
    value_width = channels - 2 * key_width
    at_v = (row * tokens + t)[:, None] * value_width + (columns - 2 * key_width)[None, :]
    tl.store(v + at_v, value.to(tl.float16), mask=written & (columns >= 2 * key_width)[None, :])
    _window_after(x, past, present, row, block, columns, inside, tokens, channels, past_rows, K, BLOCK_T)
