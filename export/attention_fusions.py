"""Fused attention (``--fused-attention``): each full-attention layer's core one ``MultiHeadAttention``.

The fused graphs attend unchunked (``s1omni.export.patches``, ``QUERY_CHUNKS["fused"]``: a ``Scan`` would
keep ONNX Runtime from capturing CUDA graphs), as transformers' ``eager_attention_forward`` spells it:
``MatMul(q, Transpose(k)) → Mul(scaling) → Add(mask) → Softmax → MatMul(·, v) → Transpose → Reshape``,
with ``q`` ``[B, N, S, D]`` after its RMSNorm and partial M-RoPE, ``k``/``v`` ``[B, N, T, D]`` already
repeated from the key/value heads to the query heads (``repeat_kv``: ``Unsqueeze → Expand → Reshape``, kv
head ``h // (N / N_kv)`` for query head ``h``) and the additive mask ``[B, 1, S, T]`` the graph builds once
from the key mask and causality (``KeyMask``: prefill's left-padded rows; continue's past keys under
``past_mask``, then the block's own keys causally), shared by every attention layer. Each step is a float32
``[B, N, S, T]`` tensor: on the H200 one merged 0.8B forward of 15 rows x 5,632 tokens asked for 15 GB
of them and ran out of memory, and the attention GEMMs and transposes cost about 5 of the router
request's 61 ms of kernels (``benchmarks/README.md``, ``h200-0.8B-mixers``).

The rewrite keeps everything but that core: ``q`` goes to ``[B, S, N·D]`` (``Transpose → Reshape``), and
``MultiHeadAttention(q, k, v, attention_bias=mask)`` (``com.microsoft``, CPU and CUDA kernels in ONNX
Runtime 1.31; its schema prints from ``onnxruntime.capi.onnxruntime_pybind11_state.get_all_operator_schema()``,
``microsoft/onnxruntime:docs/ContribOperators.md``) writes the ``[B, S, N·D]`` the graph's ``Reshape`` did,
which the sigmoid output gate reads as before. The op's contract, as used here:

- ``query`` ``[B, S, N·D]``; ``key``/``value`` 4-D are taken as ``[B, N, T, D]`` (its "past_key" layout,
  ``Q_K_V_BSNH_BNSH_BNSH`` in ``microsoft/onnxruntime:onnxruntime/contrib_ops/cpu/bert/multihead_attention_helper.h``),
  so the repeated k/v go in as the graph has them: the op takes no GQA (one ``num_heads`` for all three),
  and the head mapping stays the graph's ``repeat_kv``;
- ``attention_bias`` ``[B or 1, N or 1, S, T]`` is added to ``scale · q kᵀ`` before the softmax: the
  graph's own mask, broadcast over heads, so the continue graph's past/own key order and left padding are
  the graph's, whatever they are; ``unidirectional`` stays 0 and no ``key_padding_mask`` is given;
- ``scale`` is the graph's ``Mul`` constant (``head_dim ** -0.5`` here, which is also the op's default).

The mask goes in clamped at -1e30 (one ``Max`` per mask, shared by the layers). The CUDA EP's CUTLASS
memory-efficient kernel multiplies scores by log2(e), so the float32 ``lowest()`` the export masks with
becomes -inf and a fully masked row (a left-padded prefill row's padding queries) divides 0 by 0
(``microsoft/onnxruntime:onnxruntime/contrib_ops/cuda/bert/cutlass_fmha/memory_efficient_attention.h``,
``kCutlassSafeMaskFilterValue``); those rows' NaNs would reach the real tokens through the next layers
(``0 · NaN`` is NaN). Any finite score stays ``-1e30`` away from it either way, so ``exp`` of a masked
score underflows to 0 as before, and a fully masked row is still the uniform average.

Which CUDA kernel runs is the op's choice (``microsoft/onnxruntime:onnxruntime/contrib_ops/cuda/bert/multihead_attention.cc``):
flash attention and the TensorRT kernels are float16-only and take no ``attention_bias``; float32 gets the
memory-efficient (CUTLASS) kernel when the query or key length is at least 256
(``ORT_MIN_SEQ_LEN_EFFICIENT_ATTENTION_FP32``) and, with a bias, the query length is a multiple of 16;
otherwise the op's unfused kernel, which still holds one ``[B, N, S, T]`` float32 score tensor (the graph
held several). So the memory win needs query widths that are multiples of 16: with ``--cuda-graphs`` every width over
128 rounds up to one (``s1omni.runtime.runners.cuda_graphs.bucket``: steps of 16 up to 256, 32 up to 512, ...),
so the long calls qualify; shorter calls gain fewer launches only. Not covered: the portable (``Scan``, chunked) graphs, which already attend in
chunks and which TensorRT parses (no contrib op); any spelling other than the one above (a different
scale position, a mask with a head axis, a softmax not over keys) is left as exported. It changes float32
rounding only (``tests/test_attention_fusions.py`` holds the tiny member's graphs to it on the CPU EP).

``s1omni build --backend onnxruntime --target cuda --fused-attention`` runs it (opt-in: on the H200, ONNX
Runtime 1.31.1's CUTLASS kernel refused the float32 call at head size 256; the manifest and ``build --json``
say ``fused_attention``). CPU and TensorRT builds refuse the option:
TensorRT parses no contrib op, and CPU engines run the portable graphs, which attend in chunks already.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .cuda_fusions import GraphIndex, Replacement, attribute, contrib_rewrite, other_input
from .naming import CONTRIB_DOMAIN

SAFE_MASK = -1.0e30  # the most negative bias the CUDA kernel takes without a fully masked row's NaN (see above)


def _perm(node: onnx.NodeProto | None, perm: list[int]) -> bool:
    return node is not None and node.op_type == "Transpose" and not node.domain and attribute(node, "perm", None) == perm


class _Core:
    """One attention core matched from its ``Softmax``: the nodes replaced and what the op reads."""

    def __init__(self, index: GraphIndex, producers: dict[str, onnx.NodeProto], softmax: onnx.NodeProto):
        self.nodes: list[onnx.NodeProto] = []
        add = producers.get(softmax.input[0])
        scale = next((producers[i] for i in add.input if i in producers and producers[i].op_type == "Mul"), None) if add and add.op_type == "Add" else None
        scores = scale and next((producers[i] for i in scale.input if i in producers and producers[i].op_type == "MatMul"), None)
        keys_t = scores and producers.get(scores.input[1])
        self.mask = scale and other_input(add, scale.output[0])
        self.scale = scores and index.scalar(other_input(scale, scores.output[0]))
        weighted = index.only_consumer(softmax, "MatMul")
        merged = weighted and index.only_consumer(weighted, "Transpose")
        reshape = merged and index.only_consumer(merged, "Reshape")
        if not (self.scale and _perm(keys_t, [0, 1, 3, 2]) and weighted.input[0] == softmax.output[0] and _perm(merged, [0, 2, 1, 3]) and reshape):
            return
        chain = [keys_t, scores, scale, add, softmax, weighted, merged, reshape]
        if any(node.domain or index.only_consumer(node, follower.op_type) is not follower for node, follower in zip(chain[:4], chain[1:5])):
            return
        self.query, self.key, self.value, self.output = scores.input[0], keys_t.input[0], weighted.input[1], reshape.output[0]
        query, key, value, mask, output = (index.dims(name) for name in (self.query, self.key, self.value, self.mask, self.output))
        if not (query and key and value and mask and output and len(query) == len(key) == len(value) == len(mask) == 4):
            return
        batch, heads, length, size = query
        self.heads, self.size = heads, size
        shapes = {
            "q, k and v share batch, heads and head size": key[0] == value[0] == batch and key[1] == value[1] == heads and key[3] == value[3] == size,
            "k and v share the keys": key[2] == value[2],
            "the mask is [B or 1, 1, S, T]": mask[0] in (batch, 1) and mask[1] == 1 and mask[2:] == [length, key[2]],
            "the softmax is over the keys": attribute(softmax, "axis", -1) in (-1, 3),
            "the output is [B, S, N·D]": isinstance(heads, int) and isinstance(size, int) and output == [batch, length, heads * size],
        }
        if all(shapes.values()):
            self.nodes = chain


def _cores(index: GraphIndex, producers: dict[str, onnx.NodeProto], graph: onnx.GraphProto) -> Iterator[Replacement]:
    """Each attention core as ``MultiHeadAttention``, its query reshaped to ``[B, S, N·D]``; each mask
    clamped once, where its first core stood."""
    cores = [core for node in graph.node if node.op_type == "Softmax" and not node.domain for core in [_Core(index, producers, node)] if core.nodes]
    safe: dict[str, onnx.NodeProto] = {}
    for core in cores:
        tag = core.output
        shape = f"{tag}.query_shape"
        graph.initializer.append(numpy_helper.from_array(np.array([0, 0, core.heads * core.size], np.int64), shape))
        new = [
            helper.make_node("Transpose", [core.query], [f"{tag}.query_bsnh"], name=f"{tag}/query/Transpose", perm=[0, 2, 1, 3]),
            helper.make_node("Reshape", [f"{tag}.query_bsnh", shape], [f"{tag}.query"], name=f"{tag}/query/Reshape"),
        ]
        if core.mask not in safe:
            floor = f"{core.mask}.floor"
            graph.initializer.append(numpy_helper.from_array(np.array(SAFE_MASK, np.float32), floor))
            safe[core.mask] = helper.make_node("Max", [core.mask, floor], [f"{core.mask}.safe"], name=f"{core.mask}/Max")
            new.insert(0, safe[core.mask])
        new.append(helper.make_node(
            "MultiHeadAttention", [f"{tag}.query", core.key, core.value, "", "", safe[core.mask].output[0]], [core.output],
            name=f"{tag}/MultiHeadAttention", domain=CONTRIB_DOMAIN, num_heads=core.heads, scale=core.scale,
        ))  # fmt: skip
        yield core.nodes, new


def fuse_attention(model: onnx.ModelProto) -> int:
    """Rewrite ``model`` in place with each attention core as one ``MultiHeadAttention``; returns how many."""
    return contrib_rewrite(model, _cores)
