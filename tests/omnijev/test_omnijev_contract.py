"""Every refusal of the OmniJev contract (wire-contract.md §11.1-§11.6), status and detail."""

from __future__ import annotations

import base64
import copy
import io
import json
from typing import Any

import pytest
from PIL import Image

from s1omni.runtime.errors import RequestError
from s1omni.runtime.omnijev.contract import (
    MAX_BODY,
    ContractError,
    Kind,
    compile_request,
    parse_strict,
    served_names,
)

NAMES = served_names("tinnel123/OmniJev", "OmniJev-4B-v1.1")


def png_url(width: int = 96, height: int = 64) -> str:
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), (10, 20, 30)).save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


URL = png_url()


def body(**questions: Any) -> dict[str, Any]:
    return {"model": "tinnel123/OmniJev", "state": {"images": [URL]}, "questions": questions}


def refused(value: dict[str, Any]) -> ContractError:
    with pytest.raises(ContractError) as error:
        compile_request(value, NAMES)
    return error.value


NOUL = {"type": "noul", "instructions": "A person is visible."}


# ----------------------------------------------------------------------------- strict JSON (400, 413)


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b'{"a": 1, "a": 2}', "duplicate key 'a'"),
        (b'{"questions": {"q": {"type": "noul", "type": "choice"}}}', "duplicate key 'type'"),
        (b'{"a": NaN}', "NaN is not a JSON number"),
        (b'{"a": Infinity}', "Infinity is not a JSON number"),
        (b'{"a": -Infinity}', "-Infinity is not a JSON number"),
        (b'{"a": 1e999}', "out of range"),
        (b'{"a": ' + b"9" * 400 + b"}", "out of range"),
        (b'{"a": "\xff"}', "invalid UTF-8"),
        (b'{"a": "\\ud800"}', "lone surrogate"),
        (b"[" * 129 + b"]" * 129, "recursion limit"),
        (b'{"a": 1} trailing', "Extra data"),
        (b"", "Expecting value"),
        (b"[1, 2]", "must be an object"),
        (b'"text"', "must be an object"),
    ],
)
def test_parse_strict_refuses_with_400(raw: bytes, reason: str) -> None:
    with pytest.raises(ContractError) as error:
        parse_strict(raw)
    assert error.value.status == 400
    assert reason in error.value.detail
    assert error.value.body() == {"detail": error.value.detail}


def test_parse_strict_accepts_what_json_allows() -> None:
    value = parse_strict('{"a": [1, 2.5, -0.0, "\\ud83d\\ude00", null, true], "b": {"c": "é"}}'.encode())
    assert value == {"a": [1, 2.5, -0.0, "😀", None, True], "b": {"c": "é"}}
    nested = b'{"a": ' + b"[" * 126 + b"]" * 126 + b"}"
    assert parse_strict(nested)["a"]


def test_body_over_12_mib_is_413() -> None:
    raw = json.dumps({"pad": "x" * MAX_BODY}).encode()
    with pytest.raises(ContractError) as error:
        parse_strict(raw)
    assert (error.value.status, error.value.detail) == (413, "request body exceeds 12 MiB")
    assert parse_strict(b'{"pad": "' + b"x" * (MAX_BODY - 11) + b'"}')  # exactly 12 MiB parses


def test_503_carries_retry_after() -> None:
    busy = ContractError(503, "the worker is busy")
    assert busy.headers() == {"Retry-After": "1"}
    assert ContractError(422, "x").headers() == {}


@pytest.mark.parametrize(
    ("status", "code"),
    [(400, "invalid_request"), (413, "request_too_large"), (422, "unsupported_surface"), (503, "not_ready")],
)
def test_contract_errors_are_request_errors_with_omnijevs_body(status: int, code: str) -> None:
    error = ContractError(status, "why")
    assert isinstance(error, RequestError)
    assert (error.status, error.code, error.message, error.body()) == (status, code, "why", {"detail": "why"})


# ----------------------------------------------------------------------------- envelope (422)


