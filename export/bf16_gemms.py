"""BF16 GEMMs for CUDA builds: every weight matrix multiply runs in bfloat16 on the tensor cores.

A float32 engine's GEMMs run on the H200's CUDA cores (``cutlass_80_simt_sgemm``; most of the 4B and
9B engines' kernel time, ``benchmarks/h200-*``). ``--precision bf16`` rewrites each ``MatMul`` whose
second input is a float32 weight matrix: the weight is stored in bfloat16 (rounded to nearest, ties
to even), the activation is cast to bfloat16 on the way in and the product back to float32 on the
way out. ONNX Runtime's CUDA ``MatMul`` for bfloat16 is cuBLAS's with bfloat16 operands and result
and float32 accumulation (``CUBLAS_COMPUTE_32F``; microsoft/onnxruntime:
onnxruntime/core/providers/cuda/shared_inc/fpgeneric.h), i.e. a torch bfloat16 ``nn.Linear``.
Everything else stays float32: embeddings, norms, rotary, attention scores, the Gated DeltaNet rule
and its state, and every input and output of the graphs, so the runner is unchanged.

OmniJev's vision tower (``vision.onnx``) spells its linear layers as ``Gemm`` (``x Wᵀ + b``): each such
``Gemm`` runs in bfloat16 the same way, its bias rounded to bfloat16 too, which is what a torch
``nn.Linear`` under BF16 autocast (the reference's GPU policy) does with it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .cuda_fusions import attribute
from .naming import ALIGNMENT

BF16_SUFFIX = "/bf16"  # what use_bf16_gemms appends to a GEMM's bfloat16 product (and its bfloat16 inputs)

BF16_FILE = "weights.bf16.data"


def bfloat16_bits(values: np.ndarray) -> np.ndarray:
    """``values`` (finite float32) rounded to bfloat16, nearest with ties to even, as uint16 bit patterns."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    if not np.isfinite(values).all():
        raise ValueError("bfloat16 rounding: the weights hold a non-finite value")
    return ((bits + (0x7FFF + ((bits >> 16) & 1))) >> 16).astype(np.uint16)


def float32_array(tensor: onnx.TensorProto, directory: Path) -> np.ndarray:
    """``tensor``'s float32 values, read from its external data file (relative to ``directory``) if it has one.
    Read here, not by ``numpy_helper.to_array``: newer onnx refuses a data file with several hard links, and
    our builds hard-link the export's weights into the engine directories."""
    if tensor.data_location != TensorProto.EXTERNAL:
        return numpy_helper.to_array(tensor)
    if tensor.data_type != TensorProto.FLOAT:
        raise ValueError(f"bf16 GEMMs: {tensor.name} is not float32")
    entries = {entry.key: entry.value for entry in tensor.external_data}
    location = Path(entries["location"])
    if location.is_absolute() or ".." in location.parts:
        raise ValueError(f"bf16 GEMMs: {tensor.name}'s data file {location} is outside the model's directory")
    dims = tuple(tensor.dims)
    count = int(np.prod(dims, dtype=np.int64))
    if "length" in entries and int(entries["length"]) != count * 4:
        raise ValueError(f"bf16 GEMMs: {tensor.name}'s data length does not match its shape {dims}")
    values = np.fromfile(directory / location, dtype=np.float32, count=count, offset=int(entries.get("offset", 0)))
    if values.size != count:
        raise ValueError(f"bf16 GEMMs: {tensor.name}'s data file {location} is too short")
    return values.reshape(dims)


class Bf16Weights:
    """Where the rounded weights go: ``file`` (``BF16_FILE``) in the engine directory when the export kept its
    weights outside the graphs (one copy for both graphs), else inside each graph."""

    def __init__(self, source_dir: Path, target_dir: Path, file: str = BF16_FILE):
        self.source_dir, self.target_dir, self.file = source_dir, target_dir, file
        self.offsets: dict[tuple[int | str, ...], int] = {}
        self.lengths: dict[tuple[int | str, ...], int] = {}

    def rounded(self, tensor: onnx.TensorProto) -> onnx.TensorProto:
        """The float32 ``tensor`` (any shape: a matrix or a bias) rounded, as the bfloat16 initializer of its name."""
        return self.placed(tensor.name, TensorProto.BFLOAT16, tensor.dims,
                           lambda: bfloat16_bits(float32_array(tensor, self.source_dir)).tobytes(), [tensor])  # fmt: skip

    def concatenated(self, parts: Sequence[onnx.TensorProto], name: str) -> onnx.TensorProto:
        """The float32 matrices ``parts`` side by side (``s1omni.export.merged_projections``), each rounded,
        as the bfloat16 initializer ``name``: in ``BF16_FILE`` when every part is outside its graph (written
        once per combination of the export's tensors, whichever graph asks first), else in the graph."""
        shape = [parts[0].dims[0], sum(part.dims[1] for part in parts)]

        def bits() -> bytes:
            return np.concatenate([bfloat16_bits(float32_array(part, self.source_dir)) for part in parts], axis=1).tobytes()

        return self.placed(name, TensorProto.BFLOAT16, shape, bits, parts)

    def placed(self, name: str, data_type: int, dims: Sequence[int], data: Callable[[], bytes], parts: Sequence[onnx.TensorProto]) -> onnx.TensorProto:
        """The initializer ``name`` whose raw bytes ``data`` makes from the export's ``parts``: in ``file`` when every part
        is outside its graph (made and written once per combination of the export's tensors, whichever graph asks
        first: the other finds it there), else inside the graph."""
        if any(part.data_location != TensorProto.EXTERNAL for part in parts):
            return helper.make_tensor(name, data_type, list(dims), data(), raw=True)
        # The export's files and offsets, and what is made of them (a weight and its scales are two tensors).
        key = (data_type, *dims, *(f"{entry.key}={entry.value}" for part in parts for entry in part.external_data))
        if key not in self.offsets:
            raw = data()
            with (self.target_dir / self.file).open("ab") as out:
                out.write(b"\0" * (-out.tell() % ALIGNMENT))
                self.offsets[key] = out.tell()
                out.write(raw)
            self.lengths[key] = len(raw)
        tensor = onnx.TensorProto(name=name, data_type=data_type, dims=list(dims), data_location=TensorProto.EXTERNAL)
        for entry, value in (("location", self.file), ("offset", self.offsets[key]), ("length", self.lengths[key])):
            tensor.external_data.add(key=entry, value=str(value))
        return tensor


