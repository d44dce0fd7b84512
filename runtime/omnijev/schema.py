"""The JSON Schema (2020-12) of an OmniJev request, built from the tables ``contract.py`` validates with.

Each kind's fields are ``contract.FIELDS``, an option's ``contract.OPTION_FIELDS``, the bounds
``MAX_QUESTIONS``, ``MAX_OPTIONS``, ``MAX_TEXT_CHARS`` and ``MAX_ID_CHARS``; this module adds the
shapes, the words and one example per kind. What needs decoding (the image, reserved marker text,
repeated answer keys, the 1,024-option total) stays the contract's, so a body the schema accepts may
still be refused 422, never the reverse (``tests/test_openapi.py``).
"""

from __future__ import annotations

from typing import Any

from .contract import ALIASES, FIELDS, MAX_ID_CHARS, MAX_OPTIONS, MAX_QUESTIONS, MAX_TEXT_CHARS, OPTION_FIELDS

TEXT = {"type": "string", "maxLength": MAX_TEXT_CHARS}
REGION = {
    "type": "object",
    "description": "A box on the image, in its pixels: `region [x1,y1,x2,y2]` is what the model reads.",
    "required": ["box"],
    "properties": {
        "box": {
            "type": "array",
            "items": {"type": "number", "minimum": -1e9, "maximum": 1e9},
            "minItems": 4,
            "maxItems": 4,
        }
    },
    "additionalProperties": False,
}
# A noul's region is read as the reference's ``if q.get("region")``: any false JSON value means none.
FALSY = {"enum": [None, False, 0, "", [], {}], "description": "No region."}
OPTION = {
    "type": "object",
    "description": "One option: its answer key (default its text), its text or a region; `abstain` options are dropped.",
    "properties": {"key": TEXT, "text": TEXT, "region": REGION, "abstain": {"type": "boolean"}},
    "additionalProperties": False,
}
RUBRICS = {
    "type": "object",
    "description": "Answer keys to rubrics (null for none), in the order shown to the model.",
    "additionalProperties": {"anyOf": [{"type": "string"}, {"type": "null"}]},
    "minProperties": 1,
    "maxProperties": MAX_OPTIONS,
}
SHAPES: dict[str, dict[str, Any]] = {
    "noul": {"region": {"anyOf": [REGION, FALSY]}},
    "choice": {"options": {"type": "array", "items": OPTION, "minItems": 1, "maxItems": 4 * MAX_OPTIONS}, "criteria": RUBRICS},
    "score": {"levels": {"type": "array", "items": TEXT, "minItems": 1, "maxItems": MAX_OPTIONS}, "criteria": RUBRICS},
}
SUMMARIES = {
    "noul": 'Whether a statement holds, optionally about a region. Answers `{"yes": P}`.',
    "choice": "Which one option applies: `options` (text or region) or `criteria`. Answers each key's probability.",
    "score": "Where on a scale: `levels` or `criteria` keyed by level. Answers each level's probability.",
}
EXAMPLES: dict[str, dict[str, Any]] = {
    "noul": {"type": "noul", "instructions": "Is there a button here?", "region": {"box": [8, 8, 40, 24]}},
    "choice": {"type": "choice", "instructions": "Which colour dominates?", "criteria": {"red": None, "green": "mostly green"}},
    "score": {"type": "score", "instructions": "How cluttered is the screen?", "levels": ["calm", "busy", "cluttered"]},
}
# Kinds that take one field of two: exactly one of them (the contract's "takes X or Y, not both").
EITHER = {"choice": ("options", "criteria"), "score": ("levels", "criteria")}


def question_schema(kind: str) -> dict[str, Any]:
    """One kind's question: exactly the fields ``contract.FIELDS[kind]`` names."""
    properties = {"type": {"const": kind}, "instructions": TEXT, **SHAPES[kind]}
    assert set(properties) == set(FIELDS[kind]), kind
    schema: dict[str, Any] = {
        "title": f"{kind.capitalize()}Question",
        "description": SUMMARIES[kind],
        "type": "object",
        "required": ["type", "instructions"],
        "properties": properties,
        "additionalProperties": False,
        "examples": [EXAMPLES[kind]],
    }
    if kind in EITHER:
        schema["oneOf"] = [{"required": [name]} for name in EITHER[kind]]
    return schema


def request_schema() -> dict[str, Any]:
    """The whole body of ``POST /v1/systemone`` for an OmniJev model."""
    assert set(OPTION["properties"]) == set(OPTION_FIELDS)
    return {
        "title": "OmniJevRequest",
        "type": "object",
        "required": ["state", "questions"],
        "properties": {
            "model": {
                "description": f"The served id, or a released alias ({', '.join(ALIASES)}); absent or null: the served model.",
                "anyOf": [{"type": "string"}, {"type": "null"}],
            },
            "state": {
                "type": "object",
                "required": ["images"],
                "properties": {
                    "images": {
                        "type": "array",
                        "description": "Exactly one PNG or JPEG image as a base64 data URL.",
                        "items": {"type": "string", "pattern": "^data:image/"},
                        "minItems": 1,
                        "maxItems": 1,
                    }
                },
                "additionalProperties": False,
            },
            "questions": {
                "type": "object",
                "description": f"1 to {MAX_QUESTIONS} named questions; answers keep this order.",
                "propertyNames": {"maxLength": MAX_ID_CHARS},
                "additionalProperties": {"oneOf": [question_schema(kind) for kind in FIELDS]},
                "minProperties": 1,
                "maxProperties": MAX_QUESTIONS,
            },
        },
        "additionalProperties": False,
    }
