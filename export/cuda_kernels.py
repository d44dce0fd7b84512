"""The CUDA build's Gated DeltaNet rewrite: each ``LinearAttention`` node becomes ``GatedDeltaNet`` or
``ChunkedGatedDeltaRule``.

Both are ONNX Runtime ``com.microsoft`` contrib ops computing the same gated delta rule (schemas in
ONNX Runtime 1.31, ``onnxruntime/core/graph/contrib_ops``). ``LinearAttention`` has CPU and CUDA
kernels, so the exported graphs run (and are validated) everywhere; its CUDA kernel walks the tokens
one by one. ``GatedDeltaNet`` is CUDA-only (no CPU kernel, so nothing here can run it). They differ in
layout only:

- activations: ``LinearAttention`` takes ``[B, T, H*D]``; ``GatedDeltaNet``'s rank-4 spelling takes
  ``[B, T, H, D]`` (a ``Reshape`` each way, static targets, so CUDA graphs still capture);
- state: ``LinearAttention``'s is key-major ``[B, H, Dk, Dv]``, ``GatedDeltaNet``'s value-major
  ``[B, H, Dv, Dk]`` (a ``Transpose`` each way, so the engine's state tensors keep one layout);
- decay (log space) and beta ``[B, T, H]`` go in as they are (``gate_activation``/``beta_activation``
  ``none``), q and k are already l2-normalised (``qk_l2_norm`` 0), and both default the scale to 1/sqrt(Dk).

Which engine ``GatedDeltaNet`` runs is its plan's choice per call (microsoft/onnxruntime:
docs/contrib_ops/cuda/gdn.md, "CUDA Engines and Plan Selection"). Its chunked tensor-core prefill
engine needs float16 q/k/v, ``head_size_qk == head_size_v == 128``, equal q and k heads, v heads a
multiple of them, a scalar decay per head, at least 32 tokens a row, SM80 or newer; otherwise the
sequential engine runs, one warp per state column (``GatedDeltaNetDecodeWarpKernel``), which with
float32 q/k/v still beats ``LinearAttention`` by 2–29% on the H200 (``benchmarks/h200-0.8B-kernels``).
``inputs="fp16"`` (``--gated-delta-inputs fp16``, opt-in for bf16 builds: validated on the H200 at every member size, not on the tiny member, docs/validation.md) feeds q, k and v to the node in float16 and
casts its output back to float32; the state, decay and beta stay float32, as the schema has them
whatever the activations' type. ``chunked_prefill`` says which of the conditions a graph meets. On
the H200 (ONNX Runtime 1.31.1, 4 heads of 128, continuing from a random state) that spelling gave
``LinearAttention``'s float32 output within 1e-3 of its largest value and its state within 9e-4, at 8
to 2,048 tokens; at 2,048 tokens (16 heads) its output was the pinned chunked plan's
(``ORT_GDN_PLAN=chunked``) bit for bit, and not the sequential plan's.

``ChunkedGatedDeltaRule`` (domain ``ai.s1omni``) is this project's custom op: flash-linear-attention's
chunked forward compiled ahead of time for the engine's GPU (``s1omni.export.gdn_library``, which also
states its schema). It takes the rank-4 spelling with float16 q, k, v and output, and the state key-major,
as ``LinearAttention`` keeps it (no transposes); the decay and beta stay float32. Its scale is
1/sqrt(Dk) as the schema's default, written out, so the head sizes come from the graph's state shapes.

The kernel's own gating (``gate_activation`` ``qwen``, ``beta_activation`` ``sigmoid``, ``qk_l2_norm``)
is not used: the prefill graph multiplies the gated log-decay by its realignment mask after the gate
(``s1omni.export.patches``: a left-padded row's tail must not decay), which no input of the in-kernel
gate can express, and without a CPU kernel the rewrite could not be checked here.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .cuda_fusions import attribute
from .naming import CONTRIB_DOMAIN, OP_DOMAIN, OP_TYPE

KERNELS = ("LinearAttention", "GatedDeltaNet", OP_TYPE)
# The element type GatedDeltaNet's q, k, v and output take per ``inputs`` choice.
INPUT_TYPES = {"fp32": TensorProto.FLOAT, "fp16": TensorProto.FLOAT16}
CHUNKED_HEAD_SIZE = 128  # the only head size of the chunked engine
CHUNKED_MIN_TOKENS = 32  # per row: below it the plan takes the sequential engine


def _head_reshapes(node: onnx.NodeProto, index: int) -> tuple[str, list[onnx.TensorProto]]:
    """The tag of the ``index``-th rewritten ``LinearAttention`` node, and the reshape targets between its packed
    ``[B, T, H*D]`` tensors and the kernels' ``[B, T, H, D]`` (``{tag}.heads``, ``{tag}.packed``)."""
    tag = f"gdn{index}"
    heads = attribute(node, "q_num_heads")
    if attribute(node, "kv_num_heads") != heads:
        raise ValueError(f"{node.name}: grouped LinearAttention is not rewritten")
    return tag, [
        numpy_helper.from_array(np.array([0, 0, heads, -1], np.int64), f"{tag}.heads"),
        numpy_helper.from_array(np.array([0, 0, -1], np.int64), f"{tag}.packed"),
    ]


