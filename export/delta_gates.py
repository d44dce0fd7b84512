"""The gated delta rule's per-token gates as one op (``--fused-delta-gates``): ``GatedDeltaGates`` of the engine's op
library in place of the nodes that make a ``ChunkedGatedDeltaRule``'s decay and beta.

After the bf16 GEMMs (``s1omni.export.bf16_gemms``) each Gated DeltaNet layer makes the rule's two ``[B, T, H]``
gate inputs from the ``a`` and ``b`` projections' bfloat16 products in eight kernels on a few values a token: the
decay as a cast to float32, ``Add`` of ``dt_bias``, torch's thresholded softplus spelled ``Softplus``, ``Greater``,
``Where``, then ``Mul`` by the folded ``-exp(A_log)`` (and in the prefill graph by the padding mask); beta as a cast
and ``Sigmoid``. ONNX Runtime launches each on
its own, a few microseconds apiece at any size, once a layer and call: on the 0.8B's router request (18 layers, 5
calls) that is 720 launches. The op (``s1omni.export.delta_gates_kernel``) is one launch reading the two products and
writing both gates in float32, the same arithmetic with each function in its accurate form.

A layer is rewritten where the rule's decay and beta are made exactly so, checked on the recorded shapes
(``value_info``): each gate read by its rule alone, every step's output read only by the next, ``dt_bias`` and the
decay scale float32 initializers of ``[H]`` with ``H`` the products' last axis, the threshold a scalar, a mask
``[B, T, 1]`` where there is one, and both products widened from bfloat16 GEMM products (with ``--merged-projections``,
the bfloat16 parts of the merged product's ``Split``). Any other layer keeps them.
"""

from __future__ import annotations

from collections.abc import Iterator

import onnx
from onnx import TensorProto, helper

from .bf16_gemms import widened_product
from .cuda_fusions import GraphIndex, Replacement, contrib_rewrite, other_input
from .naming import OP_DOMAIN, OP_TYPE

GATES_OP = "GatedDeltaGates"
DECAY_INPUT, BETA_INPUT = 3, 4  # the rule's (s1omni.export.gdn_op.cc)


def _made_by(producers: dict[str, onnx.NodeProto], index: GraphIndex, name: str, op_type: str, readers: int = 1) -> onnx.NodeProto | None:
    """The ``op_type`` node (default domain) that made ``name``, where ``readers`` nodes read it and nothing else."""
    node = producers.get(name)
    if node is None or node.op_type != op_type or node.domain or not index.internal(name, readers):
        return None
    return node


def _head_vector(index: GraphIndex, name: str | None, heads: int) -> bool:
    """Whether ``name`` is a float32 initializer of ``[heads]``."""
    tensor = index.constants.get(name or "")
    return tensor is not None and tensor.data_type == TensorProto.FLOAT and list(tensor.dims) == [heads]


def _beta(index: GraphIndex, producers: dict[str, onnx.NodeProto], name: str) -> tuple[list[onnx.NodeProto], str] | None:
    """The nodes making beta ``name`` from a bfloat16 product (a cast, ``Sigmoid``), and that product."""
    sigmoid = _made_by(producers, index, name, "Sigmoid")
    cast = sigmoid and widened_product(producers, sigmoid.input[0])
    if not cast or not index.internal(cast.output[0], 1):
        return None
    return [cast, sigmoid], cast.input[0]


def _where_read_by(producers: dict[str, onnx.NodeProto], node: onnx.NodeProto) -> onnx.NodeProto | None:
    """The ``Where`` (default domain) that makes one of ``node``'s inputs, if one does."""
    return next((producers[x] for x in node.input if x in producers and (producers[x].op_type, producers[x].domain) == ("Where", "")), None)


def _masked(index: GraphIndex, producers: dict[str, onnx.NodeProto], name: str) -> tuple[onnx.NodeProto, onnx.NodeProto | None, str]:
    """The ``Mul`` by the decay scale that made ``name``, or made its factor where ``name`` is that times a mask: the
    scaling node, the masking one (None: none) and the mask."""
    outer = producers[name]
    for term in outer.input:
        inner = _made_by(producers, index, term, "Mul")
        if inner is not None and _where_read_by(producers, inner) is not None:
            return inner, outer, other_input(outer, term) or ""
    return outer, None, ""


def _decay(index: GraphIndex, producers: dict[str, onnx.NodeProto], name: str) -> tuple[list[onnx.NodeProto], list[str], float] | None:
    """The nodes making the decay ``name`` (a cast, ``Add``, ``Softplus``, ``Greater``, ``Where``, ``Mul``, and in the
    prefill graph ``Mul`` by the padding mask), the op's inputs they read (the bfloat16 product, ``dt_bias``, the scale,
    the mask where there is one) and the softplus threshold."""
    if _made_by(producers, index, name, "Mul") is None:
        return None
    scale, masking, mask = _masked(index, producers, name)
    chosen = _where_read_by(producers, scale)
    if not chosen or not index.internal(chosen.output[0], 1):
        return None
    condition, x, softplus_name = chosen.input
    greater = _made_by(producers, index, condition, "Greater")
    softplus = _made_by(producers, index, softplus_name, "Softplus")
    add = _made_by(producers, index, x, "Add", 3)
    if not (greater and softplus and add) or greater.input[0] != x or softplus.input[0] != x:
        return None
    threshold = index.scalar(greater.input[1])
    cast = next((found for found in map(lambda term: widened_product(producers, term), add.input) if found), None)
    if threshold is None or cast is None or not index.internal(cast.output[0], 1):
        return None
    dims = index.dims(cast.output[0])
    heads = dims[-1] if dims else None
    dt_bias, decay_scale = other_input(add, cast.output[0]), other_input(scale, chosen.output[0])
    if not isinstance(heads, int) or not (_head_vector(index, dt_bias, heads) and _head_vector(index, decay_scale, heads)):
        return None
    if masking is None:
        return [cast, add, softplus, greater, chosen, scale], [cast.input[0], dt_bias, decay_scale], threshold
    if mask in index.constants or index.dims(mask) != [*dims[:-1], 1]:
        return None
    return [cast, add, softplus, greater, chosen, scale, masking], [cast.input[0], dt_bias, decay_scale, mask], threshold


def _gates(index: GraphIndex, producers: dict[str, onnx.NodeProto], graph: onnx.GraphProto) -> Iterator[Replacement]:
    for rule in graph.node:
        if rule.op_type != OP_TYPE or rule.domain != OP_DOMAIN or len(rule.input) <= BETA_INPUT:
            continue
        decay, beta = _decay(index, producers, rule.input[DECAY_INPUT]), _beta(index, producers, rule.input[BETA_INPUT])
        if not decay or not beta:
            continue
        (decay_nodes, (a, dt_bias, decay_scale, *mask), threshold), (beta_nodes, b) = decay, beta
        if index.dims(beta_nodes[0].output[0]) != index.dims(decay_nodes[0].output[0]) or a == b:
            continue
        name = f"{rule.name}/{GATES_OP}"
        op = helper.make_node(GATES_OP, [a, b, dt_bias, decay_scale, *mask], [rule.input[DECAY_INPUT], rule.input[BETA_INPUT]],
                              name=name, domain=OP_DOMAIN, threshold=threshold)  # fmt: skip
        yield [*decay_nodes, *beta_nodes], [op]


def use_delta_gates(model: onnx.ModelProto) -> int:
    """Rewrite ``model`` in place with each rule's decay and beta made by one ``GatedDeltaGates``; returns how many."""
    return contrib_rewrite(model, _gates, OP_DOMAIN)
