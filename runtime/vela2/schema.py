"""The JSON Schema (2020-12) of a Vela 2.0 question, built from the tables ``request.py`` validates with.

Each kind's field set is ``request.FIELDS`` (plus ``FAMILY_FIELDS``), its listed alternative
``request.LISTED``, its bounds ``MIN_OPTIONS`` .. ``MAX_LEVELS``; this module adds only the shape and
the words of each field, and one example per kind. The schema states what the validator checks
structurally (types, bounds, which fields a kind takes); what needs the state or the package
(``over`` naming a state key, a preset the package has, unique ``key``s) stays the validator's, so a
body the schema accepts may still get ``invalid_question``, never the reverse
(``tests/test_openapi.py`` checks both on the calibration cases and on malformed questions).
"""

from __future__ import annotations

from typing import Any

from .calibration import SPAN_HEADS
from .request import (
    FAMILY_FIELDS,
    FIELDS,
    LISTED,
    MAX_LEVELS,
    MAX_OPTIONS,
    MIN_LEVELS,
    MIN_OPTIONS,
    OVERFLOW,
    PRESET_FIELDS,
    PRESETS,
    QUESTION_TYPES,
)

NON_BLANK = r"\S"
# Text (not blank), an object or an array: what instructions, descriptions and levels may be.
CONTENT: dict[str, Any] = {
    "description": "Non-blank text, or an object or array of finite JSON values (sent to the model as canonical JSON).",
    "anyOf": [{"type": "string", "pattern": NON_BLANK}, {"type": "object"}, {"type": "array"}],
}
DESCRIPTION = {"anyOf": [CONTENT, {"type": "null"}], "description": "What the option means to the model; null for none."}
OVER = {
    "description": (
        "The state key or part (user, context, answer) the question reads, or a list of them read together in "
        "state order. Default: the whole state; for a span, the answer if present, else the user part."
    ),
    "anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}, "minItems": 1}, {"type": "null"}],
}
OVERFLOW_SHAPE = {
    "enum": list(OVERFLOW),
    "default": OVERFLOW[0],
    "description": (
        "How a part longer than the scan budget is read: `window` (whole, in windows; past the budget "
        "scan_budget_exceeded) or `truncate` (its first tokens only; not with require_full_input)."
    ),
}
# ``truncate`` reads part of the input, which a required full input refuses.
FULL_AND_TRUNCATED = {
    "not": {
        "required": ["require_full_input", "overflow"],
        "properties": {"require_full_input": {"const": True}, "overflow": {"const": "truncate"}},
    }
}
THRESHOLD = {
    "description": "The decision threshold of each label (default: the package's); the one applied is in `thresholds`.",
    "anyOf": [{"type": "number", "minimum": 0, "maximum": 1}, {"type": "null"}],
}


def _listed(minimum: int, maximum: int, keys: list[str] | None = None) -> dict[str, Any]:
    """An ordered ``[{key, description}]`` list, the Router config's form of a criteria object."""
    key: dict[str, Any] = {"type": "string", "pattern": NON_BLANK}
    if keys is not None:
        key = {"enum": keys}
    entry = {
        "type": "object",
        "required": ["key"],
        "properties": {"key": key, "description": DESCRIPTION},
        "additionalProperties": False,
    }
    return {"type": "array", "items": entry, "minItems": minimum, "maxItems": maximum}


def _named(minimum: int, what: str) -> dict[str, Any]:
    return {
        "type": "object",
        "description": f"{what} names (non-blank, {minimum} to {MAX_OPTIONS}) to descriptions, in the order shown to the model.",
        "propertyNames": {"pattern": NON_BLANK},
        "additionalProperties": DESCRIPTION,
        "minProperties": minimum,
        "maxProperties": MAX_OPTIONS,
    }