def gated_delta_net_nodes(
    node: onnx.NodeProto, index: int, inputs: str = "fp32"
) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    """The ``GatedDeltaNet`` spelling of one ``LinearAttention`` node (inputs q, k, v, state, decay, beta),
    with q, k, v and the output in ``inputs``'s type (``INPUT_TYPES``), and the reshape targets it adds."""
    query, key, value, state, decay, beta = node.input
    output, present = node.output
    tag, constants = _head_reshapes(node, index)
    cast = INPUT_TYPES[inputs] != TensorProto.FLOAT
    nodes = []
    for name in (query, key, value):
        if cast:
            nodes.append(helper.make_node("Cast", [name], [f"{name}.{tag}.{inputs}"], to=INPUT_TYPES[inputs], name=f"{tag}/cast_{name}"))
        source = f"{name}.{tag}.{inputs}" if cast else name
        nodes.append(helper.make_node("Reshape", [source, f"{tag}.heads"], [f"{name}.{tag}"], name=f"{tag}/reshape_{name}"))
    result = f"{tag}.output.{inputs}" if cast else f"{tag}.output"
    nodes += [
        helper.make_node("Transpose", [state], [f"{tag}.state_in"], perm=[0, 1, 3, 2], name=f"{tag}/state_in"),
        helper.make_node(
            "GatedDeltaNet",
            [f"{query}.{tag}", f"{key}.{tag}", f"{value}.{tag}", "", decay, beta, f"{tag}.state_in"],
            [result, f"{tag}.state_out"],
            domain=CONTRIB_DOMAIN,
            name=f"{tag}/GatedDeltaNet",
            update_rule="gated_delta",
        ),
        *([helper.make_node("Cast", [result], [f"{tag}.output"], to=TensorProto.FLOAT, name=f"{tag}/cast_output")] if cast else []),
        helper.make_node("Reshape", [f"{tag}.output", f"{tag}.packed"], [output], name=f"{tag}/pack"),
        helper.make_node("Transpose", [f"{tag}.state_out"], [present], perm=[0, 1, 3, 2], name=f"{tag}/state_out"),
    ]
    return nodes, constants


def chunked_rule_nodes(
    node: onnx.NodeProto, index: int, key_size: int
) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    """The ``ChunkedGatedDeltaRule`` spelling of one ``LinearAttention`` node whose keys have ``key_size``
    elements a head, and the reshape targets it adds."""
    query, key, value, state, decay, beta = node.input
    output, present = node.output
    tag, constants = _head_reshapes(node, index)
    nodes = []
    for name in (query, key, value):
        nodes.append(helper.make_node("Cast", [name], [f"{name}.{tag}.fp16"], to=TensorProto.FLOAT16, name=f"{tag}/cast_{name}"))
        nodes.append(helper.make_node("Reshape", [f"{name}.{tag}.fp16", f"{tag}.heads"], [f"{name}.{tag}"], name=f"{tag}/reshape_{name}"))
    nodes += [
        helper.make_node(
            OP_TYPE,
            [f"{query}.{tag}", f"{key}.{tag}", f"{value}.{tag}", decay, beta, state],
            [f"{tag}.output.fp16", present],
            domain=OP_DOMAIN,
            name=f"{tag}/{OP_TYPE}",
            scale=float(1.0 / np.sqrt(key_size)),
        ),
        helper.make_node("Cast", [f"{tag}.output.fp16"], [f"{tag}.output"], to=TensorProto.FLOAT, name=f"{tag}/cast_output"),
        helper.make_node("Reshape", [f"{tag}.output", f"{tag}.packed"], [output], name=f"{tag}/pack"),
    ]
    return nodes, constants


