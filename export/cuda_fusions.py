"""Fewer kernel launches on the CUDA EP: the norms and sigmoids the exporter spells out op by op.

The exported graphs write every RMSNorm as ``Pow → ReduceMean → Add(eps) → Sqrt → Reciprocal → Mul``
(then a ``Mul`` by its weight), the L2 norm of the Gated DeltaNet q and k as ``Mul → ReduceSum → Add →
Sqrt → Reciprocal → Mul``, and every sigmoid as ``Neg → Exp → Add(1) → Reciprocal`` (``Div`` for SiLU).
That spelling is the reference's own rounding, which the CPU engine needs for its 1e-5 gate, and ONNX
Runtime's graph optimizer leaves it alone (the 0.8B prefill graph goes from 2,326 nodes to 2,290). On
the CUDA EP each op is a launch of its own, and small requests are launch-bound: on the H200 a 128-token
0.8B forward took 4,398 launches with kernels busy 38% of its time, and 2,428 launches (51% busy, p50
25.3 → 19.1 ms) once rewritten as below (``benchmarks/h200-0.8B-kernels``, ``benchmarks/h200-0.8B``).

A CUDA build therefore rewrites, in the top-level graph only:

- each norm as one ``SimplifiedLayerNormalization`` (ONNX Runtime's RMSNorm, CPU and CUDA kernels,
  ``microsoft/onnxruntime:onnxruntime/contrib_ops/cuda/layer_norm.cc``), with the RMSNorm's weight as its
  scale where a ``Mul`` by a ``[D]`` initializer follows. The L2 norm is the same op:
  ``x / sqrt(sum(x²) + eps) = x / sqrt(mean(x²) + eps/D) · 1/sqrt(D)``;
- each sigmoid as ``Sigmoid``, and each SiLU ``x / (1 + exp(-x))`` as ``x · Sigmoid(x)``.

Both change float32 rounding only (a few ulps); the GPU gate is what holds the result. The matching
pieces (``attribute``, ``GraphIndex``, ``rms_norms``, ``other_input``, ``replace_nodes``) serve
``s1omni.export.mixer_fusions`` too, which runs before these rewrites.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .naming import CONTRIB_DOMAIN


_REQUIRED = object()


def attribute(node: onnx.NodeProto, name: str, default: object = _REQUIRED) -> object:
    """The value of ``node``'s attribute ``name``: ``default`` where the node has none, an error where no default is given."""
    found = next((helper.get_attribute_value(a) for a in node.attribute if a.name == name), _REQUIRED)
    if found is _REQUIRED and default is _REQUIRED:
        raise KeyError(f"{node.op_type} node {node.name!r} has no attribute {name!r}")
    return default if found is _REQUIRED else found


class GraphIndex:
    """Producers, consumers, constants and last-dimension sizes of one graph, for pattern matching."""

    def __init__(self, graph: onnx.GraphProto):
        self.consumers: dict[str, list[onnx.NodeProto]] = defaultdict(list)
        for node in graph.node:
            for name in node.input:
                self.consumers[name].append(node)
        self.constants = {tensor.name: tensor for tensor in graph.initializer}
        self.outputs = {value.name for value in graph.output}
        self.shapes = {
            value.name: value.type.tensor_type.shape.dim
            for value in (*graph.value_info, *graph.input)
            if value.type.tensor_type.HasField("shape")
        }

    def only_consumer(self, node: onnx.NodeProto, *op_types: str) -> onnx.NodeProto | None:
        """The single consumer of ``node``'s output when it is one of ``op_types`` and the output is internal."""
        name = node.output[0]
        users = self.consumers[name]
        if len(users) == 1 and users[0].op_type in op_types and not users[0].domain and name not in self.outputs:
            return users[0]
        return None

    def internal(self, name: str, readers: int = 1) -> bool:
        """Whether ``name`` is read by exactly ``readers`` nodes and is no graph output: a rewrite may drop it."""
        return name not in self.outputs and len(self.consumers[name]) == readers

    def dims(self, name: str) -> list[int | str] | None:
        """``name``'s shape, each dimension a size or a symbol; ``None`` unless every dimension is known."""
        dims = [dim.dim_value or dim.dim_param for dim in self.shapes.get(name, ())]
        return dims if name in self.shapes and all(dims) else None

    def scalar(self, name: str | None) -> float | None:
        tensor = self.constants.get(name or "")
        if tensor is None or tensor.data_location == onnx.TensorProto.EXTERNAL:
            return None
        value = numpy_helper.to_array(tensor)
        return float(value.reshape(())) if value.size == 1 else None

    def ints(self, name: str) -> list[int] | None:
        """The values of the 1-D int64 initializer ``name`` (shapes, axes, sizes, slice bounds); None for anything else."""
        tensor = self.constants.get(name)
        if tensor is None or tensor.data_location == onnx.TensorProto.EXTERNAL or tensor.data_type != onnx.TensorProto.INT64 or len(tensor.dims) != 1:
            return None
        return [int(value) for value in numpy_helper.to_array(tensor)]

    def last_dim(self, name: str) -> int | None:
        dims = self.shapes.get(name)
        return dims[-1].dim_value or None if dims else None

    def reduces_last_axis(self, node: onnx.NodeProto) -> bool:
        if attribute(node, "keepdims", 1) != 1 or len(node.input) < 2 or node.input[1] not in self.constants:
            return False
        axes = numpy_helper.to_array(self.constants[node.input[1]]).tolist()
        rank = len(self.shapes.get(node.input[0], ()))
        return axes in ([-1], [rank - 1] if rank else [-1])


