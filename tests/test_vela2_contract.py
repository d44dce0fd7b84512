"""Request and answer rules of the Vela 2.0 contract (issue 18): repeated score levels, input
coverage, ``overflow``, the unread span block of a windowed row, question ids, model-output
failures, the default scan budget, colliding label answers and the PII sparse gate's boundary
(wire-contract.md §3, §5, §7; vela2-decoder.md §2.6, §3.5, §3.7, §4.4)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from s1omni.runtime.errors import RequestError
from s1omni.runtime.synth.vela2 import calibration as fixture_calibration
from s1omni.runtime.vela2.answers import Answerer, RawRow, RawSpan
from s1omni.runtime.vela2.calibration import Calibration
from s1omni.runtime.vela2.request import Part, Question, State

CAL = Calibration(fixture_calibration())  # score temperature 1.1; sparse gate K 3, t_sparse 0.1
PROSE = (
    "Our refund policy allows returns within 30 days of delivery for unused items. Shipping takes three to "
    "five business days; tracking numbers arrive by e-mail. Dr. Maria García works for the World Health "
    "Organization in Geneva, Switzerland, and can be reached at maria.garcia@who.example.org. "
)
# Both past the length rule's t_sparse; at the 0.5 probe the tiny member decodes exactly K = 3 spans
# in the first and K + 1 in the second (the calib cases span-pii-sparse-gate-at-k / -over-k).
SPARSE_AT_K, SPARSE_OVER_K = "zzz zzz zzz " * 36, "zzz zzz zzz " * 44
FIVE_KINDS = {
    "c": {"type": "choice", "instructions": "Topic?", "criteria": {"refunds": None, "travel": None}},
    "n": {"type": "noul", "instructions": "Is it polite?"},
    "s": {"type": "score", "instructions": "Urgency?", "criteria": ["low", "high"]},
    "t": {"type": "set", "instructions": "Topics?", "criteria": {"money": None, "time": None}},
    "p": {"type": "span", "instructions": "Names?", "criteria": {"name": None}},
}


def _question(kind: str, options: list[tuple[str, str]], **extra) -> Question:
    engine = "choice" if kind == "noul" else kind
    return Question(id="q", kind=kind, type=engine, text="t", over="user", options=tuple(options), key="q",
                    abstain=kind in ("choice", "noul"), **extra)  # fmt: skip


def _answer(question: Question, raw: RawRow, text: str = "text", calibration: Calibration = CAL) -> dict:
    response: dict = {"answers": {}}
    Answerer(calibration).answer(question, raw, State((Part("user", text),), {}), response)
    return response


# -- 1. repeated score levels ---------------------------------------------------------------------


def test_repeated_score_levels_are_read_by_position() -> None:
    question = _question("score", [("a", ""), ("b", ""), ("a", "")], levels=("a", "b", "a"))
    raw = RawRow(tokens={"user": 3}, input_tokens=0, logits={"q": np.asarray([1.0, 2.0, 3.0], np.float32)})
    answer = _answer(question, raw)["answers"]["q"]
    exps = [math.exp(v / 1.1) for v in (1.0, 2.0, 3.0)]
    p = [e / sum(exps) for e in exps]
    mean = p[1] + 2 * p[2]
    assert answer["probabilities"] == {str(i): pytest.approx(p[i], abs=1e-12) for i in range(3)}
    assert answer["legend"] == {"0": "a", "1": "b", "2": "a"}
    assert answer["score"] == pytest.approx(mean, abs=1e-12)
    variance = sum(p[i] * (i - mean) ** 2 for i in range(3))
    assert answer["confidence"] == pytest.approx(1 - variance / ((9 - 1) / 12), abs=1e-12)


def test_a_request_with_repeated_levels_answers_every_level(tiny_model) -> None:
    body = {"state": "It broke again.", "questions": {"q": {"type": "score", "instructions": "Severity?", "criteria": ["a", "b", "a"]}}}
    answer = tiny_model.answer(body)["answers"]["q"]
    assert list(answer["probabilities"]) == ["0", "1", "2"] and sum(answer["probabilities"].values()) == pytest.approx(1.0)
    assert answer["score"] == pytest.approx(answer["probabilities"]["1"] + 2 * answer["probabilities"]["2"], abs=1e-12)


# -- 2. require_full_input ------------------------------------------------------------------------


def test_questions_that_require_their_full_input_say_it_was_read_whole(tiny_model) -> None:
    full = {key: {**question, "require_full_input": True} for key, question in FIVE_KINDS.items()}
    body = {"state": "Please refund Anna the 40 euros today.", "questions": {**full, "plain": FIVE_KINDS["n"]}}
    response = tiny_model.answer(body)
    answers = response["answers"]
    for key in ("c", "n", "s", "t.money", "t.time", "p"):
        assert answers[key]["input_coverage"] == "complete", key
        assert list(answers[key])[-1] == "input_coverage"
    assert response["sets"]["t"]["input_coverage"] == "complete"
    assert "input_coverage" not in answers["plain"]
    plain = tiny_model.answer({"state": body["state"], "questions": FIVE_KINDS})
    assert all("input_coverage" not in answer for answer in plain["answers"].values())
    assert "input_coverage" not in plain["sets"]["t"]


def test_a_clipped_full_input_is_max_length_exceeded_not_complete(tiny_model) -> None:
    body = {"state": {"request": "Refund?", "context": "x " * 9000},  # 18,000 tokens: past one input, within the budget
            "questions": {"q": {"type": "noul", "instructions": "Refund?", "over": "request", "require_full_input": True}}}  # fmt: skip
    plan = tiny_model.plan(body)
    (_, trees), = plan.rows
    assert trees is None and not plan.trees  # the context is clipped to fit: the row fails, nothing runs
    body["questions"]["q"]["require_full_input"] = False
    assert tiny_model.plan(body).rows[0][1] is not None


# -- 3. overflow ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("question", "message"),
    [
        ({"overflow": "wrap"}, "overflow must be one of ['window', 'truncate']"),
        ({"overflow": None}, "overflow must be one of ['window', 'truncate']"),
        ({"overflow": "truncate", "require_full_input": True}, "require_full_input cannot be combined with overflow: truncate"),
    ],
)
def test_overflow_values_other_than_window_and_truncate_are_invalid(tiny_model, question: dict, message: str) -> None:
    body = {"state": "Hello.", "questions": {"ok": FIVE_KINDS["n"], "q": {**FIVE_KINDS["n"], **question}}}
    plan = tiny_model.plan(body)
    assert plan.request.errors == {"q": {"type": "noul", "error": "invalid_question", "message": message}}


def test_window_is_the_default_and_truncate_reads_the_first_tokens(tiny_model) -> None:
    state = {"request": "Refund?", "context": PROSE * 3}
    questions = {
        "default": {**FIVE_KINDS["n"], "over": "context"},
        "window": {**FIVE_KINDS["n"], "over": "context", "overflow": "window"},
        "cut": {**FIVE_KINDS["n"], "over": "context", "overflow": "truncate"},
        "pii": {"preset": "pii", "over": "context", "overflow": "truncate"},
    }
    plan = tiny_model.plan({"state": state, "questions": questions, "options": {"max_tokens": 40}})
    assert {qid: error["error"] for qid, error in plan.request.errors.items()} == {
        "default": "scan_budget_exceeded", "window": "scan_budget_exceeded"}  # fmt: skip
    (row, trees), = plan.rows
    assert [q.id for q in row.questions] == ["cut", "pii"] and trees is not None
    context = tiny_model.tokens.part("context", state["context"], False).ids
    assert len(row.part("context").ids) == 40 and np.array_equal(row.part("context").ids, context[:40])
    assert row.part("context").length == len(context) > 40  # the PII length rule still counts the whole part
    whole = tiny_model.plan({"state": state, "questions": questions})
    assert not whole.request.errors and len(whole.rows) == 1  # under the budget, truncate reads as window does
    assert plan.trees[0][0].prefix.ids.size < whole.trees[0][0].prefix.ids.size


# -- 4. the unread span block of a windowed row ---------------------------------------------------


def test_a_windowed_span_block_stays_in_its_row_tree_unread(tiny_model) -> None:
    body = {"state": PROSE * 45, "questions": {"pii": {"preset": "pii"}, "topic": FIVE_KINDS["n"]}}
    plan = tiny_model.plan(body)
    (row, trees), = plan.rows
    assert trees is not None and len(trees.windows) >= 2
    row_tree, blocks = plan.trees[0]
    assert [block.question.id for block in blocks] == ["topic", "pii"]
    span = blocks[1]
    assert span is trees.span and not span.read and span.readouts().size == 0
    assert row_tree.blocks[1].readouts.size == 0 and len(row_tree.blocks[1].ids) == len(span.ids)
    assert len(plan.trees) == 1 + len(trees.windows)
    assert plan.input_tokens == sum(tree.tokens for tree, _ in plan.trees)  # usage counts what runs
    outputs = tiny_model.read([plan], [[np.zeros((len(b.readouts()), tiny_model.runner.hidden_size), np.float32)
                                         for b in tree_blocks] for _, tree_blocks in plan.trees])[0]  # fmt: skip
    assert id(span) not in outputs and id(blocks[0]) in outputs


# -- 5. question ids ------------------------------------------------------------------------------


@pytest.mark.parametrize("question_id", ["", " ", "\t\n"])
def test_blank_question_ids_are_invalid_requests(tiny_model, question_id: str) -> None:
    with pytest.raises(RequestError, match="question ids must not be empty or whitespace") as refused:
        tiny_model.plan({"state": "Hello.", "questions": {"ok": FIVE_KINDS["n"], question_id: FIVE_KINDS["n"]}})
    assert refused.value.code == "invalid_request"


# -- 6. invalid_model_output ----------------------------------------------------------------------


def test_model_output_failures_say_what_was_wrong_with_which_output() -> None:
    noul = _question("noul", [("no", ""), ("yes", "")])
    nan = RawRow(tokens={"user": 3}, input_tokens=0, logits={"q": np.asarray([np.nan, 1.0, 0.0], np.float32)})
    assert _answer(noul, nan)["answers"]["q"] == {
        "type": "noul", "error": "invalid_model_output", "message": "question 'q': its 2 noul option logits are not all finite"}  # fmt: skip
    empty = RawRow(tokens={"user": 3}, input_tokens=0)
    assert _answer(noul, empty)["answers"]["q"]["message"] == "question 'q': the model returned no choice output for it"
    span = _question("span", [("PERSON", "")])
    assert _answer(span, empty)["answers"]["q"]["message"] == "question 'q': the model returned no span output for it"
    no_set_default = Calibration({**fixture_calibration(), "thresholds": {"span:*": 0.5}})
    labels = _question("set", [("a", "")])
    raw = RawRow(tokens={"user": 3}, input_tokens=0, logits={"q": np.asarray([0.5], np.float32)})
    message = _answer(labels, raw, calibration=no_set_default)["answers"]["q"]["message"]
    assert message == "question 'q': answering it needs 'set:*', which the package calibration lacks"
    words = RawSpan(["PERSON"], np.asarray([[0, 4]], np.int32), np.asarray([[np.nan]]), "router")
    spanned = RawRow(tokens={"user": 1}, input_tokens=0, span=words)
    assert "span word probabilities are not all finite" in _answer(span, spanned)["answers"]["q"]["message"]


# -- 9. the default scan budget -------------------------------------------------------------------


def test_the_default_scan_budget_is_four_inputs_on_a_cpu(tiny_model) -> None:
    limits = tiny_model.card()["limits"]
    assert limits["max_scan_tokens"] == 4 * limits["max_input_tokens"] == tiny_model.max_scan_tokens
    long = "x " * (limits["max_scan_tokens"] // 2 + 8)  # two tokens a repeat: just past the budget
    body = {"state": {"request": "Hi.", "context": long},
            "questions": {"long": {**FIVE_KINDS["n"], "over": "context"}, "short": {**FIVE_KINDS["n"], "over": "request"},
                          "full": {**FIVE_KINDS["n"], "over": "request", "require_full_input": True}}}  # fmt: skip
    plan = tiny_model.plan(body)
    assert {qid: error["error"] for qid, error in plan.request.errors.items()} == {
        "long": "scan_budget_exceeded", "full": "scan_budget_exceeded"}  # fmt: skip
    given = tiny_model.plan({**body, "options": {"max_tokens": 1 << 20}})
    assert not given.request.errors  # a client's own budget replaces the default


# -- 12. colliding label answers ------------------------------------------------------------------


def test_sets_whose_label_answers_collide_are_an_invalid_request(tiny_model) -> None:
    questions = {"a": {"type": "set", "instructions": "x", "criteria": {"b.c": None}},
                 "a.b": {"type": "set", "instructions": "y", "criteria": {"c": None, "d": None}}}  # fmt: skip
    with pytest.raises(RequestError) as refused:
        tiny_model.plan({"state": "Hello.", "questions": questions})
    assert refused.value.code == "invalid_request"
    assert refused.value.message == "set 'a' (label 'b.c') and set 'a.b' (label 'c') would both answer answers['a.b.c']"
    apart = {**questions, "a.b": {**questions["a.b"], "criteria": {"d": None}}}
    assert not tiny_model.plan({"state": "Hello.", "questions": apart}).request.errors


# -- 14. the PII sparse gate's boundary -----------------------------------------------------------


def _probe(spans: int) -> tuple[np.ndarray, np.ndarray, str]:
    """Probabilities over ``2 * spans`` words that decode to exactly ``spans`` spans at 0.5."""
    text = " ".join(f"w{i}" for i in range(2 * spans))
    starts = [i for i, c in enumerate(text) if c == "w"]
    offsets = np.asarray([[s, text.index(" ", s) if " " in text[s:] else len(text)] for s in starts], np.int32)
    probabilities = np.asarray([[0.9 if i % 2 == 0 else 0.2] for i in range(2 * spans)])
    return probabilities, offsets, text


@pytest.mark.parametrize(("spans", "fires"), [(0, True), (3, True), (4, False)])
def test_the_sparse_gate_fires_at_k_spans_and_not_past_them(spans: int, fires: bool) -> None:
    probabilities, offsets, text = _probe(max(spans, 1))
    if spans == 0:
        probabilities = probabilities * 0.0
    gated = CAL.sparse_gate(probabilities, offsets, ["PERSON"], text, 0.05, "pii:length")
    assert gated == ((0.1, "pii:length+sparse") if fires else (0.05, "pii:length"))
    assert CAL.sparse_gate(probabilities, offsets, ["PERSON"], text, 0.1, "pii:length") == (0.1, "pii:length")


def test_the_tiny_member_answers_on_both_sides_of_the_gate(tiny_model) -> None:
    plans = [tiny_model.plan({"state": text, "questions": {"pii": {"preset": "pii"}}}) for text in (SPARSE_AT_K, SPARSE_OVER_K)]
    at_k, over_k = (tiny_model.finish(plan, outputs) for plan, outputs in zip(plans, tiny_model.execute(plans), strict=True))
    for text, response in ((SPARSE_AT_K, at_k), (SPARSE_OVER_K, over_k)):
        tokens = len(tiny_model.tokens.part("user", text, False).ids)
        assert CAL.pii_length_threshold(tokens) < 0.1  # the gate is consulted for both
    assert at_k["thresholds"]["pii"] == 0.1 and len(at_k["spans"]["pii"]) == 3
    tokens = len(tiny_model.tokens.part("user", SPARSE_OVER_K, False).ids)
    assert over_k["thresholds"]["pii"] == pytest.approx(CAL.pii_length_threshold(tokens)) and len(over_k["spans"]["pii"]) == 4
