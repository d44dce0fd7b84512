"""Short convolutions in bfloat16 (``--bf16-convolutions``): each fused Gated DeltaNet convolution reads its
GEMM's bfloat16 product as it is, sequence-major, and writes bfloat16.

After ``--fused-mixers`` (``s1omni.export.mixer_fusions``) and the bf16 GEMMs (``s1omni.export.bf16_gemms``),
a Gated DeltaNet layer's short convolution still runs in float32 on ``[B, C, T]``: its input projection's
bfloat16 product is cast to float32 (all of it, with merged projections: q|k|v, the output gate, beta's and
the decay's inputs), its q|k|v part transposed to channels-major, convolved, and transposed back, in each
graph of the engine. On the H200 that float32 ``CausalConvPrefillKernel`` was the largest single kernel of
the 0.8B's router request after the Gated DeltaNet rule went to its own op (3.98 of 39.8 ms, and 7.1 of
104 ms on the 4B; ``benchmarks/README.md``, ``h200-chunked-gdn``).

This rewrite gives the convolution what the reference computes it from. The reference runs under BF16
autocast, which runs ``nn.Conv1d`` in bfloat16: its input (already the bfloat16 product) and weight
rounded to bfloat16, the output rounded to bfloat16, then the SiLU in bfloat16
(``vllm-project/semantic-router:src/model-runtime/vllm_srun`` runs transformers' Qwen3.5 module;
``s1omni.runtime.runners.torch_runner``, ``autocast``). Here, for each ``CausalConvWithState`` whose
input is ``Transpose(perm 0,2,1)`` of a bfloat16 product's float32 copy:

- the product's ``Split`` (merged projections) runs on the bfloat16 product, and each part the graph reads
  in float32 is cast after it (a cast and a split commute: the same values); an unmerged product is read
  before its cast;
- the convolution becomes ``CausalConvWithState(channels_last=1)`` on that bfloat16 ``[B, T, C]``, its weight
  rounded to bfloat16 (nearest, ties to even, as autocast rounds it), its past window (continue and
  packed graphs) transposed to ``[B, K-1, C]`` and rounded. ONNX Runtime's kernels accumulate in float32 and
  round once, after the SiLU (``microsoft/onnxruntime:onnxruntime/contrib_ops/cuda/bert/causal_conv_with_state_impl.cu``):
  one rounding where the reference has two;
- its ``[B, C, T]`` output's readers, ``Transpose(perm 0,2,1)``, or a ``Mul`` by the ``[B, 1, T]`` padding
  mask followed by one, read the bfloat16 ``[B, T, C]`` output cast to float32 (and multiplied by the mask
  transposed to ``[B, T, 1]``): what the graph did next is unchanged.

The channels-major copy stays only where something else reads it (the prefill graph's state window). A
convolution whose neighbourhood differs from this is left as it was. ``tests/test_bf16_convolutions.py``
holds the rewritten tiny member to the original graph with the same two roundings, on the CPU EP.
"""

from __future__ import annotations

import onnx
from onnx import TensorProto, helper

from .bf16_gemms import Bf16Weights, widened_product
from .cuda_fusions import GraphIndex, Replacement, attribute, other_input, replace_nodes
from .naming import CONTRIB_DOMAIN

TRANSPOSED = [0, 2, 1]


def _transposes(node: onnx.NodeProto | None) -> bool:
    return node is not None and node.op_type == "Transpose" and not node.domain and list(attribute(node, "perm", [])) == TRANSPOSED


def _cast_of_bf16(producers: dict[str, onnx.NodeProto], name: str) -> onnx.NodeProto | None:
    """The ``Cast`` to float32 that made ``name`` from a bfloat16 GEMM product (``bf16_gemms``' ``.../bf16``)."""
    cast = widened_product(producers, name)
    made = producers.get(cast.input[0]) if cast is not None else None
    return cast if made is not None and made.op_type == "MatMul" else None


