"""The OpenAPI documents: valid OpenAPI 3.1, and their request schemas agree with the validators the
server runs (a question the schema refuses is one the validator refuses, on the calibration cases
and on malformed questions; what only the state or the package can decide is the validator's)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from openapi_spec_validator import validate
from openapi_spec_validator.validation.exceptions import OpenAPIValidationError

from s1omni.runtime.omnijev import contract
from s1omni.runtime.omnijev import schema as omnijev_schema
from s1omni.runtime.vela2 import schema as vela_schema
from s1omni.server.openapi import document, page
from tests.contracts import component

CALIB = Path(__file__).resolve().parents[1] / "calib"
# Refusals that need the state or the package, which a schema of the body alone cannot see.
NEEDS_CONTEXT = ("is another question's id", "is not a field of the state", "preset must be one of", "no broad span head")
STATE = {"request": "Please refund the duplicate charge of $42.", "answer": "I have refunded $42."}
MALFORMED_VELA: list[Any] = [
    "not an object",
    {"type": "colour", "instructions": "Which?"},
    {"type": "choice", "criteria": {"a": None, "b": None}},
    {"type": "choice", "instructions": "   ", "criteria": {"a": None, "b": None}},
    {"type": "choice", "instructions": "Which?", "options": [{"key": "a"}, {"key": "b"}]},
    {"type": "choice", "instructions": "Which?", "criteria": {"only": None}},
    {"type": "choice", "instructions": "Which?", "criteria": {"a": None, " ": None}},
    {"type": "choice", "instructions": "Which?", "choices": [{"key": "a"}, {"key": "b", "weight": 1}]},
    {"type": "choice", "instructions": "Which?", "criteria": {"a": None, "b": None}, "choices": [{"key": "a"}]},
    {"type": "noul", "instructions": "Is it?", "criteria": {"maybe": "perhaps"}},
    {"type": "noul", "instructions": "Is it?", "require_full_input": "yes"},
    {"type": "noul", "instructions": "Is it?", "overflow": "skip"},
    {"type": "noul", "instructions": "Is it?", "overflow": None},
    {"type": "noul", "instructions": "Is it?", "overflow": "truncate", "require_full_input": True},
    {"type": "score", "instructions": "How much?", "criteria": ["only one"]},
    {"type": "score", "instructions": "How much?", "criteria": {"low": None, "high": None}},
    {"type": "score", "instructions": "How much?", "levels": [str(level) for level in range(11)]},
    {"type": "set", "instructions": "Which?", "criteria": {}},
    {"type": "set", "instructions": "Which?", "criteria": {"a": None}, "threshold": 1.5},
    {"type": "set", "instructions": "Which?", "criteria": {"a": None}, "threshold": True},
    {"type": "set", "instructions": "Which?", "criteria": {"a": None}, "head": "router"},
    {"type": "span", "instructions": "Mark.", "criteria": {"a": None}, "head": "wide"},
    {"type": "span", "instructions": "Mark.", "criteria": {"a": None}, "over": []},
    {"type": "span", "instructions": "Mark.", "criteria": {"a": None}, "labels": [{"key": "b"}]},
    {"preset": "pii", "instructions": "Mark."},
    {"preset": "pii", "type": "choice"},
]
MALFORMED_OMNIJEV: list[Any] = [
    "not an object",
    {"type": "set", "instructions": "Which?"},
    {"type": "noul"},
    {"type": "noul", "instructions": 3},
    {"type": "noul", "instructions": "Is it?", "region": {"box": [1, 2, 3]}},
    {"type": "noul", "instructions": "Is it?", "region": {"box": [1, 2, 3, "4"]}},
    {"type": "noul", "instructions": "Is it?", "region": {"box": [0, 0, 2e9, 1]}},
    {"type": "noul", "instructions": "Is it?", "criteria": {"yes": None}},
    {"type": "choice", "instructions": "Which?"},
    {"type": "choice", "instructions": "Which?", "options": [{"text": "a"}], "criteria": {"a": None}},
    {"type": "choice", "instructions": "Which?", "options": [{"label": "a"}]},
    {"type": "choice", "instructions": "Which?", "options": [{"text": "a", "abstain": "no"}]},
    {"type": "choice", "instructions": "Which?", "criteria": {"a": 1}},
    {"type": "choice", "instructions": "Which?", "choices": [{"key": "a"}]},
    {"type": "score", "instructions": "How much?", "levels": "low, high"},
    {"type": "score", "instructions": "How much?", "levels": ["low", 2]},
    {"type": "score", "instructions": "How much?", "levels": ["low"], "criteria": {"low": None}},
    {"type": "score", "instructions": "x" * (contract.MAX_TEXT_CHARS + 1), "levels": ["low", "high"]},
]


def cases(family: str) -> list[dict[str, Any]]:
    return json.loads((CALIB / family / "cases.json").read_text(encoding="utf-8"))["cases"]


@pytest.mark.parametrize("family", ["vela2", "omnijev"])
def test_the_documents_are_openapi_3_1_and_the_page_lists_them(family: str) -> None:
    spec = document(family)
    assert spec["openapi"] == "3.1.0"
    validate(spec)
    rendered = page(spec)
    assert all(f'<h3 id="{name}">' in rendered for name in spec["components"]["schemas"])
    assert "GET /v1/models" in rendered and "http" not in rendered.replace("href=/openapi.json", "")  # nothing fetched


def test_every_family_has_a_document_and_no_other() -> None:
    from s1omni.runtime.families import FAMILIES, UnknownFamily
    from s1omni.server.openapi import DOCUMENTS

    assert set(DOCUMENTS) == set(FAMILIES)
    with pytest.raises(UnknownFamily, match="'vela3'"):
        document("vela3")


def test_a_broken_document_is_refused() -> None:
    spec = document("vela2")
    del spec["paths"]["/v1/models"]["get"]["responses"]["200"]["description"]
    with pytest.raises(OpenAPIValidationError):
        validate(spec)


def vela_refusals(model: Any, question: Any) -> str | None:
    """The reader's message for ``question`` about ``STATE``, or None when it is valid."""
    read = model.reader.read(STATE, {"q": question})
    return read.errors["q"].get("message", "") if "q" in read.errors else None


