"""The Vela 2.0 reference runtime end to end on the tiny synthetic member (torch runner, float32 CPU)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from s1omni.export.gate import load_gates
from s1omni.runtime.errors import RequestError
from s1omni.runtime.runners.base import Block, Prefix
from tests.members import make_vela_member

GATE_BOUND = load_gates("vela2")["cpu-fp32"]["max_probability"]
WORDS = "Alice Müller visited 東京 and wrote to alice.m@example.com about https://example.org/x?y=1 (urgent). "


def test_golden_request_has_every_documented_field_in_order(tiny_model) -> None:
    body = tiny_model.golden_request()
    response = tiny_model.answer(body)
    assert list(response) == ["answers", "usage", "spans", "span_heads", "sets", "thresholds"]
    assert list(response["answers"]) == ["domain", "jailbreak", "urgency", "topics.medication", "topics.billing", "pii", "halu"]
    answers = response["answers"]
    assert list(answers["domain"]) == ["type", "choice", "confidence", "probabilities", "abstain_probability"]
    assert list(answers["domain"]["probabilities"]) == ["health", "math", "other"]
    assert sum(answers["domain"]["probabilities"].values()) == pytest.approx(1.0)
    assert list(answers["jailbreak"]) == ["type", "noul"] and 0 <= answers["jailbreak"]["noul"] <= 1
    assert list(answers["urgency"]) == ["type", "score", "confidence", "legend", "probabilities"]
    assert answers["urgency"]["legend"] == {"0": "Routine", "1": "Needs prompt attention", "2": "Critical"}
    assert answers["topics.medication"]["type"] == "noul" and "topics" not in answers
    assert list(response["sets"]["topics"]) == ["selected", "probabilities"]
    assert list(response["thresholds"]) == ["topics", "pii", "halu"]
    assert response["span_heads"] == {"pii": "router", "halu": "router"}
    assert response["usage"]["output_tokens"] == 0 and response["usage"]["input_tokens"] > 100
    request_text = body["state"]["request"]
    for span in response["spans"]["pii"]:
        assert list(span) == ["label", "start", "end", "text", "probability"]
        assert span["text"] == request_text[span["start"] : span["end"]]
    answer_text = body["state"]["answer"]
    for span in response["spans"]["halu"]:
        assert span["label"] == "unsupported" and span["text"] == answer_text[span["start"] : span["end"]]
    json.dumps(response, allow_nan=False)


def test_answers_do_not_depend_on_question_order(tiny_model) -> None:
    """The same answers, within float32 rounding: reversed, the blocks share their forwards with other blocks
    (padded to other widths), and the GEMMs round a row by the shape it is in (1.25e-6 measured on an
    AVX-512 host). The bound is the cpu-fp32 gate's, what this project holds float32 rounding to."""
    body = tiny_model.golden_request()
    forward = tiny_model.answer(body)
    body["questions"] = dict(reversed(list(body["questions"].items())))
    backward = tiny_model.answer(body)
    assert list(backward["answers"])[0] == "halu"
    for key, answer in forward["answers"].items():
        other = backward["answers"][key]
        assert set(answer) == set(other)
        for field, value in answer.items():
            if isinstance(value, float):
                assert other[field] == pytest.approx(value, abs=GATE_BOUND)
            elif isinstance(value, dict):
                assert other[field] == pytest.approx(value, abs=GATE_BOUND)
            else:
                assert other[field] == value
    assert forward["spans"] == backward["spans"] or all(
        [s["text"] for s in forward["spans"][k]] == [s["text"] for s in backward["spans"][k]] for k in forward["spans"]
    )


def test_tree_execution_equals_one_plain_forward(tiny_model) -> None:
    """A block continuing from its prefix's state reads what one causal forward over prefix + block reads.

    With the prefix a multiple of the delta rule's 64-token chunk, both paths chunk the block alike
    and the hidden states agree to 1e-5. Otherwise the chunks are aligned differently and float32
    rounding of the chunked rule differs (measured up to ~7e-5 on hidden values of magnitude ~5 on
    this member); the answers still agree to 1e-5.
    """
    runner = tiny_model.runner
    rng = np.random.default_rng(0)
    aligned = unaligned = probability = 0.0
    for prefix_length in (1, 5, 63, 64, 65, 128, 200):
        prefix = Prefix(rng.integers(1, 1800, prefix_length))
        blocks = [Block(rng.integers(1, 1800, n), np.arange(n)) for n in (1, 3, 64, 97)]
        tree = runner.continue_blocks(runner.prefill(prefix), prefix, blocks)
        for block, hidden in zip(blocks, tree, strict=True):
            plain = runner.forward(np.concatenate([prefix.ids, block.ids]))[prefix_length:]
            difference = float(np.abs(plain - hidden).max())
            if prefix_length % 64 == 0:
                aligned = max(aligned, difference)
            else:
                unaligned = max(unaligned, difference)
            if len(block.ids) >= 3:  # the candidate head over both: the answer-level difference
                a = _softmax(tiny_model.candidate(hidden[:-1], hidden[-1]))
                b = _softmax(tiny_model.candidate(plain[:-1], plain[-1]))
                probability = max(probability, float(np.abs(a - b).max()))
    assert aligned <= 1e-5
    assert unaligned <= 1e-4
    assert probability <= 1e-5


def _softmax(logits: np.ndarray) -> np.ndarray:
    e = np.exp(logits.astype(np.float64) - logits.max())
    return e / e.sum()


