"""Every Vela 2.0 head-to-answer formula against values computed by hand (vela2-decoder.md §3, §4.3)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from s1omni.runtime.synth.vela2 import calibration as fixture_calibration
from s1omni.runtime.vela2.answers import Answerer, RawRow, RawSpan
from s1omni.runtime.vela2.calibration import Calibration
from s1omni.runtime.vela2.request import Part, Question, State

CAL = Calibration(fixture_calibration())  # temperatures choice 1.3, score 1.1, set 1.05, span 0.4


def f32(value: float) -> float:
    """A logit as the heads hand it over (float32), read back as a double."""
    return float(np.float32(value))


def _softmax(values: list[float]) -> list[float]:
    top = max(values)
    exps = [math.exp(v - top) for v in values]
    return [e / sum(exps) for e in exps]


def _question(kind: str, options: list[tuple[str, str]], **extra) -> Question:
    engine = "choice" if kind == "noul" else kind
    return Question(id="q", kind=kind, type=engine, text="t", over="user", options=tuple(options), key="q",
                    abstain=kind in ("choice", "noul"), **extra)  # fmt: skip


def _answer(question: Question, logits: list[float], answerer: Answerer = Answerer(CAL)) -> dict:
    response: dict = {"answers": {}}
    raw = RawRow(tokens={"user": 10}, input_tokens=0, logits={"q": np.asarray(logits, np.float32)})
    answerer.answer(question, raw, State((Part("user", "text"),), {}), response)
    return response


def test_choice_probabilities_margin_and_abstain() -> None:
    answer = _answer(_question("choice", [("a", ""), ("b", ""), ("c", "")]), [2.0, 1.0, 0.0, 0.5])["answers"]["q"]
    expected = _softmax([2.0 / 1.3, 1.0 / 1.3, 0.0])
    assert list(answer) == ["type", "choice", "confidence", "probabilities", "abstain_probability"]
    assert answer["choice"] == "a"
    for got, want in zip(answer["probabilities"].values(), expected, strict=True):
        assert got == pytest.approx(want, abs=1e-12)
    assert answer["confidence"] == pytest.approx(expected[0] - expected[1], abs=1e-12)
    assert answer["abstain_probability"] == pytest.approx(_softmax([2 / 1.3, 1 / 1.3, 0.0, 0.5 / 1.3])[-1], abs=1e-12)


def test_choice_ties_pick_the_first_option_and_zero_margin() -> None:
    answer = _answer(_question("choice", [("x", ""), ("y", "")]), [1.0, 1.0, -5.0])["answers"]["q"]
    assert answer["choice"] == "x" and answer["confidence"] == 0.0


def test_noul_is_p_yes_without_abstain() -> None:
    answer = _answer(_question("noul", [("no", ""), ("yes", "")]), [0.0, 1.3, 9.0])["answers"]["q"]
    assert answer == {"type": "noul", "noul": pytest.approx(1 / (1 + math.exp(-f32(1.3) / 1.3)), abs=1e-12)}


def test_noul_calibration_refit() -> None:
    p = 1 / (1 + math.exp(-f32(1.3) / 1.3))
    answer = _answer(_question("noul", [("no", ""), ("yes", "")]), [0.0, 1.3, 0.0], Answerer(CAL, noul_calibration=True))
    refit = 1 / (1 + math.exp(-((math.log(p) - math.log(1 - p)) / 2.0 + 0.25)))
    assert answer["answers"]["q"]["noul"] == pytest.approx(refit, abs=1e-12)
    clamped = 1 - 1e-12  # p is clamped to [1e-12, 1 - 1e-12] before the logit
    expected = 1 / (1 + math.exp(-(math.log(clamped / (1 - clamped)) / 2 + 0.25)))
    assert CAL.noul(1.0, True) == pytest.approx(expected, abs=1e-12)


def test_score_expectation_variance_confidence_and_legend() -> None:
    question = _question("score", [("Low", ""), ("Mid", ""), ("High", "")], levels=("Low", "Mid", {"x": 1}))
    answer = _answer(question, [0.0, 1.1, 2.2])["answers"]["q"]
    p = _softmax([0.0, f32(1.1) / 1.1, f32(2.2) / 1.1])
    mean = p[1] + 2 * p[2]
    variance = sum(pi * (i - mean) ** 2 for i, pi in enumerate(p))
    assert list(answer) == ["type", "score", "confidence", "legend", "probabilities"]
    assert answer["score"] == pytest.approx(mean, abs=1e-12)
    assert answer["confidence"] == pytest.approx(1 - variance / ((9 - 1) / 12), abs=1e-12)
    assert answer["legend"] == {"0": "Low", "1": "Mid", "2": '{"x":1}'}
    assert "abstain_probability" not in answer


def test_set_threshold_precedence_and_label_answers() -> None:
    options = [("a", ""), ("b", "")]
    logits = [0.0, 1.05]  # sigmoid(0) = 0.5, sigmoid(1) = 0.731
    default = _answer(_question("set", options), logits)
    assert default["thresholds"]["q"] == 0.3 and default["sets"]["q"]["selected"] == ["a", "b"]
    assert "q" not in default["answers"] and list(default["answers"]) == ["q.a", "q.b"]
    assert default["answers"]["q.b"]["noul"] == pytest.approx(1 / (1 + math.exp(-f32(1.05) / 1.05)), abs=1e-12)
    keyed = Answerer(Calibration({**fixture_calibration(), "thresholds": {"set:*": 0.3, "set:q": 0.6}}))
    assert _answer(_question("set", options), logits, keyed)["sets"]["q"]["selected"] == ["b"]
    given = _answer(_question("set", options, threshold=0.5), logits, keyed)
    assert given["thresholds"]["q"] == 0.5 and given["sets"]["q"]["selected"] == ["b"]  # 0.5 is not > 0.5


def test_pii_length_rule_interpolates_in_log_space_and_clamps() -> None:
    assert CAL.pii_length_threshold(21) == pytest.approx(0.75)
    assert CAL.pii_length_threshold(126) == pytest.approx(0.05)
    assert CAL.pii_length_threshold(5) == pytest.approx(0.75)
    assert CAL.pii_length_threshold(100_000) == pytest.approx(0.005919)
    t = (math.log(50) - math.log(21)) / (math.log(126) - math.log(21))
    assert CAL.pii_length_threshold(50) == pytest.approx(math.exp(math.log(0.75) + t * (math.log(0.05) - math.log(0.75))))
    assert CAL.span_threshold("pii", ["PERSON"], 126, "router") == (pytest.approx(0.05), "pii:length")
    assert CAL.span_threshold("names", ["PERSON", "AGE"], 21, "router")[1] == "pii:length"
    assert CAL.span_threshold("halu", ["unsupported"], 21, "router") == (0.55, "halu")
    assert CAL.span_threshold("x", ["thing"], 21, "router") == (0.5, "span:*")
    assert CAL.span_threshold("x", ["thing"], 21, "broad") == (0.55, "broad")


def test_pii_sparse_gate_raises_a_low_threshold_on_sparse_documents() -> None:
    text = "Alice met Bob"
    offsets = np.asarray([[0, 5], [6, 9], [10, 13]], np.int32)
    probabilities = np.asarray([[0.9], [0.08], [0.06]])  # one span at the 0.5 probe <= K = 3
    assert CAL.sparse_gate(probabilities, offsets, ["PERSON"], text, 0.05, "pii:length") == (0.1, "pii:length+sparse")
    assert CAL.sparse_gate(probabilities, offsets, ["PERSON"], text, 0.2, "pii:length") == (0.2, "pii:length")
    dense = np.asarray([[0.9], [0.1], [0.9]])
    crowded = Calibration({**fixture_calibration(), "pii_sparse_gate": {"K": 1, "t_sparse": 0.1}})
    assert crowded.sparse_gate(dense, offsets, ["PERSON"], text, 0.05, "pii:length") == (0.05, "pii:length")


def test_span_answer_threshold_clipping_and_noul() -> None:
    text = "Alice met Bob"
    span = RawSpan(["PERSON"], np.asarray([[0, 5], [6, 9], [10, 13]], np.int32), np.asarray([[2.0], [-2.0], [1.0]]), "router")
    raw = RawRow(tokens={"user": 3}, input_tokens=0, span=span)
    question = _question("span", [("PERSON", "a person")], threshold=0.5)
    response: dict = {"answers": {}}
    Answerer(CAL, report_heads=True).answer(question, raw, State((Part("user", text),), {}), response)
    p = [1 / (1 + math.exp(-v / 0.4)) for v in (2.0, -2.0, 1.0)]
    assert [s["text"] for s in response["spans"]["q"]] == ["Alice", "Bob"]
    assert response["spans"]["q"][0] == {"label": "PERSON", "start": 0, "end": 5, "text": "Alice",
                                         "probability": pytest.approx(p[0], abs=1e-6)}  # fmt: skip
    assert response["answers"]["q"] == {"type": "noul", "noul": pytest.approx(p[0], abs=1e-12)}
    assert response["thresholds"]["q"] == 0.5 and response["span_heads"]["q"] == "router"


def test_span_answer_settles_units_in_the_gate_and_the_decode() -> None:
    """An e-mail address read as three words, the middle one below the threshold: its unit fills it, so the
    answer is one span (three without units), and the PII sparse gate's probe counts that one span too."""
    text = "mail jane.doe@example.org now"
    offsets = np.asarray([[0, 4], [5, 9], [9, 13], [13, 25], [26, 29]], np.int32)
    logits = np.asarray([[-3.0], [1.0], [-1.0], [1.0], [-3.0]])  # sigmoid(x / 0.4): 0.92 and 0.076 around 0.5
    span = RawSpan(["EMAIL_ADDRESS"], offsets, logits, "router")
    raw = RawRow(tokens={"user": 126}, input_tokens=0, span=span)  # the length rule's 0.05: under t_sparse
    gated = Calibration({**fixture_calibration(), "pii_sparse_gate": {"K": 1, "t_sparse": 0.6, "probe_threshold": 0.5}})
    question = _question("span", [("EMAIL_ADDRESS", "an address")])
    response: dict = {"answers": {}}
    Answerer(gated).answer(question, raw, State((Part("user", text),), {}), response)
    assert [s["text"] for s in response["spans"]["q"]] == ["jane.doe@example.org"]
    # One span at the probe (K = 1) moved the length rule's threshold to t_sparse: three spans would not have.
    assert response["thresholds"]["q"] == 0.6


