"""FP8 GEMMs (``s1omni build --target cuda --precision fp8``, the copy ``max_speed`` serves).

The weight quantizer is held bit for bit to torch's float8 e4m3fn rounding; the rewritten graph's
structure is checked node by node; its numerics run on the CPU through the emulation
(``tests.cuda_builds.gemm_float8_emulated``), held to an independent numpy computation of the same
scales. On the device (``needs_cuda``) the real ``GemmFloat8`` is held to that emulation, and the tiny
member's fp8 engine runs its calibration cases.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from s1omni.calib import CALIB
from s1omni.export.bf16_gemms import Bf16Weights, float32_array
from s1omni.export.fp8_gemms import E4M3_MAX, FP8_FILE, OPSET, quantize_weight, use_fp8_gemms
from s1omni.export.naming import graph_file
from s1omni.export.reference import load_cases
from s1omni.runtime.engine import load_engine_model, read_manifest, write_manifest
from tests.cli import run_s1omni, s1omni
from tests.cuda_builds import bfloat16_emulated, gated_delta_net_emulated, gemm_float8_emulated, needs_cuda

K, N, ODD = 32, 48, 24


def _e4m3(bits: np.ndarray) -> np.ndarray:
    return torch.from_numpy(bits.copy()).view(torch.float8_e4m3fn).float().numpy()


def test_weights_round_as_torch_s_float8_e4m3fn_per_channel() -> None:
    rng = np.random.default_rng(0)
    weight = (rng.standard_normal((K, N)) * rng.uniform(1e-3, 30, N)).astype(np.float32)
    weight[:, 5] = 0.0  # an all-zero channel: scale 1, zeros kept
    bits, scales = quantize_weight(weight)
    assert bits.shape == (N, K) and bits.dtype == np.uint8 and scales.shape == (N,) and scales.dtype == np.float32
    expected_scales = np.where(np.abs(weight).max(0) > 0, np.abs(weight).max(0) / np.float32(448), 1).astype(np.float32)
    assert np.array_equal(scales, expected_scales) and scales[5] == 1
    reference = torch.from_numpy(weight / scales).to(torch.float8_e4m3fn).view(torch.uint8).numpy().T
    assert np.array_equal(bits, reference)
    assert np.abs(_e4m3(bits)).max() == E4M3_MAX  # each channel's peak is e4m3's largest value
    with pytest.raises(ValueError, match="non-finite"):
        quantize_weight(np.array([[1.0, np.nan]], np.float32))


def test_ties_round_to_even() -> None:
    """Halfway between two e4m3 values (mantissa step 2**-3 at 1): 1 + 2**-4 rounds down to 1, 1 + 3 * 2**-4 up to 1.25."""
    weight = np.array([[448.0], [1 + 2**-4], [1 + 3 * 2**-4], [-(1 + 2**-4)]], np.float32)
    bits, scales = quantize_weight(weight)
    assert scales[0] == 1 and list(_e4m3(bits)[0]) == [448.0, 1.0, 1.25, -1.0]


def _graph() -> onnx.ModelProto:
    """x [B, T, K] through three weights: one float8 takes, one of a width off the alignment, one also read by another node."""
    rng = np.random.default_rng(1)
    weights = {"w_fp8": rng.standard_normal((K, N)), "w_odd": rng.standard_normal((K, ODD)), "w_shared": rng.standard_normal((K, K))}
    nodes = [
        helper.make_node("MatMul", ["x", "w_fp8"], ["y"]),
        helper.make_node("MatMul", ["x", "w_odd"], ["z"]),
        helper.make_node("MatMul", ["x", "w_shared"], ["s"]),
        helper.make_node("Identity", ["w_shared"], ["u"]),
    ]
    graph = helper.make_graph(
        nodes, "gemms", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "t", K])],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in ("y", "z", "s", "u")],
        [numpy_helper.from_array(value.astype(np.float32), name) for name, value in weights.items()],
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=9)


def test_the_rewrite_runs_each_aligned_weight_gemm_in_float8(tmp_path: Path) -> None:
    model = _graph()
    assert use_fp8_gemms(model, Bf16Weights(tmp_path, tmp_path, FP8_FILE)) == 1
    gemms = [node for node in model.graph.node if node.op_type == "GemmFloat8"]
    assert len(gemms) == 1 and gemms[0].domain == "com.microsoft"
    attributes = {a.name: helper.get_attribute_value(a) for a in gemms[0].attribute}
    assert attributes == {"transA": 0, "transB": 1, "dtype": TensorProto.FLOAT}
    assert len(gemms[0].input) == 5 and gemms[0].input[2] == ""  # A, B, no bias, scaleA, scaleB: as ONNX Runtime 1.31.1 reads them
    initializers = {t.name: t for t in model.graph.initializer}
    assert initializers["w_fp8/fp8"].data_type == TensorProto.FLOAT8E4M3FN and list(initializers["w_fp8/fp8"].dims) == [N, K]
    assert "w_fp8" not in initializers and {"w_odd", "w_shared"} <= initializers.keys()  # left to bf16 / float32
    assert [n.op_type for n in model.graph.node if "x" in n.input] == ["Shape", "Reshape", "MatMul", "MatMul"]
    casts = [n for n in model.graph.node if n.op_type == "Cast"]
    assert [helper.get_attribute_value(a) for a in casts[0].attribute if a.name == "saturate"] == [1]
    assert {(o.domain, o.version) for o in model.opset_import} == {("", OPSET), ("com.microsoft", 1)}
    assert not (tmp_path / FP8_FILE).exists()  # the weights were inside the graph: they stay there
    # ONNX Runtime's own schema of GemmFloat8 (registered in its CPU build too) takes the node: only its kernel is missing here.
    with pytest.raises(onnxruntime.capi.onnxruntime_pybind11_state.NotImplemented, match="GemmFloat8"):
        onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def _run(model: onnx.ModelProto, x: np.ndarray, provider: str = "CPUExecutionProvider") -> list[np.ndarray]:
    return onnxruntime.InferenceSession(model.SerializeToString(), providers=[provider]).run(None, {"x": x})


def _expected(x: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """The same product computed apart from the graph: rows scaled by their peak, cast, multiplied, scaled back."""
    rows = x.reshape(-1, K)
    row_scales = np.maximum(np.abs(rows).max(1, keepdims=True) / np.float32(448), np.finfo(np.float32).tiny)
    quantized = torch.from_numpy(rows / row_scales).to(torch.float8_e4m3fn).float().numpy()
    bits, scales = quantize_weight(weight)
    return ((quantized.astype(np.float64) @ _e4m3(bits).T.astype(np.float64)) * row_scales * scales).reshape(*x.shape[:-1], -1)


def test_the_emulated_product_is_the_scaled_float8_product_and_each_row_its_own(tmp_path: Path) -> None:
    source = _graph()
    weight = numpy_helper.to_array(next(t for t in source.graph.initializer if t.name == "w_fp8"))
    model = _graph()
    use_fp8_gemms(model, Bf16Weights(tmp_path, tmp_path, FP8_FILE))
    emulated = gemm_float8_emulated(model)
    x = np.random.default_rng(2).standard_normal((3, 5, K)).astype(np.float32)
    x[1, 2] *= 1000  # a loud row: the others' scales are their own
    x[2, 4] = 0  # an all-zero (padding) row stays zero
    y, z, s, u = _run(emulated, x)
    exact_y, exact_z, exact_s, exact_u = _run(source, x)
    np.testing.assert_allclose(y, _expected(x, weight), rtol=1e-5, atol=1e-5)
    assert np.linalg.norm(y - exact_y) / np.linalg.norm(exact_y) < 0.05  # e4m3's 3 mantissa bits, averaged over K
    assert np.array_equal(z, exact_z) and np.array_equal(s, exact_s) and np.array_equal(u, exact_u) and not y[2, 4].any()
    alone = _run(emulated, x[1:2, 2:3])[0]
    assert np.array_equal(alone[0, 0], y[1, 2])  # a row answers as when it runs alone


def test_weights_outside_the_graphs_are_quantized_once_into_one_file(external_export: Path, tmp_path: Path) -> None:
    """As a real-size member's export keeps them: both graphs point at one copy of each quantized weight and its scales."""
    export = external_export
    weights = Bf16Weights(export, tmp_path, FP8_FILE)
    graphs = [onnx.load(str(export / graph_file(graph, "fused")), load_external_data=False) for graph in ("prefill", "continue")]
    sources = {t.name: t for t in graphs[0].graph.initializer}
    assert [use_fp8_gemms(graph, weights) for graph in graphs] == [25, 25]
    placed = [{t.name: {e.key: e.value for e in t.external_data} for t in graph.graph.initializer if t.name.endswith(("/fp8", "/fp8_scale"))}
              for graph in graphs]  # fmt: skip
    entries = [sorted(tuple(sorted(entry.items())) for entry in graph.values()) for graph in placed]  # the graphs name them apart
    assert entries[0] == entries[1] and all(entry["location"] == FP8_FILE for entry in placed[0].values())
    assert (tmp_path / FP8_FILE).stat().st_size == max(int(e["offset"]) + int(e["length"]) for e in placed[0].values())
    name = next(name for name in placed[0] if name.endswith("/fp8")).removesuffix("/fp8")
    bits, scales = quantize_weight(float32_array(sources[name], export))
    data = (tmp_path / FP8_FILE).read_bytes()
    stored, scale = placed[0][f"{name}/fp8"], placed[0][f"{name}/fp8_scale"]
    assert data[int(stored["offset"]) : int(stored["offset"]) + int(stored["length"])] == bits.tobytes()
    assert data[int(scale["offset"]) : int(scale["offset"]) + int(scale["length"])] == scales.tobytes()


