"""Strict JSON for request bodies, one reader for every family.

Beyond what ``json.loads`` refuses, a strict body holds no duplicate object key (a reader that kept
the last one would answer a different question than the one sent, in silence), no ``NaN`` or
``Infinity``, no number outside the float range, no lone surrogate and no nesting past 128 levels
(the System1-Omni workers' rules, wire-contract.md §11.5; serde_json's default depth limit).
Callers phrase the refusal in their own contract's words from ``StrictJsonError.kind``.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

MAX_DEPTH = 128
# Valid UTF-8 holds no surrogate, so only a \uD800-\uDFFF escape can leave a lone one: bodies
# without such an escape skip the walk that looks for it.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


class StrictJsonError(ValueError):
    """A body a strict reader refuses; ``kind`` is utf8, syntax, duplicate, constant, range, surrogate or depth."""

    def __init__(self, kind: str, reason: str):
        super().__init__(reason)
        self.kind = kind


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    value = dict(pairs)
    if len(value) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise StrictJsonError("duplicate", f"duplicate key {key!r}")
            seen.add(key)
    return value


def _constant(name: str) -> Any:
    raise StrictJsonError("constant", f"{name} is not a JSON number")


def _float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise StrictJsonError("range", f"number {text[:40]} is out of range")
    return value


def _int(text: str) -> int:
    value = int(text)
    try:
        float(value)
    except OverflowError:
        raise StrictJsonError("range", f"number {text[:40]} is out of range") from None
    return value


def _check_tree(value: Any, escapes_surrogates: bool) -> None:
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            if escapes_surrogates:
                try:
                    item.encode("utf-8")
                except UnicodeEncodeError:
                    raise StrictJsonError("surrogate", "lone surrogate in a string") from None
        elif isinstance(item, (dict, list)):
            if depth > MAX_DEPTH:
                raise StrictJsonError("depth", "recursion limit exceeded")
            children = [*item.keys(), *item.values()] if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)


def loads(raw: bytes) -> Any:
    """The JSON value of ``raw``; ``StrictJsonError`` for anything a strict reader refuses."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise StrictJsonError("utf8", f"invalid UTF-8: {exc.reason} at byte {exc.start}") from None
    try:
        value = json.loads(text, object_pairs_hook=_object, parse_constant=_constant, parse_float=_float, parse_int=_int)
    except StrictJsonError:
        raise
    except RecursionError:
        raise StrictJsonError("depth", "recursion limit exceeded") from None
    except ValueError as exc:
        raise StrictJsonError("syntax", str(exc)) from None
    _check_tree(value, _SURROGATE_ESCAPE.search(raw) is not None)
    return value
