"""OmniJev's request contract: strict JSON, the envelope, the three question kinds, statuses.

Behaviour follows wire-contract.md §11.1–§11.6, which documents
``ThinkFlowLab/system1-omni:src/models/omnijev/native/src/contract.rs`` (question shapes and
option rendering as ``tinnel123666888/OmniJev:mso/infer.py`` ``MSO1._options``). Every refusal
is a ``ContractError`` carrying its HTTP status and the ``detail`` of the ``{"detail": ...}``
body: 400 for a body that does not parse strictly, 413 for one over 12 MiB, 422 for any
contract, image or token refusal (context first, as ``question next: ...``), 503 when busy.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

from .. import strict_json
from ..errors import RequestError
from .image import EncodedImage, ImageRefused, read_data_url

MODEL_ID = "tinnel123/OmniJev"
ALIASES = ("omnijev", "omnijev-4b-v1.1")
MAX_BODY = 12 * 1024 * 1024
MAX_QUESTIONS = 64
MAX_OPTIONS = 255
MAX_ROWS = 1024
MAX_TEXT_CHARS = 8192
MAX_ID_CHARS = 256
# Rendered option text is cut to this many code points, as the reference does.
OPTION_CHARS = 200
# Text the reference would read as image or option markers, moving the readouts.
RESERVED_TOKENS = ("<|opt|>", "<|/opt|>", "<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>")
BUSY = "the worker is busy"
# The fields each question kind takes, and those of a choice's option (refused messages list them).
FIELDS = {
    "noul": ("type", "instructions", "region"),
    "choice": ("type", "instructions", "options", "criteria"),
    "score": ("type", "instructions", "levels", "criteria"),
}
OPTION_FIELDS = ("key", "text", "region", "abstain")


# The project's request error code for each status OmniJev answers with (for logs and metrics).
CODES = {400: "invalid_request", 413: "request_too_large", 422: "unsupported_surface", 503: "not_ready"}


class ContractError(RequestError):
    """A refused request: ``status`` and the ``detail`` of its ``{"detail": ...}`` body.

    A ``RequestError``, so a server that answers ``error.body()`` at ``error.status`` renders
    OmniJev's bodies unchanged; ``headers()`` adds ``Retry-After: 1`` to the busy 503.
    """

    def __init__(self, status: int, detail: str):
        super().__init__(CODES[status], detail)
        self.detail = detail
        self._status = status

    @property
    def status(self) -> int:
        return self._status

    def body(self) -> dict[str, str]:
        return {"detail": self.detail}

    def headers(self) -> dict[str, str]:
        return {"Retry-After": "1"} if self.status == 503 else {}


class Kind(IntEnum):
    """Question kinds; the value is the decision head's type id."""

    NOUL = 0
    CHOICE = 1
    SCORE = 2

    @property
    def label(self) -> str:
        return self.name.lower()


@dataclass(frozen=True)
class Question:
    id: str
    kind: Kind
    instructions: str
    keys: tuple[str, ...]  # answer keys, one per option, in the caller's order
    options: tuple[str, ...]  # each option's text as written between the option markers


@dataclass(frozen=True)
class Request:
    image: EncodedImage
    questions: tuple[Question, ...]


def served_names(model_id: str, member: str) -> frozenset[str]:
    """What a request's ``model`` may name: the served id, the member, and the released aliases."""
    names = {model_id, member}
    if model_id == MODEL_ID:
        names.update(ALIASES)
    return frozenset(names)


# ----------------------------------------------------------------------------- strict JSON


