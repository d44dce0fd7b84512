"""The CUDA build's one graph rewrite: each ``LinearAttention`` node becomes ``GatedDeltaNet``.

Both are ONNX Runtime ``com.microsoft`` contrib ops computing the same gated delta rule (schemas in
ONNX Runtime 1.31, ``onnxruntime/core/graph/contrib_ops``). ``LinearAttention`` has CPU and CUDA
kernels, so the exported graphs run (and are validated) everywhere; its CUDA kernel walks the tokens
one by one. ``GatedDeltaNet`` is CUDA-only (no CPU kernel, so nothing here can run it). Its chunked
tensor-core prefill engine takes float16 inputs only; with these graphs' float32 inputs every call runs
its sequential engine, one warp per state column (``GatedDeltaNetDecodeWarpKernel``), which still beats
``LinearAttention`` by 2–29% on the H200 (microsoft/onnxruntime:docs/contrib_ops/cuda/gdn.md, "CUDA
Engines and Plan Selection"; ``benchmarks/h200-0.8B-kernels``). They differ in layout only:

- activations: ``LinearAttention`` takes ``[B, T, H*D]``; ``GatedDeltaNet``'s rank-4 spelling takes
  ``[B, T, H, D]`` (a ``Reshape`` each way);
- state: ``LinearAttention``'s is key-major ``[B, H, Dk, Dv]``, ``GatedDeltaNet``'s value-major
  ``[B, H, Dv, Dk]`` (a ``Transpose`` each way, so the engine's state tensors keep one layout);
- decay (log space) and beta go in as they are (``gate_activation``/``beta_activation`` ``none``),
  q and k are already l2-normalised (``qk_l2_norm`` 0), and both default the scale to 1/sqrt(Dk).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

KERNELS = ("LinearAttention", "GatedDeltaNet")
DOMAIN = "com.microsoft"


def _attribute(node: onnx.NodeProto, name: str) -> int:
    return next(helper.get_attribute_value(a) for a in node.attribute if a.name == name)


def gated_delta_net_nodes(node: onnx.NodeProto, index: int) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    """The ``GatedDeltaNet`` spelling of one ``LinearAttention`` node (inputs q, k, v, state, decay, beta),
    and the reshape targets it adds."""
    query, key, value, state, decay, beta = node.input
    output, present = node.output
    tag = f"gdn{index}"
    heads = _attribute(node, "q_num_heads")
    if _attribute(node, "kv_num_heads") != heads:
        raise ValueError(f"{node.name}: grouped LinearAttention is not rewritten")
    nodes = []
    for name in (query, key, value):
        nodes.append(helper.make_node("Reshape", [name, f"{tag}.heads"], [f"{name}.{tag}"], name=f"{tag}/reshape_{name}"))
    nodes += [
        helper.make_node("Transpose", [state], [f"{tag}.state_in"], perm=[0, 1, 3, 2], name=f"{tag}/state_in"),
        helper.make_node(
            "GatedDeltaNet",
            [f"{query}.{tag}", f"{key}.{tag}", f"{value}.{tag}", "", decay, beta, f"{tag}.state_in"],
            [f"{tag}.output", f"{tag}.state_out"],
            domain=DOMAIN,
            name=f"{tag}/GatedDeltaNet",
            update_rule="gated_delta",
        ),
        helper.make_node("Reshape", [f"{tag}.output", f"{tag}.packed"], [output], name=f"{tag}/pack"),
        helper.make_node("Transpose", [f"{tag}.state_out"], [present], perm=[0, 1, 3, 2], name=f"{tag}/state_out"),
    ]
    return nodes, [
        numpy_helper.from_array(np.array([0, 0, heads, -1], np.int64), f"{tag}.heads"),
        numpy_helper.from_array(np.array([0, 0, -1], np.int64), f"{tag}.packed"),
    ]


def use_gated_delta_net(model: onnx.ModelProto) -> int:
    """Rewrite ``model`` in place with every ``LinearAttention`` node as ``GatedDeltaNet``; returns how many
    were rewritten."""
    graph = model.graph
    rewritten, nodes = 0, []
    for node in graph.node:
        if node.domain == DOMAIN and node.op_type == "LinearAttention":
            replacement, constants = gated_delta_net_nodes(node, rewritten)
            nodes += replacement
            graph.initializer.extend(constants)
            rewritten += 1
        else:
            nodes.append(node)
    del graph.node[:]
    graph.node.extend(nodes)
    return rewritten