def test_fp8_builds_are_for_cuda_only_without_cuda_graphs(exported: Path, tmp_path: Path) -> None:
    cpu = run_s1omni("build", str(exported), "--backend", "onnxruntime", "--target", "cpu", "--precision", "fp8", "--out", str(tmp_path / "c"))
    assert cpu.returncode == 2 and "--precision fp8" in cpu.stderr and "onnxruntime/cuda only" in cpu.stderr
    graphs = run_s1omni("build", str(exported), "--backend", "onnxruntime", "--target", "cuda", "--precision", "fp8", "--cuda-graphs",
                        "--out", str(tmp_path / "g"))  # fmt: skip
    assert graphs.returncode == 2 and "without CUDA graphs" in graphs.stderr
    assert not (tmp_path / "c").exists() and not (tmp_path / "g").exists()


def test_an_fp8_build_records_its_precision_and_no_cuda_graphs(exported: Path, tmp_path: Path) -> None:
    engine = tmp_path / "fp8"
    progress = s1omni("build", str(exported), "--backend", "onnxruntime", "--target", "cuda", "--precision", "fp8", "--out", str(engine)).stderr
    manifest = read_manifest(engine)
    assert (manifest["precision"], manifest["cuda_graphs"], manifest["validation"]) == ("fp8", False, None)
    assert "float8 GEMMs" in progress
    for graph in ("prefill", "continue"):
        model = onnx.load(str(engine / f"{graph}.onnx"))
        assert sum(node.op_type == "GemmFloat8" for node in model.graph.node) == 25
        # Every node ONNX Runtime's schemas check (GemmFloat8's included) is accepted: with the other CUDA-only
        # nodes emulated, all the CPU lacks is GemmFloat8's kernel.
        others = bfloat16_emulated(gated_delta_net_emulated(model, "fp32"), engine)
        with pytest.raises(onnxruntime.capi.onnxruntime_pybind11_state.NotImplemented, match="GemmFloat8"):
            onnxruntime.InferenceSession(others.SerializeToString(), providers=["CPUExecutionProvider"])


