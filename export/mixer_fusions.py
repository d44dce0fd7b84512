"""Fused Gated DeltaNet mixers (``--fused-mixers``): each short convolution and each gated output norm one op.

A Gated DeltaNet layer (``s1omni.export.patches.gated_delta_net_forward``) runs two pieces around its
delta rule that the exporter spells out op by op, and that ONNX Runtime 1.31 has single contrib ops
for (``com.microsoft``, CPU and CUDA kernels; their schemas print from
``onnxruntime.capi.onnxruntime_pybind11_state.get_all_operator_schema()``):

- the short convolution over the q/k/v channels, ``Concat(past_conv, x) → Conv(group=C, kernel K, no
  padding) → SiLU`` on ``[B, C, T]``, becomes ``CausalConvWithState(x, weight, bias, past_conv)`` with
  ``activation="silu"``. The op pads each channel's row with its ``past_state`` (``[B, C, K-1]``; zeros
  when absent), correlates it with the ``Conv`` weight as it is (``[C, 1, K]``, tap ``k`` of output ``t``
  reading padded position ``t + k``), and applies ``x / (1 + exp(-x))``
  (``microsoft/onnxruntime:onnxruntime/contrib_ops/cpu/bert/causal_conv_with_state.cc``), which is
  the ``Conv`` and the SiLU the graph spells. Only its ``output`` is used. Prefill keeps its own
  present state: each row's window is gathered at the row's real length (rows are realigned, padding
  at the end), which the op's ``present_state`` (the window after the last position) is not; so the
  ``Concat`` stays there for that ``Gather``, and the op reads the ``Concat``'s own first input, the zeros
  prefill starts from. Continue returns no state, so its ``Concat`` goes too;
- the gated output norm, Qwen3.5's ``Qwen3_5RMSNormGated`` (transformers 5.17,
  ``models/qwen3_5/modeling_qwen3_5.py``: ``weight · x · rsqrt(mean(x²) + eps) · silu(z)`` per head,
  the weight as it is, not ``1 + weight``), spelled as an RMSNorm with its weight
  (``s1omni.export.cuda_fusions`` reads those), a SiLU of the gate and their product, becomes
  ``GatedRMSNorm(x, weight, z)`` with ``activation="silu"`` and the norm's epsilon. Its mean runs over
  the trailing ``len(weight)`` elements, the head size of the ``[rows, head size]`` operands the graph
  already has.

On the H200 the 0.8B's short convolutions ran as cuDNN grouped convolutions (4.0 ms of the router
request's 63.2 ms of kernels; ``benchmarks/README.md``, "Where the router request goes") and the norms
and SiLUs op by op. The patterns are matched by structure in the top-level
graph: the convolution must be depthwise with stride and dilation 1, no padding, a ``[C, 1, K]``
initializer weight and a ``[B, C, K-1]`` past window concatenated on the time axis, and read by its SiLU
alone; the norm's product must be read only by the product with the SiLU of a gate of its input's own
shape. Anything else is left as exported. Both rewrites change float32 rounding only
(``tests/test_mixer_fusions.py`` holds the tiny member's graphs to it on the CPU EP). They run before
the norm and sigmoid fusion, on the spelling the export wrote, and accept a SiLU already written
``x · Sigmoid(x)``.

``s1omni build --backend onnxruntime --target cuda --fused-mixers`` runs them (opt-in: validated on the
H200 at every member size with the float16 options, not on the tiny member, docs/validation.md; the manifest and
``build --json`` say ``fused_mixers``). CPU and TensorRT builds refuse the
option: TensorRT parses no contrib op, and on the CPU EP the ops' kernels are slower than the exported
spelling (the tiny member's 512-token prefill on one thread: 17.5 -> 20.6 ms for the Scan graph, 10.3 ->
13.9 ms for the LinearAttention one).
"""

from __future__ import annotations

from collections.abc import Iterator

import onnx
from onnx import helper

from .cuda_fusions import GraphIndex, Replacement, attribute, contrib_rewrite, other_input, rms_norms
from .naming import CONTRIB_DOMAIN


def _silu(index: GraphIndex, producers: dict[str, onnx.NodeProto], name: str) -> tuple[str, list[onnx.NodeProto]] | None:
    """``(x, nodes)`` where ``name`` is ``x / (1 + exp(-x))`` or ``x · Sigmoid(x)`` computed by ``nodes``, each
    read by the next alone; ``None`` otherwise."""
    last = producers.get(name)
    if last is None or last.domain or last.op_type not in ("Div", "Mul"):
        return None
    if last.op_type == "Div":
        x, denominator = last.input
        add = producers.get(denominator)
        one = add and add.op_type == "Add" and next((i for i in add.input if index.scalar(i) == 1.0), None)
        exp = one and producers.get(other_input(add, one) or "")
        negate = exp and exp.op_type == "Exp" and producers.get(exp.input[0])
        if not (negate and negate.op_type == "Neg" and negate.input[0] == x):
            return None
        nodes = [negate, exp, add]
    else:
        sigmoid = next((producers[i] for i in last.input if i in producers and producers[i].op_type == "Sigmoid"), None)
        x = sigmoid and other_input(last, sigmoid.output[0])
        if not (x and sigmoid.input[0] == x):
            return None
        nodes = [sigmoid]
    if any(node.domain or index.only_consumer(node, follower.op_type) is not follower for node, follower in zip(nodes, [*nodes[1:], last])):
        return None
    return x, [*nodes, last]


