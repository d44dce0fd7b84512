"""The residual adds and their RMSNorms as one op (``s1omni build --fused-residual-norms``,
``s1omni.export.residual_norms``) on the tiny member: the graphs it writes and what they compute, emulated on the CPU
EP (``tests.cuda_builds.residual_norms_emulated`` spells each ``ResidualRmsNorm`` as the graph had it;
``bfloat16_emulated`` rounds each bfloat16 value where it is made), and the op's CUDA kernel on the GPU against the
exact sum and norm of its inputs."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from s1omni.export.bf16_gemms import Bf16Weights
from s1omni.export.cuda_fusions import fuse_norms
from s1omni.export.naming import OP_DOMAIN, OP_TYPE
from s1omni.export.residual_norms import MOVES_VALUES, NORM_OP, fuse_residual_norms, norm_widths
from s1omni.runtime.engine import read_manifest
from s1omni.runtime.runners.onnxruntime_runner import session_options
from tests.cli import run_s1omni
from tests.cuda_builds import needs_cuda, residual_norms_emulated, silu_products_emulated
from tests.test_bf16_convolutions import emulated_outputs, emulated_variants, inlined, prefill_then_continue
from tests.test_silu_products import bf16_built

# The tiny member: 3 Gated DeltaNet layers, then an attention layer; each norm after an add is read by GEMMs (the
# prefill graph's Gated DeltaNet input norms through their padding masks, the packed graph's through moves), but the first layer's input
# norm has no add before it and the last norm is the backbone's float32 output.
FUSED = {"prefill": 7, "continue": 7, "packed": 7}
HIDDEN = 64


def _built(export: Path, graph: str, weights: Bf16Weights, merged: bool, fused: bool) -> onnx.ModelProto:
    """``graph`` as a bf16 build with its SiLU products fused writes it, with or without the residual norms fused."""
    model = bf16_built(export, graph, weights, merged, True)
    if fused:
        assert fuse_residual_norms(model) == FUSED[graph]
    return model


@pytest.mark.parametrize("merged", [True, False], ids=["merged", "unmerged"])
def test_the_op_computes_what_the_graph_did(external_export: Path, tmp_path: Path, merged: bool) -> None:
    """Prefill, then continue from its state: every output of the rewritten graphs, the op spelled back, the same bit
    for bit as the graphs without the rewrite (the moves of the Gated DeltaNet's product before its cast, not after,
    change no value); an op that normalized the residual without its addend is told apart."""
    def built(graph: str, weights: Bf16Weights, fused: bool) -> onnx.ModelProto:
        return silu_products_emulated(_built(external_export, graph, weights, merged, fused))

    outputs = emulated_variants(external_export, tmp_path, built,
                                {"fused": residual_norms_emulated, "no-add": lambda model: residual_norms_emulated(model, add=False)})  # fmt: skip
    assert all(np.array_equal(a, b) for a, b in zip(outputs["fused"], outputs["graph"], strict=True))
    assert not np.array_equal(outputs["no-add"][0], outputs["graph"][0])


def test_each_op_reads_a_bfloat16_product_and_feeds_the_gemms(external_export: Path, tmp_path: Path) -> None:
    """In every graph: each op's addend a GEMM's bfloat16 product (moved, not cast), its normalized rows read by GEMMs
    alone (through the padding mask and moves, in bfloat16), its sum by the next residual step; the adds, norms and
    casts it replaced gone (a bfloat16 cast of each mask it reads made), the rest kept."""
    weights = Bf16Weights(external_export, tmp_path)
    for graph, count in FUSED.items():
        before = Counter(node.op_type for node in _built(external_export, graph, weights, False, False).graph.node)
        model = _built(external_export, graph, weights, False, True)
        nodes = list(model.graph.node)
        producers = {output: node for node in nodes for output in node.output}
        readers = {name: [node for node in nodes if name in node.input] for name in producers}
        ops = [node for node in nodes if node.op_type == NORM_OP]
        assert len(ops) == count and all(node.domain == OP_DOMAIN for node in ops)
        masked = 0
        for op in ops:
            source = producers[op.input[1]]
            while source.op_type in MOVES_VALUES:
                source = producers[source.input[0]]
            assert source.op_type == "MatMul" and source.output[0].endswith("/bf16"), graph
            values, read = [op.output[0]], set()
            while values:  # every reader of the normalized rows, through the mask and the moves
                for node in readers[values.pop()]:
                    read.add(node.op_type)
                    if node.op_type in ("Mul", *MOVES_VALUES):
                        values.append(node.output[0])
                        masked += node.op_type == "Mul"
            assert read - {"Mul", *MOVES_VALUES} == {"MatMul"}, graph
            assert {node.op_type for node in readers[op.output[1]]} <= {"Add", NORM_OP, "SimplifiedLayerNormalization"}
        after = Counter(node.op_type for node in nodes)
        assert before["Add"] - after["Add"] == before["SimplifiedLayerNormalization"] - after["SimplifiedLayerNormalization"] == count
        assert masked == (2 if graph == "prefill" else 0), graph  # its second and third Gated DeltaNet layers
        assert before["Cast"] - after["Cast"] == 2 * count - masked, graph  # the addend's cast up, the result's down; the masks'
        assert norm_widths(model) == [HIDDEN]


def test_a_norm_read_in_float32_is_left_alone(external_export: Path, tmp_path: Path) -> None:
    """A norm whose float32 result something else reads too keeps its nodes; so does a graph without bf16 GEMMs."""
    weights = Bf16Weights(external_export, tmp_path)
    model = _built(external_export, "prefill", weights, False, False)
    producers = {output: node for node in model.graph.node for output in node.output}
    norm = next(node for node in model.graph.node if node.op_type == "SimplifiedLayerNormalization" and producers.get(node.input[0], node).op_type == "Add")
    model.graph.output.append(helper.make_tensor_value_info(norm.output[0], TensorProto.FLOAT, None))
    assert fuse_residual_norms(model) == FUSED["prefill"] - 1
    plain = onnx.load(str(external_export / "continue.fused.onnx"), load_external_data=False)
    fuse_norms(plain)
    before = plain.SerializeToString()
    assert fuse_residual_norms(plain) == 0 and plain.SerializeToString() == before


def test_the_build_option_needs_the_op_library(exported: Path, tmp_path: Path, cuda_engine: Callable[..., tuple[Path, str]]) -> None:
    refused = run_s1omni("build", str(exported), "--backend", "onnxruntime", "--target", "cuda", "--precision", "bf16",
                         "--fused-residual-norms", "--out", str(tmp_path / "refused"))  # fmt: skip
    assert refused.returncode == 2 and "--fused-residual-norms runs the op library" in refused.stderr and not (tmp_path / "refused").exists()
    engine, progress = cuda_engine("--precision", "bf16", "--gated-delta-kernel", OP_TYPE, "--cuda-arch", "90", "--fused-residual-norms")
    assert f"{NORM_OP} nodes" in progress
    manifest = read_manifest(engine)
    assert manifest["fused_residual_norms"] is True and f"residual_rms_norm_{HIDDEN}" in manifest["gated_delta_library"]["kernels"]
    for graph, count in FUSED.items():
        ops = Counter(node.op_type for node in onnx.load(str(engine / f"{graph}.onnx"), load_external_data=False).graph.node)
        assert ops[NORM_OP] == count and ops[OP_TYPE] == 3, graph


def _unit_model(width: int, weight: np.ndarray, epsilon: float) -> onnx.ModelProto:
    """``ResidualRmsNorm`` of a float32 residual and a bfloat16 addend (float32 in and out around it, which numpy can feed)."""
    nodes = [helper.make_node("Cast", ["addend"], ["addend/bf16"], to=TensorProto.BFLOAT16),
             helper.make_node(NORM_OP, ["residual", "addend/bf16", "weight"], ["normalized/bf16", "sum"], name="norm", domain=OP_DOMAIN, epsilon=epsilon),
             helper.make_node("Cast", ["normalized/bf16"], ["normalized"], to=TensorProto.FLOAT)]  # fmt: skip
    inputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in ("residual", "addend")]
    outputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in ("normalized", "sum")]
    graph = helper.make_graph(nodes, "norm", inputs, outputs, [numpy_helper.from_array(weight, "weight")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(OP_DOMAIN, 1)], ir_version=10)


def _bfloat16(values: np.ndarray) -> np.ndarray:
    return torch.from_numpy(values).to(torch.bfloat16).to(torch.float32).numpy()


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("shape", [(1, 1, 64), (2, 37, 1000), (3, 5, 1024), (4096, 2560), (7, 4096)], ids=str)
def test_the_op_rounds_the_exact_norm_on_the_gpu(gpu_library: Path, shape: tuple[int, ...]) -> None:
    """The op, built for this GPU, against float64: the sum exactly float32's, the normalized rows within one bfloat16
    step of the exact norm of that sum times the weight, at most 1% not its nearest bfloat16 (float32 statistics on the
    way), over widths under and at the compiled blocks (64, 1,024, 4,096)."""
    rng = np.random.default_rng(sum(shape))
    epsilon = 1e-6
    weight = (1 + rng.standard_normal(shape[-1]) * 0.1).astype(np.float32)
    residual = (rng.standard_normal(shape) * 4).astype(np.float32)
    addend = _bfloat16(rng.standard_normal(shape).astype(np.float32))
    cuda = [("CUDAExecutionProvider", {"use_tf32": 0}), "CPUExecutionProvider"]
    session = onnxruntime.InferenceSession(_unit_model(shape[-1], weight, epsilon).SerializeToString(), session_options("cuda", gpu_library), providers=cuda)
    normalized, total = session.run(None, {"residual": residual, "addend": addend})
    assert normalized.shape == total.shape == shape
    assert np.array_equal(total, residual + addend)
    x = total.astype(np.float64)
    exact = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + epsilon) * weight
    nearest = _bfloat16(exact.astype(np.float32))
    step = np.spacing(np.abs(nearest)) * 2.0**16
    assert np.all(np.abs(normalized - exact) <= step) and np.mean(normalized != nearest) <= 0.01


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("merged", [True, False], ids=["merged", "unmerged"])
def test_the_cuda_ep_runs_the_rewrite_as_emulated(gpu_library: Path, external_export: Path, tmp_path: Path, merged: bool) -> None:
    """Prefill, then continue from its state, through the rewritten graphs on the CUDA EP (bfloat16 GEMMs, the op
    library's SiLU products and residual norms, the padding masks' bfloat16 ``Mul``) against their emulation here:
    every output within a few bfloat16 steps (cuBLAS, the ops and the CPU sum in other orders, and a value near a
    rounding boundary rounds the other way)."""
    weights = Bf16Weights(external_export, tmp_path)
    models = {graph: _built(external_export, graph, weights, merged, True) for graph in ("prefill", "continue")}
    cuda = [("CUDAExecutionProvider", {"use_tf32": 0}), "CPUExecutionProvider"]
    sessions = [onnxruntime.InferenceSession(inlined(models[graph], external_export, tmp_path), session_options("cuda", gpu_library), providers=cuda)
                for graph in ("prefill", "continue")]  # fmt: skip
    ran = prefill_then_continue(*sessions)
    found = [*ran["prefill"], *ran["continue"]]
    expected = emulated_outputs(external_export, tmp_path / "emulated",
                                lambda graph, w: residual_norms_emulated(silu_products_emulated(_built(external_export, graph, w, merged, True))))  # fmt: skip
    for got, want in zip(found, expected, strict=True):
        scale = float(np.abs(want).max())
        assert float(np.abs(got - want).max()) <= 0.05 * scale and float(np.abs(got - want).mean()) <= 2e-3 * scale
