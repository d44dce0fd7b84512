"""``s1omni.export.cpu_exp``: the CPU build's float64 exponentials.

On a hand-made graph (an ``Exp`` at the top and one inside a ``Scan`` body), ONNX Runtime's CPU EP then
gives exactly the float64 exp rounded once to float32, over the whole range a float32 exp takes. That
the CPU engine's graphs are the export's so rewritten, and that they meet the cpu-fp32 gate, is
``test_engine_pipeline``'s to show.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime
from onnx import TensorProto, helper

from s1omni.export.cpu_exp import exp_in_float64

# From where exp underflows to where it overflows in float32, and the small values SiLU and the decays see.
VALUES = np.concatenate([np.linspace(-103.0, 88.7, 200_001), np.geomspace(1e-8, 1.0, 10_001) * -1]).astype(np.float32)


def _graph() -> onnx.ModelProto:
    """``top = Exp(x)``; ``scanned = Scan(body: Exp(row))`` over the rows of ``x`` reshaped to ``[R, C]``."""
    body = helper.make_graph(
        [helper.make_node("Exp", ["row"], ["row_exp"], name="body_exp")],
        "body",
        [helper.make_tensor_value_info("row", TensorProto.FLOAT, ["C"])],
        [helper.make_tensor_value_info("row_exp", TensorProto.FLOAT, ["C"])],
    )
    nodes = [
        helper.make_node("Exp", ["x"], ["top"], name="top_exp"),
        helper.make_node("Scan", ["rows"], ["scanned"], name="scan", body=body, num_scan_inputs=1),
    ]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N"]), helper.make_tensor_value_info("rows", TensorProto.FLOAT, ["R", "C"])]
    outputs = [helper.make_tensor_value_info("top", TensorProto.FLOAT, ["N"]), helper.make_tensor_value_info("scanned", TensorProto.FLOAT, ["R", "C"])]
    graph = helper.make_graph(nodes, "exps", inputs, outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def _run(model: onnx.ModelProto) -> list[np.ndarray]:
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": VALUES, "rows": VALUES[:200_000].reshape(400, 500)})


def test_every_exp_rounds_the_float64_result_once() -> None:
    model = _graph()
    assert exp_in_float64(model) == 2
    onnx.checker.check_model(model, full_check=True)
    top, scanned = _run(model)
    with np.errstate(over="ignore"):
        want = np.exp(VALUES.astype(np.float64)).astype(np.float32)
    assert top.dtype == np.float32 and np.array_equal(top, want)
    assert np.array_equal(scanned, want[:200_000].reshape(400, 500))
    assert [node.op_type for node in model.graph.node][:3] == ["Cast", "Exp", "Cast"]
