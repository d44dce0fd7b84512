"""The wire contract over HTTP against one real ``s1omni serve`` process serving a tiny member."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Iterator

import httpx
import pytest
from serving import FRAMING_ERRORS, FRAMING_PREFIX, Server, error, exchange, metric, stages

STATE = {
    "request": "Please refund the duplicate charge of 40 euros to my card — thanks, Jürgen.",
    "answer": "The refund goes back to the card within five days.",
}
FIVE_KINDS = {
    "intent": {"type": "choice", "instructions": "What does the customer want?", "criteria": {"refund": "money back", "other": None}},
    "refund": {"type": "noul", "instructions": "Does the customer ask for a refund?", "over": "request"},
    "urgency": {"type": "score", "instructions": "How urgent is it?", "criteria": ["Routine", "Soon", "Right now — today"]},
    "topics": {"type": "set", "instructions": "Which topics?", "criteria": {"billing": "payments", "shipping": "parcels"}},
    "entities": {"type": "span", "instructions": "Which spans name money?", "criteria": {"money": "an amount"}},
}
NOUL = {"refund": {"type": "noul", "instructions": "Does the customer ask for a refund?"}}
SMALL = {"state": "Please refund the duplicate charge.", "questions": NOUL}
META_KEYS = ["revision", "model_sha256", "profile", "numerics", "engine", "accelerator", "device", "queue_ms", "compute_ms"]


@pytest.fixture(scope="module")
def server(start, tiny_vela) -> Iterator[Server]:
    server = start(str(tiny_vela))
    server.wait_status("ready")
    yield server
    server.stop()


def test_five_kinds_answer_in_the_documented_key_order(server: Server) -> None:
    response = server.post({"state": STATE, "questions": FIVE_KINDS, "options": {"return_meta": True}})
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    model = server.client.get("/v1/models").json()["data"][0]["id"]
    assert body["model"] == model
    assert list(body) == ["model", "answers", "usage", "spans", "span_heads", "sets", "thresholds", "meta"]
    assert list(body["answers"]) == ["intent", "refund", "urgency", "topics.billing", "topics.shipping", "entities"]
    assert [body["answers"][key]["type"] for key in ("intent", "refund", "urgency", "entities")] == ["choice", "noul", "score", "noul"]
    assert body["usage"]["input_tokens"] > 0 and body["usage"]["output_tokens"] == 0
    assert list(body["meta"]) == META_KEYS
    assert body["meta"]["profile"] == "exact" and body["meta"]["compute_ms"] > 0
    # Compact UTF-8: no separator spaces, non-ASCII as itself (the score legend echoes its level).
    assert response.content.startswith(b'{"model":"') and b'":"' in response.content
    assert "Right now — today".encode() in response.content and b"\\u2014" not in response.content
    timing = stages(response)
    assert timing["forward"] > 0 and timing["tokenize"] > 0 and timing["heads"] > 0 and timing["post"] > 0
    assert timing["total"] >= sum(value for name, value in timing.items() if name != "total") - 0.01


def test_systemone_and_decisions_are_one_handler(server: Server) -> None:
    first, second = server.post(SMALL, "/v1/systemone"), server.post(SMALL, "/v1/decisions")
    assert first.status_code == second.status_code == 200
    assert first.json() == second.json()
    assert "meta" not in first.json()


def test_a_failed_question_keeps_its_place(server: Server) -> None:
    questions = {"bad": {"type": "colour", "instructions": "x"}, **NOUL}
    body = server.post({"state": SMALL["state"], "questions": questions}).json()
    assert list(body["answers"]) == ["bad", "refund"]
    assert body["answers"]["bad"]["error"] == "invalid_question"
    assert "noul" in body["answers"]["refund"]


def test_states_are_answered_under_their_names(server: Server) -> None:
    request = {**SMALL, "states": {"later": {"state": "Where is my parcel? It was due on Monday and the tracking page shows nothing.", "questions": NOUL}}, "options": {"return_meta": True}}
    response = server.post(request)
    assert response.status_code == 200, response.text
    body = response.json()
    assert list(body) == ["model", "answers", "usage", "states", "meta"]
    assert list(body["states"]) == ["later"]
    later = body["states"]["later"]
    assert list(later) == ["model", "answers", "usage"] and later["model"] == body["model"]
    assert later["usage"]["input_tokens"] != body["usage"]["input_tokens"]  # each state counts its own tokens


def test_a_request_is_refused_only_when_no_question_in_any_state_is_valid(server: Server) -> None:
    invalid = {"bad": {"type": "noul", "instructions": " "}}
    later = {"later": {"state": "Where is my parcel?", "questions": NOUL}}
    answered = server.post({"state": "x", "questions": invalid, "states": later})
    assert answered.status_code == 200, answered.text
    body = answered.json()
    assert body["answers"]["bad"]["error"] == "invalid_question" and "noul" in body["states"]["later"]["answers"]["refund"]
    refused = server.post({"state": "x", "questions": invalid, "states": {"later": {"state": "y", "questions": invalid}}})
    message = error(refused, 400, "invalid_request")
    assert "no question is valid" in message and "states['later']" in message


def test_max_tokens_reaches_the_model_as_the_scan_budget(server: Server) -> None:
    body = server.post({**SMALL, "options": {"max_tokens": 1}}).json()
    assert body["answers"]["refund"]["error"] == "scan_budget_exceeded"


def test_a_tiny_deadline_answers_every_question_deadline_exceeded(server: Server) -> None:
    before = metric(server.metrics(), "s1omni_deadline_expired_total")
    response = server.post({"state": STATE, "questions": FIVE_KINDS, "options": {"deadline_ms": 0.001}})
    assert response.status_code == 200, response.text
    body = response.json()
    assert {answer["error"] for answer in body["answers"].values()} == {"deadline_exceeded"}
    assert list(body["answers"]) == list(FIVE_KINDS)
    assert body["usage"] == {"input_tokens": 0, "output_tokens": 0}
    assert stages(response)["forward"] == 0
    assert metric(server.metrics(), "s1omni_deadline_expired_total") == before + 1


# About 1,200 tokens and 32 rows: one forward of a second or more on the CPU, however fast the host.
# A forward of about 0.85 s on an idle 2-core CPU (the tiny member), far longer than DEADLINE_MS + DEADLINE_SLACK_S.
LONG = {
    "state": "Please refund the duplicate charge of forty euros to my card today. " * 120,
    "questions": {
        f"q{index}": {"type": "choice", "instructions": f"Question {index} about the refund?", "criteria": {f"o{option}": f"option {option}" for option in range(16)}}
        for index in range(16)
    },
}
DEADLINE_MS = 200
# How late past its deadline a request queued behind a forward may be answered (its measure is printed).
DEADLINE_SLACK_S = 0.1


def test_a_deadline_passing_behind_a_long_forward_is_answered_when_it_passes(server: Server) -> None:
    async def scenario() -> tuple[httpx.Response, float, bool, httpx.Response]:
        async with httpx.AsyncClient(base_url=server.url, timeout=300) as client:
            long = asyncio.create_task(client.post("/v1/systemone", json=LONG))
            while True:  # its job taken by the worker: its forward has begun
                text = (await client.get("/metrics")).text
                if metric(text, "s1omni_pending_jobs") == 1 and metric(text, "s1omni_queue_depth") == 0:
                    break
                await asyncio.sleep(0.005)
            sent = time.monotonic()
            late = await client.post("/v1/systemone", json={**SMALL, "options": {"deadline_ms": DEADLINE_MS}})
            waited = time.monotonic() - sent
            return late, waited, long.done(), await long

    before = metric(server.metrics(), "s1omni_deadline_expired_total")
    late, waited, long_done, long = asyncio.run(scenario())
    print(f"answered {(waited - DEADLINE_MS / 1e3) * 1e3:.1f} ms after its {DEADLINE_MS} ms deadline")
    assert late.status_code == 200 and late.json()["answers"] == {"refund": {"type": "noul", "error": "deadline_exceeded"}}, late.text
    assert stages(late)["forward"] == 0
    assert not long_done and long.status_code == 200, long.text  # answered while the forward still ran
    assert DEADLINE_MS / 1e3 <= waited < DEADLINE_MS / 1e3 + DEADLINE_SLACK_S
    assert metric(server.metrics(), "s1omni_deadline_expired_total") == before + 1


BAD_BODIES = {
    "malformed JSON": b'{"state": ',
    "invalid UTF-8": b'{"state": "\xff", "questions": {}}',
    "unpaired surrogate": b'{"state": "\\ud800", "questions": {"q": {"type": "noul", "instructions": "x"}}}',
    "not an object": b'[{"state": "x"}]',
    "duplicate key": b'{"state": "a", "state": "b", "questions": {"q": {"type": "noul", "instructions": "x"}}}',
    "nested duplicate key": b'{"state": "a", "questions": {"q": {"type": "noul", "type": "choice", "instructions": "x"}}}',
    "NaN": b'{"state": "a", "questions": {"q": {"type": "noul", "instructions": "x"}}, "options": {"deadline_ms": NaN}}',
    "Infinity": b'{"state": "a", "questions": {"q": {"type": "noul", "instructions": "x", "threshold": -Infinity}}}',
    "float overflow": b'{"state": "a", "questions": {"q": {"type": "noul", "instructions": "x", "threshold": 1e999}}}',
    "deep nesting": b"[" * 100_000 + b"]" * 100_000,
}


def test_escaped_pairs_and_large_bodies_are_fine(server: Server) -> None:
    question = b'"questions": {"q": {"type": "noul", "instructions": "A smile?"}}'
    paired = server.client.post("/v1/systemone", content=b'{"state": "I am \\ud83d\\ude00", ' + question + b"}")
    assert paired.status_code == 200, paired.text
    # Past 16 KiB the body is planned and finished on a thread; whitespace makes it large, not slow.
    padded = server.client.post("/v1/systemone", content=b'{"state": "I am \xf0\x9f\x98\x80", ' + question + b" " * (17 << 10) + b"}")
    assert padded.status_code == 200, padded.text
    assert padded.json() == paired.json()


@pytest.mark.parametrize("raw", BAD_BODIES.values(), ids=BAD_BODIES.keys())
def test_bodies_that_are_not_strict_json_are_400(server: Server, raw: bytes) -> None:
    response = server.client.post("/v1/systemone", content=raw, headers={"content-type": "application/json"})
    error(response, 400, "invalid_request")


BAD_REQUESTS = {
    "unknown field": {**SMALL, "stream": True},
    "model not a string": {**SMALL, "model": 7},
    "state missing": {"questions": NOUL},
    "questions empty": {"state": "x", "questions": {}},
    "blank state": {"state": "   ", "questions": NOUL},
    "no valid question": {"state": "x", "questions": {"a": {"type": "colour"}, "b": {"type": "noul"}}},
    "options not an object": {**SMALL, "options": []},
    "unknown option": {**SMALL, "options": {"stream": True}},
    "deadline zero": {**SMALL, "options": {"deadline_ms": 0}},
    "deadline negative": {**SMALL, "options": {"deadline_ms": -5}},
    "deadline text": {**SMALL, "options": {"deadline_ms": "5"}},
    "deadline bool": {**SMALL, "options": {"deadline_ms": True}},
    "deadline overflow": {**SMALL, "options": {"deadline_ms": 10**400}},
    "profile unknown": {**SMALL, "options": {"profile": "max_speed"}},
    "profile not enabled": {**SMALL, "options": {"profile": "batching"}},
    "profile malformed": {**SMALL, "options": {"profile": "Exact"}},
    "return_meta text": {**SMALL, "options": {"return_meta": "yes"}},
    "max_tokens zero": {**SMALL, "options": {"max_tokens": 0}},
    "max_tokens float": {**SMALL, "options": {"max_tokens": 1.5}},
    "max_tokens bool": {**SMALL, "options": {"max_tokens": True}},
    "images without the modality": {**SMALL, "images": ["data:image/png;base64,iVBORw0KGgo="]},
    "images not a list": {**SMALL, "images": "data:image/png;base64,iVBORw0KGgo="},
    "states not an object": {**SMALL, "states": []},
    "state entry with a stray field": {**SMALL, "states": {"x": {"state": "y", "questions": NOUL, "options": {}}}},
    "state entry without questions": {**SMALL, "states": {"x": {"state": "y"}}},
    "state entry with a blank name": {**SMALL, "states": {" ": {"state": "y", "questions": NOUL}}},
    "state entry with a bad state": {**SMALL, "states": {"x": {"state": " ", "questions": NOUL}}},
}


@pytest.mark.parametrize("body", BAD_REQUESTS.values(), ids=BAD_REQUESTS.keys())
def test_malformed_requests_are_400(server: Server, body: dict) -> None:
    error(server.post(body), 400, "invalid_request")


def test_a_profile_not_enabled_is_400_saying_how_to_enable_it(server: Server) -> None:
    message = error(server.post(BAD_REQUESTS["profile not enabled"]), 400, "invalid_request")
    assert message == (
        "options.profile 'batching' is not enabled on this server, which runs ['exact'] "
        "(`s1omni serve --profiles batching` enables it)"
    )


def test_every_reason_is_in_the_message_when_no_question_is_valid(server: Server) -> None:
    message = error(server.post(BAD_REQUESTS["no valid question"]), 400, "invalid_request")
    assert "a:" in message and "b:" in message


def test_a_named_model_must_be_the_served_one(server: Server) -> None:
    model = server.client.get("/v1/models").json()["data"][0]
    assert server.post({**SMALL, "model": model["id"]}).status_code == 200
    assert server.post({**SMALL, "model": model["repo"]}).status_code == 200
    assert server.post({**SMALL, "model": None}).status_code == 200
    error(server.post({**SMALL, "model": "someone/else"}), 404, "model_not_found")


def test_unknown_routes_and_methods_are_invalid_request(server: Server) -> None:
    error(server.client.get("/v1/nothing"), 404, "invalid_request")
    error(server.client.post("/v2/systemone", json=SMALL), 404, "invalid_request")
    response = server.client.get("/v1/systemone")
    error(response, 405, "invalid_request")
    assert response.headers["allow"] == "POST"
    error(server.client.post("/health"), 405, "invalid_request")


@pytest.mark.parametrize("path", ["/v1/classify", "/v1/embeddings", "/v1/rerank", "/v1/bundle"])
def test_other_families_surfaces_are_unsupported(server: Server, path: str) -> None:
    error(server.client.post(path, json={"input": "x"}), 422, "unsupported_surface")


@pytest.mark.parametrize(("method", "path"), [("POST", "/v1/systemone/"), ("POST", "/v1/decisions/"), ("GET", "/v1/models/"), ("GET", "/health/")])
def test_a_trailing_slash_is_404_not_a_redirect(server: Server, method: str, path: str) -> None:
    response = server.client.request(method, path, json=SMALL if method == "POST" else None)
    message = error(response, 404, "invalid_request")
    assert "location" not in response.headers
    assert message == f"no route {path} (routes have no trailing slash: {path.rstrip('/')})"


def post_head(path: str, length: int) -> bytes:
    return b"POST %s HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % (path.encode(), length)


def test_a_declared_length_over_the_limit_is_413_before_the_body_is_read(server: Server) -> None:
    """100 MiB declared, 1 KiB sent: the answer comes anyway, and the connection closes."""
    response = exchange(server, post_head("/v1/systemone", 100 << 20) + b" " * 1024)
    assert response.status == 413 and response.headers["connection"] == "close"
    assert response.json()["error"]["code"] == "request_too_large"
    assert "server-timing" in response.headers


def test_a_streamed_body_is_413_once_it_passes_the_limit(server: Server) -> None:
    """A chunked body is counted as it arrives: one byte past 8 MiB, and the rest is never waited for."""
    limit = server.client.get("/v1/models").json()["limits"]["max_request_bytes"]
    chunk = b" " * 65536
    chunks = [b"%x\r\n%s\r\n" % (len(chunk), chunk)] * (limit // len(chunk)) + [b"1\r\n \r\n"]
    head = b"POST /v1/systemone HTTP/1.1\r\nHost: test\r\nTransfer-Encoding: chunked\r\n\r\n"
    response = exchange(server, head + b"".join(chunks))  # no final chunk
    assert response.status == 413 and response.headers["connection"] == "close"
    assert response.json()["error"]["code"] == "request_too_large"


def test_a_naive_client_sending_a_body_over_the_limit_reads_the_413(server: Server) -> None:
    """The whole body written before a byte is read: the server reads and discards it, answers, then
    closes in order (a reset would lose the answer under the client's write)."""
    limit = server.client.get("/v1/models").json()["limits"]["max_request_bytes"]
    declared = exchange(server, post_head("/v1/systemone", limit + 1) + b" " * (limit + 1), until_closed=True)
    assert declared.status == 413 and declared.json()["error"]["code"] == "request_too_large"
    chunk = b" " * (1 << 20)
    head = b"POST /v1/systemone HTTP/1.1\r\nHost: test\r\nTransfer-Encoding: chunked\r\n\r\n"
    streamed = head + b"%x\r\n%s\r\n" % (len(chunk), chunk) * (limit // len(chunk) + 2) + b"0\r\n\r\n"
    assert exchange(server, streamed, until_closed=True).json()["error"]["code"] == "request_too_large"
    assert server.post(SMALL).status_code == 200


@pytest.mark.parametrize(("method", "path", "status"), [("POST", "/v1/nothing", 404), ("POST", "/v1/bundle", 422), ("PUT", "/v1/systemone", 405)])
def test_every_early_refusal_reaches_a_naive_client(server: Server, method: str, path: str, status: int) -> None:
    body = b" " * (4 << 20)
    head = post_head(path, len(body)).replace(b"POST", method.encode(), 1)
    response = exchange(server, head + body, until_closed=True)
    assert response.status == status and response.headers["connection"] == "close"
    assert list(response.json()) == ["error"]


@pytest.mark.parametrize(("raw", "reason"), FRAMING_ERRORS.values(), ids=FRAMING_ERRORS.keys())
def test_http_framing_errors_get_the_json_400(server: Server, raw: bytes, reason: str) -> None:
    response = exchange(server, raw, until_closed=True)
    assert response.status == 400 and response.headers["connection"] == "close"
    body = response.json()
    assert list(body) == ["error"] and body["error"]["code"] == "invalid_request"
    assert body["error"]["message"].startswith(FRAMING_PREFIX + reason), body
    assert server.post(SMALL).status_code == 200


def test_repeated_equal_content_lengths_are_one_header(server: Server) -> None:
    raw = json.dumps(SMALL).encode()
    head = b"POST /v1/systemone HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\nContent-Length: %d\r\n\r\n" % (len(raw), len(raw))
    assert exchange(server, head + raw).status == 200


def test_models_health_and_liveness(server: Server) -> None:
    models = server.client.get("/v1/models").json()
    assert list(models) == ["object", "api_version", "data", "limits"] and models["object"] == "list"
    assert models["limits"] == {
        "max_request_bytes": 8 << 20,
        "max_input_tokens": models["data"][0]["limits"]["max_input_tokens"],
        "max_queue": 256,
        "max_queued_tokens": 1 << 22,
    }
    card = models["data"][0]
    assert card["ready"] is True and card["status"] == "ready" and card["family"] == "vela2"
    assert card["question_types"] == ["choice", "noul", "score", "set", "span"]
    assert [profile["name"] for profile in card["profiles"]] == ["exact"]  # batching only where enabled
    assert "random" in card["weights"]
    health = server.client.get("/health")
    assert health.status_code == 200
    assert health.json() == {"api_version": models["api_version"], "status": "ready", "reason": None, "model": card["id"]}
    assert server.client.get("/health/live").json() == {"api_version": models["api_version"], "status": "alive"}


def test_metrics_count_requests_and_tokens(server: Server) -> None:
    before = server.metrics()
    answered = server.post(SMALL).json()
    error(server.post({**SMALL, "stream": True}), 400, "invalid_request")
    after = server.metrics()
    assert after.startswith("# HELP ") and "# TYPE s1omni_requests_total counter" in after
    ok = {"route": "/v1/systemone", "status": "200", "code": "ok"}
    bad = {"route": "/v1/systemone", "status": "400", "code": "invalid_request"}
    assert metric(after, "s1omni_requests_total", **ok) == metric(before, "s1omni_requests_total", **ok) + 1
    assert metric(after, "s1omni_requests_total", **bad) == metric(before, "s1omni_requests_total", **bad) + 1
    tokens = answered["usage"]["input_tokens"]
    assert metric(after, "s1omni_input_tokens_total") == metric(before, "s1omni_input_tokens_total") + tokens
    for stage in ("parse", "tokenize", "queue", "forward", "heads", "post", "serialize", "total"):
        count = metric(after, "s1omni_request_stage_seconds_count", stage=stage)
        assert count == metric(before, "s1omni_request_stage_seconds_count", stage=stage) + 2
    assert metric(after, "s1omni_forward_seconds_count") > metric(before, "s1omni_forward_seconds_count")
    assert metric(after, "s1omni_ready") == 1 and metric(after, "s1omni_pending_jobs") == 0


def _wait_for(server: Server, name: str, value: float, **labels: str) -> None:
    deadline = time.monotonic() + 120
    while metric(server.metrics(), name, **labels) != value:
        assert time.monotonic() < deadline, f"{name} never reached {value}:\n{server.log()}"
        time.sleep(0.01)


def test_a_client_that_leaves_frees_nothing_early_and_leaks_nothing(server: Server) -> None:
    gone = {"route": "/v1/systemone", "status": "499", "code": "client_closed"}
    count = metric(server.metrics(), "s1omni_requests_total", **gone)
    long = json.dumps({"state": "Please refund the duplicate charge. " * 100, "questions": NOUL}).encode()
    head = b"POST /v1/systemone HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(long)
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as client:
        client.sendall(head + long)
        _wait_for(server, "s1omni_pending_jobs", 1)  # admitted, then the client leaves
    _wait_for(server, "s1omni_requests_total", count + 1, **gone)  # its job ran to the end, then was dropped
    with socket.create_connection((host, int(port))) as client:
        client.sendall(head + long[:10])
        _wait_for(server, "s1omni_requests_in_flight", 1)  # its body was still arriving
    _wait_for(server, "s1omni_requests_total", count + 2, **gone)
    text = server.metrics()
    assert metric(text, "s1omni_pending_jobs") == metric(text, "s1omni_requests_in_flight") == 0
    assert metric(text, "s1omni_requests_total", route="/v1/systemone", status="500", code="internal_error") == 0
    assert server.post(SMALL).status_code == 200


def test_request_ids_are_echoed_or_made(server: Server) -> None:
    assert server.client.post("/v1/systemone", json=SMALL, headers={"x-request-id": "abc-123"}).headers["x-request-id"] == "abc-123"
    made = server.client.post("/v1/systemone", json=SMALL, headers={"x-request-id": "not a token"}).headers["x-request-id"]
    assert made != "not a token" and len(made) == 32
    assert "id=abc-123" in server.log()