def _relative(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.linalg.norm(got.astype(np.float64) - want) / np.linalg.norm(want))


@pytest.mark.gpu
@needs_cuda
def test_gemm_float8_on_cuda_matches_its_emulation(tmp_path: Path) -> None:
    """The layout ``GemmFloat8`` is given (row-major, ``transB=1``, no bias, unit scales for A and B) against the CPU emulation:
    only the accumulation differs (a transposed or misread operand would be off by its whole size)."""
    model = _graph()
    use_fp8_gemms(model, Bf16Weights(tmp_path, tmp_path, FP8_FILE))
    x = np.random.default_rng(3).standard_normal((2, 7, K)).astype(np.float32)
    cuda = [("CUDAExecutionProvider", {"use_tf32": 0})]  # the float32 MatMuls beside it without TF32
    on_cuda = onnxruntime.InferenceSession(model.SerializeToString(), providers=cuda).run(None, {"x": x})
    y, *rest = _run(gemm_float8_emulated(model), x)
    assert on_cuda[0].shape == y.shape and _relative(on_cuda[0], y) < 1e-3
    for got, want in zip(on_cuda[1:], rest, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def fp8_engine(exported: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    engine = tmp_path_factory.mktemp("fp8") / "engine"
    s1omni("build", str(exported), "--backend", "onnxruntime", "--target", "cuda", "--precision", "fp8", "--out", str(engine))
    return engine


@pytest.mark.gpu
@needs_cuda
def test_the_tiny_fp8_engine_on_cuda_computes_what_its_emulation_does(fp8_engine: Path, tmp_path: Path) -> None:
    """Every calibration case on the CUDA engine, its hidden states held to the same engine emulated on the CPU.

    On the tiny member's random weights the fp8 copy is 37-45% (relative L2) off the float32 engine, and the
    bf16 engine 4-9% (measured with the emulations on the CPU): a misread operand or a lost scale is off by
    all of it or more. What is not: the accumulation (cuBLASLt's fast FP8 accumulation on Hopper) and the
    activations it moves to a neighbouring e4m3 value, which later layers carry on; on the H200 the worst
    block was 16.5% off (2026-12-01), the bound is 25%."""

    emulated = tmp_path / "emulated"
    shutil.copytree(fp8_engine, emulated)
    for graph in ("prefill", "continue"):
        model = onnx.load(str(emulated / f"{graph}.onnx"))
        onnx.save(bfloat16_emulated(gemm_float8_emulated(gated_delta_net_emulated(model, "fp32")), emulated), str(emulated / f"{graph}.onnx"))
    manifest = read_manifest(emulated)
    write_manifest(emulated, {**{k: v for k, v in manifest.items() if k != "files"}, "target": "cpu", "device": "cpu", "provider_options": {}})
    on_cuda = load_engine_model(fp8_engine, device="cuda", allow_unvalidated=True)
    on_cpu = load_engine_model(emulated, allow_unvalidated=True)
    worst = 0.0
    for case in load_cases(CALIB / "vela2"):
        plan = on_cuda.plan(case["request"])
        got, want = on_cuda.forward([plan])[0], on_cpu.forward([plan])[0]
        for got_blocks, want_blocks in zip(got, want, strict=True):
            for g, w in zip(got_blocks, want_blocks, strict=True):
                assert np.isfinite(g).all() and g.shape == w.shape
                if w.size:  # a block with no readouts has nothing to compare
                    worst = max(worst, _relative(g, w))
        on_cuda.finish(plan, on_cuda.readout(plan, got))  # answers, whatever they are
    assert worst < 0.25, f"hidden states {worst:.2e} off the emulation (relative L2, worst block)"