def weight_matrices(graph: onnx.GraphProto, what: str, takes: Callable[[onnx.TensorProto], bool],
                    ops: tuple[str, ...] = ("MatMul",)) -> dict[str, onnx.TensorProto]:  # fmt: skip
    """The 2-D initializers ``takes`` accepts whose every reader is one of ``ops`` taking it as its second input, by
    name; ``ValueError`` for a graph with subgraphs (Scan), which a rewrite does not enter."""
    if any(attribute.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for node in graph.node for attribute in node.attribute):
        raise ValueError(f"{what} GEMMs: the graph has subgraphs (Scan); build from the fused graphs")
    readers: dict[str, list[tuple[onnx.NodeProto, int]]] = defaultdict(list)
    for node in graph.node:
        for index, name in enumerate(node.input):
            readers[name].append((node, index))
    return {
        tensor.name: tensor
        for tensor in graph.initializer
        if len(tensor.dims) == 2
        and takes(tensor)
        and readers[tensor.name]
        and all(node.op_type in ops and node.domain in ("", "ai.onnx") and index == 1 for node, index in readers[tensor.name])
    }


def _gemm_biases(graph: onnx.GraphProto, matrices: dict[str, onnx.TensorProto]) -> set[str]:
    """The float32 initializers that are a bfloat16 ``Gemm``'s bias (its third input) and nothing else's."""
    readers: dict[str, int] = defaultdict(int)
    for node in graph.node:
        for name in node.input:
            readers[name] += 1
    float32 = {tensor.name for tensor in graph.initializer if tensor.data_type == TensorProto.FLOAT}
    return {node.input[2] for node in graph.node if node.op_type == "Gemm" and node.input[1] in matrices
            and len(node.input) > 2 and node.input[2] in float32 and readers[node.input[2]] == 1}  # fmt: skip


def use_bf16_gemms(model: onnx.ModelProto, weights: Bf16Weights) -> int:
    """Rewrite ``model`` in place (see the module docstring); returns how many ``MatMul`` and ``Gemm`` nodes now
    run in bfloat16. A weight also read by any other node is left in float32, and so are its products; one
    already in bfloat16 (merged projections, rounded as they were concatenated) is kept as it is."""
    graph = model.graph
    matrices = weight_matrices(graph, "bf16", lambda tensor: tensor.data_type in (TensorProto.FLOAT, TensorProto.BFLOAT16), ("MatMul", "Gemm"))
    biases = _gemm_biases(graph, matrices)

    rounding = biases | {name for name, tensor in matrices.items() if tensor.data_type == TensorProto.FLOAT}
    initializers = [weights.rounded(tensor) if tensor.name in rounding else tensor for tensor in graph.initializer]
    del graph.initializer[:]
    graph.initializer.extend(initializers)
    retyped = {tensor.name for tensor in initializers if tensor.data_type == TensorProto.BFLOAT16}
    kept = [info for info in graph.value_info if info.name not in retyped]  # an exporter's float32 types for them (onnx_ir writes some)
    del graph.value_info[:]
    graph.value_info.extend(kept)
    nodes: list[onnx.NodeProto] = []
    cast_in: set[str] = set()  # activations already cast (q, k, v and the gates read one input)
    rewritten = 0
    for node in graph.node:
        if node.op_type not in ("MatMul", "Gemm") or node.input[1] not in matrices:
            nodes.append(node)
            continue
        if node.op_type == "Gemm" and len(node.input) > 2 and node.input[2] and node.input[2] not in biases:
            bias = node.input[2]  # an activation, or a bias read elsewhere too: cast on the way in
            nodes.append(helper.make_node("Cast", [bias], [f"{bias}/bf16"], to=TensorProto.BFLOAT16, name=f"{bias}/to_bf16"))
            node.input[2] = f"{bias}/bf16"
        activation, product = node.input[0], node.output[0]
        if activation not in cast_in:
            nodes.append(helper.make_node("Cast", [activation], [f"{activation}/bf16"], to=TensorProto.BFLOAT16, name=f"{activation}/to_bf16"))
            cast_in.add(activation)
        node.input[0], node.output[0] = f"{activation}/bf16", f"{product}{BF16_SUFFIX}"
        nodes += [node, helper.make_node("Cast", [f"{product}{BF16_SUFFIX}"], [product], to=TensorProto.FLOAT, name=f"{product}/to_fp32")]
        rewritten += 1
    del graph.node[:]
    graph.node.extend(nodes)
    return rewritten


def widened_product(producers: dict[str, onnx.NodeProto], name: str) -> onnx.NodeProto | None:
    """The ``Cast`` to float32 that made ``name`` from a bfloat16 product (``.../bf16``, as ``use_bf16_gemms`` names a
    GEMM's), if that is what made it."""
    cast = producers.get(name)
    if cast is None or cast.op_type != "Cast" or cast.domain or attribute(cast, "to") != TensorProto.FLOAT:
        return None
    return cast if cast.input[0].endswith(BF16_SUFFIX) else None
