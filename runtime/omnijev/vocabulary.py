"""The option-text log-probabilities of an OmniJev engine, run in the engine's own execution provider.

The reference takes them with ``features.token_logprobs``: float32 logits of each predicting state against
the tied embedding, the log-sum-exp over the vocabulary in float64 (omnijev.md §6.1; the native worker
takes BF16 logits on its GPU, then a float64 sum). In numpy on the host that reads the whole
``[248,079, 2,560]`` float32 embedding, 2.5 GB, once per request on one BLAS thread
(``s1omni.runtime.cpu_heads``): on the H200's host it was 611 of the 709 ms a one-option screenshot
request took on the 4B bf16 engine (``benchmarks/h200-omnijev-4B``, profile ``stages_ms.readout``).

An engine runs the same arithmetic as a small ONNX graph in its execution provider: ``Gemm`` of the states
against the embedding (``transB``: the table is read in place, never transposed), the logits cast to float64,
``LogSoftmax`` over the vocabulary (the peak-shifted log-sum-exp above, in one kernel), and the token's entry
gathered. The log-sum-exp was first spelled op by op (``ReduceMax``, ``Sub``, ``Exp``, ``ReduceSum``, ``Log``):
on the H200 the CUDA EP hands a float64 ``ReduceMax`` to cuDNN, whose kernel took 22.2 ms of a one-option
screenshot request's 101.5 ms of kernels for eight rows (``benchmarks/h200-omnijev-4B-attn16``, profile),
where ONNX Runtime's own softmax kernels run a block a row. On the CUDA EP the embedding goes to the device
once, at load, and stays bound to the session (``OrtValue``); each call sends the states and token ids and gets
back one float32 per token. The CUDA EP's float32 GEMM runs with TF32 off (the engine's provider options), so it
differs from the reference's numpy GEMM by summation order only: about 1e-6 of a logit. On the CPU EP the table
is the engine's own array, not a copy, and MLAS spreads the GEMM over ONNX Runtime's threads: at the 4B's table
on a 2-core host, p50 186 ms against numpy's 645 for 8 tokens and 434 against 1,205 for 40, the largest
difference 9.5e-7 (``benchmarks/cpu-omnijev-logprobs``; that shared host gave 186 to 292 ms for 8 tokens
across three runs of the same graph).

States go in row chunks of at most ``LOGIT_ELEMENTS // vocabulary``: a request of 255 options holds about
1,500 option-text tokens, whose float64 logits at once would be 3 GB.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime
from onnx import TensorProto, helper

from ..runners.capture_lock import device_run
from ..runners.onnxruntime_runner import GATHER_IR_VERSION, GATHER_OPSET, device_of, providers

# Logits held at once per call (rows x vocabulary): 32 Mi elements, 256 MiB in float64.
LOGIT_ELEMENTS = 1 << 25


def logprob_graph() -> onnx.ModelProto:
    """``logprobs[i] = log softmax(hidden[i] @ embedding.T)[tokens[i]]``, the log-sum-exp in float64."""
    nodes = [
        helper.make_node("Gemm", ["hidden", "embedding"], ["logits"], transB=1),
        helper.make_node("Cast", ["logits"], ["logits64"], to=TensorProto.DOUBLE),
        helper.make_node("LogSoftmax", ["logits64"], ["normalized"], axis=1),
        helper.make_node("Unsqueeze", ["tokens", "vocabulary_axis"], ["token_index"]),
        helper.make_node("GatherElements", ["normalized", "token_index"], ["logprobs64"], axis=1),
        helper.make_node("Cast", ["logprobs64"], ["logprobs"], to=TensorProto.FLOAT),
    ]
    graph = helper.make_graph(
        nodes,
        "omnijev_option_logprobs",
        [helper.make_tensor_value_info("embedding", TensorProto.FLOAT, ["vocabulary", "hidden_size"]),
         helper.make_tensor_value_info("hidden", TensorProto.FLOAT, ["rows", "hidden_size"]),
         helper.make_tensor_value_info("tokens", TensorProto.INT64, ["rows"])],  # fmt: skip
        [helper.make_tensor_value_info("logprobs", TensorProto.FLOAT, ["rows", 1])],
        [helper.make_tensor("vocabulary_axis", TensorProto.INT64, [1], [1])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", GATHER_OPSET)], ir_version=GATHER_IR_VERSION)


class EngineLogProbs:
    """``features.token_logprobs`` with ``embedding`` fixed, run by ONNX Runtime on ``device``
    (``cpu`` or ``cuda[:N]``) with the engine's CUDA EP ``provider_options``."""

    def __init__(self, embedding: np.ndarray, device: str = "cpu", provider_options: dict | None = None):
        kind, device_id = device_of(device)
        self.vocabulary = embedding.shape[0]
        self.session = onnxruntime.InferenceSession(logprob_graph().SerializeToString(), providers=providers(kind, device_id, provider_options or {}))
        self.embedding = onnxruntime.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(embedding, np.float32), kind, device_id)

    @device_run
    def __call__(self, hidden: np.ndarray, tokens: np.ndarray) -> np.ndarray:
        """log p(tokens[i] | hidden[i]): float32 ``[N]``."""
        hidden = np.ascontiguousarray(hidden, np.float32)
        tokens = np.ascontiguousarray(tokens, np.int64)
        rows = max(1, LOGIT_ELEMENTS // self.vocabulary)
        out = [np.zeros(0, np.float32)]
        for start in range(0, len(tokens), rows):
            binding = self.session.io_binding()
            binding.bind_ortvalue_input("embedding", self.embedding)
            binding.bind_cpu_input("hidden", hidden[start : start + rows])
            binding.bind_cpu_input("tokens", tokens[start : start + rows])
            binding.bind_output("logprobs", "cpu")
            self.session.run_with_iobinding(binding)
            out.append(binding.copy_outputs_to_cpu()[0].reshape(-1))
        return np.concatenate(out)
