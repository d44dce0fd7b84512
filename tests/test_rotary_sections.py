"""The rotary embedding's interleaved sections as a selection (``s1omni.export.rotary_sections``): the exported
graphs' chains replaced, their outputs bit for bit the same on the CPU EP; chains that are not a selection kept."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

from s1omni.export.naming import graph_file
from s1omni.export.onnx_export import continue_example, load_package_backbone, packed_example, prefill_example
from s1omni.export.rotary_sections import select_rotary_sections

SCATTERS = ("ScatterND", "ScatterElements")


def _outputs(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    return onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


@pytest.mark.slow
@pytest.mark.parametrize("graph", ["prefill", "continue", "packed"])
def test_each_graph_s_interleavings_become_selections_with_the_same_outputs(graph: str, exported: Path, tiny_vela: Path) -> None:
    """The cosines' and the sines' chains of every fused graph, with T, H and W position rows that differ (an
    image's do), so that a column taken from the wrong row shows."""
    model = load_package_backbone(tiny_vela)
    examples = {"prefill": prefill_example(model, 37), "continue": continue_example(model, 9), "packed": packed_example(model, 9)}
    original = onnx.load(str(exported / graph_file(graph, "fused")))
    rewritten = copy.deepcopy(original)
    assert select_rotary_sections(rewritten) == 2
    assert not [node for node in rewritten.graph.node if node.op_type in SCATTERS]
    assert len(rewritten.graph.node) < len(original.graph.node) - 50
    onnx.checker.check_model(rewritten)
    feeds = {value.name: arg.numpy() for value, arg in zip(original.graph.input, examples[graph][0], strict=False)}
    feeds["position_ids"] = feeds["position_ids"] + 7 * np.arange(3, dtype=np.int64)[:, None, None]
    for found, expected in zip(_outputs(rewritten, feeds), _outputs(original, feeds), strict=True):
        assert np.array_equal(found, expected)


def _model(chain: list[onnx.NodeProto], extra_inputs: tuple[str, ...] = (), constants: tuple[onnx.TensorProto, ...] = ()) -> onnx.ModelProto:
    """``angles`` [3, b, t, 4] -> Cos -> ``chain`` (making ``y``) -> Concat(y, y)."""
    inputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, [3, "b", "t", 4]) for name in ("angles", *extra_inputs)]
    nodes = [helper.make_node("Cos", ["angles"], ["cos"]), *chain, helper.make_node("Concat", ["y", "y"], ["doubled"], axis=-1)]
    graph = helper.make_graph(nodes, "rotary", inputs, [helper.make_tensor_value_info("doubled", TensorProto.FLOAT, None)], list(constants))
    graph.value_info.append(helper.make_tensor_value_info("cos", TensorProto.FLOAT, [3, "b", "t", 4]))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)


ROW = (numpy_helper.from_array(np.array(0, np.int64), "zero"), numpy_helper.from_array(np.array(1, np.int64), "one"))
MASK = numpy_helper.from_array(np.array([False, True, False, True]), "mask")
SELECTION = [
    helper.make_node("Gather", ["cos", "zero"], ["t"], axis=0),
    helper.make_node("Gather", ["cos", "one"], ["h"], axis=0),
    helper.make_node("Where", ["mask", "h", "t"], ["y"]),
]


def test_a_selection_spelled_otherwise_is_found_by_what_it_computes() -> None:
    model = _model(SELECTION, constants=(*ROW, MASK))
    rewritten = copy.deepcopy(model)
    assert select_rotary_sections(rewritten) == 1
    angles = np.random.default_rng(1).standard_normal((3, 2, 5, 4)).astype(np.float32)
    assert np.array_equal(_outputs(rewritten, {"angles": angles})[0], _outputs(model, {"angles": angles})[0])


@pytest.mark.parametrize(
    ("chain", "extra", "constants"),
    [
        # A value that is no row's: scaled.
        ([*SELECTION[:2], helper.make_node("Where", ["mask", "h", "t"], ["w"]), helper.make_node("Mul", ["w", "two"], ["y"])],
         (), (*ROW, MASK, numpy_helper.from_array(np.array(2.0, np.float32), "two"))),
        # Rows mixed by arithmetic: the probe's values are rows' (0 + 1 = 1), random values are not.
        ([*SELECTION[:2], helper.make_node("Add", ["t", "h"], ["y"])], (), ROW),
        # A chain that reads another input.
        ([SELECTION[0], helper.make_node("Gather", ["other", "zero"], ["o"], axis=0), helper.make_node("Add", ["t", "o"], ["y"])],
         ("other",), ROW),
        # A chain whose step is read outside it.
        ([*SELECTION, helper.make_node("Neg", ["h"], ["elsewhere"])], (), (*ROW, MASK)),
    ],
    ids=["scaled", "added", "another-input", "read-elsewhere"],
)  # fmt: skip
def test_a_chain_that_is_not_a_selection_is_left_alone(chain: list[onnx.NodeProto], extra: tuple[str, ...], constants: tuple) -> None:
    model = _model(chain, extra, constants)
    if "elsewhere" in {name for node in chain for name in node.output}:
        model.graph.output.append(helper.make_tensor_value_info("elsewhere", TensorProto.FLOAT, None))
    rewritten = copy.deepcopy(model)
    assert select_rotary_sections(rewritten) == 0
    assert rewritten == model