def test_every_vela_calibration_request_validates_and_its_refused_questions_are_the_readers(tiny_model: Any) -> None:
    spec = document("vela2")
    request, question = component(spec, "DecisionRequest"), component(spec, "Question")
    refused = 0
    for case in cases("vela2"):
        body = case["request"]
        read = tiny_model.reader.read(body["state"], body["questions"])
        for qid, entry in body["questions"].items():
            if not question.is_valid(entry):
                refused += 1
                assert qid in read.errors, f"{case['name']}.{qid}: the schema refuses what the server answers"
            elif qid in read.errors:
                assert any(part in read.errors[qid]["message"] for part in NEEDS_CONTEXT), (case["name"], read.errors[qid])
        valid = {qid: entry for qid, entry in body["questions"].items() if qid not in read.errors}
        request.validate({**body, "questions": valid})
    assert refused > 0  # the mixed-invalid case's malformed questions


@pytest.mark.parametrize("entry", MALFORMED_VELA, ids=range(len(MALFORMED_VELA)))
def test_a_malformed_vela_question_is_refused_by_schema_and_server(tiny_model: Any, entry: Any) -> None:
    spec = document("vela2")
    assert not component(spec, "Question").is_valid(entry)
    assert vela_refusals(tiny_model, entry) is not None
    assert not component(spec, "DecisionRequest").is_valid({"state": STATE, "questions": {"q": entry}})


