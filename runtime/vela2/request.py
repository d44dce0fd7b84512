"""Reading a ``/v1/systemone`` request the way the Vela 2.0 packages read it.

The state becomes typed parts in user, context, answer order. Questions are validated one by one:
a question that fails gets ``invalid_question`` in place and never affects the others. Choice and
Noul show the abstain option; Noul is the two options ``no``/``yes``; Score levels are options with
empty descriptions (the ``relevance`` preset names them); Set and Span take 1 to 255 labels
(vllm-project/semantic-router:src/model-runtime/vllm_srun/families/vela2/request.py and
vllm_srun/systemone.py; wire-contract.md §3–§4).

Any question may carry ``require_full_input`` and ``overflow`` (``window``, the default, or
``truncate``; not both ``truncate`` and a required full input). Request-level refusals
(``invalid_request``): a blank or whitespace-only question id, and two sets whose label answers
``<id>.<label>`` would land on one ``answers`` key.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from dataclasses import dataclass, field, replace
from typing import Any

from ..digest import canonical_json
from ..errors import INVALID_QUESTION, QuestionError, RequestError, item_error
from .calibration import BROAD, SPAN_HEADS, Calibration

ROLES = ("user", "context", "answer")
KEY_ROLES = {
    "request": "user", "user": "user", "prompt": "user",
    "source": "context", "context": "context", "document": "context", "tools": "context", "previous_answer": "context",
    "answer": "answer", "response": "answer",
}  # fmt: skip
QUESTION_TYPES = ("choice", "noul", "score", "set", "span")
MIN_OPTIONS, MAX_OPTIONS = 2, 255
MIN_LEVELS, MAX_LEVELS = 2, 10
MAX_LABELS = 255
FIELDS = {
    "choice": {"type", "instructions", "criteria", "choices", "require_full_input"},
    "noul": {"type", "instructions", "criteria", "choices", "require_full_input"},
    "score": {"type", "instructions", "criteria", "levels", "require_full_input"},
    "set": {"type", "instructions", "criteria", "labels", "threshold", "require_full_input"},
    "span": {"type", "instructions", "criteria", "labels", "threshold", "head", "require_full_input"},
}
# Each kind's ordered alternative to a criteria object or list (the Router config's form).
LISTED = {"choice": "choices", "noul": "choices", "score": "levels", "set": "labels", "span": "labels"}
FAMILY_FIELDS = {"over", "preset", "overflow"}
PRESET_FIELDS = {"preset", "type", "over", "threshold", "overflow"}
# How a question reads a part longer than the scan budget: in windows up to the budget (``window``,
# the default) or as the part's first tokens only (``truncate``).
OVERFLOW = ("window", "truncate")
PRESETS = ("pii", "halu", "relevance")
NOUL_OPTIONS = (
    ("no", "false", "No. The statement or question is not satisfied."),
    ("yes", "true", "Yes. The statement or question is satisfied."),
)


def content_text(value: Any) -> str:
    """JSON content as model text: strings as they are, anything else as canonical JSON."""
    return value if isinstance(value, str) else canonical_json(value)


def finite_json(value: Any) -> bool:
    """Text, numbers, booleans, null, arrays and objects of them, with no non-finite float."""
    if value is None or isinstance(value, (str, bool, int)):
        return True
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, list):
        return all(finite_json(item) for item in value)
    if isinstance(value, dict):
        return all(isinstance(key, str) and finite_json(item) for key, item in value.items())
    return False


@dataclass(frozen=True)
class Part:
    role: str
    text: str


@dataclass(frozen=True)
class State:
    """Parts in role order, and each state key's ``(role, start, end)`` code-point range in its part."""

    parts: tuple[Part, ...]
    fields: dict[str, tuple[str, int, int]]

    @property
    def roles(self) -> tuple[str, ...]:
        return tuple(part.role for part in self.parts)

    def text(self, role: str) -> str:
        return next(part.text for part in self.parts if part.role == role)


@dataclass(frozen=True)
class Question:
    """A validated question in the engine's form.

    ``kind`` is the request type; ``type`` the engine type (Noul renders as a choice). ``options``
    are ``(name, description)`` pairs (labels for Set and Span). ``key`` names the calibration
    entry (the preset, else the id). ``span_range`` clips a span to one state key of a shared part.
    """

    id: str
    kind: str
    type: str
    text: str
    over: str | tuple[str, ...]
    options: tuple[tuple[str, str], ...]
    levels: tuple[Any, ...] = ()
    key: str = ""
    abstain: bool = False
    threshold: float | None = None
    head: str | None = None
    span_range: tuple[int, int] | None = None
    require_full_input: bool = False
    truncate: bool = False

    @property
    def names(self) -> list[str]:
        return [name for name, _ in self.options]

    @property
    def roles(self) -> tuple[str, ...]:
        return self.over if isinstance(self.over, tuple) else (self.over,)


