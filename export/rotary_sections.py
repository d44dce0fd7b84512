"""The rotary embedding's interleaved sections as a selection, in a CUDA build's backbone graphs.

transformers' Qwen3.5 rotary embedding computes its cosines and sines for the T, H and W position rows
(``[3, B, T, D]``) and interleaves them by slice assignment into the T row (``recomposition_frequencies``:
columns ``1, 4, ...`` from H and ``2, 5, ...`` from W, up to three times each section), then doubles the
result (``Concat`` of the row with itself). The exporter writes the assignments as ``ScatterND``s and a
``ScatterElements`` of whole rows with their transposes and index arithmetic, about thirty nodes for the
cosines and as many for the sines of every graph: on the 0.8B member's router request on an H100, 0.76 ms of
``ScatterND`` and most of 0.49 ms of float32 transposes (``benchmarks/h100-call-groups``). Every value of the
result is one of its inputs' values, so the same tensor is ``Where(from_h, X[1], Where(from_w, X[2], X[0]))``
with constant column masks: two ``Where`` and three ``Gather``.

The rewrite does not read the chain's nodes to learn the masks: it runs the chain (ONNX Runtime, CPU) on rows
holding 0, 1 and 2, which gives each column's source row, keeps the chain only if that map is one of the three
rows for every column and position and the chain then gives the selection bit for bit on random rows, and
otherwise leaves the graph as it is. (Doing the selection in the export's torch forward gives the same values,
but the trace then asks for sequences longer than one token at the attention's reshapes.)
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime
from onnx import helper, numpy_helper

from .cuda_fusions import GraphIndex, replace_nodes

ROWS = 3  # T, H and W
PROBE_SHAPE = (2, 3)  # the probe's batch and length: any will do, the chain's columns do not depend on them


def _chain(graph: onnx.GraphProto, index: GraphIndex, producer: dict[str, onnx.NodeProto], rows: str, result: str) -> list[onnx.NodeProto] | None:
    """The nodes between ``rows`` and ``result`` (``result``'s ancestors back to ``rows``, in graph order) where
    they read nothing else but constants and only each other or ``result``'s readers read them; None otherwise."""
    chain: dict[int, onnx.NodeProto] = {}
    pending = [result]
    while pending:
        name = pending.pop()
        if name in index.constants and index.constants[name].data_location == onnx.TensorProto.EXTERNAL:
            return None  # a weight, which no interleaving reads (and the probe could not load)
        if name == rows or name in index.constants or not name:
            continue
        node = producer.get(name)
        if node is None or node.domain:
            return None  # a graph input other than the rows, or a custom op
        if id(node) not in chain:
            chain[id(node)] = node
            pending.extend(node.input)
    for node in chain.values():
        for name in node.output:
            if name != result and (name in index.outputs or any(id(reader) not in chain for reader in index.consumers[name])):
                return None
    if result in index.outputs or rows not in {name for node in chain.values() for name in node.input}:
        return None
    return [node for node in graph.node if id(node) in chain]


def _run(chain: list[onnx.NodeProto], index: GraphIndex, rows: str, result: str, values: np.ndarray, source: onnx.ModelProto) -> np.ndarray:
    """The chain alone on ``values``, as a model of ``source``'s opsets and IR version."""
    read = {name for node in chain for name in node.input}
    constants = [tensor for name, tensor in index.constants.items() if name in read]
    graph = helper.make_graph(
        chain, "rotary_sections", [helper.make_tensor_value_info(rows, onnx.TensorProto.FLOAT, list(values.shape))],
        [helper.make_tensor_value_info(result, onnx.TensorProto.FLOAT, None)], constants,
    )
    model = helper.make_model(graph, opset_imports=source.opset_import, ir_version=source.ir_version)
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {rows: values})[0]


def _sources(chain: list[onnx.NodeProto], index: GraphIndex, rows: str, result: str, width: int, source: onnx.ModelProto) -> np.ndarray | None:
    """Each column's source row (0, 1 or 2) where the chain is that selection, bit for bit; None otherwise."""
    shape = (ROWS, *PROBE_SHAPE, width)
    probe = np.broadcast_to(np.arange(ROWS, dtype=np.float32)[:, None, None, None], shape).copy()
    found = _run(chain, index, rows, result, probe, source)
    if found.shape != shape[1:] or not np.isin(found, np.arange(ROWS)).all() or not (found == found[:1, :1]).all():
        return None
    sources = found[0, 0].astype(np.int64)
    values = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    selected = values[sources, :, :, np.arange(width)].transpose(1, 2, 0)
    return sources if np.array_equal(_run(chain, index, rows, result, values, source), selected) else None


def select_rotary_sections(model: onnx.ModelProto) -> int:
    """Rewrite ``model`` in place with each interleaving of a ``Cos`` or ``Sin`` output's rows as a selection
    (see the module docstring); returns how many."""
    graph = model.graph
    index = GraphIndex(graph)
    producer = {name: node for node in graph.node for name in node.output}
    doubled = [node.input[0] for node in graph.node if node.op_type == "Concat" and len(node.input) == 2 and node.input[0] == node.input[1]]
    replacements = []
    for node in [node for node in graph.node if node.op_type in ("Cos", "Sin") and not node.domain]:
        rows = node.output[0]
        dims = index.dims(rows)
        if not dims or len(dims) != 4 or dims[0] != ROWS or not isinstance(dims[-1], int):
            continue
        for result in doubled:
            chain = _chain(graph, index, producer, rows, result)
            sources = None if chain is None else _sources(chain, index, rows, result, dims[-1], model)
            if sources is None:
                continue
            prefix = f"{result}/rotary_sections"
            constants = [
                numpy_helper.from_array(np.array(row, np.int64), f"{prefix}/row{row}") for row in range(ROWS)
            ] + [numpy_helper.from_array(sources == row, f"{prefix}/from{row}") for row in (1, 2)]
            graph.initializer.extend(constants)
            new = [helper.make_node("Gather", [rows, f"{prefix}/row{row}"], [f"{prefix}/{row}"], axis=0, name=f"{prefix}/gather{row}")
                   for row in range(ROWS)]  # fmt: skip
            new += [
                helper.make_node("Where", [f"{prefix}/from2", f"{prefix}/2", f"{prefix}/0"], [f"{prefix}/w"], name=f"{prefix}/where_w"),
                helper.make_node("Where", [f"{prefix}/from1", f"{prefix}/1", f"{prefix}/w"], [result], name=f"{prefix}/where_h"),
            ]
            replacements.append((chain, new))
    replace_nodes(graph, replacements)
    return len(replacements)
