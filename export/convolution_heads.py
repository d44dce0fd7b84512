"""The gated delta rule's q, k and v written by the short convolution itself (``--fused-convolution-heads``):
``ShortConvolutionHeads`` of the engine's op library in place of a ``ShortConvolution`` and everything between it and
the ``ChunkedGatedDeltaRule`` that reads its output.

After ``--fused-short-convolutions`` (``s1omni.export.short_convolutions``) a Gated DeltaNet layer still makes the
rule's inputs from the convolution's bfloat16 ``[B, T, C]`` output in a dozen nodes: a cast to float32 (times the
prefill graph's padding mask), a ``Split`` into q, k and v, q's and k's heads repeated to the value heads where the
member has more of those (``Unsqueeze``, ``Expand``, ``Reshape``: the 4B's and 9B's), their l2 norms (one
``SimplifiedLayerNormalization`` each, ``s1omni.export.cuda_fusions``) and the three casts to float16. On the H100
those were 2.5 + 1.8 + 1.1 ms of the 0.8B's router request (``Split``, the norms, the casts) and more on the 4B
(``Expand`` 2.7 ms; ``benchmarks/README.md``, ``h100-residual-norms``). The op's kernel
(``s1omni.export.short_convolution_kernel``) does it all on the convolution's tile in registers, the same float32
values in the same steps: the rounding to bfloat16, the mask, each head's norm, the cast to float16.

A convolution is rewritten where its neighbourhood is exactly that, each step checked on the shapes the export
recorded (``value_info``): its output read only by a cast to float32, then (optionally) a ``Mul`` by a ``[B, T, 1]``
mask, then a three-way ``Split`` of the last axis whose parts reach input 0, 1 and 2 of one ``ChunkedGatedDeltaRule``
through reshapes (which keep the order of values), q's and k's each through one norm over heads of the same size
``key_size`` (a float32 scale of one value, the same for both), optionally one repeat of each head in a row before it
(``Unsqueeze`` of axis 3 of ``[B, T, H, key_size]``, ``Expand`` by ``[1, 1, 1, r, 1]``), and each through one cast to
float16; the rule's inputs ``[B, T, Hv, D]`` (a last ``Reshape`` to ``[0, 0, Hv, -1]``). Nodes that only computed the
shapes of the dropped reshapes go with them. Any other convolution stays a ``ShortConvolution``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .cuda_fusions import GraphIndex, Replacement, attribute, contrib_rewrite, other_input
from .naming import OP_DOMAIN, OP_TYPE
from .short_convolutions import CONVOLUTION_OP

HEADS_OP = "ShortConvolutionHeads"


@dataclass
class _Path:
    """One part of the split, from the ``Split`` to the rule: its nodes and what they do to the values."""

    nodes: list[onnx.NodeProto]
    rule: onnx.NodeProto  # the ChunkedGatedDeltaRule it reaches
    position: int  # the rule's input it is
    heads: int  # the rule's heads
    repeat: int  # how many times each head is repeated in a row
    norm: tuple[int, float, float] | None  # the norm's heads' size, scale and epsilon (None: no norm)


def _dims(index: GraphIndex, producers: dict[str, onnx.NodeProto], name: str) -> list[int | str] | None:
    """``name``'s recorded shape, or its source's through a cast or a transpose."""
    known = index.dims(name)
    node = producers.get(name)
    if known is not None or node is None or node.domain:
        return known
    source = _dims(index, producers, node.input[0]) if node.op_type in ("Cast", "Transpose") else None
    if source is None or node.op_type == "Cast":
        return source
    perm = list(attribute(node, "perm", list(range(len(source)))[::-1]))
    return [source[axis] for axis in perm]


def _uniform_scale(index: GraphIndex, name: str, size: int) -> float | None:
    """The one value of float32 initializer ``name`` of ``size`` values, if it has one."""
    tensor = index.constants.get(name)
    if tensor is None or tensor.data_type != TensorProto.FLOAT or list(tensor.dims) != [size] or tensor.data_location == TensorProto.EXTERNAL:
        return None
    values = numpy_helper.to_array(tensor)
    return float(values[0]) if np.all(values == values[0]) else None


def _repeat(index: GraphIndex, producers: dict[str, onnx.NodeProto], unsqueeze: onnx.NodeProto) -> tuple[list[onnx.NodeProto], int] | None:
    """``Unsqueeze`` of axis 3 of ``[B, T, H, D]``, ``Expand`` by ``[1, 1, 1, r, 1]``, ``Reshape`` to ``[B, T, H r, D]``:
    each head repeated r times in a row (``repeat_interleave``); the three nodes and r."""
    dims = _dims(index, producers, unsqueeze.input[0])
    axes = index.ints(unsqueeze.input[1]) if len(unsqueeze.input) > 1 else list(attribute(unsqueeze, "axes", []))
    expand = index.only_consumer(unsqueeze, "Expand")
    reshape = expand and index.only_consumer(expand, "Reshape")
    if dims is None or len(dims) != 4 or axes != [3] or not reshape or expand.input[0] != unsqueeze.output[0]:
        return None
    factors = index.ints(expand.input[1])
    if factors is None or len(factors) != 5 or factors[:3] + factors[4:] != [1, 1, 1, 1] or factors[3] < 1:
        return None
    repeated = _dims(index, producers, reshape.output[0])
    if repeated != [*dims[:2], dims[2] * factors[3] if isinstance(dims[2], int) else None, dims[3]]:
        return None
    return [unsqueeze, expand, reshape], factors[3]


def _path(index: GraphIndex, producers: dict[str, onnx.NodeProto], part: str, rows: list[int | str]) -> _Path | None:
    """The nodes from split part ``part`` to the rule input it reaches (``Shape`` readers aside: they only size the
    reshapes), if they are reshapes, at most one repeat and one norm (in float32, before the cast), and one cast to
    float16; ``rows`` the split's ``[B, T]``, which every step keeps."""
    nodes: list[onnx.NodeProto] = []
    value, cast, repeat, norm = part, False, 1, None
    while True:
        readers = [node for node in index.consumers[value] if node.op_type != "Shape"]
        if len(readers) != 1:
            return None
        node = readers[0]
        if (node.op_type, node.domain) == (OP_TYPE, OP_DOMAIN):  # the op writes this input (a graph output too, where it is one)
            last = nodes[-1] if nodes else None
            if not cast or last is None or last.op_type != "Reshape" or list(node.input).count(value) != 1:
                return None
            shape, dims = index.ints(last.input[1]), _dims(index, producers, last.input[0])
            if shape is None or len(shape) != 4 or shape[:2] != [0, 0] or shape[3] != -1 or shape[2] < 1 or dims is None or dims[:2] != rows:
                return None
            return _Path(nodes, node, list(node.input).index(value), shape[2], repeat, norm)
        if node.domain or node.input[0] != value or value in index.outputs:
            return None
        dims = _dims(index, producers, value)
        if node.op_type == "Reshape":
            step = [node]
        elif node.op_type == "Unsqueeze" and not cast and norm is None and repeat == 1 and dims is not None and dims[:2] == rows:
            repeated = _repeat(index, producers, node)
            if repeated is None:
                return None
            step, repeat = repeated
        elif node.op_type == "SimplifiedLayerNormalization" and not cast and norm is None:
            if dims is None or len(dims) != 4 or dims[:2] != rows or not isinstance(dims[3], int) or len(node.input) != 2:
                return None
            if attribute(node, "axis", -1) not in (-1, 3) or attribute(node, "stash_type", 1) != 1 or len([o for o in node.output if o]) != 1:
                return None
            scale = _uniform_scale(index, node.input[1], dims[3])
            if scale is None:
                return None
            step, norm = [node], (dims[3], scale, float(attribute(node, "epsilon", 1e-5)))
        elif node.op_type == "Cast" and not cast and attribute(node, "to") == TensorProto.FLOAT16:
            step, cast = [node], True
        else:
            return None
        nodes += step
        value = step[-1].output[0]