def test_long_state_spans_are_read_through_windows(tiny_model) -> None:
    text = WORDS * 400
    tokens = len(tiny_model.tokens.part("user", text, False).ids)
    assert tokens > 10_000
    body = {
        "state": {"request": "Summarize the notes.", "answer": text},
        "questions": {
            "names": {"type": "span", "instructions": "Mark the names.", "criteria": {"name": "a person", "place": "a place"}},
            "mail": {"type": "span", "instructions": "Mark e-mail addresses.", "over": "answer", "criteria": {"email": None}},
            "topic": {"type": "noul", "instructions": "Is this about travel?"},
        },
    }
    plan = tiny_model.plan(body)
    windows = [trees.windows for _, trees in plan.rows if trees is not None and trees.windows]
    assert len(windows) == 2 and all(len(w) >= 6 for w in windows)
    response = tiny_model.finish(plan, tiny_model.execute([plan])[0])
    assert response["usage"]["input_tokens"] == plan.input_tokens > 2 * tokens
    for key in ("names", "mail"):
        assert response["answers"][key]["type"] == "noul"
        for span in response["spans"][key]:
            assert span["text"] == text[span["start"] : span["end"]] and span["text"].strip() == span["text"]
    assert response["answers"]["topic"]["type"] == "noul"


def test_per_question_errors_are_answered_in_place(tiny_model) -> None:
    response = tiny_model.answer(
        {
            "state": "Please refund the duplicate charge.",
            "questions": {
                "ok": {"type": "noul", "instructions": "Does the customer ask for a refund?"},
                "blank": {"type": "noul", "instructions": "   "},
                "few": {"type": "choice", "instructions": "Pick", "criteria": {"only": None}},
                "odd": {"type": "set", "instructions": "Which?", "criteria": {"a": None}, "colour": "red"},
                "t": {"type": "set", "instructions": "Which?", "criteria": {"x": None}, "threshold": True},
                "broad": {"type": "span", "instructions": "Mark", "criteria": {"x": None}, "head": "wide"},
            },
        }
    )
    answers = response["answers"]
    assert list(answers) == ["ok", "blank", "few", "odd", "t", "broad"]
    assert answers["blank"] == {"type": "noul", "error": "invalid_question", "message": "instructions must not be empty or whitespace"}
    assert answers["few"]["error"] == "invalid_question" and "2 to 255" in answers["few"]["message"]
    assert answers["odd"]["message"] == (
        "set questions do not take ['colour']: "
        "a set question takes criteria (or labels), instructions, over, overflow, require_full_input, threshold"
    )
    assert answers["t"]["message"] == "threshold must be a number in [0, 1]"
    assert answers["broad"]["error"] == "invalid_question"
    assert answers["ok"]["type"] == "noul" and "error" not in answers["ok"]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"state": "   ", "questions": {"q": {"type": "noul", "instructions": "x"}}}, "state must not be empty"),
        ({"state": "x", "questions": {}}, "at least one question"),
        ({"state": "x", "questions": {"q": {"type": "nope", "instructions": "x"}}}, "no question is valid"),
        ({"state": {"context": float("nan")}, "questions": {"q": {"type": "noul", "instructions": "x"}}}, "state must be"),
    ],
)
def test_request_level_errors(tiny_model, body: dict, message: str) -> None:
    with pytest.raises(RequestError, match=message) as error:
        tiny_model.plan(body)
    assert error.value.code == "invalid_request" and error.value.status == 400


def test_state_object_maps_keys_to_parts_and_over_resolves_keys(tiny_model) -> None:
    body = {
        "state": {"Prompt": "What is 17 times 23?", "notes": "internal", "source": "math table", "response": "391"},
        "questions": {"pii": {"preset": "pii", "over": "notes"}, "s": {"type": "span", "instructions": "x", "criteria": {"n": None}}},
    }
    plan = tiny_model.plan(body)
    state = plan.request.state
    assert state.roles == ("user", "context", "answer")
    assert state.text("context") == "notes:\ninternal\n\nsource:\nmath table"
    assert state.fields["source"] == ("context", len("notes:\ninternal\n\nsource:\n"), len(state.text("context")))
    questions = {q.id: q for q in plan.request.questions}
    assert questions["pii"].over == "context" and questions["pii"].span_range == (len("notes:\n"), len("notes:\ninternal"))
    assert questions["s"].over == "answer"  # a span reads the answer part by default


def test_rows_that_cannot_fit_fail_with_max_length_exceeded(tmp_path: Path) -> None:
    from s1omni.runtime.api import load_model

    model = load_model(make_vela_member(tmp_path / "short", seed=0, max_length=320))
    criteria = {f"option number {i}": f"a long description of option {i} " * 3 for i in range(12)}
    response = model.answer(
        {
            "state": {"request": "short question", "context": "background " * 400},
            "questions": {
                "big": {"type": "choice", "instructions": "Which one?", "criteria": criteria},
                "first": {"type": "span", "instructions": "Mark", "over": "request", "criteria": {"n": None}},
                "second": {"type": "span", "instructions": "Mark", "over": "request", "criteria": {"n": None}},
            },
            # Past the default budget of four 320-token inputs the context would not be read at all.
            "options": {"max_tokens": 1 << 20},
        }
    )
    # Row 1 holds every non-span question and the first span; each further span has its own row.
    assert response["answers"]["big"] == {"type": "choice", "error": "max_length_exceeded"}
    assert response["answers"]["first"] == {"type": "span", "error": "max_length_exceeded"}
    assert response["answers"]["second"]["type"] == "noul" and "second" in response["spans"]
    plan = model.plan({"state": {"request": "short question", "context": "background " * 400},
                       "questions": {"q": {"type": "noul", "instructions": "Is it short?", "over": "request"}}})  # fmt: skip
    _, trees = plan.rows[0]
    prefix_tokens = len(plan.trees[0][0].prefix.ids)
    assert trees is not None and prefix_tokens < 320  # the unread context shrank to fit
