"""The CPU build's exponentials: every float32 ``Exp`` of a backbone graph computed in float64 and
rounded once to float32.

ONNX Runtime's float32 ``Exp`` on the CPU is a vectorised approximation: over 210,002 float32 inputs
across its range (``tests/test_cpu_exp.py``'s) it is one ulp off the float64 exp rounded once on 6.0%
of them, torch's on 1.0% (ONNX Runtime 1.31.1, torch 2.13, an AVX-512 AMD EPYC host). The backbone
amplifies those ulps: the chunked Gated DeltaNet rule feeds differences of exponentiated cumulative
decays through a unit-triangular solve, and SiLU's ``exp(-x)`` reaches every gate. On the tiny
synthetic member that alone put the engine 1.25e-5 from the float32 reference on one case
(``span-pii-labels``), past the cpu-fp32 gate's 1e-5. One op type at a time in float64 moved that case
to 2.5e-6 for ``Exp``, against 6.3e-6 for ``MatMul``, 7.8e-6 for ``Softplus`` and 1.23e-5 for the
rotary ``Cos`` and ``Sin``; with this rewrite the 45 calibration cases pass at 5.96e-6. Rounding the
float64 result once is nearer torch's own exp (which agrees with it on 99% of inputs), not a precision
the reference lacks. It is not free: the tiny member's router request (2,977 tokens, the CPU engine's
``answer``) went from 171.1 / 193.0 / 223.2 to 216.6 / 238.2 / 257.2 ms p50 in three interleaved runs of
8 on the 2-core host (about +40 ms, a fifth), the float64 exponentials of every SiLU and decay.

Only the CPU build takes it: the CUDA EP's exp is not the CPU's, and the GPU gates are what hold it.
"""

from __future__ import annotations

import onnx
from onnx import TensorProto, helper


def exp_in_float64(graph: onnx.ModelProto) -> int:
    """Wrap each ``Exp`` (the top-level graph and every subgraph) as ``Cast(double) → Exp → Cast(float)``;
    how many. The node keeps its output name, so nothing that reads it changes."""
    return _rewrite(graph.graph)


def _rewrite(graph: onnx.GraphProto) -> int:
    count = 0
    nodes: list[onnx.NodeProto] = []
    for index, node in enumerate(graph.node):
        for attribute in node.attribute:  # a Scan's body, say
            subgraphs = [attribute.g] if attribute.type == onnx.AttributeProto.GRAPH else list(attribute.graphs)
            count += sum(_rewrite(subgraph) for subgraph in subgraphs)
        if node.op_type != "Exp" or node.domain:
            nodes.append(node)
            continue
        wide_in, wide_out = f"{node.output[0]}.float64_in_{index}", f"{node.output[0]}.float64_{index}"
        nodes += [
            helper.make_node("Cast", [node.input[0]], [wide_in], name=f"{node.name}.to_float64", to=TensorProto.DOUBLE),
            helper.make_node("Exp", [wide_in], [wide_out], name=node.name),
            helper.make_node("Cast", [wide_out], node.output, name=f"{node.name}.to_float32", to=TensorProto.FLOAT),
        ]
        count += 1
    del graph.node[:]
    graph.node.extend(nodes)
    return count
