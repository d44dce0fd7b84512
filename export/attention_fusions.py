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
which the sigmoid output gate reads as before. OmniJev's vision tower attends in the same spelling, one image a
call (batch 1, its block-diagonal mask over the images' patches), and reshapes to ``[S, N·D]``: there the op's
output loses its batch axis (``Squeeze``). ``s1omni build`` rewrites ``vision.onnx`` with the backbone graphs. The
op's contract, as used here:

- ``query`` ``[B, S, N·D]``; ``key``/``value`` 4-D are taken as ``[B, N, T, D]`` (its "past_key" layout,
  ``Q_K_V_BSNH_BNSH_BNSH`` in ``microsoft/onnxruntime:onnxruntime/contrib_ops/cpu/bert/multihead_attention_helper.h``),
  so the repeated k/v go in as the graph has them: the op takes no GQA (one ``num_heads`` for all three),
  and the head mapping stays the graph's ``repeat_kv``;
- ``attention_bias`` ``[B or 1, N or 1, S, T]`` is added to ``scale · q kᵀ`` before the softmax: the
  graph's own mask, broadcast over heads, so the continue graph's past/own key order and left padding are
  the graph's, whatever they are; ``unidirectional`` stays 0 and no ``key_padding_mask`` is given;
- ``scale`` is the graph's ``Mul`` constant (``head_dim ** -0.5`` here, which is also the op's default).

