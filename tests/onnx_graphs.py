"""ONNX graphs compared by what they compute rather than by what their values are named."""

from __future__ import annotations

import onnx
from onnx import helper, numpy_helper


def structure(graph: onnx.GraphProto, outer: dict[str, str] | None = None, scope: str = "") -> list[tuple]:
    """Every node as (op, attributes, inputs), in order: an input is a graph input by position, an
    initializer by its type, shape and bytes, a node output by (node position, output position);
    subgraphs likewise. Names play no part, so two exports of one model compare equal however the
    exporter numbered their values, and differ if any node, wire or weight byte does."""
    where = dict(outer or {})
    where.update({value.name: f"input {i}" for i, value in enumerate(graph.input)})
    for tensor in graph.initializer:
        where[tensor.name] = f"{tensor.data_type}{list(tensor.dims)}:{numpy_helper.to_array(tensor).tobytes().hex()}"
    nodes: list[tuple] = []
    for position, node in enumerate(graph.node):
        attributes = [
            (a.name, structure(a.g, where, f"{scope}{position}/")) if a.type == onnx.AttributeProto.GRAPH else helper.printable_attribute(a) for a in node.attribute
        ]
        nodes.append((node.domain, node.op_type, attributes, [where[name] if name else "" for name in node.input]))
        where.update({name: f"node {scope}{position}.{i}" for i, name in enumerate(node.output)})
    nodes.append(("outputs", [where[value.name] for value in graph.output]))
    return nodes


def rms_norm_nodes(x: str, out: str) -> list[onnx.NodeProto]:
    """``out = x / sqrt(mean(x²) + eps)`` over the last axis, spelled op by op as the export writes an RMSNorm
    (before its weight); the graph holds the constants ``two``, ``last`` (``[-1]``) and ``eps``."""
    return [
        helper.make_node("Pow", [x, "two"], [f"{out}.square"]),
        helper.make_node("ReduceMean", [f"{out}.square", "last"], [f"{out}.mean"]),
        helper.make_node("Add", [f"{out}.mean", "eps"], [f"{out}.shifted"]),
        helper.make_node("Sqrt", [f"{out}.shifted"], [f"{out}.root"]),
        helper.make_node("Reciprocal", [f"{out}.root"], [f"{out}.inverse"]),
        helper.make_node("Mul", [x, f"{out}.inverse"], [out]),
    ]

