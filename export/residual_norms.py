"""The residual adds and the RMSNorms after them as one op (``--fused-residual-norms``): ``ResidualRmsNorm`` of the
engine's op library.

After the bf16 GEMMs (``s1omni.export.bf16_gemms``) a layer's residual step reads: the mixer's or the MLP's bfloat16
product cast to float32 (the Gated DeltaNet's through the reshapes and gather that put its rows back in order),
``Add`` to the float32 residual stream, ``SimplifiedLayerNormalization`` (float32 statistics, the (1 + w) weight
baked) and a cast of the result to bfloat16 for the next GEMMs: four kernels and their float32 traffic, where ONNX
Runtime's CUDA EP has no kernel that takes a bfloat16 addend or writes a bfloat16 result beside the float32 sum. The
op (``s1omni.export.residual_norm_kernel``, ``gdn_op.cc``) reads the bfloat16 product and the residual and writes
the sum and the bfloat16 normalized rows, float32 between. The reshapes and gather move ahead of the cast, onto the
bfloat16 product: they only move values, so the op reads what the ``Add`` did.

A norm is rewritten where the next GEMMs' cast to bfloat16 is its only reader, straight or through moves and a
Gated DeltaNet layer's padding mask (a ``Mul`` by a float32 cast of a boolean: 0 or 1, which commutes with the
rounding, so the op rounds first and the mask and moves run on bfloat16), where its weight is
a float32 initializer, and where nothing made before the cast reads the add's sum. The last norm, the backbone's
float32 output, is left alone.
"""

from __future__ import annotations

from collections.abc import Iterator

import onnx
from onnx import TensorProto, helper

from .bf16_gemms import BF16_SUFFIX, widened_product
from .cuda_fusions import GraphIndex, Replacement, attribute, contrib_rewrite, other_input, weight_widths
from .naming import OP_DOMAIN

NORM_OP = "ResidualRmsNorm"
MOVES_VALUES = ("Reshape", "Gather", "Squeeze", "Unsqueeze", "Flatten")  # exact on any type: they commute with a cast


def _bf16_addend(index: GraphIndex, producers: dict[str, onnx.NodeProto], name: str) -> tuple[onnx.NodeProto, list[onnx.NodeProto]] | None:
    """Where float32 ``name`` is a bf16 GEMM's product cast to float32, then only moved (each step read once):
    the cast and the moves after it, in order."""
    moves: list[onnx.NodeProto] = []
    node = producers.get(name)
    while node is not None and node.op_type in MOVES_VALUES and not node.domain and index.internal(node.output[0]):
        moves.insert(0, node)
        node = producers.get(node.input[0])
    cast = widened_product(producers, node.output[0]) if node is not None else None
    return (cast, moves) if cast is not None and index.internal(cast.output[0]) else None


def _moved(move: onnx.NodeProto, source: str, output: str) -> onnx.NodeProto:
    """``move`` again, on the bfloat16 ``source``."""
    attributes = {a.name: helper.get_attribute_value(a) for a in move.attribute}
    return helper.make_node(move.op_type, [source, *move.input[1:]], [output], name=f"{move.name}{BF16_SUFFIX}", **attributes)


def _zero_or_one(producers: dict[str, onnx.NodeProto], boolean_inputs: set[str], name: str) -> bool:
    """Whether float32 ``name`` is a cast of a boolean value (a cast to bool, or a boolean graph input), reshaped or
    expanded on the way: 0 and 1, a factor that commutes with rounding (the padding masks)."""
    cast = producers.get(name)
    if cast is None or cast.op_type != "Cast" or cast.domain or attribute(cast, "to") != TensorProto.FLOAT:
        return False
    source = cast.input[0]
    while source in producers and producers[source].op_type in (*MOVES_VALUES, "Expand") and not producers[source].domain:
        source = producers[source].input[0]
    made = producers.get(source)
    return source in boolean_inputs or (made is not None and made.op_type == "Cast" and not made.domain and attribute(made, "to") == TensorProto.BOOL)


