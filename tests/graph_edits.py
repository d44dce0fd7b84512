"""Edits of small ONNX graphs for the graph rewrites' refusal tests: a test edits a copy of a unit graph one way and
expects the rewrite to leave it as it was."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx
from onnx import numpy_helper


def edited(model: onnx.ModelProto, edit: Callable[[onnx.GraphProto], None]) -> onnx.ModelProto:
    """A copy of ``model`` with ``edit`` applied to its graph."""
    copy = onnx.ModelProto.FromString(model.SerializeToString())
    edit(copy.graph)
    return copy


def node_making(graph: onnx.GraphProto, output: str) -> onnx.NodeProto:
    """The node of ``graph`` that makes ``output``."""
    return next(node for node in graph.node if output in node.output)


def set_initializer(graph: onnx.GraphProto, name: str, values: np.ndarray) -> None:
    """The initializer ``name`` of ``graph`` replaced by ``values``."""
    next(tensor for tensor in graph.initializer if tensor.name == name).CopyFrom(numpy_helper.from_array(values, name))


def rewritten_edits(model: onnx.ModelProto, edits: dict[str, Callable[[onnx.GraphProto], None]],
                    rewrite: Callable[[onnx.ModelProto], int]) -> list[str]:  # fmt: skip
    """The names of ``edits`` whose edited copy of ``model`` ``rewrite`` changed (none, where it refuses them all)."""
    changed = []
    for name, edit in edits.items():
        copy = edited(model, edit)
        before = copy.SerializeToString()
        if rewrite(copy) != 0 or copy.SerializeToString() != before:
            changed.append(name)
    return changed