def _value_shapes(graph: onnx.GraphProto) -> dict[str, list[int | None]]:
    return {
        value.name: [dim.dim_value or None for dim in value.type.tensor_type.shape.dim]
        for value in (*graph.value_info, *graph.input, *graph.output)
        if value.type.tensor_type.HasField("shape")
    }


def state_shapes(model: onnx.ModelProto) -> list[tuple[int, int, int]]:
    """(heads, key size, value size) of each ``LinearAttention`` node of ``model``, from its state's shape."""
    shapes, found = _value_shapes(model.graph), []
    for node in model.graph.node:
        if node.domain == CONTRIB_DOMAIN and node.op_type == "LinearAttention":
            state = shapes.get(node.output[1])
            if not state or len(state) != 4 or None in state[1:]:
                raise ValueError(f"{node.name}: its state's shape [B, H, Dk, Dv] is not in the graph")
            found.append((state[1], state[2], state[3]))
    return found


def use_gated_delta_kernel(model: onnx.ModelProto, kernel: str, inputs: str = "fp32") -> int:
    """Rewrite ``model`` in place with every ``LinearAttention`` node as ``kernel`` (``GatedDeltaNet`` taking q,
    k, v in ``inputs``'s type, or ``ChunkedGatedDeltaRule``); returns how many were rewritten."""
    graph = model.graph
    key_sizes = [key_size for _, key_size, _ in state_shapes(model)] if kernel == OP_TYPE else []
    rewritten, nodes = 0, []
    for node in graph.node:
        if node.domain == CONTRIB_DOMAIN and node.op_type == "LinearAttention":
            if kernel == OP_TYPE:
                replacement, constants = chunked_rule_nodes(node, rewritten, key_sizes[rewritten])
            else:
                replacement, constants = gated_delta_net_nodes(node, rewritten, inputs)
            nodes += replacement
            graph.initializer.extend(constants)
            rewritten += 1
        else:
            nodes.append(node)
    del graph.node[:]
    graph.node.extend(nodes)
    if kernel == OP_TYPE and rewritten and OP_DOMAIN not in {opset.domain for opset in model.opset_import}:
        model.opset_import.append(helper.make_opsetid(OP_DOMAIN, 1))
    return rewritten


def chunked_prefill(model: onnx.ModelProto, inputs: str) -> str:
    """What ``GatedDeltaNet`` will run for the ``LinearAttention`` nodes of ``model`` (before the rewrite)
    with q, k, v in ``inputs``'s type, as a sentence: the chunked prefill engine's conditions a build can
    check, and those not met. Head counts hold by construction (one count for q, k and v); the head sizes
    come from each node's state ``[B, H, Dk, Dv]``; token counts and the device are the call's."""
    graph = model.graph
    shapes = _value_shapes(graph)
    problems = []
    for node in graph.node:
        if node.domain != CONTRIB_DOMAIN or node.op_type != "LinearAttention":
            continue
        state, decay = shapes.get(node.output[1]), shapes.get(node.input[4])
        sizes = tuple(state[2:]) if state and len(state) == 4 else (None, None)
        if sizes != (CHUNKED_HEAD_SIZE, CHUNKED_HEAD_SIZE):
            known = "unknown" if None in sizes else f"{sizes[0]} and {sizes[1]}"
            problems.append(f"head sizes (key, value) {known}, not {CHUNKED_HEAD_SIZE}")
        if not decay or len(decay) != 3:
            problems.append("a decay that is not one scalar per head")
    if INPUT_TYPES[inputs] != TensorProto.FLOAT16:
        problems.insert(0, f"{inputs} q/k/v (the chunked engine takes float16)")
    if problems:
        return f"GatedDeltaNet runs its sequential engine at every length: {'; '.join(dict.fromkeys(problems))}"
    return f"GatedDeltaNet takes its chunked prefill engine for calls of {CHUNKED_MIN_TOKENS} tokens a row or more on SM80 or newer"