def test_window_logits_are_averaged_and_uncovered_words_get_minus_30() -> None:
    from s1omni.runtime.vela2.layout import EncodedPart, RenderedBlock, Row, RowTrees
    from s1omni.runtime.vela2.model import Vela2Model
    from s1omni.runtime.vela2.words import Words

    question = _question("span", [("A", ""), ("B", "")])
    words = Words(np.asarray([[0, 1], [2, 3], [4, 5], [6, 7]], np.int32), np.asarray([0, 1, 2, 3]))
    part = EncodedPart("user", np.arange(4), np.zeros((4, 2), np.int32), words)
    first = RenderedBlock(question, [1], [0], word_index=np.asarray([0, 1]))
    second = RenderedBlock(question, [1], [0], word_index=np.asarray([1, 2]))
    span = RenderedBlock(question, [1], [0])
    trees = RowTrees(Row([question], [part]), tokens=0, span=span, windows=[first, second])
    outputs = {id(first): np.asarray([[1.0, 2.0], [3.0, 4.0]]), id(second): np.asarray([[5.0, 6.0], [7.0, 8.0]])}
    raw = Vela2Model._combine(trees, outputs)
    assert raw.span is not None
    np.testing.assert_array_equal(raw.span.logits, [[1, 2], [4, 5], [7, 8], [-30, -30]])