def _bf16_reader(index: GraphIndex, producers: dict[str, onnx.NodeProto], boolean_inputs: set[str], norm: onnx.NodeProto) -> list[onnx.NodeProto] | None:
    """Where ``norm``'s result is read only through a padding mask's ``Mul`` and moves (each read once), then cast to
    bfloat16 for the next GEMMs: those nodes, the cast last."""
    path: list[onnx.NodeProto] = []
    value = norm.output[0]
    node = index.only_consumer(norm, "Mul", "Cast", *MOVES_VALUES)
    if node is not None and node.op_type == "Mul":
        mask = other_input(node, value)
        if mask is None or not _zero_or_one(producers, boolean_inputs, mask):
            return None
        path.append(node)
        value, node = node.output[0], index.only_consumer(node, "Cast", *MOVES_VALUES)
    while node is not None and node.op_type in MOVES_VALUES and node.input[0] == value:
        path.append(node)
        value, node = node.output[0], index.only_consumer(node, "Cast", *MOVES_VALUES)
    if node is None or node.op_type != "Cast" or attribute(node, "to") != TensorProto.BFLOAT16:
        return None
    return [*path, node]


def _residual_norms(index: GraphIndex, producers: dict[str, onnx.NodeProto], graph: onnx.GraphProto) -> Iterator[Replacement]:
    position = {id(node): i for i, node in enumerate(graph.node)}
    boolean_inputs = {value.name for value in graph.input if value.type.tensor_type.elem_type == TensorProto.BOOL}
    for norm in graph.node:
        if norm.op_type != "SimplifiedLayerNormalization" or norm.domain or len([o for o in norm.output if o]) != 1:
            continue
        weight = index.constants.get(norm.input[1]) if len(norm.input) == 2 else None
        add = producers.get(norm.input[0])
        if weight is None or weight.data_type != TensorProto.FLOAT or len(weight.dims) != 1 or add is None:
            continue
        if attribute(norm, "axis", -1) != -1 or attribute(norm, "stash_type", 1) != 1 or add.op_type != "Add" or add.domain:
            continue
        reader = _bf16_reader(index, producers, boolean_inputs, norm)
        if reader is None or len(add.input) != 2:
            continue
        rounded = reader[-1]
        readers = [node for node in index.consumers[add.output[0]] if node is not norm]
        if any(position[id(node)] < position[id(rounded)] for node in readers):
            continue  # the op stands where the cast stood: every other reader of the sum must come after it
        for addend, residual in (add.input, reversed(add.input)):
            found = _bf16_addend(index, producers, addend)
            if found is None:
                continue
            cast, moves = found
            source, made = cast.input[0], []
            for move in moves:  # the same moves, on the bfloat16 product
                made.append(_moved(move, source, f"{move.output[0]}{BF16_SUFFIX}"))
                source = made[-1].output[0]
            after = reader[:-1]  # the mask and the moves, on the bfloat16 result: the last writes what the cast did
            normalized = f"{norm.output[0]}{BF16_SUFFIX}" if after else rounded.output[0]
            op = helper.make_node(NORM_OP, [residual, source, norm.input[1]], [normalized, add.output[0]],
                                  name=f"{rounded.output[0]}/{NORM_OP}", domain=OP_DOMAIN, epsilon=attribute(norm, "epsilon", 1e-5))  # fmt: skip
            made.append(op)
            for k, node in enumerate(after):
                output = rounded.output[0] if k == len(after) - 1 else f"{node.output[0]}{BF16_SUFFIX}"
                if node.op_type == "Mul":
                    mask = other_input(node, norm.output[0])
                    mask_bf16 = f"{node.output[0]}/mask{BF16_SUFFIX}"  # one per norm: the graph may share the mask
                    made.append(helper.make_node("Cast", [mask], [mask_bf16], name=f"{node.name}/mask", to=TensorProto.BFLOAT16))
                    made.append(helper.make_node("Mul", [normalized, mask_bf16], [output], name=f"{node.name}{BF16_SUFFIX}"))
                else:
                    made.append(_moved(node, made[-1].output[0], output))
            yield [cast, *moves, add, norm, *reader], made
            break


def norm_widths(model: onnx.ModelProto) -> list[int]:
    """The row widths of ``model``'s ``ResidualRmsNorm`` nodes (their weights' lengths): what the op library compiles for."""
    return weight_widths(model, NORM_OP, 2, OP_DOMAIN)


def fuse_residual_norms(model: onnx.ModelProto) -> int:
    """Rewrite ``model`` in place with each residual add and the RMSNorm after it as one ``ResidualRmsNorm``; returns how many."""
    return contrib_rewrite(model, _residual_norms, OP_DOMAIN)
