"""An OmniJev engine's option-text log-probabilities (``s1omni.runtime.omnijev.vocabulary``) against the
reference's numpy ones (``features.token_logprobs``): the same arithmetic in ONNX Runtime, on the CPU EP here
and on the CUDA EP on the device."""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import onnx
import pytest
from onnx import helper

from s1omni.runtime.omnijev import vocabulary
from s1omni.runtime.omnijev.features import token_logprobs
from s1omni.runtime.omnijev.vocabulary import EngineLogProbs, logprob_graph
from tests.cuda_builds import needs_cuda

# float32 logits summed in other orders by numpy's BLAS and ONNX Runtime's GEMM: a few float32 ulps of logits up
# to ~40 (tests/omnijev/test_omnijev_heads.py), the log-softmax in float64 on both sides.
BOUND = 1e-5


def _problem(vocabulary_size: int, hidden_size: int, rows: int, scale: float = 3.0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(11)
    embedding = rng.standard_normal((vocabulary_size, hidden_size)).astype(np.float32)
    hidden = (rng.standard_normal((rows, hidden_size)) * scale).astype(np.float32)
    return embedding, hidden, rng.integers(0, vocabulary_size, rows)


@pytest.mark.parametrize("logit_elements", [1 << 25, 1000], ids=["one-call", "row-chunks"])
def test_the_engine_takes_the_reference_log_probs(monkeypatch: pytest.MonkeyPatch, logit_elements: int) -> None:
    """Row chunks (1000 elements: 3 rows of 301 a call, 13 calls for 37 rows) answer as one call."""
    monkeypatch.setattr(vocabulary, "LOGIT_ELEMENTS", logit_elements)
    embedding, hidden, tokens = _problem(301, 16, 37)
    ours = EngineLogProbs(embedding)(hidden, tokens)
    assert ours.dtype == np.float32 and ours.shape == (37,)
    np.testing.assert_allclose(ours, token_logprobs(embedding, hidden, tokens), rtol=0, atol=BOUND)
    assert EngineLogProbs(embedding)(hidden[:0], tokens[:0]).shape == (0,)


def test_large_logits_stay_finite() -> None:
    """Logits in the hundreds, whose exponentials overflow float64, keep their log-probabilities."""
    embedding, hidden, tokens = _problem(301, 16, 9, scale=60.0)
    want = token_logprobs(embedding, hidden, tokens)
    assert np.abs(hidden @ embedding.T).max() > 710  # exp overflows float64 past 709.8
    np.testing.assert_allclose(EngineLogProbs(embedding)(hidden, tokens), want, rtol=1e-7, atol=BOUND)


def _node(model: onnx.ModelProto, op_type: str) -> onnx.NodeProto:
    return next(node for node in model.graph.node if node.op_type == op_type)


def _softmax(model: onnx.ModelProto) -> None:  # the probability, not its logarithm
    _node(model, "LogSoftmax").op_type = "Softmax"


def _over_rows(model: onnx.ModelProto) -> None:  # normalized across the states instead of the vocabulary
    _node(model, "LogSoftmax").attribute[0].i = 0


def _raw_logit(model: onnx.ModelProto) -> None:  # the token's logit, never normalized
    _node(model, "GatherElements").input[0] = "logits64"


def _next_token(model: onnx.ModelProto) -> None:  # each state scored against the token after its own
    one = helper.make_tensor("one", onnx.TensorProto.INT64, [], [1])
    model.graph.initializer.append(one)
    model.graph.node.insert(0, helper.make_node("Add", ["tokens", "one"], ["tokens_next"]))
    _node(model, "Unsqueeze").input[0] = "tokens_next"


BROKEN: dict[str, Callable[[onnx.ModelProto], None]] = {
    "softmax": _softmax,
    "over the states": _over_rows,
    "unnormalized logit": _raw_logit,
    "next token": _next_token,
}


@pytest.mark.parametrize("broken", list(BROKEN))
def test_a_broken_graph_misses_the_bound(monkeypatch: pytest.MonkeyPatch, broken: str) -> None:
    """The comparison above can fail: each wrong graph answers off by far more than ``BOUND`` (or not at all)."""
    model = logprob_graph()
    BROKEN[broken](model)
    monkeypatch.setattr(vocabulary, "logprob_graph", lambda: model)
    embedding, hidden, tokens = _problem(301, 16, 9, scale=60.0)
    ours = EngineLogProbs(embedding)(hidden, tokens)
    assert not np.allclose(ours, token_logprobs(embedding, hidden, tokens), rtol=0, atol=100 * BOUND)


@pytest.mark.gpu
@needs_cuda
def test_the_engine_log_probs_run_on_the_gpu_at_the_4b_vocabulary() -> None:
    """The 4B's table (248,079 x 2,560, 2.5 GB float32) on the CUDA EP: the reference's values, and fast enough that
    the GEMM cannot have fallen back to the host (which takes about 0.3 s a pass over that table there)."""
    embedding, hidden, tokens = _problem(248_079, 2_560, 200, scale=0.05)
    head = EngineLogProbs(embedding, "cuda")
    ours = head(hidden, tokens)  # includes the kernels' first-call costs
    np.testing.assert_allclose(ours, token_logprobs(embedding, hidden, tokens), rtol=0, atol=BOUND)
    started = time.perf_counter()
    for _ in range(5):
        head(hidden, tokens)
    per_call = (time.perf_counter() - started) / 5
    assert per_call < 0.05, f"{per_call * 1e3:.1f} ms a call at 200 rows"