def _feeding_only(index: GraphIndex, seeds: list[onnx.NodeProto], dropped: set[int]) -> list[onnx.NodeProto] | None:
    """``seeds`` and every node they feed, where all of them feed only each other and ``dropped`` (so they go with
    it); None where one feeds anything else."""
    side: dict[int, onnx.NodeProto] = {}
    pending = list(seeds)
    while pending:
        node = pending.pop()
        if id(node) in side or id(node) in dropped:
            continue
        side[id(node)] = node
        for output in node.output:
            if output in index.outputs:
                return None
            pending += index.consumers[output]
    return list(side.values())


def _convolution_heads(index: GraphIndex, producers: dict[str, onnx.NodeProto], graph: onnx.GraphProto) -> Iterator[Replacement]:
    position = {id(node): i for i, node in enumerate(graph.node)}
    for conv in graph.node:
        if (conv.op_type, conv.domain) != (CONVOLUTION_OP, OP_DOMAIN) or not index.internal(conv.output[0]):
            continue
        (cast,) = index.consumers[conv.output[0]]
        if cast.op_type != "Cast" or cast.domain or attribute(cast, "to") != TensorProto.FLOAT or not index.internal(cast.output[0]):
            continue
        mask, split = None, index.consumers[cast.output[0]][0]
        if split.op_type == "Mul" and not split.domain and index.internal(split.output[0]):
            mask = other_input(split, cast.output[0])
            masking, split = split, index.consumers[split.output[0]][0]
        dims = _dims(index, producers, split.input[0])
        if split.op_type != "Split" or split.domain or len(split.output) != 3 or dims is None or len(dims) != 3:
            continue
        if mask is not None and _dims(index, producers, mask) != [*dims[:2], 1]:
            continue
        sizes = index.ints(split.input[1]) if len(split.input) > 1 else list(attribute(split, "split", []))
        if attribute(split, "axis", 0) not in (-1, 2) or sizes is None or len(sizes) != 3:
            continue
        paths = [_path(index, producers, part, dims[:2]) for part in split.output]
        if any(path is None for path in paths):
            continue
        q, k, v = paths
        if {id(path.rule) for path in paths} != {id(q.rule)} or [path.position for path in paths] != [0, 1, 2]:
            continue
        if q.norm is None or (k.norm, k.repeat) != (q.norm, q.repeat) or v.norm is not None or v.repeat != 1:
            continue
        key_size, scale, epsilon = q.norm
        key_heads, value_heads = sizes[0] // key_size, q.heads
        if sizes[0] != sizes[1] or sizes[0] % key_size or key_heads * q.repeat != value_heads or {k.heads, v.heads} != {value_heads}:
            continue
        if sizes[2] % value_heads:
            continue
        dropped_nodes = [conv, cast, *([masking] if mask else []), split, *q.nodes, *k.nodes, *v.nodes]
        dropped = {id(node) for node in dropped_nodes}
        written = [q.nodes[-1].output[0], k.nodes[-1].output[0], v.nodes[-1].output[0], conv.output[1]]  # what the op writes
        seeds = [node for kept in dropped_nodes for name in kept.output if name not in written for node in index.consumers[name] if id(node) not in dropped]
        side = _feeding_only(index, seeds, dropped)
        if side is None:
            continue
        last = max(position[id(node)] for node in [*dropped_nodes, *side])
        if any(position[id(node)] < last for node in index.consumers[conv.output[1]]):
            continue  # the op stands where the last dropped node stood: the window's readers must come after it
        inputs = [*conv.input, *[""] * (4 - len(conv.input)), *([mask] if mask else [])]
        made = helper.make_node(
            HEADS_OP, inputs, written,
            name=f"{conv.name}/{HEADS_OP}", domain=OP_DOMAIN, key_heads=key_heads, value_heads=value_heads, key_size=key_size,
            scale=scale, epsilon=epsilon,
        )  # fmt: skip
        yield [*dropped_nodes, *side], [made]


def head_kernels(model: onnx.ModelProto) -> list[tuple[int, int, int]]:
    """The (taps, key size, repeat) of ``model``'s ``ShortConvolutionHeads`` nodes: what the op library compiles for."""
    weights = {tensor.name: tensor for tensor in model.graph.initializer}
    found = set()
    for node in model.graph.node:
        if (node.op_type, node.domain) == (HEADS_OP, OP_DOMAIN):
            facts = {a.name: helper.get_attribute_value(a) for a in node.attribute}
            found.add((weights[node.input[1]].dims[2], facts["key_size"], facts["value_heads"] // facts["key_heads"]))
    return sorted(found)


def use_convolution_heads(model: onnx.ModelProto) -> int:
    """Rewrite ``model`` in place with each ``ShortConvolution`` whose output only becomes a ``ChunkedGatedDeltaRule``'s
    q, k and v as one ``ShortConvolutionHeads`` writing them; returns how many."""
    return contrib_rewrite(model, _convolution_heads, OP_DOMAIN)