@dataclass
class ReadRequest:
    """A request after validation: its state, question ids in order, valid questions and errors."""

    state: State
    question_ids: list[str]
    questions: list[Question] = field(default_factory=list)
    errors: dict[str, dict[str, Any]] = field(default_factory=dict)


def read_state(state: Any) -> State:
    """The typed parts of a state; ``ValueError`` says why a state is unusable."""
    if isinstance(state, str) and state.strip().startswith("{"):
        try:
            decoded = json.loads(state.strip())
        except ValueError:
            decoded = None
        if isinstance(decoded, dict):
            state = decoded
    if isinstance(state, str):
        if not state.strip():
            raise ValueError("state must not be empty or whitespace")
        return State((Part("user", state),), {"request": ("user", 0, len(state))})
    if isinstance(state, list):
        if not finite_json(state):
            raise ValueError("state must hold finite JSON values")
        text = canonical_json(state)
        return State((Part("user", text),), {"request": ("user", 0, len(text))})
    if not isinstance(state, dict) or not state or not finite_json(state):
        raise ValueError("state must be a non-empty string, JSON object or JSON array")
    by_role: dict[str, list[tuple[str, str, bool]]] = defaultdict(list)
    for key, value in state.items():
        role = KEY_ROLES.get(key.lower(), "context")
        by_role[role].append((key, content_text(value), key.lower() in KEY_ROLES))
    parts, fields = [], {}
    for role in ROLES:
        items = by_role.get(role)
        if not items:
            continue
        if len(items) == 1 and items[0][2]:
            key, text, _ = items[0]
            fields[key] = (role, 0, len(text))
        else:
            text = ""
            for key, value, _ in items:
                if text:
                    text += "\n\n"
                head = f"{key}:\n"
                start = len(text) + len(head)
                fields[key] = (role, start, start + len(value))
                text += head + value
        if not text.strip():
            raise ValueError(f"the {role} part of the state is empty")
        parts.append(Part(role, text))
    return State(tuple(parts), fields)


def _invalid(message: str) -> QuestionError:
    return QuestionError(INVALID_QUESTION, message)


def content(value: Any, where: str, nullable: bool = False) -> Any:
    """Non-blank text, or an object or array of finite JSON values (or null where allowed)."""
    if value is None and nullable:
        return None
    if isinstance(value, str):
        if not value.strip():
            raise _invalid(f"{where} must not be empty or whitespace")
        return value
    if isinstance(value, (dict, list)) and finite_json(value):
        return value
    raise _invalid(f"{where} must be text, an object or an array")


def named_options(criteria: Any, minimum: int) -> dict[str, Any]:
    """``{name: description}`` with ``minimum`` to 255 non-blank names; descriptions content or null."""
    if not isinstance(criteria, dict) or not minimum <= len(criteria) <= MAX_OPTIONS:
        raise _invalid(f"criteria must name {minimum} to {MAX_OPTIONS} options")
    options = {}
    for name, value in criteria.items():
        if not name.strip():
            raise _invalid("option names must be nonempty strings")
        options[name] = content(value, f"criteria.{name}", nullable=True)
    return options


def listed_options(items: Any, field_name: str, allowed: tuple[str, ...] | None = None) -> dict[str, Any]:
    """An ordered ``[{key, description}]`` list (``choices``, ``labels``) as criteria."""
    if not isinstance(items, list):
        raise _invalid(f"{field_name} must be a list of {{key, description}}")
    criteria: dict[str, Any] = {}
    for item in items:
        if not isinstance(item, dict) or "key" not in item or set(item) - {"key", "description"}:
            raise _invalid(f"each entry of {field_name} is {{key, description}}")
        key = item["key"]
        if not isinstance(key, str) or not key.strip() or key in criteria:
            raise _invalid(f"{field_name} keys must be unique nonempty strings")
        if allowed is not None and key not in allowed:
            raise _invalid(f"{field_name} may contain only {list(allowed)}")
        criteria[key] = item.get("description")
    return criteria


