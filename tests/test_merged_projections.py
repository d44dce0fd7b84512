"""Merged projections (``s1omni.export.merged_projections``) on the tiny member's float32 graph, run here.

A bf16 build merges them with its rounded weights; ``tests/test_bf16_gemms.py`` checks that composition.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
from onnx import TensorProto, helper, numpy_helper

from s1omni.export.merged_projections import merge_projections, projection_groups
from s1omni.runtime.runners.base import text_positions


def side_by_side(parts: Sequence[onnx.TensorProto], name: str) -> onnx.TensorProto:
    """The float32 concatenation a float32 graph merges with."""
    return numpy_helper.from_array(np.concatenate([numpy_helper.to_array(part) for part in parts], axis=1), name)


def prefill_feeds(tokens: int) -> dict[str, np.ndarray]:
    ids = np.random.default_rng(4).integers(1, 2048, tokens)
    return {"input_ids": ids[None], "position_ids": text_positions(0, tokens)[:, None],
            "attention_mask": np.ones((1, tokens), np.int64), "readout_index": np.arange(tokens)[None]}  # fmt: skip


def _run(model: onnx.ModelProto | str, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    source = model if isinstance(model, str) else model.SerializeToString()
    return onnxruntime.InferenceSession(source, providers=["CPUExecutionProvider"]).run(None, feeds)


def _largest_difference(model: onnx.ModelProto, source: str) -> float:
    feeds = prefill_feeds(300)
    return max(float(np.abs(got - want).max()) for got, want in zip(_run(model, feeds), _run(source, feeds), strict=True))


def test_each_layer_s_projections_become_one_matmul_and_a_split(exported: Path) -> None:
    source = str(exported / "prefill.fused.onnx")
    model = onnx.load(source)
    before = Counter(node.op_type for node in model.graph.node)
    # 3 Gated DeltaNet layers (qkv, z, b, a), 1 attention layer (q with its gate, k, v), 4 MLPs (gate, up)
    assert sorted(len(group) for group in projection_groups(model.graph)) == [2, 2, 2, 2, 3, 4, 4, 4]
    assert merge_projections(model, side_by_side) == 8
    onnx.checker.check_model(model, full_check=True)
    after = Counter(node.op_type for node in model.graph.node)
    assert after["MatMul"] == before["MatMul"] - 15 and after["Split"] == before["Split"] + 8
    used = {name for node in model.graph.node for name in node.input}
    assert all(tensor.name in used for tensor in model.graph.initializer)  # the parts are gone, one copy each
    weights = {tensor.name: tensor for tensor in model.graph.initializer}
    widths = sorted(tuple(weights[node.input[1]].dims) for node in model.graph.node if node.op_type == "MatMul" and node.input[1] in weights)
    assert (64, 200) in widths and (64, 384) in widths and (64, 256) in widths  # 128+64+4+4, 256+64+64, 128+128
    # ONNX Runtime's CPU GEMM computes each column alike whatever the matrix's width: nothing moves
    assert _largest_difference(model, source) == 0


def test_a_split_in_the_wrong_order_is_caught(exported: Path) -> None:
    """The numerics check is only as good as what it rejects: an MLP's gate and up handed back swapped
    (the same widths, so the graph still runs)."""
    source = str(exported / "prefill.fused.onnx")
    model = onnx.load(source)
    merge_projections(model, side_by_side)
    split = next(node for node in model.graph.node if node.op_type == "Split" and node.name.startswith("merged") and len(node.output) == 2)
    split.output[0], split.output[1] = split.output[1], split.output[0]
    assert _largest_difference(model, source) > 1e-2


def test_only_weights_nothing_else_reads_are_merged() -> None:
    """Two projections of ``x`` whose weights are free, one whose weight is also added elsewhere, one of
    another activation, one by a computed matrix: only the free pair merges, and it computes the same."""
    rng = np.random.default_rng(0)
    weights = {name: rng.standard_normal((8, width)).astype(np.float32) for name, width in (("a", 3), ("b", 5), ("shared", 4), ("other", 2))}
    nodes = [helper.make_node("MatMul", ["x", "a"], ["xa"]), helper.make_node("MatMul", ["x", "b"], ["xb"]),
             helper.make_node("MatMul", ["x", "shared"], ["xs"]), helper.make_node("Add", ["shared", "shared"], ["twice"]),
             helper.make_node("MatMul", ["y", "other"], ["yo"]), helper.make_node("Transpose", ["x"], ["xt"], perm=[1, 0]),
             helper.make_node("MatMul", ["x", "xt"], ["xx"])]  # fmt: skip
    outputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in ("xa", "xb", "xs", "twice", "yo", "xx")]
    graph = helper.make_graph(
        nodes, "projections",
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, [8, 8]) for name in ("x", "y")], outputs,
        [numpy_helper.from_array(value, name) for name, value in weights.items()],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    feeds = {name: rng.standard_normal((8, 8)).astype(np.float32) for name in ("x", "y")}
    want = _run(model, feeds)
    assert merge_projections(model, side_by_side) == 1
    ops = [node.op_type for node in model.graph.node]
    assert ops.count("MatMul") == 4 and ops.count("Split") == 1 and {"a", "b"}.isdisjoint(t.name for t in model.graph.initializer)
    assert all(np.array_equal(g, w) for g, w in zip(_run(model, feeds), want, strict=True))