def short_convolutions_in_bf16(model: onnx.ModelProto, weights: Bf16Weights) -> int:
    """Rewrite ``model`` in place (see the module docstring); returns how many convolutions now run in bfloat16."""
    graph = model.graph
    index = GraphIndex(graph)
    producers = {output: node for node in graph.node for output in node.output}
    replacements: list[Replacement] = []
    split_in_bf16: set[int] = set()  # the merged products' splits already rewritten
    rounded: dict[str, onnx.TensorProto] = {}
    masks: set[str] = set()  # masks already transposed (once per graph)
    transposed: set[str] = set()  # past windows already transposed and rounded
    count = 0
    for conv in list(graph.node):
        if conv.op_type != "CausalConvWithState" or conv.domain != CONTRIB_DOMAIN or attribute(conv, "channels_last", 0):
            continue
        transpose = producers.get(conv.input[0])
        if not _transposes(transpose):
            continue
        x = transpose.input[0]
        split = producers.get(x)
        split = split if split is not None and split.op_type == "Split" else None
        cast = _cast_of_bf16(producers, split.input[0] if split else x)
        weight = index.constants.get(conv.input[1])
        readers = _output_readers(index, conv)
        present = conv.output[1] if len(conv.output) > 1 else ""
        if cast is None or weight is None or readers is None or (present and (index.consumers[present] or present in index.outputs)):
            continue
        if len(conv.input) > 2 and conv.input[2]:
            continue  # a bias: the exported Gated DeltaNet convolutions have none
        if split is not None and id(split) not in split_in_bf16:
            if index.consumers[cast.output[0]] != [split]:
                continue  # the float32 product is read elsewhere too: splitting the bfloat16 one saves nothing
            split_in_bf16.add(id(split))
            replacements.append(_split_in_bf16(split, cast))
        x16 = f"{x}/bf16" if split is not None else cast.input[0]
        past = conv.input[3] if len(conv.input) > 3 else ""
        inputs = [x16, _rounded_weight(weight, weights, rounded), "", *([f"{past}/cl/bf16"] if past else [])]
        made: list[onnx.NodeProto] = []
        if past and past not in transposed:  # a past window's transpose, made once per graph (prefill's zeros are shared)
            transposed.add(past)
            made += [helper.make_node("Transpose", [past], [f"{past}/cl"], perm=TRANSPOSED, name=f"{past}/to_channels_last"),
                     helper.make_node("Cast", [f"{past}/cl"], [f"{past}/cl/bf16"], to=TensorProto.BFLOAT16, name=f"{past}/cl/to_bf16")]  # fmt: skip
        output = conv.output[0]
        made.append(helper.make_node("CausalConvWithState", inputs, [f"{output}/bf16", f"{output}.present_state"], name=f"{output}/CausalConvWithState.bf16",
                                     domain=CONTRIB_DOMAIN, activation=attribute(conv, "activation", "none"), channels_last=1))  # fmt: skip
        replacements.append(([conv], made))
        for reader, mask, last in readers:  # in place of the transpose back, which comes after the mask too
            widened = last.output[0] if mask is None else f"{last.output[0]}/unmasked"
            instead = [helper.make_node("Cast", [f"{output}/bf16"], [widened], to=TensorProto.FLOAT, name=f"{widened}/to_fp32")]
            if mask is not None:
                if mask not in masks:
                    masks.add(mask)
                    instead.append(helper.make_node("Transpose", [mask], [f"{mask}/cl"], perm=TRANSPOSED, name=f"{mask}/to_channels_last"))
                instead.append(helper.make_node("Mul", [widened, f"{mask}/cl"], list(last.output), name=f"{last.output[0]}/masked"))
            replacements.append(([reader, last] if reader is not last else [last], instead))
        count += 1
    replace_nodes(graph, replacements)  # each replacement where the last node it replaces stood: after its inputs
    _drop_unread(graph)
    graph.initializer.extend(rounded.values())
    return count


def _output_readers(index: GraphIndex, conv: onnx.NodeProto) -> list[tuple[onnx.NodeProto, str | None, onnx.NodeProto]] | None:
    """``(reader, mask, transpose)`` for each reader of ``conv``'s ``[B, C, T]`` output: a ``Transpose(0,2,1)`` (then
    reader is the transpose, mask None) or a ``Mul`` by a mask read back by one; None where any reader is else."""
    output = conv.output[0]
    if output in index.outputs or not index.consumers[output]:
        return None
    found = []
    for reader in index.consumers[output]:
        if _transposes(reader):
            found.append((reader, None, reader))
            continue
        mask = other_input(reader, output) if reader.op_type == "Mul" and not reader.domain else None
        follower = mask and index.only_consumer(reader, "Transpose")
        dims = index.dims(mask) if mask else None
        if not (mask and _transposes(follower) and dims and len(dims) == 3 and dims[1] == 1):
            return None
        found.append((reader, mask, follower))
    return found


def _split_in_bf16(split: onnx.NodeProto, cast: onnx.NodeProto) -> Replacement:
    """``split`` on the bfloat16 product ``cast`` widens, each of its parts cast to float32 after it (the same
    values: a cast commutes with a split; ``_drop_unread`` drops the casts nothing reads), in place of both."""
    bf16_split = onnx.NodeProto()
    bf16_split.CopyFrom(split)
    bf16_split.input[0] = cast.input[0]
    bf16_split.name = f"{split.name}.bf16"
    del bf16_split.output[:]
    bf16_split.output.extend(f"{name}/bf16" for name in split.output)
    casts = [helper.make_node("Cast", [f"{name}/bf16"], [name], to=TensorProto.FLOAT, name=f"{name}/to_fp32") for name in split.output]
    return [cast, split], [bf16_split, *casts]


def _rounded_weight(weight: onnx.TensorProto, weights: Bf16Weights, rounded: dict[str, onnx.TensorProto]) -> str:
    """The name of ``weight`` rounded to bfloat16 (made once per graph)."""
    if weight.name not in rounded:
        copy = onnx.TensorProto()
        copy.CopyFrom(weight)
        copy.name = f"{weight.name}/bf16"
        rounded[weight.name] = weights.rounded(copy)
    return rounded[weight.name].name


def _drop_unread(graph: onnx.GraphProto) -> None:
    """``graph`` without the nodes whose outputs nothing reads any more (a channels-major copy only the
    convolution read, a float32 part of a split product nothing reads), nor what only they read."""
    nodes = list(graph.node)
    outputs = {value.name for value in graph.output}
    while True:
        read = {name for node in nodes for name in node.input} | outputs
        live = [node for node in nodes if any(name in read for name in node.output)]
        if len(live) == len(nodes):
            break
        nodes = live
    del graph.node[:]
    graph.node.extend(nodes)