@pytest.mark.parametrize(
    ("change", "detail"),
    [
        (lambda b: b.update(extra=1), "request fields must be model, state and questions"),
        (lambda b: b.update(model="gpt"), "requested model is not loaded"),
        (lambda b: b.update(model=7), "requested model is not loaded"),
        (lambda b: b.pop("state"), "request requires state"),
        (lambda b: b.update(state=[URL]), "state must be an object with images"),
        (lambda b: b.update(state={"images": [URL], "video": {}}), "state supports images only"),
        (lambda b: b.update(state={"images": URL}), "state.images must be an array"),
        (lambda b: b.update(state={"images": []}), "state.images must contain exactly one image"),
        (lambda b: b.update(state={"images": [URL, URL]}), "state.images must contain exactly one image"),
        (lambda b: b.update(state={"images": [{"url": URL}]}), "an image must be a data URL"),
        (lambda b: b.update(state={"images": ["/tmp/a.png"]}), "invalid image data URL"),
        (
            lambda b: b.update(state={"images": ["data:image/webp;base64,AAAA"]}),
            "only inline PNG/JPEG images are supported",
        ),
        (lambda b: b.update(state={"images": [png_url(4097, 10)]}), "image must be at most 4096 pixels per side"),
        (lambda b: b.update(state={"images": [png_url(1, 201)]}), "image aspect ratio must be at most 200"),
        (lambda b: b.update(questions=[NOUL]), "questions must be an object"),
        (lambda b: b.update(questions={}), "questions must contain 1 to 64 questions"),
        (lambda b: b.update(questions={f"q{i}": NOUL for i in range(65)}), "questions must contain 1 to 64 questions"),
        (lambda b: b.update(questions={"x" * 257: NOUL}), "question ids must be at most 256 characters"),
    ],
)
def test_envelope_refusals(change, detail: str) -> None:
    value = body(q=NOUL)
    change(value)
    error = refused(value)
    assert (error.status, error.detail) == (422, detail)


def test_the_image_is_checked_before_the_questions() -> None:
    value = body(q={"type": "bad"})
    value["state"] = {"images": ["data:image/gif;base64,AAAA"]}
    assert refused(value).detail == "only inline PNG/JPEG images are supported"


@pytest.mark.parametrize("model", [None, "tinnel123/OmniJev", "omnijev", "omnijev-4b-v1.1", "OmniJev-4B-v1.1"])
def test_model_names_accepted(model: str | None) -> None:
    value = body(q=NOUL)
    value["model"] = model
    assert compile_request(value, NAMES).questions[0].kind == Kind.NOUL
    del value["model"]
    assert compile_request(value, NAMES).image.format == "png"


def test_a_synthetic_member_answers_to_its_own_names_only() -> None:
    names = served_names("synthetic/omnijev-synth-tiny-s0", "omnijev-synth-tiny-s0")
    assert names == {"synthetic/omnijev-synth-tiny-s0", "omnijev-synth-tiny-s0"}


def test_64_questions_and_256_character_ids_are_accepted() -> None:
    value = body(**{f"{i:0256d}": NOUL for i in range(64)})
    assert len(compile_request(value, NAMES).questions) == 64


# ----------------------------------------------------------------------------- questions (422)

LONG = "x" * 8193