def parse_strict(body: bytes) -> dict[str, Any]:
    """The request body as a JSON object: 413 over 12 MiB, 400 for anything a strict parser refuses.

    Duplicate keys, NaN/Infinity, numbers outside the float range, malformed UTF-8 or JSON, lone
    surrogates and excessive nesting are all malformed (wire-contract.md §11.5).
    """
    if len(body) > MAX_BODY:
        raise ContractError(413, "request body exceeds 12 MiB")
    try:
        value = strict_json.loads(body)
    except strict_json.StrictJsonError as exc:
        raise ContractError(400, str(exc) if exc.kind == "utf8" else f"invalid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ContractError(400, "invalid JSON: the request must be an object")
    return value


# ----------------------------------------------------------------------------- the contract


def _refuse(detail: str) -> ContractError:
    return ContractError(422, detail)


def _quoted(text: str) -> str:
    """``text`` quoted as the reference's messages print it (Rust's ``{:?}``)."""
    escapes = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"}
    body = "".join(escapes.get(c, f"\\u{{{ord(c):x}}}" if ord(c) < 0x20 or ord(c) == 0x7F else c) for c in text)
    return f'"{body}"'


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _text(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise _refuse(f"{what} must be a string")
    if len(value) > MAX_TEXT_CHARS:
        raise _refuse(f"{what} exceeds {MAX_TEXT_CHARS} characters")
    return value


def _cut(text: str) -> str:
    return text[:OPTION_CHARS]


def _region(value: Any) -> str:
    """``region [x1,y1,x2,y2]``, each coordinate rounded half to even as Python's ``round``."""
    corners = value.get("box") if isinstance(value, dict) and len(value) == 1 else None
    if not isinstance(corners, list) or len(corners) != 4:
        raise _refuse('a region must be {"box": [x1, y1, x2, y2]}')
    rounded = []
    for corner in corners:
        if not _is_number(corner):
            raise _refuse("region coordinates must be numbers")
        if abs(corner) > 1e9:
            raise _refuse("region coordinates must be within ±1e9")
        rounded.append(round(corner))
    return "region [{},{},{},{}]".format(*rounded)


def _allowed(question: dict[str, Any], keys: tuple[str, ...], message: str) -> None:
    if any(key not in keys for key in question):
        raise _refuse(message)


def _noul(question: dict[str, Any]) -> tuple[list[str], list[str]]:
    _allowed(question, FIELDS["noul"], "Noul supports type, instructions and region")
    # Python truthiness, as the reference's ``if q.get("region")``: null, {}, "", [], 0, false mean none.
    text = _region(question["region"]) if question.get("region") else ""
    return ["yes"], [text]


def _score(question: dict[str, Any]) -> tuple[list[str], list[str]]:
    _allowed(question, FIELDS["score"], "Score supports type, instructions, levels and criteria")
    if "levels" in question and "criteria" in question:
        raise _refuse("Score takes levels or criteria, not both")
    if "levels" in question:
        if not isinstance(question["levels"], list):
            raise _refuse("levels must be an array of strings")
        levels = [_text(level, "a level") for level in question["levels"]]
    else:
        criteria = question.get("criteria")
        if not isinstance(criteria, dict):
            raise _refuse("Score requires levels, or criteria as an object keyed by level")
        levels = [_text(level, "a level") for level in criteria]
    return levels, [_cut(level) for level in levels]


def _choice_options(entries: Any) -> tuple[list[str], list[str]]:
    if not isinstance(entries, list):
        raise _refuse("options must be an array")
    if len(entries) > 4 * MAX_OPTIONS:
        raise _refuse("too many options")
    keys, options = [], []
    for index, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise _refuse("an option must be an object")
        _allowed(entry, OPTION_FIELDS, "an option supports key, text, region and abstain")
        if "abstain" in entry and not isinstance(entry["abstain"], bool):
            raise _refuse("abstain must be a boolean")
        if entry.get("abstain"):
            continue  # the head has its own abstain output
        for field in ("key", "text"):
            if field in entry:
                _text(entry[field], field)
        keys.append(entry.get("key") or entry.get("text") or f"option_{index}")
        options.append(_region(entry["region"]) if "region" in entry else _cut(entry.get("text", "")))
    return keys, options


def _choice_criteria(criteria: Any) -> tuple[list[str], list[str]]:
    if not isinstance(criteria, dict):
        raise _refuse("Choice requires options or criteria")
    options = []
    for key, rubric in criteria.items():
        if rubric is not None and not isinstance(rubric, str):
            raise _refuse("criteria values must be strings or null")
        rubric = rubric or ""
        if len(key) + len(rubric) > MAX_TEXT_CHARS:
            raise _refuse(f"criteria exceed {MAX_TEXT_CHARS} characters")
        options.append(_cut(f"{key}: {rubric}" if rubric else key))
    return list(criteria), options


def _choice(question: dict[str, Any]) -> tuple[list[str], list[str]]:
    _allowed(question, FIELDS["choice"], "Choice supports type, instructions, options and criteria")
    if "options" in question and "criteria" in question:
        raise _refuse("Choice takes options or criteria, not both")
    if "options" in question:
        return _choice_options(question["options"])
    return _choice_criteria(question.get("criteria"))


KINDS = {"noul": (Kind.NOUL, _noul), "choice": (Kind.CHOICE, _choice), "score": (Kind.SCORE, _score)}


def _question(qid: str, question: Any) -> Question:
    if not isinstance(question, dict):
        raise _refuse("a question must be an object")
    kind_name = question.get("type")
    if not isinstance(kind_name, str) or kind_name not in KINDS:
        raise _refuse("question type must be choice, score, or noul")
    kind, read = KINDS[kind_name]
    instructions = _text(question.get("instructions"), "instructions")
    keys, options = read(question)
    if not 1 <= len(options) <= MAX_OPTIONS:
        raise _refuse(f"a question needs 1 to {MAX_OPTIONS} options")
    seen: set[str] = set()
    for key in keys:
        if key in seen:
            raise _refuse(f"answer key {_quoted(key)} is repeated")
        seen.add(key)
    for text in (instructions, *options):
        token = next((t for t in RESERVED_TOKENS if t in text), None)
        if token is not None:
            raise _refuse(f"text must not contain {token}")
    return Question(qid, kind, instructions, tuple(keys), tuple(options))


def _image(state: Any) -> EncodedImage:
    if not isinstance(state, dict):
        raise _refuse("state must be an object with images")
    if any(key != "images" for key in state):
        raise _refuse("state supports images only")
    images = state.get("images")
    if not isinstance(images, list):
        raise _refuse("state.images must be an array")
    if len(images) != 1:
        raise _refuse("state.images must contain exactly one image")
    if not isinstance(images[0], str):
        raise _refuse("an image must be a data URL")
    try:
        return read_data_url(images[0])
    except ImageRefused as exc:
        raise _refuse(str(exc)) from None


def compile_request(body: dict[str, Any], model_names: Collection[str]) -> Request:
    """The typed request, validated whole before any work; ``ContractError`` (422) names the first refusal.

    Checks run in the reference's order: fields, model, the image (header only), the questions in
    request order, then the option total.
    """
    if any(key not in ("model", "state", "questions") for key in body):
        raise _refuse("request fields must be model, state and questions")
    model = body.get("model")
    if model is not None and not (isinstance(model, str) and model in model_names):
        raise _refuse("requested model is not loaded")
    if "state" not in body:
        raise _refuse("request requires state")
    image = _image(body["state"])
    questions = body.get("questions")
    if not isinstance(questions, dict):
        raise _refuse("questions must be an object")
    if not 1 <= len(questions) <= MAX_QUESTIONS:
        raise _refuse(f"questions must contain 1 to {MAX_QUESTIONS} questions")
    compiled = []
    for qid, question in questions.items():
        if len(qid) > MAX_ID_CHARS:
            raise _refuse(f"question ids must be at most {MAX_ID_CHARS} characters")
        try:
            compiled.append(_question(qid, question))
        except ContractError as exc:
            raise _refuse(f"question {qid}: {exc.detail}") from None
    if sum(len(q.options) for q in compiled) > MAX_ROWS:
        raise _refuse(f"request exceeds {MAX_ROWS} options in all")
    return Request(image, tuple(compiled))