def test_span_head_matches_its_formula_over_several_word_chunks() -> None:
    """The span head against the formula of heads.py's docstring in float64 torch, over words that
    span several of its threaded chunks (an offset or a chunk written twice would show)."""
    import torch

    from s1omni.runtime.vela2.heads import SPAN_TENSORS, WORD_CHUNK, SpanHead

    rng = np.random.default_rng(3)
    hidden, d, slots, count, words = 48, 16, 4, 6, 3 * WORD_CHUNK + 5
    shapes = {"wn.weight": (hidden,), "wn.bias": (hidden,), "ln.weight": (hidden,), "ln.bias": (hidden,),
              "slot.weight": (slots, hidden), "K.weight": (d, hidden), "Q.weight": (d, hidden), "M.weight": (d, hidden),
              "M.bias": (d,), "N.weight": (d, hidden), "v.weight": (1, d), "o.weight": (1, d), "o.bias": (1,)}  # fmt: skip
    assert set(shapes) == SPAN_TENSORS
    tensors = {name: rng.standard_normal(shape).astype(np.float32) for name, shape in shapes.items()}
    word_states = rng.standard_normal((words, hidden)).astype(np.float32)
    label_states = rng.standard_normal((count, hidden)).astype(np.float32)
    scores = SpanHead(tensors, "span2.")(word_states, label_states)

    t = {name: torch.from_numpy(tensors[name]).double() for name in shapes}
    norm = lambda x, w, b: torch.nn.functional.layer_norm(x, (hidden,), w, b, eps=1e-5)  # noqa: E731
    x = norm(torch.from_numpy(word_states).double(), t["wn.weight"], t["wn.bias"])
    x = x - x.mean(0, keepdim=True)
    y = norm(torch.from_numpy(label_states).double(), t["ln.weight"], t["ln.bias"])
    y = y + t["slot.weight"][torch.clamp(torch.arange(count), max=slots - 1)]
    y = y - y.mean(0, keepdim=True)
    bilinear = (x @ t["K.weight"].T) @ (y @ t["Q.weight"].T).T / math.sqrt(d)
    inner = (x @ t["M.weight"].T + t["M.bias"])[:, None, :] + (y @ t["N.weight"].T)[None, :, :]
    expected = bilinear + torch.nn.functional.gelu(inner) @ t["v.weight"][0]
    assert scores.shape == (words, count) and scores.dtype == np.float32
    np.testing.assert_allclose(scores, expected.numpy(), rtol=1e-4, atol=1e-4)
