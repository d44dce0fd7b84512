"""A full-attention layer's q and k head norms and partial rotary embedding as one op each (``--fused-head-rotary``):
``HeadNormRotary`` of the engine's op library in place of the dozen nodes between a projection's heads and the
attention's transposed q or k.

The export spells each of q and k as ``SimplifiedLayerNormalization`` over the head (``s1omni.export.cuda_fusions``),
``Transpose`` to ``[B, H, T, D]``, then the rotation of the first ``R`` values (``rotate_half``): a ``Slice`` of them and
of the rest, two of the rotated part's halves, ``Neg``, ``Concat``, ``Mul`` by ``cos`` and by ``sin``, ``Add``, and a
``Concat`` of the rotated and the passed values. ONNX Runtime runs each as a kernel of its own, a few microseconds at
any size: 24 a full-attention layer and call, 720 of the 0.8B's router request (6 layers, 5 calls). The op
(``s1omni.export.head_rotary_kernel``) is one launch for all of them, the same float32 steps.

A norm is rewritten where its neighbourhood is exactly that, checked on the constants and the recorded shapes
(``value_info``): a ``[B, T, H, D]`` float32 input and a ``[D]`` weight, the transpose ``[0, 2, 1, 3]``, the slices of
the last axis with step 1 (the rotated ``[0, R)`` and the rest ``[R, D)``, its halves ``[0, R/2)`` and ``[R/2, R)``),
the ``Concat`` of the negated second half and the first, ``cos`` multiplying the rotated values and ``sin`` their
rotation, both ``[B, 1, T, R]``, and every value between read by nothing else. Any other norm stays as it was.
"""

from __future__ import annotations

from collections.abc import Iterator

import onnx
from onnx import helper

from .cuda_fusions import GraphIndex, Replacement, attribute, contrib_rewrite, other_input, weight_widths
from .naming import OP_DOMAIN

HEAD_ROTARY_OP = "HeadNormRotary"


def _last_axis_slice(index: GraphIndex, node: onnx.NodeProto, width: int) -> tuple[int, int] | None:
    """``[start, end)`` of a ``Slice`` of the last axis (of ``width`` values) with step 1, ends clamped; None otherwise."""
    if node.op_type != "Slice" or node.domain or len(node.input) < 4:
        return None
    starts, ends, axes = (index.ints(name) for name in node.input[1:4])
    steps = index.ints(node.input[4]) if len(node.input) > 4 and node.input[4] else [1]
    if not (starts and ends and axes and steps) or len(starts) != 1 or axes[0] not in (-1, 3) or steps != [1]:
        return None
    return starts[0], min(ends[0], width)


def _last_axis_concat(node: onnx.NodeProto | None, inputs: list[str]) -> bool:
    return node is not None and list(node.input) == inputs and attribute(node, "axis") in (-1, 3)


def _head_rotaries(index: GraphIndex, producers: dict[str, onnx.NodeProto], graph: onnx.GraphProto) -> Iterator[Replacement]:
    for norm in graph.node:
        if norm.op_type != "SimplifiedLayerNormalization" or norm.domain or attribute(norm, "axis", -1) not in (-1, 3):
            continue
        x, weight = norm.input[:2]
        dims, tensor = index.dims(x), index.constants.get(weight)
        if dims is None or len(dims) != 4 or not isinstance(dims[3], int) or tensor is None or list(tensor.dims) != [dims[3]]:
            continue
        width = dims[3]
        transpose = index.only_consumer(norm, "Transpose")
        if transpose is None or list(attribute(transpose, "perm")) != [0, 2, 1, 3] or transpose.output[0] in index.outputs:
            continue
        parts = {_last_axis_slice(index, node, width): node for node in index.consumers[transpose.output[0]]}
        rotary = next((end for start, end in filter(None, parts) if start == 0 and end < width), None)
        if len(index.consumers[transpose.output[0]]) != 2 or len(parts) != 2 or rotary is None or rotary % 2 or (rotary, width) not in parts:
            continue
        rotated, passed = parts[(0, rotary)], parts[(rotary, width)]
        readers = index.consumers[rotated.output[0]]
        halves = {_last_axis_slice(index, node, rotary): node for node in readers if node.op_type == "Slice"}
        scaled = [node for node in readers if node.op_type == "Mul" and not node.domain]
        if len(readers) != 3 or set(halves) != {(0, rotary // 2), (rotary // 2, rotary)} or len(scaled) != 1 or rotated.output[0] in index.outputs:
            continue
        low, high = halves[(0, rotary // 2)], halves[(rotary // 2, rotary)]
        negated = index.only_consumer(high, "Neg")
        turned = negated and index.only_consumer(negated, "Concat")
        if not (negated and turned and _last_axis_concat(turned, [negated.output[0], low.output[0]])):
            continue
        if index.only_consumer(low, "Concat") is not turned:
            continue
        by_sin = index.only_consumer(turned, "Mul")
        total = by_sin and index.only_consumer(by_sin, "Add")
        cos, sin = other_input(scaled[0], rotated.output[0]), by_sin and other_input(by_sin, turned.output[0])
        if not total or index.only_consumer(scaled[0], "Add") is not total or not cos or not sin:
            continue
        joined = index.only_consumer(total, "Concat")
        if not _last_axis_concat(joined, [total.output[0], passed.output[0]]) or index.only_consumer(passed, "Concat") is not joined:
            continue
        angles = [dims[0], 1, dims[1], rotary]
        if index.dims(cos) != angles or index.dims(sin) != angles:
            continue
        made = helper.make_node(HEAD_ROTARY_OP, [x, weight, cos, sin], list(joined.output), name=f"{norm.name}/{HEAD_ROTARY_OP}", domain=OP_DOMAIN,
                                epsilon=attribute(norm, "epsilon"))  # fmt: skip
        yield [norm, transpose, rotated, passed, low, high, negated, turned, scaled[0], by_sin, total, joined], [made]


def head_rotary_widths(model: onnx.ModelProto) -> list[int]:
    """The head sizes of ``model``'s ``HeadNormRotary`` nodes (their weights' lengths): what the op library compiles for."""
    return weight_widths(model, HEAD_ROTARY_OP, 1, OP_DOMAIN)


def use_head_rotary(model: onnx.ModelProto) -> int:
    """Rewrite ``model`` in place with each q and k head norm and rotary embedding as one ``HeadNormRotary``; returns how many."""
    return contrib_rewrite(model, _head_rotaries, OP_DOMAIN)
