"""Merged projections: the weight ``MatMul`` nodes that read one activation become one ``MatMul`` and a ``Split``.

Each exported layer projects one normalised activation several times: attention's q (with its gate), k
and v; the Gated DeltaNet's qkv, z, b and a; the MLP's gate and up. On the CUDA EP each projection is a
GEMM launch of its own (and, in a bf16 build, a cast of its product), and the small requests are
launch-bound (``s1omni.export.cuda_fusions``): a bf16 Gated DeltaNet layer's four projections took nine
launches, merged they take four (cast in, GEMM, cast out, split). Merged, a layer's projections are one GEMM over the weights side by side,
``x · [W1 | W2 | …]``, whose columns a ``Split`` on the last axis hands back under the products' own names,
so nothing downstream changes.

The groups are found by structure alone: ``MatMul`` nodes of the top-level graph with the same first
input, each with a 2-D initializer as its second input that nothing else reads, of one type and one
height. Every column of a product is the same dot product before and after, so the values change only
where the GEMM's summation order depends on the matrix's width (not at all with ONNX Runtime's CPU
GEMM on the tiny member; ``tests/test_merged_projections.py``). The merged ``MatMul`` and its ``Split``
take the place of the group's first node; every reader of a product came after its producer, so after
them too.

How the side-by-side weight is made is the caller's: a bf16 build writes it rounded, once for both
graphs (``s1omni.export.bf16_gemms.Bf16Weights.concatenated``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper

# ``concatenate(parts, name)``: the initializer ``name`` holding the 2-D ``parts`` side by side (axis 1).
Concatenate = Callable[[Sequence[onnx.TensorProto], str], onnx.TensorProto]


def projection_groups(graph: onnx.GraphProto) -> list[list[int]]:
    """The weight ``MatMul`` nodes of ``graph`` that can be merged, as positions in ``graph.node``: groups of
    two or more reading one activation, each in graph order."""
    weights = {tensor.name: tensor for tensor in graph.initializer}
    readers: dict[str, int] = defaultdict(int)
    for node in graph.node:
        for name in node.input:
            readers[name] += 1
    groups: dict[tuple[str, int, int], list[int]] = defaultdict(list)
    for position, node in enumerate(graph.node):
        if node.op_type != "MatMul" or node.domain not in ("", "ai.onnx") or node.input[1] not in weights:
            continue
        weight = weights[node.input[1]]
        if len(weight.dims) == 2 and readers[weight.name] == 1:
            groups[(node.input[0], weight.data_type, weight.dims[0])].append(position)
    return [group for group in groups.values() if len(group) > 1]


def merge_projections(model: onnx.ModelProto, concatenate: Concatenate) -> int:
    """Rewrite ``model`` in place (see the module docstring); returns how many groups were merged."""
    graph = model.graph
    weights = {tensor.name: tensor for tensor in graph.initializer}
    replacements: dict[int, list[onnx.NodeProto]] = {}  # position -> its nodes ([] for a merged node but the first)
    merged_weights: set[str] = set()
    initializers = []
    groups = projection_groups(graph)
    for index, group in enumerate(groups):
        nodes = [graph.node[position] for position in group]
        parts = [weights[node.input[1]] for node in nodes]
        name, product, widths = f"merged{index}.weight", f"merged{index}.product", f"merged{index}.widths"
        initializers += [concatenate(parts, name), numpy_helper.from_array(np.array([part.dims[1] for part in parts], np.int64), widths)]
        replacements.update(dict.fromkeys(group[1:], []))
        replacements[group[0]] = [
            helper.make_node("MatMul", [nodes[0].input[0], name], [product], name=f"merged{index}/MatMul"),
            helper.make_node("Split", [product, widths], [node.output[0] for node in nodes], axis=-1, name=f"merged{index}/Split"),
        ]
        merged_weights.update(part.name for part in parts)
    rewritten = [new for position, node in enumerate(graph.node) for new in replacements.get(position, [node])]
    kept = [tensor for tensor in graph.initializer if tensor.name not in merged_weights]
    del graph.node[:]
    graph.node.extend(rewritten)
    del graph.initializer[:]
    graph.initializer.extend(kept + initializers)
    return len(groups)
