"""``GET /openapi.json`` (OpenAPI 3.1) and ``GET /docs`` (a static page of it) for the served family.

The request schemas are the ones the families validate with: a Vela 2.0 question is
``s1omni.runtime.vela2.schema``, built from ``request.FIELDS`` and its bounds, and the envelope
around it is built here from ``envelope.FIELDS`` and ``envelope.OPTIONS``; an OmniJev request is
``s1omni.runtime.omnijev.schema``, built from ``contract.FIELDS``. The response schemas follow what
the families answer (the Vela 2.0 ones after vllm-project/semantic-router:
src/model-runtime/vllm_srun/api/openapi.yaml, where this server's differences are in the README).
The page needs nothing from outside the server: plain HTML with each operation and schema.
"""

from __future__ import annotations

import html
import json
from collections.abc import Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Route

from s1omni import __version__
from s1omni.runtime import families
from s1omni.runtime.errors import ITEM_CODES, REQUEST_STATUS

from . import envelope, profiles, wire

VERSION = "3.1.0"
REF = "#/components/schemas/"
STRING, NUMBER, INTEGER, BOOLEAN = ({"type": kind} for kind in ("string", "number", "integer", "boolean"))
NULLABLE_STRING = {"type": ["string", "null"]}
NUMBERS = {"type": "object", "additionalProperties": NUMBER}
STYLE = "body{font-family:sans-serif;max-width:70em;margin:auto}td{padding:0 1em}pre{background:#f4f4f4;padding:.5em}"
STATUSES = ("starting", "loading", "warming", "ready", "degraded", "failed")


def _ref(name: str) -> dict[str, str]:
    return {"$ref": REF + name}


