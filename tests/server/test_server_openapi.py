"""``/openapi.json`` and ``/docs`` of real servers, and every response checked twice: against this
server's own document and, on the routes it shares, against the reference runtime's published
contract (vllm-project/semantic-router:src/model-runtime/vllm_srun/api/openapi.yaml, vendored in
tests/fixtures/semantic-router/)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from jsonschema.exceptions import ValidationError
from serving import Server

from s1omni.server.openapi import document
from tests.contracts import component, reference_component, reference_response

CALIB = Path(__file__).resolve().parents[2] / "calib"
# Where this server answers what the reference contract does not describe (README: "Differences from
# the reference runtime"): its /v1/models has no bundle limit, as it serves no /v1/bundle.
KNOWN_DIFFERENCES = {("/v1/models", "get", 200): "'max_bundle_tasks' is a required property"}
# The calibration cases a CPU answers in well under a second each: all but the 255-option and windowed ones.
SMALL_CASE_BYTES = 1200


def calibration_cases(family: str) -> list[dict[str, Any]]:
    return json.loads((CALIB / family / "cases.json").read_text(encoding="utf-8"))["cases"]


def own_schema(spec: dict[str, Any], path: str, method: str, status: int) -> str:
    response = spec["paths"][path][method]["responses"][str(status)]
    return response["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[1]


def check(spec: dict[str, Any], response: httpx.Response, path: str, method: str = "post") -> None:
    """The response against this server's document, and against the reference's where it has the route."""
    status, body = response.status_code, response.json()
    component(spec, own_schema(spec, path, method, status)).validate(body)
    name = reference_response(path, method, status)
    if name is None:
        return
    difference = KNOWN_DIFFERENCES.get((path, method, status))
    if difference is None:
        reference_component(name).validate(body)
    else:
        with pytest.raises(ValidationError, match=difference):
            reference_component(name).validate(body)


@pytest.fixture(scope="module")
def server(start, tiny_vela: Path) -> Iterator[Server]:
    server = start(str(tiny_vela))
    server.wait_status("ready")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def spec(server: Server) -> dict[str, Any]:
    return server.client.get("/openapi.json").json()


def test_the_served_document_is_the_families_and_the_page_renders_it(server: Server, spec: dict[str, Any]) -> None:
    assert spec == json.loads(json.dumps(document("vela2")))
    page = server.client.get("/docs")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert '<h3 id="DecisionRequest">' in page.text and "POST /v1/systemone" in page.text


@pytest.mark.slow
def test_calibration_answers_match_both_contracts(server: Server, spec: dict[str, Any]) -> None:
    cases = [case for case in calibration_cases("vela2") if len(json.dumps(case["request"])) <= SMALL_CASE_BYTES]
    kinds = {entry.get("type") or entry["preset"] for case in cases for entry in case["request"]["questions"].values()}
    assert kinds == {"choice", "noul", "score", "set", "span", "pii", "halu", "relevance"}
    for case in cases:
        response = server.post(case["request"])
        assert response.status_code == 200, (case["name"], response.text)
        check(spec, response, "/v1/systemone")


def test_the_golden_request_with_states_and_meta_matches_both_contracts(server: Server, spec: dict[str, Any]) -> None:
    golden = next(case["request"] for case in calibration_cases("vela2") if case["name"] == "golden")
    body = {**golden, "options": {"return_meta": True}}
    body["states"] = {"again": {"state": body["state"], "questions": body["questions"]}}
    for path in ("/v1/systemone", "/v1/decisions"):
        response = server.post(body, path)
        assert response.status_code == 200 and set(response.json()) >= {"meta", "states"}, response.text
        check(spec, response, path)


def test_errors_match_both_contracts(server: Server, spec: dict[str, Any]) -> None:
    noul = {"q": {"type": "noul", "instructions": "Is it?"}}
    refusals = [
        (server.client.post("/v1/systemone", content=b'{"state": "x", "state": "y"}'), 400),
        (server.post({"state": "x", "questions": {"q": {"type": "colour"}}}), 400),
        (server.post({"state": "x", "questions": noul, "model": "another/model"}), 404),
        (server.client.post("/v1/systemone", content=b" " * ((8 << 20) + 1)), 413),
    ]
    for response, status in refusals:
        assert response.status_code == status, response.text
        check(spec, response, "/v1/systemone")
    classify = server.client.post("/v1/classify", json={"input": "x"})
    assert classify.status_code == 422
    check(spec, classify, "/v1/classify")  # only the reference's Error: this server has no ClassifyResponse


def test_models_health_and_liveness_match_both_contracts(server: Server, spec: dict[str, Any]) -> None:
    models = server.client.get("/v1/models")
    check(spec, models, "/v1/models", "get")
    card = models.json()["data"][0]
    question = spec["components"]["schemas"]["Question"]
    assert card["question_types"] == [entry["properties"]["type"]["const"] for entry in question["oneOf"][:-1]]
    check(spec, server.client.get("/health"), "/health", "get")
    check(spec, server.client.get("/health/live"), "/health/live", "get")


def test_an_omnijev_server_serves_its_own_document(start, omnijev_package: Path) -> None:
    server = start(str(omnijev_package))
    try:
        server.wait_status("ready")
        spec = server.client.get("/openapi.json").json()
        assert spec == json.loads(json.dumps(document("omnijev")))
        case = calibration_cases("omnijev")[0]
        answered = server.post(case["request"])
        assert answered.status_code == 200, answered.text
        component(spec, own_schema(spec, "/v1/systemone", "post", 200)).validate(answered.json())
        refused = server.post({**case["request"], "colour": "red"})
        assert refused.status_code == 422
        component(spec, own_schema(spec, "/v1/systemone", "post", 422)).validate(refused.json())
    finally:
        server.stop()