def other_input(node: onnx.NodeProto, name: str) -> str | None:
    """The input of a binary ``node`` that is not ``name`` (``None`` unless ``name`` is exactly one of them)."""
    first, second = node.input
    return second if first == name and second != name else first if second == name and first != name else None


def rms_norms(index: GraphIndex, graph: onnx.GraphProto) -> Iterator[tuple[list[onnx.NodeProto], onnx.NodeProto, list[onnx.TensorProto]]]:
    """Every RMSNorm / L2 norm: the nodes it replaces, its ``SimplifiedLayerNormalization``, new constants."""
    for square in graph.node:
        if square.domain or square.op_type not in ("Pow", "Mul"):
            continue
        x = square.input[0]
        if square.op_type == "Pow" and index.scalar(square.input[1]) == 2.0:
            reduce_op, mean = "ReduceMean", True
        elif square.op_type == "Mul" and square.input[1] == x:
            reduce_op, mean = "ReduceSum", False
        else:
            continue
        reduce = index.only_consumer(square, reduce_op)
        add = reduce and index.only_consumer(reduce, "Add")
        sqrt = add and index.only_consumer(add, "Sqrt")
        reciprocal = sqrt and index.only_consumer(sqrt, "Reciprocal")
        scale = reciprocal and index.only_consumer(reciprocal, "Mul")
        if not (scale and index.reduces_last_axis(reduce) and other_input(scale, reciprocal.output[0]) == x):
            continue
        epsilon = index.scalar(other_input(add, reduce.output[0]))
        size = index.last_dim(x)
        if epsilon is None or size is None:
            continue
        replaced = [square, reduce, add, sqrt, reciprocal, scale]
        weight, output, constants = None, scale.output[0], []
        follower = index.only_consumer(scale, "Mul")
        if mean and follower is not None:
            candidate = other_input(follower, output)
            tensor = index.constants.get(candidate or "")
            if tensor is not None and list(tensor.dims) == [size] and tensor.data_type == onnx.TensorProto.FLOAT:
                weight, output = candidate, follower.output[0]
                replaced.append(follower)
        if weight is None:
            weight = f"{scale.name or output}.norm_scale"
            level = 1.0 if mean else 1.0 / np.sqrt(size)  # float64 → float32 once
            constants.append(numpy_helper.from_array(np.full(size, level, np.float32), weight))
        fused = helper.make_node(
            "SimplifiedLayerNormalization",
            [x, weight],
            [output],
            name=f"{output}/SimplifiedLayerNormalization",
            axis=-1,
            epsilon=epsilon if mean else epsilon / size,
            stash_type=1,
        )
        yield replaced, fused, constants


