"""The Gated DeltaNet short convolutions as an op of the engine's library (``--fused-short-convolutions``):
``ShortConvolution`` in place of each bfloat16 ``CausalConvWithState`` that ``--bf16-convolutions`` wrote.

Those nodes (``s1omni.export.bf16_convolutions``) read a layer's bfloat16 product sequence-major, ``[B, T, C]``, with
its weight rounded to bfloat16 and its past window ``[B, K-1, C]``, and ONNX Runtime's CUDA kernel for them gives a
thread each output value on a grid of one block row a token: the largest single kernel of the 0.8B's router request
(3.79 ms in 90 calls, and 6.74 ms in 120 of the 4B's; ``benchmarks/README.md``, ``h100-residual-norms``), about 8x
the time its bytes take at the GPU's bandwidth. The op (``s1omni.export.short_convolution_kernel``, ``gdn_op.cc``)
computes the same sums in the same order, in tiles of tokens by channels, on the node's inputs and outputs as they
are, so nothing else in the graph changes.

A node is rewritten where it is exactly what the op computes: channels-last (``channels_last=1``), one spatial axis,
no dilation or state window, the SiLU its activation, and a bfloat16 ``[C, 1, K]`` weight initializer with C a
multiple of ``CHANNEL_MULTIPLE`` (the op reads rows as 16-byte vectors) and K at least 2 (a window of a row or more).
Any other is left to ONNX Runtime.
"""

from __future__ import annotations

from collections.abc import Iterator

import onnx
from onnx import TensorProto, helper

from .cuda_fusions import GraphIndex, Replacement, attribute, contrib_rewrite
from .naming import CONTRIB_DOMAIN, OP_DOMAIN

CONVOLUTION_OP = "ShortConvolution"
CHANNEL_MULTIPLE = 8  # the op's rows of channels: whole 16-byte vectors of bfloat16 (s1omni.export.gdn_library compiles for it)
# CausalConvWithState's attributes: (the schema's default, the one value the op computes with). The op takes the
# defaults but for the layout and the activation, which --bf16-convolutions sets; a node with any other is left alone.
ATTRIBUTES = {"channels_last": (0, 1), "activation": (b"none", b"silu"), "ndim": (1, 1), "dilation": (1, 1), "state_window": (0, 0)}


def _convolutions(index: GraphIndex, producers: dict[str, onnx.NodeProto], graph: onnx.GraphProto) -> Iterator[Replacement]:
    for conv in graph.node:
        if conv.op_type != "CausalConvWithState" or conv.domain != CONTRIB_DOMAIN or len(conv.output) != 2:
            continue
        unknown = {a.name for a in conv.attribute} - ATTRIBUTES.keys()
        if unknown or any(attribute(conv, name, default) != value for name, (default, value) in ATTRIBUTES.items()):
            continue
        weight = index.constants.get(conv.input[1])
        if weight is None or weight.data_type != TensorProto.BFLOAT16 or len(weight.dims) != 3 or weight.dims[1] != 1:
            continue
        if weight.dims[0] % CHANNEL_MULTIPLE or weight.dims[2] < 2:
            continue
        made = helper.make_node(CONVOLUTION_OP, list(conv.input), list(conv.output), name=f"{conv.name}/{CONVOLUTION_OP}", domain=OP_DOMAIN)
        yield [conv], [made]


def kernel_sizes(model: onnx.ModelProto) -> list[int]:
    """The kernel sizes (taps, K) of ``model``'s ``ShortConvolution`` nodes: what the op library compiles for."""
    weights = {tensor.name: tensor for tensor in model.graph.initializer}
    return sorted({weights[node.input[1]].dims[2] for node in model.graph.node if node.op_type == CONVOLUTION_OP and node.domain == OP_DOMAIN})


def use_convolution_op(model: onnx.ModelProto) -> int:
    """Rewrite ``model`` in place with each bfloat16 channels-last ``CausalConvWithState`` as one ``ShortConvolution``;
    returns how many."""
    return contrib_rewrite(model, _convolutions, OP_DOMAIN)
