"""JSON on the wire: the strict request decoder and the response encoder.

Decoding is stricter than the reference's plain ``json.loads``
(vllm-project/semantic-router:src/model-runtime/vllm_srun/api/app.py ``_read_json``): besides
invalid UTF-8, malformed JSON and unpaired surrogate escapes, a duplicate object key, ``NaN``,
``Infinity``, a number too large for a float and nesting past 128 levels are refused with 400
``invalid_request`` (``s1omni.runtime.strict_json``, the reader every family shares). A decoder
that kept the last duplicate would answer a different question than the client asked, in silence;
the System1-Omni workers refuse both the same way (wire-contract.md §11.5).

Encoding is UTF-8 with non-ASCII kept, compact separators and no NaN or infinity: a response that
holds one becomes 500 ``internal_error`` "the model produced a non-finite number".
"""

from __future__ import annotations

import json
from typing import Any

from s1omni.runtime import strict_json
from s1omni.runtime.errors import RequestError

NON_FINITE = "the model produced a non-finite number"


def decode(raw: bytes) -> Any:
    """The JSON value of a request body, or ``RequestError`` 400 saying what is wrong with it."""
    try:
        return strict_json.loads(raw)
    except strict_json.StrictJsonError as exc:
        if exc.kind == "surrogate":
            message = "the request contains an unpaired surrogate"
        elif exc.kind == "utf8":
            message = f"the request body is not UTF-8: {exc}"
        else:
            message = f"the request body is not JSON: {exc}"
        raise RequestError("invalid_request", message) from exc


def encode(content: Any) -> bytes:
    """A response body; one holding NaN or infinity raises the contract's 500."""
    try:
        text = json.dumps(content, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    except ValueError as exc:
        raise RequestError("internal_error", NON_FINITE) from exc
    return text.encode("utf-8")
