"""FP8 GEMMs for the reduced copy that ``max_speed`` serves (``s1omni build --target cuda --precision fp8``).

Every ``MatMul`` whose second input is a float32 weight matrix read by ``MatMul`` nodes only, with both
of its dimensions multiples of 16 (cuBLASLt's FP8 alignment), becomes ONNX Runtime's CUDA
``com.microsoft`` ``GemmFloat8`` (microsoft/onnxruntime: onnxruntime/contrib_ops/cuda/math/gemm_float8.cc,
its schema in onnxruntime/core/graph/contrib_ops/contrib_defs.cc; cuBLASLt, sm_89 and newer) on
float8 e4m3 operands:

- the weight ``W [K, N]`` is stored transposed, ``[N, K]`` (the op takes FP8 only as ``transA=0``,
  ``transB=1``), each output channel scaled by its own ``sb[n] = max_k |W[k, n]| / 448`` and rounded to
  e4m3 (nearest, ties to even; ``ml_dtypes``), the scales kept in float32;
- the activation, flattened to rows ``[M, K]``, is scaled per row as it runs, ``sa[m] = max_k |x[m, k]| / 448``
  (at least the smallest normal float, so an all-zero padding row stays zero), and cast to e4m3 with
  saturation: a row's scale is its own, so a request's answers never depend on the rows merged beside
  it (``batching``);
- the op multiplies into float32 with unit scales, and the product is scaled back,
  ``y = (xq @ Wq^T) * sa[m] * sb[n]``, and reshaped to the activation's leading dimensions. Its schema
  (ONNX Runtime 1.31.1) takes ``transA``, ``transB``, ``alpha``, ``beta``, ``dtype`` and ``activation``
  only; the kernel's other settings keep their defaults: row-major operands, ``CUBLAS_COMPUTE_32F``, and
  cuBLASLt's fast FP8 accumulation (on Hopper, partial sums kept at reduced precision inside the tensor
  core before they are added in float32), which the consent gate's figures include.
- the op is given ``A, B, "", scaleA, scaleB``: ONNX Runtime 1.31.1's kernel reads a third input as the
  bias ``C`` (an empty name: none), and a ``scaleY`` beside a float32 output makes cuBLASLt find no
  algorithm (``CUBLAS_STATUS_INVALID_VALUE``: a D scale is for float8 outputs). Both were found on the H200
  (2026-12-01) with every input layout tried (``benchmarks/h200-fp8/``); older ONNX Runtime sources read five
  inputs as ``A, B, scaleA, scaleB, scaleY``, which is why the onnxruntime pin matters here.

The op's per-tensor ``scaleA``/``scaleB`` inputs are ones: per-row and per-channel scales cannot be
expressed through them, and the Mul after the product costs one elementwise pass. Every other
weight GEMM (a dimension off the alignment) runs in bfloat16 as in ``--precision bf16``
(``s1omni.export.bf16_gemms``); everything else stays float32, so the runner is unchanged. The rewritten
graphs import opset 19 (``Cast`` to float8 with ``saturate``).

``GemmFloat8`` allocates its cuBLASLt workspace with ``cudaMalloc`` on every call and frees it again
(``cudaFree`` waits for the device), which a CUDA graph cannot capture: fp8 builds run without CUDA graphs
(``s1omni.export.build``). The same per-call work makes the copy slow: on the H200 the 0.8B synthetic
member's fp8 copy took 10.8 s over the calibration cases against 3.2 s for its bf16 engine with CUDA
graphs, so no copy of this build passes the consent gate's "faster" condition on ONNX Runtime 1.31.1
(``benchmarks/h200-fp8/``, ``docs/max-speed.md``). CPU ONNX Runtime
has no ``GemmFloat8``; the tests run these graphs on the CPU through an emulation
(``tests.cuda_builds.gemm_float8_emulated``: the same casts and scales, the product as a float32 MatMul).
"""

from __future__ import annotations

import functools

import ml_dtypes
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .bf16_gemms import Bf16Weights, float32_array, weight_matrices
from .naming import CONTRIB_DOMAIN

FP8_FILE = "weights.fp8.data"
E4M3_MAX = 448.0  # the largest finite float8 e4m3fn value
ALIGNMENT = 16  # cuBLASLt FP8 GEMMs need K and N multiples of 16
OPSET = 19  # Cast to float8 with saturate
_TINY = float(np.finfo(np.float32).tiny)