LEVELS = {
    "type": "array",
    "description": f"The levels, lowest first ({MIN_LEVELS} to {MAX_LEVELS}); the answer's `score` is the expected level index.",
    "items": CONTENT,
    "minItems": MIN_LEVELS,
    "maxItems": MAX_LEVELS,
}
NOUL_CRITERIA = {
    "type": "object",
    "description": "Optional descriptions of the two options; null or absent keeps the model's default.",
    "properties": {"false": DESCRIPTION, "true": DESCRIPTION},
    "additionalProperties": False,
}
# The options of each kind: its criteria and its listed alternative (``request.LISTED``).
OPTIONS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "choice": (_named(MIN_OPTIONS, "Option"), _listed(MIN_OPTIONS, MAX_OPTIONS)),
    "noul": (NOUL_CRITERIA, _listed(0, 2, ["false", "true"])),
    "score": (LEVELS, LEVELS),
    "set": (_named(1, "Label"), _listed(1, MAX_OPTIONS)),
    "span": (_named(1, "Label"), _listed(1, MAX_OPTIONS)),
}
SUMMARIES = {
    "choice": "Which one option applies. Answers `choice`, `probabilities`, `confidence`, `abstain_probability`.",
    "noul": "Whether a statement holds (no/yes). Answers `noul` = P(yes), `confidence`, `abstain_probability`.",
    "score": "Where on an ordered scale. Answers `score` (expected level index), `probabilities`, `legend`.",
    "set": "Which labels apply, each on its own. Answers `selected` in `sets`, and a noul per label under `<id>.<label>`.",
    "span": "Which stretches of the text carry each label. Answers `spans` (code-point offsets) and `thresholds`.",
}
EXAMPLES: dict[str, dict[str, Any]] = {
    "choice": {
        "type": "choice",
        "instructions": "What does the customer want?",
        "criteria": {"refund": "money back for a charge", "other": None},
    },
    "noul": {"type": "noul", "instructions": "Does the customer ask for a refund?"},
    "score": {"type": "score", "instructions": "How urgent is it?", "criteria": ["Routine", "Soon", "Right now"]},
    "set": {
        "type": "set",
        "instructions": "Which topics does the message mention?",
        "criteria": {"billing": "payments or invoices", "shipping": "parcels or delivery"},
    },
    "span": {"type": "span", "instructions": "Mark the amounts of money.", "criteria": {"money": "an amount"}},
}


def _required_options(kind: str) -> list[dict[str, Any]]:
    """Criteria or its listed form, not both; every kind but noul needs one of them."""
    given = [{"required": [name], "properties": {name: {"not": {"type": "null"}}}} for name in ("criteria", LISTED[kind])]
    not_both = {"not": {"allOf": given}}
    return [not_both] if kind == "noul" else [{"anyOf": given}, not_both]


def question_schema(kind: str) -> dict[str, Any]:
    """One kind's question: exactly the fields ``request.FIELDS[kind]`` names."""
    criteria, listed = OPTIONS[kind]
    shapes: dict[str, Any] = {
        "type": {"const": kind},
        "instructions": CONTENT,
        "criteria": {"anyOf": [criteria, {"type": "null"}]},
        LISTED[kind]: {"anyOf": [listed, {"type": "null"}]},
        "over": OVER,
        "require_full_input": {
            "type": "boolean",
            "default": False,
            "description": "Fail the question (max_length_exceeded) unless every part of the state is read whole.",
        },
        "threshold": THRESHOLD,
        "head": {
            "description": "The span head that answers (default: the model's routing); `broad` only where the model has one.",
            "anyOf": [{"enum": list(SPAN_HEADS)}, {"type": "null"}],
        },
        "preset": {"type": "null"},
        "overflow": OVERFLOW_SHAPE,
    }
    names = FIELDS[kind] | FAMILY_FIELDS
    unknown = names - set(shapes)
    assert not unknown, f"no schema for {kind} fields {unknown}"
    return {
        "title": f"{kind.capitalize()}Question",
        "description": SUMMARIES[kind],
        "type": "object",
        "required": ["type", "instructions"],
        "properties": {name: shape for name, shape in shapes.items() if name in names},
        "additionalProperties": False,
        "allOf": [*_required_options(kind), FULL_AND_TRUNCATED],
        "examples": [EXAMPLES[kind]],
    }


def preset_schema() -> dict[str, Any]:
    """A question the package defines (its card's ``presets``): ``request.PRESET_FIELDS`` only."""
    shapes = {
        "preset": {"enum": list(PRESETS), "description": "pii and halu are span questions, relevance a score."},
        "type": {"enum": ["score", "span"]},
        "over": OVER,
        "threshold": THRESHOLD,
        "overflow": OVERFLOW_SHAPE,
    }
    assert set(shapes) == PRESET_FIELDS
    return {
        "title": "PresetQuestion",
        "description": "A question the package defines; which presets this model has is in its card's `presets`.",
        "type": "object",
        "required": ["preset"],
        "properties": shapes,
        "additionalProperties": False,
        "examples": [{"preset": "pii", "over": "request"}],
    }


def question() -> dict[str, Any]:
    """Any question: one of the kinds, or a preset."""
    return {
        "description": "One question; answers keep the order of the questions object.",
        "oneOf": [*(question_schema(kind) for kind in QUESTION_TYPES), preset_schema()],
    }