def _described(criteria: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    return tuple((name, "" if value is None else content_text(value)) for name, value in criteria.items())


def resolve_over(over: Any, state: State) -> tuple[str | tuple[str, ...], tuple[int, int] | None]:
    """The part (or parts, in state order) ``over`` reads, and a single state key's range."""
    items = over if isinstance(over, list) else [over]
    roles: list[str] = []
    span_range = None
    for item in items:
        if not isinstance(item, str):
            raise _invalid("over must be a state key, a part name or a list of them")
        if item in state.fields:
            role, start, end = state.fields[item]
            if not isinstance(over, list):
                span_range = (start, end)
        elif item in state.roles:
            role = item
        elif item in KEY_ROLES and KEY_ROLES[item] in state.roles:
            role = KEY_ROLES[item]
        else:
            raise _invalid(f"{item!r} is not a field of the state")
        if role not in roles:
            roles.append(role)
    if not roles:
        raise _invalid("over must not be empty")
    ordered = tuple(role for role in state.roles if role in roles)
    return (ordered[0] if len(ordered) == 1 else ordered), span_range


def taken_fields(kind: str) -> str:
    """What a ``kind`` question takes, for the message that refuses another field."""
    names = sorted(FIELDS[kind] - {"type", LISTED[kind]} | FAMILY_FIELDS - {"preset"})
    listed = ", ".join(f"criteria (or {LISTED[kind]})" if name == "criteria" else name for name in names)
    return f"a {kind} question takes {listed}"


def default_over(kind: str, state: State) -> str | tuple[str, ...]:
    roles = state.roles
    if kind == "span":
        return "answer" if "answer" in roles else ("user" if "user" in roles else roles[0])
    return roles[0] if len(roles) == 1 else roles


class QuestionReader:
    """Validates questions against one package's presets and span heads."""

    def __init__(self, calibration: Calibration, broad_head: bool):
        self.calibration = calibration
        self.broad_head = broad_head
        self.presets = tuple(name for name in PRESETS if calibration.schema(name))

    def read(self, state: Any, questions: dict[str, Any]) -> ReadRequest:
        """The state and questions; ``ValueError`` for a bad state, ``RequestError`` for a blank
        question id or two sets whose label answers would share one ``answers`` key."""
        if any(not question_id.strip() for question_id in questions):
            raise RequestError("invalid_request", "question ids must not be empty or whitespace")
        request = ReadRequest(read_state(state), list(questions))
        for question_id, question in questions.items():
            try:
                request.questions.append(self.question(question_id, question, request.state))
            except QuestionError as exc:
                kind = question.get("type") if isinstance(question, dict) else None
                request.errors[question_id] = item_error(kind if isinstance(kind, str) else None, exc.code, str(exc))
        taken = set(questions)
        for question in list(request.questions):
            if question.kind == "set" and any(f"{question.id}.{name}" in taken for name in question.names):
                request.questions.remove(question)
                request.errors[question.id] = item_error(
                    "set", INVALID_QUESTION, f"a label answer {question.id}.<label> is another question's id"
                )
        _refuse_colliding_label_answers(request.questions)
        return request

    def question(self, question_id: str, question: Any, state: State) -> Question:
        """One question in the engine's form; ``QuestionError`` when it is invalid."""
        if not isinstance(question, dict):
            raise _invalid("a question must be an object")
        level_names = None
        if question.get("preset") is not None:
            question, level_names = self._expand_preset(question)
        kind = question.get("type")
        if kind not in QUESTION_TYPES:
            raise _invalid(f"type must be one of {list(QUESTION_TYPES)}")
        unknown = set(question) - FIELDS[kind] - FAMILY_FIELDS
        if unknown:
            raise _invalid(f"{kind} questions do not take {sorted(unknown)}: {taken_fields(kind)}")
        full_input = question.get("require_full_input", False)
        if not isinstance(full_input, bool):
            raise _invalid("require_full_input must be a boolean")
        overflow = question.get("overflow", OVERFLOW[0])
        if not isinstance(overflow, str) or overflow not in OVERFLOW:
            raise _invalid(f"overflow must be one of {list(OVERFLOW)}")
        if full_input and overflow == "truncate":
            raise _invalid("require_full_input cannot be combined with overflow: truncate")
        if "instructions" not in question:
            raise _invalid("instructions is required")
        instructions = content(question["instructions"], "instructions")
        options, levels = self._options(kind, question, level_names)
        over, span_range = (
            resolve_over(question["over"], state) if question.get("over") is not None else (default_over(kind, state), None)
        )
        if kind != "span":
            span_range = None
        elif isinstance(over, tuple):
            raise _invalid("a span question reads one part")
        threshold = question.get("threshold")
        if threshold is not None and (
            isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0.0 <= threshold <= 1.0
        ):
            raise _invalid("threshold must be a number in [0, 1]")
        head = question.get("head")
        if head is not None and head not in SPAN_HEADS:
            raise _invalid(f"head must be one of {list(SPAN_HEADS)}")
        if head == BROAD and not self.broad_head:
            raise _invalid("this model has no broad span head")
        return Question(
            id=question_id,
            kind=kind,
            type="choice" if kind == "noul" else kind,
            text=content_text(instructions),
            over=over,
            options=options,
            levels=levels,
            key=question.get("preset") or question_id,
            abstain=kind in ("choice", "noul"),
            threshold=None if threshold is None else float(threshold),
            head=head,
            span_range=span_range,
            require_full_input=full_input,
            truncate=overflow == "truncate",
        )

    @staticmethod
    def _options(
        kind: str, question: dict[str, Any], level_names: list[str] | None
    ) -> tuple[tuple[tuple[str, str], ...], tuple[Any, ...]]:
        criteria = question.get("criteria")
        alternative = LISTED[kind]
        if question.get(alternative) is not None:
            if criteria is not None:
                raise _invalid(f"use criteria or {alternative}, not both")
            criteria = question[alternative]
            if kind != "score":
                criteria = listed_options(criteria, alternative, ("false", "true") if kind == "noul" else None)
        if kind == "score":
            if not isinstance(criteria, list) or not MIN_LEVELS <= len(criteria) <= MAX_LEVELS:
                raise _invalid(f"criteria must list {MIN_LEVELS} to {MAX_LEVELS} levels")
            levels = tuple(content(level, f"criteria[{index}]") for index, level in enumerate(criteria))
            texts = [content_text(level) for level in levels]
            if level_names:
                return tuple(zip(level_names, texts, strict=True)), levels
            return tuple((text, "") for text in texts), levels
        if kind == "noul":
            if criteria is not None and (not isinstance(criteria, dict) or set(criteria) - {"false", "true"}):
                raise _invalid("noul criteria may contain only false and true")
            given = {key: content(value, f"criteria.{key}", nullable=True) for key, value in (criteria or {}).items()}
            return tuple(
                (name, default if given.get(key) is None else content_text(given[key]))
                for name, key, default in NOUL_OPTIONS
            ), ()
        minimum = MIN_OPTIONS if kind == "choice" else 1
        return _described(named_options(criteria, minimum)), ()

    def _expand_preset(self, question: dict[str, Any]) -> tuple[dict[str, Any], list[str] | None]:
        """A preset question with the package's trained schema; Score presets also name their levels."""
        name = question["preset"]
        if name not in self.presets:
            raise _invalid(f"preset must be one of {list(self.presets)}")
        if set(question) - PRESET_FIELDS:
            raise _invalid("a preset question takes only preset, type, over, threshold and overflow")
        schema = self.calibration.schema(name) or {}
        level_names = None
        if name == "relevance":
            expanded = {"type": "score", "instructions": schema["text"], "criteria": list(schema["levels"].values())}
            level_names = list(schema["levels"])
        else:
            expanded = {"type": "span", "instructions": schema["text"], "criteria": dict(schema["labels"])}
        if question.get("type") not in (None, expanded["type"]):
            raise _invalid(f"preset {name} is a {expanded['type']} question")
        kept = {key: question[key] for key in ("over", "threshold", "overflow") if key in question}
        return {**expanded, **kept, "preset": name}, level_names


def _refuse_colliding_label_answers(questions: list[Question]) -> None:
    """Two sets whose label answers land on one flat key (set ``a`` label ``b.c`` and set ``a.b``
    label ``c`` both write ``answers["a.b.c"]``) would lose one in silence: the request is refused."""
    writers: dict[str, tuple[str, str]] = {}
    for question in questions:
        if question.kind != "set":
            continue
        for label in question.names:
            key = f"{question.id}.{label}"
            if key in writers:
                other, other_label = writers[key]
                raise RequestError(
                    "invalid_request",
                    f"set {other!r} (label {other_label!r}) and set {question.id!r} (label {label!r}) "
                    f"would both answer answers[{key!r}]",
                )
            writers[key] = (question.id, label)


def rendered_as(question: Question, options: tuple[tuple[str, str], ...]) -> Question:
    """The question with other options shown to the model (the span dispatcher's alias)."""
    return replace(question, options=options)