def _sigmoids(index: GraphIndex, graph: onnx.GraphProto) -> Iterator[tuple[list[onnx.NodeProto], list[onnx.NodeProto]]]:
    """Every ``1 / (1 + exp(-x))`` and ``x / (1 + exp(-x))``: the nodes replaced and their replacement."""
    for negate in graph.node:
        if negate.domain or negate.op_type != "Neg":
            continue
        x = negate.input[0]
        exp = index.only_consumer(negate, "Exp")
        add = exp and index.only_consumer(exp, "Add")
        if not add or index.scalar(other_input(add, exp.output[0])) != 1.0:
            continue
        last = index.only_consumer(add, "Reciprocal", "Div")
        if last is None:
            continue
        sigmoid = f"{last.output[0]}.sigmoid"
        if last.op_type == "Reciprocal":
            yield [negate, exp, add, last], [helper.make_node("Sigmoid", [x], list(last.output), name=f"{sigmoid}/Sigmoid")]
        elif last.op_type == "Div" and list(last.input) == [x, add.output[0]]:
            yield [negate, exp, add, last], [
                helper.make_node("Sigmoid", [x], [sigmoid], name=f"{sigmoid}/Sigmoid"),
                helper.make_node("Mul", [x, sigmoid], list(last.output), name=f"{sigmoid}/SiLU"),
            ]


Replacement = tuple[list[onnx.NodeProto], list[onnx.NodeProto]]  # nodes dropped, nodes put where the last of them stood


def weight_widths(model: onnx.ModelProto, op_type: str, weight: int, domain: str) -> list[int]:
    """The lengths of the 1-D weights (input ``weight``) of ``model``'s ``op_type`` nodes of ``domain``, each once: the
    widths an op library compiles a per-width kernel for."""
    weights = {tensor.name: tensor for tensor in model.graph.initializer}
    return sorted({weights[node.input[weight]].dims[0] for node in model.graph.node if (node.op_type, node.domain) == (op_type, domain)})


def contrib_rewrite(
    model: onnx.ModelProto,
    find: Callable[[GraphIndex, dict[str, onnx.NodeProto], onnx.GraphProto], Iterator[Replacement]],
    domain: str = CONTRIB_DOMAIN,
) -> int:
    """Rewrite ``model`` in place with the replacements ``find`` yields (given the graph's index, its nodes by
    output and the graph), importing ``domain`` (the ops': ``com.microsoft`` unless the engine's op library's) where
    any was made; returns how many."""
    graph = model.graph
    producers = {output: node for node in graph.node for output in node.output}
    found = list(find(GraphIndex(graph), producers, graph))
    replace_nodes(graph, found)
    if found and all(opset.domain != domain for opset in model.opset_import):  # a Scan graph has no contrib op yet
        model.opset_import.append(helper.make_opsetid(domain, 1))
    return len(found)


def replace_nodes(graph: onnx.GraphProto, replacements: list[Replacement]) -> None:
    """Drop each group of nodes, putting its replacement where the group's last node stood (its inputs
    are all made earlier, so the order stays topological), and the constants only they read."""
    position = {id(node): i for i, node in enumerate(graph.node)}
    dropped: set[int] = set()
    at: dict[int, list[onnx.NodeProto]] = {}
    for old, new in replacements:
        dropped.update(id(node) for node in old)
        at[max(position[id(node)] for node in old)] = new
    nodes = []
    for i, node in enumerate(graph.node):
        nodes += at.get(i, [])
        if id(node) not in dropped:
            nodes.append(node)
    freed = {name for old, _ in replacements for node in old for name in node.input}
    used = {name for node in nodes for name in node.input}
    kept = [tensor for tensor in graph.initializer if tensor.name in used or tensor.name not in freed]
    del graph.node[:], graph.initializer[:]
    graph.node.extend(nodes)
    graph.initializer.extend(kept)


def fuse_norms(model: onnx.ModelProto) -> int:
    """Rewrite ``model`` in place with each RMSNorm and L2 norm as one ``SimplifiedLayerNormalization``;
    returns how many."""
    graph = model.graph
    found = list(rms_norms(GraphIndex(graph), graph))
    for _, _, constants in found:
        graph.initializer.extend(constants)
    replace_nodes(graph, [(old, [new]) for old, new, _ in found])
    return len(found)


def fuse_sigmoids(model: onnx.ModelProto) -> int:
    """Rewrite ``model`` in place with each spelled-out sigmoid as ``Sigmoid`` (SiLU as ``x · Sigmoid(x)``);
    returns how many."""
    graph = model.graph
    found = list(_sigmoids(GraphIndex(graph), graph))
    replace_nodes(graph, found)
    return len(found)