The mask goes in clamped at a finite floor (``SAFE_MASK``: -1e30 for float32 inputs, -6e4 for float16, whose
largest magnitude is 65,504), once per mask and shared by the layers. The CUDA EP's CUTLASS
memory-efficient kernel multiplies scores by log2(e), so the float32 ``lowest()`` the export masks with
becomes -inf and a fully masked row (a left-padded prefill row's padding queries) divides 0 by 0
(``microsoft/onnxruntime:onnxruntime/contrib_ops/cuda/bert/cutlass_fmha/memory_efficient_attention.h``,
``kCutlassSafeMaskFilterValue``); those rows' NaNs would reach the real tokens through the next layers
(``0 · NaN`` is NaN). A masked score stays a floor's width below any real one either way, so its
``exp`` underflows to 0 as before, and a fully masked row is still the uniform average.

The key count the op sees is padded up to a multiple of ``KEY_MULTIPLE`` (8): keys and values with zeros, the
bias at the floor, so a padding key takes no weight from any real query. The CUTLASS kernel reads the bias
rows in 16-byte vectors, so its row stride (the key count) must be a multiple of 4 float32 or 8 float16
elements; on the H200 the float32 op without this padding failed ``Attention::check_supported`` at its first
validation forward (``benchmarks/README.md``, ``h200-0.8B-mixers-instances2``), and with it passed. The padding queries' rows now average over the
padding keys too; they are read by nothing.

``inputs`` (``--attention-inputs``, bf16 builds only) picks the op's type: ``fp32`` keeps the graph's
float32; ``fp16`` casts q, k, v and the bias to float16 and the output back to float32, so the op runs on
tensor cores: on the H200 ONNX Runtime 1.31.1 then takes cuDNN's flash SDPA kernel for it
(``cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16``; ``benchmarks/h200-0.8B-attn16``).
bfloat16 is not offered: the CUDA ``MultiHeadAttention`` registers float and float16 only.

Which CUDA kernel runs is the op's choice (``microsoft/onnxruntime:onnxruntime/contrib_ops/cuda/bert/multihead_attention.cc``):
flash attention and the TensorRT kernels take no ``attention_bias``; float32 gets the memory-efficient
(CUTLASS) kernel when the query or key length is at least 256 (``ORT_MIN_SEQ_LEN_EFFICIENT_ATTENTION_FP32``)
and, with a bias, the query length is a multiple of 16 (8 for float16); otherwise the op's unfused kernel,
which still holds one ``[B, N, S, T]`` score tensor (the graph held several). With ``--cuda-graphs`` every
width over 128 rounds up to a multiple of 16 (``s1omni.runtime.runners.cuda_graphs.bucket``: steps of 16 up
to 256, 32 up to 512, ...), so the long calls qualify. Not covered: the portable (``Scan``, chunked) graphs,
which already attend in chunks and which TensorRT parses (no contrib op); any spelling other than the one
above (a different scale position, a mask with a head axis, a softmax not over keys) is left as exported. On
the CPU EP the float32 op changes float32 rounding only, and the float16 one answers the same (ONNX Runtime's
CPU EP runs the op in float32 and drops the round-trip casts); ``tests/test_attention_fusions.py`` holds both
to that and runs both on the CUDA EP on the device.

``s1omni build --backend onnxruntime --target cuda --fused-attention [--attention-inputs fp16]`` runs it
(opt-in, docs/validation.md; the manifest and ``build --json`` say ``fused_attention`` and ``attention_inputs``). On the H200 the
0.8B's bf16 engine PASSED ``gpu-reduced`` with it in either type; float16 took the router request from 90.8 to
88.2 ms and eight merged ones from 469 to 411 ms. CPU and TensorRT builds refuse the option: TensorRT parses no
contrib op, and CPU engines run the portable graphs, which attend in chunks already.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .cuda_fusions import GraphIndex, Replacement, attribute, contrib_rewrite, other_input
from .cuda_kernels import INPUT_TYPES
from .naming import CONTRIB_DOMAIN

# The most negative bias the CUDA kernel takes without a fully masked row's NaN, per type of the op's inputs
# (see above): float16's largest finite magnitude is 65,504.
SAFE_MASK = {"fp32": -1.0e30, "fp16": -6.0e4}
# The key count the op sees is padded up to a multiple of this: the CUTLASS kernel reads bias rows in 16-byte
# vectors, so its row stride (the key count) must be a multiple of 4 float32 or 8 float16 elements (see above).
KEY_MULTIPLE = 8


def _perm(node: onnx.NodeProto | None, perm: list[int]) -> bool:
    return node is not None and node.op_type == "Transpose" and not node.domain and attribute(node, "perm", None) == perm


class _Core:
    """One attention core matched from its ``Softmax``: the nodes replaced and what the op reads."""

    def __init__(self, index: GraphIndex, producers: dict[str, onnx.NodeProto], softmax: onnx.NodeProto):
        self.nodes: list[onnx.NodeProto] = []
        self.flat = False
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
        # A vision tower's one image a call: its output drops the batch axis ([S, N·D]), which the op's then does.
        self.flat = batch == 1 and output == [length, heads * size]
        shapes = {
            "q, k and v share batch, heads and head size": key[0] == value[0] == batch and key[1] == value[1] == heads and key[3] == value[3] == size,
            "k and v share the keys": key[2] == value[2],
            "the mask is [B or 1, 1, S, T]": mask[0] in (batch, 1) and mask[1] == 1 and mask[2:] == [length, key[2]],
            "the softmax is over the keys": attribute(softmax, "axis", -1) in (-1, 3),
            "the output is [B, S, N·D] (or [S, N·D] at B = 1)": isinstance(heads, int) and isinstance(size, int)
            and (output == [batch, length, heads * size] or self.flat),
        }
        if all(shapes.values()):
            self.nodes = chain


def _shared(graph: onnx.GraphProto, name: str, value: np.ndarray) -> str:
    """An initializer every core of the graph may read, added once."""
    if all(tensor.name != name for tensor in graph.initializer):
        graph.initializer.append(numpy_helper.from_array(value, name))
    return name


def _mask_nodes(graph: onnx.GraphProto, mask: str, inputs: str) -> tuple[list[onnx.NodeProto], str, str]:
    """The nodes that ready one mask for the op, once for every core that reads it: clamped at the type's safe
    bias, its keys padded to ``KEY_MULTIPLE`` at that bias, in ``inputs``'s type. Returns them, the op's bias
    and the ``[0, pad]`` pads that every core's keys and values (and the mask) take on their key axis."""
    floor = _shared(graph, f"{mask}.floor.{inputs}", np.array(SAFE_MASK[inputs], np.float32))
    multiple = _shared(graph, "attention.key_multiple", np.array([KEY_MULTIPLE], np.int64))
    zero = _shared(graph, "attention.no_pad", np.array([0], np.int64))
    keys_axis = _shared(graph, "attention.mask_key_axis", np.array([3], np.int64))
    pads, bias = f"{mask}.key_pads", f"{mask}.bias.{inputs}"
    nodes = [
        helper.make_node("Max", [mask, floor], [f"{mask}.safe.{inputs}"], name=f"{mask}/{inputs}/Max"),
        helper.make_node("Shape", [mask], [f"{mask}.keys"], name=f"{mask}/keys/Shape", start=3, end=4),
        helper.make_node("Neg", [f"{mask}.keys"], [f"{mask}.keys_neg"], name=f"{mask}/keys/Neg"),
        # Mod's result takes the divisor's sign: (-T) mod 8, the keys short of a multiple of 8, 0 to 7
        helper.make_node("Mod", [f"{mask}.keys_neg", multiple], [f"{mask}.key_pad"], name=f"{mask}/key_pad/Mod"),
        helper.make_node("Concat", [zero, f"{mask}.key_pad"], [pads], name=f"{mask}/key_pads/Concat", axis=0),
        helper.make_node("Pad", [f"{mask}.safe.{inputs}", pads, floor, keys_axis], [f"{mask}.padded.{inputs}"], name=f"{mask}/{inputs}/Pad"),
    ]
    if inputs == "fp32":
        nodes[-1].output[0] = bias
    else:
        nodes.append(helper.make_node("Cast", [f"{mask}.padded.{inputs}"], [bias], name=f"{mask}/{inputs}/Cast", to=INPUT_TYPES[inputs]))
    return nodes, bias, pads


def _cores(inputs: str) -> Callable[[GraphIndex, dict[str, onnx.NodeProto], onnx.GraphProto], Iterator[Replacement]]:
    """Each attention core as ``MultiHeadAttention`` in ``inputs``'s type, its query reshaped to ``[B, S, N·D]``,
    its keys and values padded; each mask readied once, where its first core stood."""
    island = INPUT_TYPES[inputs] != onnx.TensorProto.FLOAT

    def cores(index: GraphIndex, producers: dict[str, onnx.NodeProto], graph: onnx.GraphProto) -> Iterator[Replacement]:
        found = [core for node in graph.node if node.op_type == "Softmax" and not node.domain for core in [_Core(index, producers, node)] if core.nodes]
        masks: dict[str, tuple[str, str]] = {}
        key_axis = _shared(graph, "attention.key_axis", np.array([2], np.int64)) if found else ""
        for core in found:
            tag = core.output
            shape = _shared(graph, f"{tag}.query_shape", np.array([0, 0, core.heads * core.size], np.int64))
            new = [
                helper.make_node("Transpose", [core.query], [f"{tag}.query_bsnh"], name=f"{tag}/query/Transpose", perm=[0, 2, 1, 3]),
                helper.make_node("Reshape", [f"{tag}.query_bsnh", shape], [f"{tag}.query"], name=f"{tag}/query/Reshape"),
            ]
            if core.mask not in masks:
                nodes, *masks[core.mask] = _mask_nodes(graph, core.mask, inputs)
                new[:0] = nodes
            bias, pads = masks[core.mask]
            query, key, value = f"{tag}.query", core.key, core.value
            if island:
                new += [helper.make_node("Cast", [name], [f"{tag}.{role}.{inputs}"], name=f"{tag}/{role}/Cast", to=INPUT_TYPES[inputs])
                        for role, name in (("query", query), ("key", key), ("value", value))]  # fmt: skip
                query, key, value = (f"{tag}.{role}.{inputs}" for role in ("query", "key", "value"))
            new += [helper.make_node("Pad", [name, pads, "", key_axis], [f"{tag}.{role}.padded"], name=f"{tag}/{role}/Pad")
                    for role, name in (("key", key), ("value", value))]  # fmt: skip
            result = f"{tag}.attended" if core.flat else core.output  # [B, S, N·D] float32
            attended = f"{tag}.attended.{inputs}" if island else result
            new.append(helper.make_node(
                "MultiHeadAttention", [query, f"{tag}.key.padded", f"{tag}.value.padded", "", "", bias], [attended],
                name=f"{tag}/MultiHeadAttention", domain=CONTRIB_DOMAIN, num_heads=core.heads, scale=core.scale,
            ))  # fmt: skip
            if island:
                new.append(helper.make_node("Cast", [attended], [result], name=f"{tag}/attended/Cast", to=onnx.TensorProto.FLOAT))
            if core.flat:
                batch_axis = _shared(graph, "attention.batch_axis", np.array([0], np.int64))
                new.append(helper.make_node("Squeeze", [result, batch_axis], [core.output], name=f"{tag}/attended/Squeeze"))
            yield core.nodes, new

    return cores


def fuse_attention(model: onnx.ModelProto, inputs: str = "fp32") -> int:
    """Rewrite ``model`` in place with each attention core as one ``MultiHeadAttention`` whose q, k, v and bias
    are in ``inputs``'s type (``INPUT_TYPES``: float32, or float16 between casts); returns how many."""
    return contrib_rewrite(model, _cores(inputs))