@pytest.mark.parametrize(
    ("question", "detail"),
    [
        ([], "a question must be an object"),
        ({"type": "set", "instructions": "x"}, "question type must be choice, score, or noul"),
        ({"instructions": "x"}, "question type must be choice, score, or noul"),
        ({"type": "noul"}, "instructions must be a string"),
        ({"type": "noul", "instructions": 3}, "instructions must be a string"),
        ({"type": "noul", "instructions": LONG}, "instructions exceeds 8192 characters"),
        ({"type": "noul", "instructions": "x", "options": []}, "Noul supports type, instructions and region"),
        ({"type": "noul", "instructions": "x", "region": "left"}, 'a region must be {"box": [x1, y1, x2, y2]}'),
        (
            {"type": "noul", "instructions": "x", "region": {"box": [1, 2, 3]}},
            'a region must be {"box": [x1, y1, x2, y2]}',
        ),
        (
            {"type": "noul", "instructions": "x", "region": {"box": [1, 2, 3, 4], "id": 1}},
            'a region must be {"box": [x1, y1, x2, y2]}',
        ),
        (
            {"type": "noul", "instructions": "x", "region": {"box": [1, 2, 3, "4"]}},
            "region coordinates must be numbers",
        ),
        (
            {"type": "noul", "instructions": "x", "region": {"box": [1, 2, 3, True]}},
            "region coordinates must be numbers",
        ),
        (
            {"type": "noul", "instructions": "x", "region": {"box": [1, 2, 3, 1e10]}},
            "region coordinates must be within ±1e9",
        ),
        (
            {"type": "score", "instructions": "x", "levels": ["a"], "options": []},
            "Score supports type, instructions, levels and criteria",
        ),
        (
            {"type": "score", "instructions": "x", "levels": ["a"], "criteria": {"a": None}},
            "Score takes levels or criteria, not both",
        ),
        ({"type": "score", "instructions": "x", "levels": "a,b"}, "levels must be an array of strings"),
        ({"type": "score", "instructions": "x", "levels": ["a", 2]}, "a level must be a string"),
        ({"type": "score", "instructions": "x", "levels": ["a", LONG]}, "a level exceeds 8192 characters"),
        ({"type": "score", "instructions": "x", "criteria": {LONG: None}}, "a level exceeds 8192 characters"),
        ({"type": "score", "instructions": "x"}, "Score requires levels, or criteria as an object keyed by level"),
        (
            {"type": "score", "instructions": "x", "criteria": ["a"]},
            "Score requires levels, or criteria as an object keyed by level",
        ),
        ({"type": "score", "instructions": "x", "levels": []}, "a question needs 1 to 255 options"),
        ({"type": "score", "instructions": "x", "levels": ["a", "b", "a"]}, 'answer key "a" is repeated'),
        (
            {"type": "choice", "instructions": "x", "levels": ["a"]},
            "Choice supports type, instructions, options and criteria",
        ),
        (
            {"type": "choice", "instructions": "x", "options": [], "criteria": {}},
            "Choice takes options or criteria, not both",
        ),
        ({"type": "choice", "instructions": "x"}, "Choice requires options or criteria"),
        ({"type": "choice", "instructions": "x", "criteria": ["a"]}, "Choice requires options or criteria"),
        ({"type": "choice", "instructions": "x", "criteria": {"a": 1}}, "criteria values must be strings or null"),
        ({"type": "choice", "instructions": "x", "criteria": {"a": "r" * 8192}}, "criteria exceed 8192 characters"),
        ({"type": "choice", "instructions": "x", "criteria": {}}, "a question needs 1 to 255 options"),
        ({"type": "choice", "instructions": "x", "options": {"a": 1}}, "options must be an array"),
        ({"type": "choice", "instructions": "x", "options": [{}] * 1021}, "too many options"),
        ({"type": "choice", "instructions": "x", "options": ["a"]}, "an option must be an object"),
        (
            {"type": "choice", "instructions": "x", "options": [{"label": "a"}]},
            "an option supports key, text, region and abstain",
        ),
        (
            {"type": "choice", "instructions": "x", "options": [{"text": "a", "abstain": 1}]},
            "abstain must be a boolean",
        ),
        ({"type": "choice", "instructions": "x", "options": [{"key": None, "text": "a"}]}, "key must be a string"),
        ({"type": "choice", "instructions": "x", "options": [{"text": 5}]}, "text must be a string"),
        ({"type": "choice", "instructions": "x", "options": [{"key": LONG}]}, "key exceeds 8192 characters"),
        (
            {"type": "choice", "instructions": "x", "options": [{"key": "a", "region": None}]},
            'a region must be {"box": [x1, y1, x2, y2]}',
        ),
        ({"type": "choice", "instructions": "x", "options": [{"abstain": True}]}, "a question needs 1 to 255 options"),
        (
            {"type": "choice", "instructions": "x", "options": [{"text": str(i)} for i in range(256)]},
            "a question needs 1 to 255 options",
        ),
        (
            {"type": "choice", "instructions": "x", "options": [{"key": "a"}, {"text": "a"}]},
            'answer key "a" is repeated',
        ),
        (
            {"type": "choice", "instructions": "x", "criteria": {'say "hi"\n': None, "b": None}, "levels": 1},
            "Choice supports type, instructions, options and criteria",
        ),
        ({"type": "noul", "instructions": "look <|image_pad|> here"}, "text must not contain <|image_pad|>"),
        ({"type": "noul", "instructions": "<|vision_start|>"}, "text must not contain <|vision_start|>"),
        ({"type": "choice", "instructions": "x", "criteria": {"<|opt|>": None}}, "text must not contain <|opt|>"),
        ({"type": "choice", "instructions": "x", "options": [{"text": "a<|/opt|>"}]}, "text must not contain <|/opt|>"),
        ({"type": "score", "instructions": "x", "levels": ["<|video_pad|>"]}, "text must not contain <|video_pad|>"),
        (
            {"type": "choice", "instructions": "x", "criteria": {"k": "<|vision_end|>"}},
            "text must not contain <|vision_end|>",
        ),
    ],
)
def test_question_refusals_name_the_question(question: Any, detail: str) -> None:
    error = refused(body(first=NOUL, bad=question))
    assert (error.status, error.detail) == (422, f"question bad: {detail}")


