"""The MLPs' SiLU products as one op (``--fused-silu``): ``SiluProduct`` of the engine's op library.

After the bf16 GEMMs (``s1omni.export.bf16_gemms``) each MLP computes ``down(silu(gate) * up)`` as: the gate's
and the up projection's bfloat16 products cast to float32 (with ``--merged-projections``, one gate|up product
cast, then split into two copies), ``Sigmoid``, ``Mul``, ``Mul``, and a cast of the result to bfloat16 for the
down GEMM: six kernels and their float32 traffic, which ONNX Runtime's CUDA EP has no one kernel for. The op
(``s1omni.export.silu_kernel``, ``gdn_op.cc``) reads the two bfloat16 products (or the merged one's halves, in
place, so its split goes too) and writes the bfloat16 result: the same float32 arithmetic and the one rounding
the graph had. In the 0.8B's merged forward of eight router requests the SiLU alone took 6.5 of 262.7 ms of
kernels, beside the float32 ``Mul``, casts and split copies it comes with, which the profile does not tell
apart from the trunk's (``benchmarks/README.md``, ``h100-op-serving``).

An MLP is rewritten where its nodes are exactly that and read by nothing else; its merged product only where
its halves are 16-byte aligned (the kernel is compiled for aligned pointers), that is I % 8 == 0.
"""

from __future__ import annotations

from collections.abc import Iterator

import onnx
from onnx import TensorProto, helper, numpy_helper

from .bf16_gemms import widened_product
from .cuda_fusions import GraphIndex, Replacement, attribute, contrib_rewrite
from .naming import OP_DOMAIN

SILU_OP = "SiluProduct"
def _silu_gate(index: GraphIndex, producers: dict[str, onnx.NodeProto], silu: onnx.NodeProto) -> tuple[str, onnx.NodeProto] | None:
    """``x`` and its ``Sigmoid`` where ``silu`` is ``Mul(x, Sigmoid(x))``."""
    if silu.op_type != "Mul" or silu.domain:
        return None
    for x, other in (silu.input, reversed(silu.input)):
        sigmoid = producers.get(other)
        if sigmoid is not None and sigmoid.op_type == "Sigmoid" and not sigmoid.domain and sigmoid.input[0] == x:
            return x, sigmoid
    return None


def _sources(index: GraphIndex, producers: dict[str, onnx.NodeProto], gate: str, up: str) -> tuple[list[str], list[onnx.NodeProto]] | None:
    """The op's inputs for float32 ``gate`` and ``up``, and the nodes that made them, which the op replaces:
    two widened products, or the two halves of one merged product's ``Split``."""
    gate_cast, up_cast = widened_product(producers, gate), widened_product(producers, up)
    if gate_cast is not None and up_cast is not None and gate_cast is not up_cast:
        return [gate_cast.input[0], up_cast.input[0]], [gate_cast, up_cast]
    split = producers.get(gate)
    if split is None or split.op_type != "Split" or split.domain or list(split.output) != [gate, up] or len(split.input) != 2:
        return None
    widths = index.constants.get(split.input[1])
    merged = widened_product(producers, split.input[0])
    if widths is None or merged is None or not index.internal(merged.output[0], 1):
        return None
    half = numpy_helper.to_array(widths).tolist()
    rank = index.dims(split.input[0])
    last_axis = attribute(split, "axis", 0) in (-1, *((len(rank) - 1,) if rank else ()))
    if len(half) != 2 or half[0] != half[1] or half[0] % 8 or not last_axis:
        return None
    return [merged.input[0]], [merged, split]


def _silu_products(index: GraphIndex, producers: dict[str, onnx.NodeProto], graph: onnx.GraphProto) -> Iterator[Replacement]:
    for product in graph.node:
        if product.op_type != "Mul" or product.domain:
            continue
        rounded = index.only_consumer(product, "Cast")
        if rounded is None or attribute(rounded, "to") != TensorProto.BFLOAT16:
            continue
        for silu_name, up in (product.input, reversed(product.input)):
            silu = producers.get(silu_name)
            found = silu and _silu_gate(index, producers, silu)
            if not found or not (index.internal(silu_name, 1) and index.internal(up, 1)):
                continue
            gate, sigmoid = found
            sources = index.internal(gate, 2) and index.internal(sigmoid.output[0], 1) and _sources(index, producers, gate, up)
            if not sources:
                continue
            inputs, made = sources
            name = f"{rounded.output[0]}/{SILU_OP}"
            yield [*made, sigmoid, silu, product, rounded], [helper.make_node(SILU_OP, inputs, list(rounded.output), name=name, domain=OP_DOMAIN)]
            break


def fuse_silu_products(model: onnx.ModelProto) -> int:
    """Rewrite ``model`` in place with each MLP's SiLU product as one ``SiluProduct``; returns how many."""
    return contrib_rewrite(model, _silu_products, OP_DOMAIN)
