"""The CUDA build's op fusion (``s1omni.export.cuda_fusions``) on the tiny member, run here with the CPU EP:
``SimplifiedLayerNormalization`` and ``Sigmoid`` have CPU kernels as well as CUDA ones."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

from s1omni.export.cuda_fusions import fuse_norms, fuse_sigmoids
from s1omni.runtime.runners.base import text_positions
from tests.cuda_builds import validate_on_the_cpu
from tests.onnx_graphs import rms_norm_nodes

SPELLED_OUT = ("Pow", "ReduceMean", "Sqrt", "Reciprocal", "Exp")  # (the rotary keeps its Negs)


def _run(model: onnx.ModelProto | str, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    source = model if isinstance(model, str) else model.SerializeToString()
    return onnxruntime.InferenceSession(source, providers=["CPUExecutionProvider"]).run(None, feeds)


def _prefill_feeds(tokens: int) -> dict[str, np.ndarray]:
    ids = np.random.default_rng(3).integers(1, 2048, tokens)
    return {"input_ids": ids[None], "position_ids": text_positions(0, tokens)[:, None],
            "attention_mask": np.ones((1, tokens), np.int64), "readout_index": np.arange(tokens)[None]}  # fmt: skip


def test_every_norm_and_sigmoid_of_the_exported_graph_becomes_one_op(exported: Path) -> None:
    source = str(exported / "prefill.fused.onnx")
    model = onnx.load(source)
    before = Counter(node.op_type for node in model.graph.node)
    # 14 RMSNorms (Pow) and 6 q/k L2 norms; 14 sigmoids, each spelled Neg -> Exp -> Add -> Reciprocal/Div
    assert (fuse_norms(model), fuse_sigmoids(model)) == (20, 14) == (before["Pow"] + 6, before["Exp"])
    after = Counter(node.op_type for node in model.graph.node)
    assert not any(after[op] for op in SPELLED_OUT), after
    assert after["SimplifiedLayerNormalization"] == 20 and after["Sigmoid"] == 14 and after["Neg"] == before["Neg"] - 14
    assert sum(after.values()) == sum(before.values()) - 146
    used = {name for node in model.graph.node for name in node.input}
    assert all(tensor.name in used for tensor in model.graph.initializer)  # the freed eps and exponents are gone

    feeds = _prefill_feeds(300)
    for fused, spelled in zip(_run(model, feeds), _run(source, feeds), strict=True):
        # float32 rounding only: the median moves ~2e-7 of the scale, the worst element ~3e-5
        scale, moved = np.abs(spelled).max(), np.abs(fused - spelled)
        assert np.median(moved) <= 1e-6 * scale and moved.max() <= 1e-4 * scale


def test_the_rewrite_computes_the_norms_it_replaces() -> None:
    """RMSNorm with its weight folded into the scale, and an L2 norm, each against numpy in float64."""
    size, eps = 24, 1e-6
    weight = np.random.default_rng(0).standard_normal(size).astype(np.float32)
    nodes = [
        *rms_norm_nodes("x", "normed"),
        helper.make_node("Mul", ["weight", "normed"], ["rms"]),
        helper.make_node("Mul", ["x", "x"], ["l2_square"]),
        helper.make_node("ReduceSum", ["l2_square", "last"], ["l2_sum"]),
        helper.make_node("Add", ["l2_sum", "eps"], ["l2_shifted"]),
        helper.make_node("Sqrt", ["l2_shifted"], ["l2_root"]),
        helper.make_node("Reciprocal", ["l2_root"], ["l2_inverse"]),
        helper.make_node("Mul", ["l2_inverse", "x"], ["l2"]),
    ]
    constants = {"two": np.float32(2), "last": np.array([-1]), "eps": np.float32(eps), "weight": weight}
    graph = helper.make_graph(
        nodes, "norms", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["rows", size])],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in ("rms", "l2")],
        [numpy_helper.from_array(np.asarray(value), name) for name, value in constants.items()],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    assert fuse_norms(model) == 2 and [node.op_type for node in model.graph.node] == ["SimplifiedLayerNormalization"] * 2
    x = np.random.default_rng(1).standard_normal((5, size)).astype(np.float32) * 3
    rms, l2 = _run(model, {"x": x})
    wide = x.astype(np.float64)
    assert np.allclose(rms, wide / np.sqrt((wide**2).mean(-1, keepdims=True) + eps) * weight, rtol=1e-6, atol=1e-6)
    assert np.allclose(l2, wide / np.sqrt((wide**2).sum(-1, keepdims=True) + eps), rtol=1e-6, atol=1e-6)


def test_an_intermediate_read_elsewhere_is_left_spelled_out() -> None:
    """A sigmoid whose ``exp(-x)`` feeds another node too cannot go: the rewrite would drop a value still read."""
    nodes = [
        helper.make_node("Neg", ["x"], ["negated"]),
        helper.make_node("Exp", ["negated"], ["exp"]),
        helper.make_node("Add", ["exp", "one"], ["denominator"]),
        helper.make_node("Reciprocal", ["denominator"], ["sigmoid"]),
        helper.make_node("Mul", ["exp", "x"], ["other"]),
    ]
    graph = helper.make_graph(
        nodes, "shared", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in ("sigmoid", "other")],
        [numpy_helper.from_array(np.asarray(np.float32(1)), "one")],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    assert fuse_sigmoids(model) == 0 and len(model.graph.node) == 5


@pytest.mark.parametrize("fusion", [True, False], ids=["fused", "unfused"])
def test_cuda_builds_fuse_unless_told_not_to(exported: Path, cuda_engine: Callable[..., tuple[Path, str]], fusion: bool) -> None:
    options = ["--gated-delta-kernel", "LinearAttention"] + ([] if fusion else ["--no-op-fusion"])
    engine, progress = cuda_engine(*options)
    assert json.loads((engine / "manifest.json").read_text())["op_fusion"] is fusion
    for graph in ("prefill", "continue"):
        built = (engine / f"{graph}.onnx").read_bytes()
        if fusion:
            ops = Counter(node.op_type for node in onnx.load_from_string(built).graph.node)
            assert ops["SimplifiedLayerNormalization"] == 20 and ops["Sigmoid"] == 14
            assert ops["Where"] >= 4 and not ops["ScatterND"] and not ops["ScatterElements"]  # the rotary sections
        else:  # nothing to rewrite: the export's own file
            assert built == (exported / f"{graph}.fused.onnx").read_bytes()
    assert ("prefill.onnx: 20 fused norms, 14 sigmoids, 2 rotary section selections" in progress) is fusion


def test_fused_cuda_engine_answers_as_the_reference_on_the_cpu(cuda_engine: Callable[..., tuple[Path, str]], tiny_vela: Path, tmp_path: Path) -> None:
    """The whole engine with fused ops, answers included, run by the CPU EP: a float32 engine on the CPU,
    so validated at the cpu-fp32 gate, whose every answer-level bound it meets (the GPU gate's are
    looser). Its graphs differ from the export's by float32 rounding alone."""
    engine = tmp_path / "fused"
    shutil.copytree(cuda_engine("--gated-delta-kernel", "LinearAttention")[0], engine)  # the shared build, whose manifest the validation changes
    report = validate_on_the_cpu(engine, tiny_vela, tmp_path / "report.json")
    summary = report["summary"]
    assert report["gate"]["name"] == "cpu-fp32" and summary["layouts_identical"] and summary["usage_identical"]
    assert summary["decisions"] == "340/340" and summary["span_sets"] == "26/26", summary  # the 4 refused questions are held apart, not counted
    assert summary["max_probability"] <= 1e-5 and summary["max_score"] <= 1e-5, summary
