"""TensorRT plans: the runner's refusal of foreign plans (everywhere) and ahead-of-time builds (where a library is installed)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from s1omni.export.tensorrt_build import build_plans, profile_shapes, read_graph
from s1omni.runtime.errors import EnvironmentMissing, PackageError
from s1omni.runtime.runners.tensorrt_runner import check_plan, device_compute_capability

HIDDEN, STATE = 16, 8


def manifest(target: str = "sm_89", library: str = "tensorrt", version: str = "10.13.3.9") -> dict:
    return {"export_dir": "exports/tiny", "target": target, "library": library, "library_version": version}


def test_refuses_a_plan_for_another_compute_capability():
    with pytest.raises(PackageError) as refused:
        check_plan(manifest("sm_89"), "sm_90", "tensorrt", "10.13.3.9")
    message = str(refused.value)
    assert "built for sm_89" in message and "this sm_90 GPU" in message
    assert "s1omni build exports/tiny --backend tensorrt --target sm_90" in message


def test_refuses_another_library_or_version_and_a_missing_gpu():
    for library, version in (("tensorrt", "10.14.1.48"), ("tensorrt_rtx", "10.13.3.9")):
        with pytest.raises(PackageError, match="--backend tensorrt --target sm_89"):
            check_plan(manifest("sm_89"), "8.9", library, version)
    with pytest.raises(EnvironmentMissing, match="none is visible"):
        check_plan(manifest("sm_89"), None, "tensorrt", "10.13.3.9")
    check_plan(manifest("sm_89"), "sm_89", "tensorrt", "10.13.3.9")  # a match loads


def test_rtx_refusal_on_hopper_says_rtx_cannot_target_it():
    with pytest.raises(PackageError, match="TensorRT for RTX cannot target sm_90"):
        check_plan(manifest("sm_89", "tensorrt_rtx", "1.7.1.116"), "sm_90", "tensorrt_rtx", "1.7.1.116")


def _model(nodes, inputs, outputs, initializers, opset: int) -> onnx.ModelProto:
    model = helper.make_model(helper.make_graph(nodes, "g", inputs, outputs, initializers), opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    onnx.checker.check_model(model)
    return model


def _weights(name: str, shape: tuple[int, ...], seed: int) -> onnx.TensorProto:
    return numpy_helper.from_array(np.random.default_rng(seed).standard_normal(shape).astype(np.float32) * 0.1, name)


def attention_graph() -> onnx.ModelProto:
    """Q/K/V MatMuls, float32 ``Attention`` (no fused kernel: builds only through the decomposable fallback), LayerNormalization.

    Q, K and V are distinct tensors: one tensor fed to all three crashes the RTX 1.7.1 builder.
    """
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 2, "sequence", HIDDEN])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 2, "sequence", HIDDEN])
    nodes = [helper.make_node("MatMul", ["x", f"w_{name}"], [name]) for name in "qkv"] + [
        helper.make_node("Attention", ["q", "k", "v"], ["a"], is_causal=1),
        helper.make_node("LayerNormalization", ["a", "gamma", "beta"], ["y"], axis=-1),
    ]
    norms = [numpy_helper.from_array(np.ones(HIDDEN, np.float32), "gamma"), numpy_helper.from_array(np.zeros(HIDDEN, np.float32), "beta")]
    return _model(nodes, [x], [y], [*(_weights(f"w_{name}", (HIDDEN, HIDDEN), seed) for seed, name in enumerate("qkv")), *norms], 23)


def recurrence_graph() -> onnx.ModelProto:
    """A ``Scan`` over tokens carrying a float32 ``[B, K, V]`` state, the shape of the Gated DeltaNet recurrence."""
    float_info = helper.make_tensor_value_info
    body = helper.make_graph(
        [
            helper.make_node("Unsqueeze", ["k_t", "last"], ["k_col"]),  # [B, K, 1]
            helper.make_node("Unsqueeze", ["k_t", "middle"], ["k_row"]),  # [B, 1, K]
            helper.make_node("MatMul", ["k_col", "k_row"], ["outer"]),
            helper.make_node("Mul", ["state_in", "decay"], ["decayed"]),
            helper.make_node("Add", ["decayed", "outer"], ["state_out"]),
            helper.make_node("MatMul", ["k_row", "state_out"], ["read"]),
            helper.make_node("Squeeze", ["read", "middle"], ["o_t"]),
        ],
        "step",
        [float_info("state_in", TensorProto.FLOAT, ["batch", STATE, STATE]), float_info("k_t", TensorProto.FLOAT, ["batch", STATE])],
        [float_info("state_out", TensorProto.FLOAT, ["batch", STATE, STATE]), float_info("o_t", TensorProto.FLOAT, ["batch", STATE])],
        [numpy_helper.from_array(np.array([2], np.int64), "last"), numpy_helper.from_array(np.array([1], np.int64), "middle"),
         numpy_helper.from_array(np.array(0.9, np.float32), "decay")],
    )  # fmt: skip
    scan = helper.make_node(
        "Scan", ["state", "keys"], ["final", "reads"], num_scan_inputs=1, body=body, scan_input_axes=[1], scan_output_axes=[1]
    )
    inputs = [
        float_info("state", TensorProto.FLOAT, ["blocks", STATE, STATE]),
        float_info("keys", TensorProto.FLOAT, ["blocks", "block_length", STATE]),
    ]
    outputs = [
        float_info("final", TensorProto.FLOAT, ["blocks", STATE, STATE]),
        float_info("reads", TensorProto.FLOAT, ["blocks", "block_length", STATE]),
    ]
    return _model([scan], inputs, outputs, [], 21)


PROFILES = {
    "prefill": {"batch": (1, 4, 32), "sequence": (1, 128, 512)},
    "continue": {"blocks": (1, 8, 64), "block_length": (1, 32, 256)},
}


def write_graphs(directory: Path) -> Path:
    onnx.save(attention_graph(), directory / "prefill.onnx")
    # External weights: the builder must parse from the path so the data file next to it is found.
    onnx.save(recurrence_graph(), directory / "continue.onnx", save_as_external_data=True, location="continue.data", size_threshold=0)
    return directory


def test_profiles_come_from_the_graphs_dimension_names(tmp_path):
    inputs, outputs, precision = read_graph(write_graphs(tmp_path) / "continue.onnx")
    assert (list(inputs), outputs, precision) == (["state", "keys"], ["final", "reads"], "fp32")
    shapes = profile_shapes(inputs, PROFILES["continue"], "continue")
    assert shapes["keys"] == ((1, 1, STATE), (8, 32, STATE), (64, 256, STATE))
    with pytest.raises(ValueError, match="no range given for dimension"):
        profile_shapes(inputs, {"blocks": (1, 8, 64)}, "continue")
    with pytest.raises(ValueError, match="no input has the dimension"):
        profile_shapes(inputs, {**PROFILES["continue"], "past_length": (1, 1, 1)}, "continue")


def test_rtx_builds_plans_ahead_of_time_on_the_cpu(tmp_path):
    trt = pytest.importorskip("tensorrt_rtx_bindings", reason="TensorRT libraries are not installed")
    out = tmp_path / "engine"
    record = build_plans(write_graphs(tmp_path), out, "sm_89", PROFILES, library="tensorrt_rtx")

    assert record["library"] == "tensorrt_rtx" and record["library_version"] == trt.__version__
    assert (record["target"], record["precision"], record["strongly_typed"], record["timing_cache"]) == ("sm_89", "fp32", True, None)
    assert record["profiles"]["continue"]["keys"] == {"min": [1, 1, STATE], "opt": [8, 32, STATE], "max": [64, 256, STATE]}
    assert record["build_seconds"] >= 0
    for graph in ("prefill", "continue"):
        entry = record["plans"][graph]
        plan = (out / entry["file"]).read_bytes()
        assert plan and len(plan) == entry["bytes"] and hashlib.sha256(plan).hexdigest() == entry["sha256"]
    assert record["plans"]["continue"]["inputs"] == ["state", "keys"]
    assert sorted(path.name for path in out.iterdir()) == ["continue.plan", "prefill.plan"]  # no temporaries left

    check_plan({**record, "member": "m"}, "sm_89", "tensorrt_rtx", trt.__version__)
    with pytest.raises(PackageError, match="cannot target sm_90"):
        check_plan({**record, "member": "m"}, "sm_90", "tensorrt_rtx", trt.__version__)


@pytest.mark.gpu
def test_standard_tensorrt_builds_for_this_gpu_with_a_timing_cache(tmp_path):
    trt = pytest.importorskip("tensorrt", reason="TensorRT libraries are not installed")
    target = device_compute_capability()
    if target is None:
        pytest.skip("standard TensorRT builds on the GPU it targets and no CUDA device is visible")
    record = build_plans(write_graphs(tmp_path), tmp_path / "engine", target, PROFILES, library="tensorrt")
    assert (record["library"], record["library_version"], record["target"]) == ("tensorrt", trt.__version__, target)
    assert (tmp_path / "engine" / record["timing_cache"]).stat().st_size > 0