def _json(schema: str, description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": _ref(schema)}}}


def _object(required: list[str], properties: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"type": "object", "required": required, "properties": properties, **extra}


# -- Vela 2.0 --------------------------------------------------------------------------------------


def _vela_options() -> dict[str, Any]:
    def nullable(shape: dict[str, Any]) -> dict[str, Any]:
        return {"anyOf": [shape, {"type": "null"}]}

    shapes = {
        "deadline_ms": nullable(
            {"type": "number", "exclusiveMinimum": 0, "description": "Work not started by then answers deadline_exceeded."}
        ),
        "profile": {
            "type": "string",
            "pattern": f"^{profiles.NAME_PATTERN}$",
            "default": profiles.EXACT.name,
            "description": "exact, or a profile the server enabled (its card's `profiles`); any other is invalid_request.",
        },
        "return_meta": {"type": "boolean", "default": False, "description": "Add `meta` to the response."},
        "max_tokens": nullable(
            {
                "type": "integer",
                "minimum": 1,
                "description": "Scan budget: the most tokens of one state part a question reads; past it scan_budget_exceeded.",
            }
        ),
    }
    assert tuple(shapes) == envelope.OPTIONS
    return {"type": ["object", "null"], "properties": shapes, "additionalProperties": False}


def _vela_request() -> dict[str, Any]:
    from s1omni.runtime.vela2 import schema

    state = {
        **schema.CONTENT,
        "description": (
            "What the questions are about: text, or an object whose `request`/`user`/`prompt` key is the user part, "
            "`answer`/`response` the answer part and every other key context (a JSON array is read as text)."
        ),
    }
    questions = {
        "type": "object",
        "description": "Named questions (non-blank ids); answers keep this order.",
        "propertyNames": {"pattern": schema.NON_BLANK},
        "minProperties": 1,
        "additionalProperties": _ref("Question"),
    }
    images = {
        "anyOf": [{"type": "array", "items": STRING}, {"type": "null"}],
        "description": "Image data URLs, for models whose card lists the `image` modality (empty or absent otherwise).",
    }
    own = {"state": state, "questions": questions, "images": images}
    assert tuple(own) == envelope.STATE_FIELDS
    fields = {
        "model": {"anyOf": [STRING, {"type": "null"}], "description": "The served id or repo; absent: the served model."},
        **own,
        "states": {
            "type": ["object", "null"],
            "description": "Further named states, each answered as its own request would be, under `states` in the response.",
            "additionalProperties": _ref("DecisionState"),
        },
        "options": _ref("RequestOptions"),
    }
    assert set(fields) == set(envelope.FIELDS)
    golden = {
        "state": {"request": "Please refund the duplicate charge of $42.", "answer": "I have refunded $42."},
        "questions": {kind: example for kind, example in schema.EXAMPLES.items()},
    }
    return {
        "DecisionRequest": _object(["state", "questions"], fields, additionalProperties=False, examples=[golden]),
        "DecisionState": _object(["state", "questions"], own, additionalProperties=False),
        "Question": schema.question(),
        "RequestOptions": _vela_options(),
    }


def _vela_responses() -> dict[str, Any]:
    from s1omni.runtime.vela2.request import QUESTION_TYPES

    answer = {
        "type": "object",
        "required": ["type"],
        "description": (
            "Choice: choice, probabilities, confidence, abstain_probability. Noul: noul = P(yes) (a span question's "
            "noul is its best word's probability). Score: score, probabilities, confidence, legend. A failed question "
            "has only type, error and message."
        ),
        "properties": {
            "type": NULLABLE_STRING,
            "choice": STRING,
            "noul": NUMBER,
            "score": NUMBER,
            "probabilities": NUMBERS,
            "confidence": NUMBER,
            "abstain_probability": NUMBER,
            "legend": {"type": "object", "additionalProperties": STRING},
            "input_coverage": {"enum": ["complete"]},
            "error": {"enum": sorted(ITEM_CODES)},
            "message": STRING,
        },
    }
    span = _object(
        ["label", "start", "end", "text", "probability"],
        {"label": STRING, "start": INTEGER, "end": INTEGER, "text": STRING, "probability": NUMBER},
        description="A labelled span: code-point offsets into the part the question read, end exclusive.",
    )
    answered = {
        "model": STRING,
        "answers": {"type": "object", "additionalProperties": _ref("Answer")},
        "usage": _object(["input_tokens", "output_tokens"], {"input_tokens": INTEGER, "output_tokens": INTEGER}),
        "spans": {"type": "object", "additionalProperties": {"type": "array", "items": _ref("Span")}},
        "span_heads": {"type": "object", "additionalProperties": STRING},
        "sets": {
            "type": "object",
            "additionalProperties": _object(
                ["selected", "probabilities"], {"selected": {"type": "array", "items": STRING}, "probabilities": NUMBERS}
            ),
        },
        "thresholds": NUMBERS,
    }
    meta = {
        "type": "object",
        "properties": {
            "revision": NULLABLE_STRING,
            "model_sha256": STRING,
            "profile": STRING,
            "numerics": STRING,
            "engine": STRING,
            "accelerator": STRING,
            "device": STRING,
            "queue_ms": NUMBER,
            "compute_ms": NUMBER,
        },
    }
    card = _object(
        ["id", "object", "ready", "status"],
        {
            "id": STRING,
            "object": {"const": "model"},
            "family": STRING,
            "repo": NULLABLE_STRING,
            "revision": NULLABLE_STRING,
            "surfaces": {"type": "array", "items": STRING},
            "question_types": {"type": "array", "items": {"enum": list(QUESTION_TYPES)}},
            "presets": {"type": "array", "items": STRING},
            "limits": {"type": "object", "additionalProperties": {"type": ["integer", "null"]}},
            "profiles": {
                "type": "array",
                "items": _object(
                    ["name", "numerics", "description"],
                    {"name": STRING, "numerics": {"enum": ["exact", "approximate"]}, "description": STRING,
                     "copy": {"type": "object", "description": "max_speed only: the reduced copy it runs on and its consent figures."},
                     "check": {"type": "object", "description": "shared_context, and batching where it packs: the gate its forwards "
                               "passed against each request alone, and the figures."}},  # fmt: skip
                ),
                "description": "The profiles requests may choose: exact, then those the server enabled.",
            },
            "ready": BOOLEAN,
            "status": {"enum": list(STATUSES)},
            "reason": NULLABLE_STRING,
        },
        description="The served model; `question_types` and `presets` are what its questions may use.",
    )
    return {
        "DecisionResponse": _object(
            ["model", "answers", "usage"],
            {
                **answered,
                "states": {"type": "object", "additionalProperties": _ref("DecisionStateResponse")},
                "meta": _ref("ResponseMeta"),
            },
        ),
        "DecisionStateResponse": _object(["model", "answers", "usage"], answered),
        "Answer": answer,
        "Span": span,
        "ResponseMeta": meta,
        "Error": _object(
            ["error"],
            {"error": _object(["code", "message"], {"code": {"enum": list(REQUEST_STATUS)}, "message": STRING})},
            description="A refused request; the status is the code's: "
            + ", ".join(f"{code} {status}" for code, status in REQUEST_STATUS.items()),
        ),
        "ModelCard": card,
        "ModelList": _object(
            ["object", "api_version", "data", "limits"],
            {
                "object": {"const": "list"},
                "api_version": STRING,
                "data": {"type": "array", "items": _ref("ModelCard")},
                "limits": {"type": "object"},
            },
        ),
        "Health": _object(
            ["api_version", "status"],
            {"api_version": STRING, "status": {"enum": list(STATUSES)}, "reason": NULLABLE_STRING, "model": NULLABLE_STRING},
        ),
        "Liveness": _object(["api_version", "status"], {"api_version": STRING, "status": {"const": "alive"}}),
    }


def _vela() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(schemas, the decisions operation's errors, extra paths) of the Vela 2.0 contract."""
    errors = {str(status): _json("Error", code) for code, status in REQUEST_STATUS.items()}
    unsupported = {
        "post": {
            "summary": "A surface this server does not serve: 422 unsupported_surface",
            "responses": {"422": _json("Error", "unsupported_surface")},
        }
    }
    extra = {path: unsupported for path in ("/v1/classify", "/v1/embeddings", "/v1/rerank")}
    return {**_vela_request(), **_vela_responses()}, errors, extra


# -- OmniJev ---------------------------------------------------------------------------------------


def _omnijev() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    from s1omni.runtime.omnijev import schema

    request = schema.request_schema()
    request["examples"] = [
        {"state": {"images": ["data:image/png;base64,..."]}, "questions": dict(schema.EXAMPLES)},
    ]
    detail = _object(["detail"], {"detail": STRING}, description="A refused request.")
    statuses = {
        "400": "the body is not strict JSON",
        "413": "the body is over 12 MiB",
        "422": "a contract, image or token refusal; `detail` says which",
        "500": "an admitted request failed (`inference failed`; the log says why)",
        "503": "busy (16 admitted) or not ready; with Retry-After: 1",
    }
    schemas = {
        "DecisionRequest": request,
        "DecisionResponse": _object(
            ["model", "answers", "usage"],
            {
                "model": STRING,
                "answers": {
                    "type": "object",
                    "description": "Each question's answer, in request order (values rounded to four decimals).",
                    "additionalProperties": _ref("Answer"),
                },
                "usage": {"type": "object", "additionalProperties": INTEGER},
            },
        ),
        "Answer": {
            "type": "object",
            "required": ["latency_s", "latency_total_s"],
            "description": (
                "Noul: noul = P(yes). Choice: choice, probabilities by answer key, abstain, valid (false when the "
                "probabilities were renormalised), confidence. Score: score (the likeliest level), probabilities, "
                "confidence. latency_s is the request's time over its questions, latency_total_s the request's."
            ),
            "properties": {
                "noul": NUMBER,
                "choice": STRING,
                "score": STRING,
                "probabilities": NUMBERS,
                "abstain": NUMBER,
                "valid": BOOLEAN,
                "confidence": NUMBER,
                "latency_s": NUMBER,
                "latency_total_s": NUMBER,
            },
            "additionalProperties": False,
        },
        "Error": detail,
        "ModelList": _object(
            ["object", "data", "limits"], {"object": {"const": "list"}, "data": {"type": "array"}, "limits": {"type": "object"}}
        ),
        "Health": _object(["status"], {"status": {"enum": list(STATUSES)}, "model": NULLABLE_STRING, "detail": NULLABLE_STRING}),
        "Liveness": _object(["status"], {"status": {"const": "alive"}}),
    }
    return schemas, {status: _json("Error", why) for status, why in statuses.items()}, {}


# Each family's part of the document under the names of ``s1omni.runtime.families``.
DOCUMENTS: dict[str, Callable[[], tuple[dict[str, Any], dict[str, Any], dict[str, Any]]]] = {
    "vela2": _vela,
    "omnijev": _omnijev,
}


def document(family: str, title: str = "s1omni") -> dict[str, Any]:
    """The OpenAPI 3.1 document of a server of ``family``; ``UnknownFamily`` for a name with no face."""
    schemas, errors, extra = DOCUMENTS[families.family(family).name]()
    decisions = {
        "post": {
            "summary": "Answer the typed questions about a state",
            "requestBody": {"required": True, "content": {"application/json": {"schema": _ref("DecisionRequest")}}},
            "responses": {
                "200": _json("DecisionResponse", "One answer per question; a failed question says why in place."),
                **errors,
            },
        }
    }
    json_page = {"get": {"summary": "This document", "responses": {"200": {"description": "OpenAPI 3.1, JSON"}}}}
    docs_page = {"get": {"summary": "This document as a page", "responses": {"200": {"description": "HTML"}}}}
    paths = {
        "/v1/systemone": decisions,
        "/v1/decisions": decisions,
        **extra,
        "/v1/models": {
            "get": {"summary": "The served model's card and limits", "responses": {"200": _json("ModelList", "The served model")}}
        },
        "/health": {
            "get": {
                "summary": "Readiness: 200 once the golden request was answered",
                "responses": {"200": _json("Health", "ready"), "503": _json("Health", "not ready")},
            }
        },
        "/health/live": {
            "get": {
                "summary": "Liveness: 503 once the model failed to load or warm up",
                "responses": {"200": _json("Liveness", "alive"), "503": _json("Health", "the load failed; the body says why")},
            }
        },
        "/metrics": {
            "get": {
                "summary": "Prometheus metrics",
                "responses": {"200": {"description": "Prometheus text", "content": {"text/plain": {"schema": STRING}}}},
            }
        },
        "/openapi.json": json_page,
        "/docs": docs_page,
    }
    return {
        "openapi": VERSION,
        "info": {
            "title": f"{title} ({family})",
            "version": __version__,
            "license": {"name": "Apache-2.0", "identifier": "Apache-2.0"},
        },
        "paths": paths,
        "components": {"schemas": schemas},
    }


def page(spec: dict[str, Any]) -> str:
    """The document as one HTML page: every operation, then every schema as JSON."""
    rows = []
    for path, operations in spec["paths"].items():
        for method, operation in operations.items():
            statuses = ", ".join(operation.get("responses", {}))
            rows.append(
                f"<tr><td><code>{method.upper()} {html.escape(path)}</code></td>"
                f"<td>{html.escape(operation.get('summary', ''))}</td><td>{statuses}</td></tr>"
            )
    schemas = "".join(
        f'<h3 id="{name}">{name}</h3><pre>{html.escape(json.dumps(schema, indent=2, ensure_ascii=False))}</pre>'
        for name, schema in spec["components"]["schemas"].items()
    )
    title = html.escape(spec["info"]["title"])
    return (
        f"<!doctype html><html><head><meta charset=utf-8><title>{title}</title>"
        f"<style>{STYLE}</style>"
        f"</head><body><h1>{title}</h1><p>OpenAPI {spec['openapi']}: <a href=/openapi.json>/openapi.json</a></p>"
        f"<h2>Routes</h2><table><tr><th>route</th><th>what</th><th>statuses</th></tr>{''.join(rows)}</table>"
        f"<h2>Schemas</h2>{schemas}</body></html>"
    )


def routes(family: str) -> list[Route]:
    """``/openapi.json`` and ``/docs`` for a server of ``family`` (built once, at startup)."""
    spec = document(family)
    encoded, rendered = wire.encode(spec), page(spec)

    async def openapi(request: Request) -> Response:
        return Response(encoded, media_type="application/json")

    async def docs(request: Request) -> Response:
        return HTMLResponse(rendered)

    return [Route("/openapi.json", openapi, methods=["GET"]), Route("/docs", docs, methods=["GET"])]
