"""Issue 18's request and answer rules over HTTP, against one real ``s1omni serve`` of the tiny member:
question ids, colliding label answers, ``overflow``, input coverage, repeated score levels and the
default scan budget on the model card."""

from __future__ import annotations

import pytest
from serving import Server, error

NOUL = {"type": "noul", "instructions": "Does the customer ask for a refund?"}
STATE = "Please refund the duplicate charge of 40 euros."


@pytest.fixture(scope="module")
def server(start, tiny_vela) -> Server:
    """The tiny member served once for this module; ``start`` stops it with the session."""
    served = start(str(tiny_vela))
    served.wait_status("ready")
    return served


@pytest.mark.parametrize("question_id", ["", "   "])
def test_a_blank_question_id_is_an_invalid_request(server: Server, question_id: str) -> None:
    response = server.post({"state": STATE, "questions": {"refund": NOUL, question_id: NOUL}})
    assert error(response, 400, "invalid_request") == "question ids must not be empty or whitespace"
    in_states = server.post({"state": STATE, "questions": {"refund": NOUL}, "states": {"later": {"state": STATE, "questions": {question_id: NOUL}}}})
    assert error(in_states, 400, "invalid_request") == "states['later']: question ids must not be empty or whitespace"


def test_sets_whose_label_answers_collide_are_refused_naming_both(server: Server) -> None:
    questions = {"a": {"type": "set", "instructions": "Which?", "criteria": {"b.c": None}},
                 "a.b": {"type": "set", "instructions": "Which?", "criteria": {"c": None}}}  # fmt: skip
    message = error(server.post({"state": STATE, "questions": questions}), 400, "invalid_request")
    assert message == "set 'a' (label 'b.c') and set 'a.b' (label 'c') would both answer answers['a.b.c']"


def test_overflow_window_and_truncate_answer_and_other_values_are_invalid_questions(server: Server) -> None:
    questions = {
        "window": {**NOUL, "overflow": "window"},
        "truncate": {**NOUL, "overflow": "truncate"},
        "pii": {"preset": "pii", "overflow": "truncate"},
        "odd": {**NOUL, "overflow": "spill"},
    }
    response = server.post({"state": STATE, "questions": questions})
    assert response.status_code == 200, response.text
    answers = response.json()["answers"]
    assert [answers[key]["type"] for key in ("window", "truncate", "pii")] == ["noul", "noul", "noul"]
    assert answers["window"]["noul"] == pytest.approx(answers["truncate"]["noul"], abs=1e-6)  # a short part reads alike
    assert answers["odd"] == {"type": "noul", "error": "invalid_question", "message": "overflow must be one of ['window', 'truncate']"}
    capped = server.post({"state": STATE, "questions": questions, "options": {"max_tokens": 3}}).json()["answers"]
    assert capped["window"]["error"] == "scan_budget_exceeded" and "noul" in capped["truncate"] and "noul" in capped["pii"]


def test_full_input_answers_carry_input_coverage(server: Server) -> None:
    questions = {
        "refund": {**NOUL, "require_full_input": True},
        "topics": {"type": "set", "instructions": "Which?", "criteria": {"money": None}, "require_full_input": True},
        "plain": NOUL,
    }
    body = server.post({"state": STATE, "questions": questions}).json()
    assert body["answers"]["refund"]["input_coverage"] == "complete"
    assert body["answers"]["topics.money"]["input_coverage"] == "complete"
    assert body["sets"]["topics"]["input_coverage"] == "complete"
    assert "input_coverage" not in body["answers"]["plain"]


def test_repeated_score_levels_answer_every_level(server: Server) -> None:
    question = {"type": "score", "instructions": "Severity?", "criteria": ["low", "high", "low"]}
    answer = server.post({"state": STATE, "questions": {"s": question}}).json()["answers"]["s"]
    assert answer["legend"] == {"0": "low", "1": "high", "2": "low"} and list(answer["probabilities"]) == ["0", "1", "2"]


def test_the_model_card_lists_the_default_scan_budget(server: Server) -> None:
    limits = server.client.get("/v1/models").json()["data"][0]["limits"]
    assert limits["max_scan_tokens"] == 4 * limits["max_input_tokens"]  # four inputs on a CPU
