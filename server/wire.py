"""JSON on the wire: the strict request decoder and the response encoder.

Decoding is stricter than the reference's plain ``json.loads``
(vllm-project/semantic-router:src/model-runtime/vllm_srun/api/app.py ``_read_json``): besides
invalid UTF-8, malformed JSON and unpaired surrogate escapes, a duplicate object key, ``NaN``,
``Infinity`` and a number too large for a float are refused with 400 ``invalid_request``. A decoder
that kept the last duplicate would answer a different question than the client asked, in silence;
the System1-Omni workers refuse both the same way (wire-contract.md §11.5).

Encoding is UTF-8 with non-ASCII kept, compact separators and no NaN or infinity: a response that
holds one becomes 500 ``internal_error`` "the model produced a non-finite number".
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from runtime.errors import RequestError

NON_FINITE = "the model produced a non-finite number"
# Strict UTF-8 cannot carry a surrogate, so only a \uD800-\uDFFF escape can leave an unpaired one;
# bodies without such an escape skip the walk that looks for it.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


class _Refused(ValueError):
    """A body that parses as JSON but breaks one of the decoder's own rules."""


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    value = dict(pairs)
    if len(value) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _Refused(f"the request body repeats the key {key!r} in one object")
            seen.add(key)
    return value


def _constant(name: str) -> float:
    raise _Refused(f"the request body holds {name}, which is not a JSON number")


def _float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _Refused(f"the number {text[:40]} is out of range")
    return value


def _unpaired(value: Any) -> bool:
    """Whether any string (or key) in ``value`` holds a lone surrogate."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return True
        elif isinstance(item, dict):
            stack.extend(item)
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def decode(raw: bytes) -> Any:
    """The JSON value of a request body, or ``RequestError`` 400 saying what is wrong with it."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RequestError("invalid_request", f"the request body is not UTF-8: {exc}") from exc
    try:
        value = json.loads(text, object_pairs_hook=_object, parse_constant=_constant, parse_float=_float)
    except _Refused as exc:
        raise RequestError("invalid_request", str(exc)) from exc
    except RecursionError as exc:
        raise RequestError("invalid_request", "the request body is nested too deeply") from exc
    except ValueError as exc:
        raise RequestError("invalid_request", f"the request body is not JSON: {exc}") from exc
    if _SURROGATE_ESCAPE.search(raw) and _unpaired(value):
        raise RequestError("invalid_request", "the request contains an unpaired surrogate")
    return value


def encode(content: Any) -> bytes:
    """A response body; one holding NaN or infinity raises the contract's 500."""
    try:
        text = json.dumps(content, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    except ValueError as exc:
        raise RequestError("internal_error", NON_FINITE) from exc
    return text.encode("utf-8")