def quantize_weight(weight: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``weight [K, N]`` (finite float32) as e4m3 bit patterns ``[N, K]`` (uint8) and its float32 scale per
    output channel ``[N]``: ``weight[k, n] ~= e4m3(bits[n, k]) * scales[n]``. An all-zero channel gets scale 1."""
    if not np.isfinite(weight).all():
        raise ValueError("fp8 quantization: the weights hold a non-finite value")
    weight = np.asarray(weight, dtype=np.float32)
    peaks = np.abs(weight).max(axis=0)
    scales = np.where(peaks > 0, peaks / np.float32(E4M3_MAX), np.float32(1)).astype(np.float32)
    scaled = np.clip(weight / scales, -E4M3_MAX, E4M3_MAX)  # a quotient may round a hair past 448
    bits = np.ascontiguousarray(scaled.T).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    return bits, scales


def eligible(tensor: onnx.TensorProto) -> bool:
    """A float32 matrix whose K and N suit cuBLASLt's FP8 GEMM."""
    return tensor.data_type == TensorProto.FLOAT and len(tensor.dims) == 2 and all(d % ALIGNMENT == 0 for d in tensor.dims)


def _constant(name: str, value: np.ndarray) -> onnx.TensorProto:
    return numpy_helper.from_array(value, name)


def use_fp8_gemms(model: onnx.ModelProto, weights: Bf16Weights) -> int:
    """Rewrite ``model`` in place (see the module docstring); returns how many ``MatMul`` nodes now run in
    float8. ``weights`` places the quantized weights and scales (``FP8_FILE`` when the export's are outside)."""
    graph = model.graph
    matrices = weight_matrices(graph, "fp8", eligible)
    if not matrices:
        return 0
    quantized: list[onnx.TensorProto] = []
    for name, tensor in matrices.items():
        k, n = tensor.dims
        made = functools.cache(lambda tensor=tensor: quantize_weight(float32_array(tensor, weights.source_dir)))  # once for both
        quantized += [
            weights.placed(f"{name}/fp8", TensorProto.FLOAT8E4M3FN, [n, k], lambda made=made: made()[0].tobytes(), [tensor]),
            weights.placed(f"{name}/fp8_scale", TensorProto.FLOAT, [n], lambda made=made: made()[1].tobytes(), [tensor]),
        ]
    kept = [tensor for tensor in graph.initializer if tensor.name not in matrices]
    shared = [
        _constant("fp8/one", np.array(1, np.float32)),
        _constant("fp8/e4m3_max", np.array(E4M3_MAX, np.float32)),
        _constant("fp8/tiny", np.array(_TINY, np.float32)),
        _constant("fp8/last_axis", np.array([-1], np.int64)),
    ]
    del graph.initializer[:]
    graph.initializer.extend(kept + quantized + shared)

    nodes: list[onnx.NodeProto] = []
    shapes: dict[str, np.ndarray] = {}  # the Reshape targets, one per width
    rows_of: set[str] = set()  # activations already flattened, scaled and cast (q, k, v and the gates read one)
    rewritten = 0
    for node in graph.node:
        if node.op_type != "MatMul" or node.input[1] not in matrices:
            nodes.append(node)
            continue
        activation, product, weight = node.input[0], node.output[0], node.input[1]
        k, n = matrices[weight].dims
        a = f"{activation}/fp8"
        if activation not in rows_of:
            rows_of.add(activation)
            nodes += [
                helper.make_node("Shape", [activation], [f"{a}/lead"], end=-1, name=f"{a}/lead"),
                helper.make_node("Reshape", [activation, f"fp8/rows_{k}"], [f"{a}/rows"], name=f"{a}/rows"),
                helper.make_node("Abs", [f"{a}/rows"], [f"{a}/abs"], name=f"{a}/abs"),
                helper.make_node("ReduceMax", [f"{a}/abs", "fp8/last_axis"], [f"{a}/peak"], keepdims=1, name=f"{a}/peak"),
                helper.make_node("Div", [f"{a}/peak", "fp8/e4m3_max"], [f"{a}/raw_scale"], name=f"{a}/raw_scale"),
                helper.make_node("Max", [f"{a}/raw_scale", "fp8/tiny"], [f"{a}/scale"], name=f"{a}/scale"),
                helper.make_node("Div", [f"{a}/rows", f"{a}/scale"], [f"{a}/scaled"], name=f"{a}/scaled"),
                helper.make_node("Cast", [f"{a}/scaled"], [f"{a}/e4m3"], to=TensorProto.FLOAT8E4M3FN, saturate=1, name=f"{a}/e4m3"),
            ]
            shapes[f"fp8/rows_{k}"] = np.array([-1, k], np.int64)
        p = f"{product}/fp8"
        nodes += [
            helper.make_node(
                "GemmFloat8", [f"{a}/e4m3", f"{weight}/fp8", "", "fp8/one", "fp8/one"], [f"{p}/raw"], domain=CONTRIB_DOMAIN,
                transA=0, transB=1, dtype=TensorProto.FLOAT, name=f"{p}/gemm",
            ),  # fmt: skip
            helper.make_node("Mul", [f"{p}/raw", f"{a}/scale"], [f"{p}/rows"], name=f"{p}/rows"),
            helper.make_node("Mul", [f"{p}/rows", f"{weight}/fp8_scale"], [f"{p}/flat"], name=f"{p}/flat"),
            helper.make_node("Concat", [f"{a}/lead", f"fp8/width_{n}"], [f"{p}/shape"], axis=0, name=f"{p}/shape"),
            helper.make_node("Reshape", [f"{p}/flat", f"{p}/shape"], [product], name=f"{p}/unflat"),
        ]
        shapes[f"fp8/width_{n}"] = np.array([n], np.int64)
        rewritten += 1
    del graph.node[:]
    graph.node.extend(nodes)
    graph.initializer.extend(_constant(name, value) for name, value in shapes.items())
    _import_opset(model)
    return rewritten


def _import_opset(model: onnx.ModelProto) -> None:
    """The default domain at ``OPSET`` at least (float8 casts), and ``com.microsoft`` imported."""
    domains = {entry.domain: entry for entry in model.opset_import}
    default = domains.get("") or domains.get("ai.onnx")
    if default is None:
        model.opset_import.append(helper.make_opsetid("", OPSET))
    elif default.version < OPSET:
        default.version = OPSET
    if CONTRIB_DOMAIN not in domains:
        model.opset_import.append(helper.make_opsetid(CONTRIB_DOMAIN, 1))