def test_a_field_of_another_kind_is_refused_with_the_fields_the_kind_takes(tiny_model: Any) -> None:
    message = vela_refusals(tiny_model, {"type": "choice", "instructions": "Which?", "options": [{"key": "a"}, {"key": "b"}]})
    takes = "a choice question takes criteria (or choices), instructions, over, overflow, require_full_input"
    assert message == f"choice questions do not take ['options']: {takes}"
    message = vela_refusals(tiny_model, {"type": "score", "instructions": "How much?", "labels": ["a", "b"]})
    assert message is not None and message.endswith("takes criteria (or levels), instructions, over, overflow, require_full_input")


def test_malformed_envelopes_are_refused() -> None:
    request = component(document("vela2"), "DecisionRequest")
    good = {"state": STATE, "questions": {"q": vela_schema.EXAMPLES["noul"]}}
    request.validate(good)
    request.validate({**good, "options": {"profile": "batching"}})  # well formed: whether it is enabled is the server's to say
    for bad in (
        {"questions": good["questions"]},
        {**good, "colour": "red"},
        {**good, "model": 3},
        {**good, "options": {"deadline_ms": 0}},
        {**good, "options": {"profile": "Fast"}},
        {**good, "options": {"profile": 7}},
        {**good, "options": {"max_tokens": 0}},
        {**good, "options": {"return_meta": None}},
        {**good, "states": {"other": {"state": "x"}}},
        {**good, "state": "   "},
        {**good, "questions": {}},
        {**good, "questions": {" ": vela_schema.EXAMPLES["noul"]}},
    ):
        assert not request.is_valid(bad), bad


def test_every_example_is_answered_by_the_tiny_member(tiny_model: Any) -> None:
    spec = document("vela2")
    examples = spec["components"]["schemas"]["DecisionRequest"]["examples"]
    for example in examples:
        component(spec, "DecisionRequest").validate(example)
        plan = tiny_model.plan(example)
        assert plan.valid_count == len(vela_schema.EXAMPLES)
    for kind in vela_schema.QUESTION_TYPES:
        assert vela_refusals(tiny_model, vela_schema.EXAMPLES[kind]) is None
    assert vela_refusals(tiny_model, vela_schema.preset_schema()["examples"][0]) is None
    component(spec, "DecisionRequest").validate(tiny_model.golden_request())


def test_the_card_lists_the_kinds_and_presets_of_the_schema(tiny_model: Any) -> None:
    question = document("vela2")["components"]["schemas"]["Question"]
    kinds = [entry["properties"]["type"]["const"] for entry in question["oneOf"] if "const" in entry["properties"]["type"]]
    card = tiny_model.card()
    assert card["question_types"] == kinds
    assert set(card["presets"]) <= set(vela_schema.preset_schema()["properties"]["preset"]["enum"])


def omnijev_refusal(image: dict[str, Any], qid: str, question: Any) -> str | None:
    try:
        contract.compile_request({"state": image, "questions": {qid: question}}, {contract.MODEL_ID})
    except contract.ContractError as exc:
        return exc.detail
    return None


def test_every_omnijev_calibration_request_validates_and_its_questions_are_the_contracts() -> None:
    spec = document("omnijev")
    request = component(spec, "DecisionRequest")
    for case in cases("omnijev"):
        body = case["request"]
        request.validate(body)
        for qid, entry in body["questions"].items():
            assert omnijev_refusal(body["state"], qid, entry) is None, (case["name"], qid)


@pytest.mark.parametrize("entry", MALFORMED_OMNIJEV, ids=range(len(MALFORMED_OMNIJEV)))
def test_a_malformed_omnijev_question_is_refused_by_schema_and_contract(entry: Any) -> None:
    image = cases("omnijev")[0]["request"]["state"]
    assert not component(document("omnijev"), "DecisionRequest").is_valid({"state": image, "questions": {"q": entry}})
    assert omnijev_refusal(image, "q", entry) is not None


def test_the_omnijev_examples_are_accepted_by_the_contract() -> None:
    image = cases("omnijev")[0]["request"]["state"]
    for kind, example in omnijev_schema.EXAMPLES.items():
        assert omnijev_refusal(image, kind, example) is None
        assert component(document("omnijev"), "DecisionRequest").is_valid({"state": image, "questions": {kind: example}})
