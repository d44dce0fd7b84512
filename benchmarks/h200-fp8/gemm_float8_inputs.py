"""Which inputs ONNX Runtime's CUDA ``GemmFloat8`` accepts beside float32 output (the H200, onnxruntime-gpu 1.31.1).

    python3 benchmarks/h200-fp8/gemm_float8_inputs.py > gemm_float8_inputs.txt

One ``x [M, 32] -> Cast e4m3 -> GemmFloat8(·, W [48, 32], transB=1)`` graph per layout of the inputs after A
and B (``""``: an absent optional input, ``one``: a float32 scalar 1), for M = 14 and 48 rows; each prints OK
with its error against the same float8 product in numpy (max error over max |reference|), or FAIL with the
end of ONNX Runtime's message. ``s1omni.export.fp8_gemms`` uses the layout that passes with scales.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnxruntime
from onnx import TensorProto, helper, numpy_helper

K, N = 32, 48
LAYOUTS = ([], ["", "one", "one"], ["", "one", "one", ""], ["", "one", "one", "one"])


def gemm_model(inputs: list[str], weight: np.ndarray) -> bytes:
    initializers = [
        numpy_helper.from_array(np.array(1, np.float32), "one"),
        helper.make_tensor("w", TensorProto.FLOAT8E4M3FN, list(weight.shape), weight.view(np.uint8).tobytes(), raw=True),
    ]
    nodes = [
        helper.make_node("Cast", ["x"], ["xq"], to=TensorProto.FLOAT8E4M3FN, saturate=1),
        helper.make_node("GemmFloat8", ["xq", "w", *inputs], ["y"], domain="com.microsoft", transA=0, transB=1, dtype=TensorProto.FLOAT),
    ]
    graph = helper.make_graph(
        nodes, "gemm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, K])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializers,
    )  # fmt: skip
    opsets = [helper.make_opsetid("", 19), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=9).SerializeToString()


def main() -> None:
    onnxruntime.preload_dlls()
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((N, K)).astype(ml_dtypes.float8_e4m3fn)
    for inputs in LAYOUTS:
        session = onnxruntime.InferenceSession(gemm_model(inputs, weight), providers=["CUDAExecutionProvider"])
        for rows in (14, 48):
            x = rng.standard_normal((rows, K)).astype(np.float32)
            try:
                y = session.run(None, {"x": x})[0]
            except Exception as exc:  # what ONNX Runtime says is the finding
                print(inputs, rows, "FAIL", str(exc)[-200:].replace("\n", " "))
                continue
            want = x.astype(ml_dtypes.float8_e4m3fn).astype(np.float32) @ weight.astype(np.float32).T
            print(inputs, rows, "OK", y.shape, float(np.abs(y - want).max() / np.abs(want).max()))


if __name__ == "__main__":
    main()
