"""Each Gated DeltaNet layer's output norm reading the rule's float16 output (``--fused-output-norms``):
``GatedOutputNorm`` of the engine's op library in place of the casts and reshapes around ONNX Runtime's
``GatedRMSNorm``.

With ``--fused-mixers`` (``s1omni.export.mixer_fusions``) a layer's output norm is one ``GatedRMSNorm`` in float32,
but a bf16 build with ``ChunkedGatedDeltaRule`` feeds it casts: the rule's float16 output and the ``z`` projection's
bfloat16 product each cast to float32, and its result cast to bfloat16 for the out projection, four kernels and their
float32 traffic a layer and call (on the H100 the norm took 0.92 ms and the bfloat16 -> float32 casts 0.97 ms of the
0.8B's router request; ``benchmarks/README.md``, ``h100-convolution-heads``). The op (``s1omni.export.output_norm_kernel``)
reads the float16 output and the bfloat16 product and writes the bfloat16 rows: the same norm and SiLU gate in float32,
one rounding.

A norm is rewritten where it is exactly that: a ``GatedRMSNorm`` with ``activation="silu"`` and a float32 ``[D]``
weight, its input the ``ChunkedGatedDeltaRule``'s output cast to float32 and its gate a bfloat16 GEMM product widened
to float32, each through reshapes by constant shapes (which keep the order of values), its result read through one
reshape by a cast to bfloat16 alone, and every value between them read by nothing else. The op writes the norm's
``[N, D]`` rows in bfloat16 and the result's reshape stays (a view), now of the op's output.
"""

from __future__ import annotations

from collections.abc import Iterator

import onnx
from onnx import TensorProto, helper

from .bf16_gemms import widened_product
from .cuda_fusions import GraphIndex, Replacement, attribute, contrib_rewrite, weight_widths
from .naming import CONTRIB_DOMAIN, OP_DOMAIN, OP_TYPE

OUTPUT_NORM_OP = "GatedOutputNorm"


def _through_reshapes(index: GraphIndex, producers: dict[str, onnx.NodeProto], name: str) -> tuple[str, list[onnx.NodeProto]]:
    """The value ``name`` was reshaped from, by constant shapes, each step read by nothing else; and those reshapes."""
    nodes = []
    while (node := producers.get(name)) is not None and node.op_type == "Reshape" and not node.domain and node.input[1] in index.constants:
        if not index.internal(name, 1):
            break
        nodes.append(node)
        name = node.input[0]
    return name, nodes


def _rule_output(index: GraphIndex, producers: dict[str, onnx.NodeProto], name: str) -> tuple[str, list[onnx.NodeProto]] | None:
    """The ``ChunkedGatedDeltaRule`` output that ``name`` is, cast to float32 and reshaped, and the nodes between."""
    source, reshapes = _through_reshapes(index, producers, name)
    cast = producers.get(source)
    if cast is None or cast.op_type != "Cast" or cast.domain or attribute(cast, "to") != TensorProto.FLOAT or not index.internal(source, 1):
        return None
    rule = producers.get(cast.input[0])
    if rule is None or (rule.op_type, rule.domain) != (OP_TYPE, OP_DOMAIN) or rule.output[0] != cast.input[0] or not index.internal(cast.input[0], 1):
        return None
    return cast.input[0], [cast, *reshapes]


def _gate(index: GraphIndex, producers: dict[str, onnx.NodeProto], name: str) -> tuple[str, list[onnx.NodeProto]] | None:
    """The bfloat16 GEMM product that ``name`` is, widened and reshaped, and the nodes between."""
    source, reshapes = _through_reshapes(index, producers, name)
    cast = widened_product(producers, source)
    if cast is None or not index.internal(source, 1):
        return None
    return cast.input[0], [cast, *reshapes]


def _output_norms(index: GraphIndex, producers: dict[str, onnx.NodeProto], graph: onnx.GraphProto) -> Iterator[Replacement]:
    for norm in graph.node:
        if (norm.op_type, norm.domain) != ("GatedRMSNorm", CONTRIB_DOMAIN) or attribute(norm, "activation", b"") not in (b"silu", "silu"):
            continue
        x, weight, z = norm.input
        tensor = index.constants.get(weight)
        rule = _rule_output(index, producers, x)
        gate = _gate(index, producers, z)
        reshape = index.only_consumer(norm, "Reshape")
        cast = reshape and index.only_consumer(reshape, "Cast")
        if tensor is None or tensor.data_type != TensorProto.FLOAT or len(tensor.dims) != 1 or not (rule and gate and cast):
            continue
        dims = index.dims(gate[1][0].output[0])
        if attribute(cast, "to") != TensorProto.BFLOAT16 or dims is None or dims != index.dims(reshape.output[0]):
            continue
        if not isinstance(dims[-1], int) or dims[-1] % tensor.dims[0]:  # the gate's rows: whole heads of D
            continue
        rows = f"{cast.output[0]}/{OUTPUT_NORM_OP}"  # after the name the Reshape gives back, which the graph holds once
        made = [helper.make_node(OUTPUT_NORM_OP, [rule[0], gate[0], weight], [rows], name=f"{norm.name}/{OUTPUT_NORM_OP}", domain=OP_DOMAIN,
                                 epsilon=attribute(norm, "epsilon")),
                helper.make_node("Reshape", [rows, reshape.input[1]], list(cast.output), name=reshape.name)]  # fmt: skip
        yield [*rule[1], *gate[1], norm, reshape, cast], made


def output_norm_widths(model: onnx.ModelProto) -> list[int]:
    """The head sizes of ``model``'s ``GatedOutputNorm`` nodes (their weights' lengths): what the op library compiles for."""
    return weight_widths(model, OUTPUT_NORM_OP, 2, OP_DOMAIN)


def use_output_norms(model: onnx.ModelProto) -> int:
    """Rewrite ``model`` in place with each Gated DeltaNet output norm as one ``GatedOutputNorm``; returns how many."""
    return contrib_rewrite(model, _output_norms, OP_DOMAIN)