def _short_convolutions(index: GraphIndex, producers: dict[str, onnx.NodeProto], graph: onnx.GraphProto) -> Iterator[Replacement]:
    """Every ``Concat(past, x) → Conv → SiLU`` of a depthwise causal convolution: the nodes replaced and
    its ``CausalConvWithState``."""
    for node in graph.node:
        silu = _silu(index, producers, node.output[0]) if node.op_type in ("Div", "Mul") else None
        conv = silu and producers.get(silu[0])
        if not (conv and conv.op_type == "Conv" and not conv.domain and _causal(index, producers, conv)):
            continue
        convolved, activation = silu
        if convolved in index.outputs or {id(user) for user in index.consumers[convolved]} != {id(n) for n in activation if convolved in n.input}:
            continue
        concat = producers[conv.input[0]]
        past, x = concat.input
        bias = conv.input[2] if len(conv.input) > 2 else ""
        replaced = [conv, *activation]
        if index.consumers[concat.output[0]] == [conv] and concat.output[0] not in index.outputs:
            replaced.insert(0, concat)  # continue: the window is read by the convolution alone
        fused = helper.make_node(
            "CausalConvWithState",
            [x, conv.input[1], bias, past],
            [node.output[0], f"{node.output[0]}.present_state"],  # the state the graph computes itself (see above)
            name=f"{node.output[0]}/CausalConvWithState",
            domain=CONTRIB_DOMAIN,
            activation="silu",
        )
        yield replaced, [fused]


def _causal(index: GraphIndex, producers: dict[str, onnx.NodeProto], conv: onnx.NodeProto) -> bool:
    """Whether ``conv`` is a depthwise convolution of ``Concat(past, x)`` on the last axis that reads the
    ``[B, C, K-1]`` window ``past`` before ``x`` ``[B, C, T]`` and pads nothing: one ``CausalConvWithState``."""
    weight = index.constants.get(conv.input[1])
    concat = producers.get(conv.input[0])
    if weight is None or len(weight.dims) != 3 or weight.dims[1] != 1 or not concat or concat.op_type != "Concat" or len(concat.input) != 2:
        return False
    channels, _, kernel = weight.dims
    bias = conv.input[2] if len(conv.input) > 2 and conv.input[2] else None
    if bias is not None and (bias not in index.constants or list(index.constants[bias].dims) != [channels]):
        return False
    past, x = (index.dims(name) for name in concat.input)
    if not (past and x and len(past) == len(x) == 3 and past[1:] == [channels, kernel - 1] and x[1] == channels):
        return False
    attributes = {
        "group": attribute(conv, "group", 1) == channels,
        "kernel_shape": attribute(conv, "kernel_shape", [kernel]) == [kernel],
        "strides": attribute(conv, "strides", [1]) == [1],
        "dilations": attribute(conv, "dilations", [1]) == [1],
        "pads": attribute(conv, "pads", [0, 0]) == [0, 0],
        "auto_pad": attribute(conv, "auto_pad", b"NOTSET") in (b"NOTSET", b"VALID"),
        "axis": attribute(concat, "axis", None) in (-1, 2),
    }
    return all(attributes.values())


def _gated_norms(index: GraphIndex, producers: dict[str, onnx.NodeProto], graph: onnx.GraphProto) -> Iterator[Replacement]:
    """Every ``RMSNorm(x) · weight · SiLU(z)``: the nodes replaced and its ``GatedRMSNorm``."""
    weighted = {replaced[-1].output[0]: (replaced, norm) for replaced, norm, constants in rms_norms(index, graph) if not constants}
    for product in graph.node:
        if product.domain or product.op_type != "Mul":
            continue
        normed = next((name for name in product.input if name in weighted), None)
        gate = normed and other_input(product, normed)
        silu = gate and _silu(index, producers, gate)
        if not silu or index.only_consumer(weighted[normed][0][-1], "Mul") is not product or index.only_consumer(silu[1][-1], "Mul") is not product:
            continue
        replaced, norm = weighted[normed]
        x, weight = norm.input
        z, activation = silu
        if index.dims(x) is None or index.dims(x) != index.dims(z):
            continue
        fused = helper.make_node(
            "GatedRMSNorm",
            [x, weight, z],
            list(product.output),
            name=f"{product.output[0]}/GatedRMSNorm",
            domain=CONTRIB_DOMAIN,
            activation="silu",
            epsilon=attribute(norm, "epsilon"),
        )
        yield [*replaced, *activation, product], [fused]


def fuse_short_convolutions(model: onnx.ModelProto) -> int:
    """Rewrite ``model`` in place with each Gated DeltaNet short convolution and its SiLU as one
    ``CausalConvWithState``; returns how many."""
    return contrib_rewrite(model, _short_convolutions)


def fuse_gated_norms(model: onnx.ModelProto) -> int:
    """Rewrite ``model`` in place with each gated RMSNorm as one ``GatedRMSNorm``; returns how many."""
    return contrib_rewrite(model, _gated_norms)