def test_repeated_keys_are_quoted_as_the_reference_prints_them() -> None:
    question = {"type": "choice", "instructions": "x", "options": [{"key": 'a "b"\n'}, {"key": 'a "b"\n'}]}
    assert refused(body(q=question)).detail == 'question q: answer key "a \\"b\\"\\n" is repeated'


def test_too_many_options_in_all() -> None:
    choice = {"type": "choice", "instructions": "x", "options": [{"text": str(i)} for i in range(255)]}
    last = {"type": "score", "instructions": "x", "levels": list("abcde")}
    value = body(**{f"q{i}": choice for i in range(4)}, last=last)
    assert refused(value).detail == "request exceeds 1024 options in all"  # 1,025 rows
    last["levels"].pop()
    assert sum(len(q.options) for q in compile_request(value, NAMES).questions) == 1024


def test_a_reserved_token_is_refused_only_in_what_the_prompt_holds() -> None:
    # A key that is not rendered (the option has text) may hold anything; <|im_end|> is allowed.
    question = {"type": "choice", "instructions": "ok <|im_end|>", "options": [{"key": "<|opt|>", "text": "fine"}]}
    compiled = compile_request(body(q=question), NAMES).questions[0]
    assert compiled.keys == ("<|opt|>",) and compiled.options == ("fine",)


# ----------------------------------------------------------------------------- what compiles


def compiled(question: dict[str, Any]):
    return compile_request(body(q=question), NAMES).questions[0]


@pytest.mark.parametrize("region", [None, {}, "", [], 0, False, 0.0])
def test_noul_with_a_falsy_region_has_empty_text(region: Any) -> None:
    q = compiled({"type": "noul", "instructions": "x", "region": region})
    assert (q.kind, q.keys, q.options) == (Kind.NOUL, ("yes",), ("",))


def test_regions_round_half_to_even() -> None:
    q = compiled({"type": "noul", "instructions": "x", "region": {"box": [10.5, 20.49, 300, 400.5]}})
    assert q.options == ("region [10,20,300,400]",)
    q = compiled({"type": "noul", "instructions": "x", "region": {"box": [11.5, -0.5, -1.5, 1e9]}})
    assert q.options == ("region [12,0,-2,1000000000]",)


def test_choice_option_list_forms() -> None:
    long = "选项" * 60 + "option text that runs past the two-hundred character cut " * 3 + "🙂end"
    astral = "x" * 199 + "🙂" + "y" * 10
    q = compiled(
        {
            "type": "choice",
            "instructions": "Which region shows the error?",
            "options": [
                {"key": "top", "region": {"box": [0, 0, 1000, 120.4]}},
                {"text": "the dialog in the middle"},
                {},
                {"abstain": True},
                {"key": "long", "text": long},
                {"key": "astral", "text": astral},
                {"key": "", "text": "", "abstain": False},
            ],
        }
    )
    assert q.keys == ("top", "the dialog in the middle", "option_2", "long", "astral", "option_6")
    assert q.options[:3] == ("region [0,0,1000,120]", "the dialog in the middle", "")
    assert q.options[3] == long[:200] and len(q.options[3]) == 200
    assert q.options[4] == "x" * 199 + "🙂"  # the cut counts code points
    assert q.options[5] == ""


def test_choice_criteria_forms() -> None:
    q = compiled(
        {"type": "choice", "instructions": "x", "criteria": {"click": None, "type": "Enter text", "scroll": ""}}
    )
    assert q.keys == ("click", "type", "scroll")
    assert q.options == ("click", "type: Enter text", "scroll")
    cut = compiled({"type": "choice", "instructions": "x", "criteria": {"k": "r" * 300}})
    assert cut.options == (("k: " + "r" * 300)[:200],)


def test_score_forms() -> None:
    q = compiled({"type": "score", "instructions": "x", "criteria": {"safe": "nothing", "check first": None}})
    assert (q.kind, q.keys, q.options) == (Kind.SCORE, ("safe", "check first"), ("safe", "check first"))
    long = "L" * 300
    q = compiled({"type": "score", "instructions": "x", "levels": ["empty", long, "🙂"]})
    assert q.keys == ("empty", long, "🙂") and q.options == ("empty", long[:200], "🙂")


def test_questions_keep_the_request_order() -> None:
    value = body(z=NOUL, a={"type": "score", "instructions": "x", "levels": ["1"]}, m=NOUL)
    assert [q.id for q in compile_request(value, NAMES).questions] == ["z", "a", "m"]
    shuffled = copy.deepcopy(value)
    shuffled["questions"] = dict(reversed(list(value["questions"].items())))
    assert [q.id for q in compile_request(shuffled, NAMES).questions] == ["m", "a", "z"]
