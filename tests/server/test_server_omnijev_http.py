"""The OmniJev contract (wire-contract.md §11) over HTTP against a real ``s1omni serve`` of the tiny member."""

from __future__ import annotations

import asyncio
import base64
import json
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from serving import FRAMING_ERRORS, FRAMING_PREFIX, S1OMNI, Server, detail, exchange, metric, stages

from s1omni.runtime.omnijev.contract import MAX_BODY, ContractError
from s1omni.runtime.omnijev.model import warmup_png

PATH = "/v1/systemone"
PNG_URL = "data:image/png;base64," + base64.b64encode(warmup_png()).decode("ascii")
# Every question form, in an order that is not sorted, so that request order shows.
QUESTIONS = {
    "where": {"type": "noul", "instructions": "The toolbar is visible.", "region": {"box": [0, 0, 500, 120.5]}},
    "blue": {"type": "noul", "instructions": "The image is mostly blue."},
    "colour": {"type": "choice", "instructions": "Which colour dominates?", "criteria": {"red": None, "green": "Mostly green"}},
    "button": {
        "type": "choice",
        "instructions": "Which control do I press?",
        "options": [{"key": "ok", "text": "the OK button"}, {"region": {"box": [10, 10, 40, 30]}}, {"abstain": True}, {}],
    },
    "bright": {"type": "score", "instructions": "How bright is it?", "levels": ["dark", "medium", "bright"]},
    "busy": {"type": "score", "instructions": "How cluttered is it?", "criteria": {"calm": "few things", "cluttered": None}},
}
REQUEST = {"model": None, "state": {"images": [PNG_URL]}, "questions": QUESTIONS}
SMALL = {"state": {"images": [PNG_URL]}, "questions": {"blue": QUESTIONS["blue"]}}
# 1,024 rows: it holds the worker for a second or more, long enough to fill admission around it.
LARGE = {
    "state": {"images": [PNG_URL]},
    "questions": {
        f"q{index}": {
            "type": "choice",
            "instructions": "Which option describes the window title best? " * 4,
            "options": [{"text": f"option number {option} of the list"} for option in range(16)],
        }
        for index in range(64)
    },
}


def without_latency(response: dict[str, Any]) -> dict[str, Any]:
    """A response without its timings, the only values that differ from one run to the next."""
    answers = {key: {k: v for k, v in answer.items() if not k.startswith("latency")} for key, answer in response["answers"].items()}
    return {**response, "answers": answers}


@pytest.fixture(scope="module")
def model(omnijev_package: Path) -> Any:
    from s1omni.runtime.api import load_model

    return load_model(omnijev_package)


@pytest.fixture(scope="module")
def server(start, omnijev_package: Path) -> Iterator[Server]:
    server = start(str(omnijev_package))
    deadline = time.monotonic() + 180
    while (health := server.client.get("/health")).status_code != 200:
        assert health.status_code == 503 and health.json()["status"] in {"starting", "loading", "warming"}, health.text
        assert time.monotonic() < deadline, server.log()
        time.sleep(0.05)
    yield server
    server.stop()


def refusal(model: Any, body: dict[str, Any]) -> ContractError:
    with pytest.raises(ContractError) as refused:
        model.plan(body)
    return refused.value


# ----------------------------------------------------------------------------- answers


def test_health_is_ready_only_after_the_warm_up_ran_through_the_worker(server: Server, model: Any) -> None:
    health = server.client.get("/health")
    assert health.status_code == 200 and health.json() == {"status": "ready", "model": model.id}
    text = server.metrics()
    # The golden request was planned, run by the scheduler's worker and finished before any client came.
    assert metric(text, "s1omni_forward_seconds_count") >= 1 and metric(text, "s1omni_ready") == 1
    assert "warm-up answered" in server.log()


def test_every_question_form_answers_as_in_process_in_request_order(server: Server, model: Any) -> None:
    response = server.post(REQUEST)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert list(body) == ["model", "answers", "usage"] and body["model"] == model.id
    assert list(body["answers"]) == list(QUESTIONS)
    assert all("type" not in answer for answer in body["answers"].values())
    assert list(body["answers"]["button"]["probabilities"]) == ["ok", "option_1", "option_3"]
    assert without_latency(body) == without_latency(model.answer(REQUEST))
    assert body["usage"]["input_tokens"] > 0 and body["usage"]["output_tokens"] == 0
    timing = stages(response)
    assert timing["tokenize"] > 0 and timing["forward"] > 0 and timing["heads"] > 0 and timing["post"] > 0


def test_models_describes_the_family_and_its_limits(server: Server, model: Any) -> None:
    models = server.client.get("/v1/models").json()
    assert list(models) == ["object", "data", "limits"]
    assert models["limits"] == {"max_request_bytes": MAX_BODY, "max_admitted": 16, "max_preparing": 2}
    card = models["data"][0]
    assert card["id"] == model.id and card["family"] == "omnijev" and card["ready"] is True
    assert sorted(card["modalities"]) == ["image", "text"] and card["question_types"] == ["noul", "choice", "score"]
    # One request a forward, as the reference worker runs it: exact is the one profile (its requests take no options).
    assert card["profile"] == "exact" and [(entry["name"], entry["numerics"]) for entry in card["profiles"]] == [("exact", "exact")]
    assert server.client.get("/health/live").json() == {"status": "alive"}


# ----------------------------------------------------------------------------- refusals

NOT_STRICT_JSON = {
    "duplicate key": b'{"state": {}, "state": {}}',
    "nested duplicate key": b'{"questions": {"q": {"type": "noul", "type": "score"}}}',
    "NaN": b'{"questions": {"q": {"region": {"box": [NaN, 0, 1, 1]}}}}',
    "Infinity": b'{"questions": {"q": {"region": {"box": [Infinity, 0, 1, 1]}}}}',
    "float out of range": b'{"questions": {"q": {"region": {"box": [1e999, 0, 1, 1]}}}}',
    "integer out of range": b'{"questions": {"q": {"region": {"box": [1' + b"0" * 400 + b', 0, 1, 1]}}}}',
    "malformed JSON": b'{"state": ',
    "malformed UTF-8": b'{"model": "\xff"}',
    "lone surrogate": b'{"model": "\\ud800"}',
    "not an object": b"[]",
}


@pytest.mark.parametrize("raw", NOT_STRICT_JSON.values(), ids=NOT_STRICT_JSON.keys())
def test_bodies_that_are_not_strict_json_are_400(server: Server, raw: bytes) -> None:
    response = server.client.post(PATH, content=raw, headers={"content-type": "application/json"})
    assert detail(response, 400).startswith("invalid")


def post_head(length: int) -> bytes:
    return b"POST /v1/systemone HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % length


def test_a_declared_length_over_12_mib_is_413_before_the_body_is_read(server: Server) -> None:
    response = exchange(server, post_head(100 << 20) + b" " * 1024)
    assert response.status == 413 and response.headers["connection"] == "close" and "server-timing" in response.headers
    assert list(response.json()) == ["detail"]


def test_the_limit_is_exactly_12_mib(server: Server) -> None:
    raw = json.dumps(SMALL).encode()
    at_limit = server.client.post(PATH, content=raw + b" " * (MAX_BODY - len(raw)))
    assert at_limit.status_code == 200, at_limit.text
    chunk = b" " * (1 << 20)
    chunks = [b"%x\r\n%s\r\n" % (len(raw), raw)] + [b"%x\r\n%s\r\n" % (len(chunk), chunk)] * 12  # no final chunk
    head = b"POST /v1/systemone HTTP/1.1\r\nHost: test\r\nTransfer-Encoding: chunked\r\n\r\n"
    response = exchange(server, head + b"".join(chunks))
    assert response.status == 413 and response.headers["connection"] == "close" and list(response.json()) == ["detail"]


def test_a_naive_client_sending_a_body_over_12_mib_reads_the_413(server: Server) -> None:
    """The whole body written before a byte is read: it is read and discarded, the 413 arrives and
    the connection closes in order."""
    response = exchange(server, post_head(MAX_BODY + 1) + b" " * (MAX_BODY + 1), until_closed=True)
    assert response.status == 413 and list(response.json()) == ["detail"]
    assert response.json()["detail"] == f"the request body exceeds {MAX_BODY} bytes"
    assert server.post(SMALL).status_code == 200


@pytest.mark.parametrize(("raw", "reason"), FRAMING_ERRORS.values(), ids=FRAMING_ERRORS.keys())
def test_http_framing_errors_get_a_detail_400(server: Server, raw: bytes, reason: str) -> None:
    response = exchange(server, raw, until_closed=True)
    assert response.status == 400 and response.headers["connection"] == "close"
    body = response.json()
    assert list(body) == ["detail"] and body["detail"].startswith(FRAMING_PREFIX + reason), body


def _png_as_jpeg() -> str:
    return PNG_URL.replace("image/png", "image/jpeg")


def choice(texts: list[str]) -> dict[str, Any]:
    return {"type": "choice", "instructions": "Which one?", "options": [{"text": text} for text in texts]}


def _broken_png() -> str:
    return "data:image/png;base64," + base64.b64encode(warmup_png()[:60]).decode("ascii")


REFUSED = {
    "unknown field": {**SMALL, "stream": True},
    "unknown model": {**SMALL, "model": "someone/else"},
    "state without images": {**SMALL, "state": {}},
    "two images": {**SMALL, "state": {"images": [PNG_URL, PNG_URL]}},
    "an http image": {**SMALL, "state": {"images": ["https://example.com/a.png"]}},
    "a PNG declared as JPEG": {**SMALL, "state": {"images": [_png_as_jpeg()]}},
    "a truncated PNG": {**SMALL, "state": {"images": [_broken_png()]}},
    "65 questions": {**SMALL, "questions": {f"q{i}": QUESTIONS["blue"] for i in range(65)}},
    "a reserved token": {**SMALL, "questions": {"q": {"type": "noul", "instructions": "Is <|image_pad|> here?"}}},
    "256 options": {**SMALL, "questions": {"q": choice([str(i) for i in range(256)])}},
    "a question over 8,192 tokens": {**SMALL, "questions": {"q": choice([f"{i} " + "zebra quartz " * 15 for i in range(255)])}},
}


@pytest.mark.parametrize("body", REFUSED.values(), ids=REFUSED.keys())
def test_contract_image_and_token_refusals_are_422(server: Server, model: Any, body: dict) -> None:
    expected = refusal(model, body)
    assert expected.status == 422
    assert detail(server.post(body), 422) == expected.detail


def test_other_routes_refuse_with_a_detail_too(server: Server) -> None:
    assert detail(server.client.get("/v1/nothing"), 404) == "no route /v1/nothing"
    assert detail(server.post(SMALL, PATH + "/"), 404) == f"no route {PATH}/ (routes have no trailing slash: {PATH})"
    for surface in ("/v1/classify", "/v1/embeddings", "/v1/rerank", "/v1/bundle"):
        assert detail(server.client.post(surface, json={"input": "x"}), 422).startswith(f"{surface} is not served here")
    response = server.client.get(PATH)
    assert detail(response, 405) == "GET is not allowed on /v1/systemone" and response.headers["allow"] == "POST"


# ----------------------------------------------------------------------------- admission


async def until(client: httpx.AsyncClient, name: str, value: float, **labels: str) -> None:
    """Poll ``/metrics`` until the sample is ``value``."""
    deadline = time.monotonic() + 60
    while metric((await client.get("/metrics")).text, name, **labels) != value:
        assert time.monotonic() < deadline, f"{name} never reached {value}"
        await asyncio.sleep(0.005)


def wait_for(server: Server, name: str, value: float, **labels: str) -> None:
    async def poll() -> None:
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            await until(client, name, value, **labels)

    asyncio.run(poll())


def test_past_16_admitted_requests_the_worker_is_busy(server: Server) -> None:
    async def scenario() -> tuple[list[httpx.Response], list[httpx.Response]]:
        limits = httpx.Limits(max_connections=32, max_keepalive_connections=32)
        async with httpx.AsyncClient(base_url=server.url, limits=limits, timeout=300) as client:
            large = asyncio.create_task(client.post(PATH, json=LARGE))
            await until(client, "s1omni_admitted_requests", 1)
            rest = [asyncio.create_task(client.post(PATH, json=SMALL)) for _ in range(15)]
            await until(client, "s1omni_admitted_requests", 16)
            refused = [
                await client.post(PATH, json=SMALL),  # the 17th
                await client.post(PATH, json={**SMALL, "stream": True}),  # admission comes before the contract
                await client.post(PATH, content=b'{"state": 1, "state": 2}'),  # strict parsing before admission
            ]
            return refused, await asyncio.gather(large, *rest)

    (busy, unchecked, malformed), answered = asyncio.run(scenario())
    for response in (busy, unchecked):
        assert detail(response, 503) == "the worker is busy" and response.headers["retry-after"] == "1"
    detail(malformed, 400)
    assert [response.status_code for response in answered] == [200] * 16
    text = server.metrics()
    assert metric(text, "s1omni_admitted_requests") == 0 and metric(text, "s1omni_pending_jobs") == 0
    assert server.post(SMALL).status_code == 200


def test_a_client_that_leaves_keeps_counting_until_its_work_ends(server: Server) -> None:
    gone = {"route": PATH, "status": "499", "code": "client_closed"}
    before = server.metrics()
    raw = json.dumps(LARGE).encode()
    head = b"POST /v1/systemone HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as client:
        client.sendall(head % len(raw) + raw)
        wait_for(server, "s1omni_admitted_requests", 1)
    assert metric(server.metrics(), "s1omni_admitted_requests") == 1  # gone, and still preparing or running
    wait_for(server, "s1omni_requests_total", metric(before, "s1omni_requests_total", **gone) + 1, **gone)
    after = server.metrics()
    assert metric(after, "s1omni_admitted_requests") == 0
    assert metric(after, "s1omni_forward_seconds_count") == metric(before, "s1omni_forward_seconds_count") + 1
    assert metric(after, "s1omni_input_tokens_total") > metric(before, "s1omni_input_tokens_total")  # it ran to the end


# ----------------------------------------------------------------------------- start-up


def test_a_model_that_never_loads_stops_the_server(s1omni_home: Path, omnijev_package: Path, tmp_path: Path) -> None:
    registry = tmp_path / "empty.json"
    registry.write_text(json.dumps({"format": "s1omni-registry/1", "members": []}), encoding="utf-8")  # pins nothing
    done = subprocess.run([str(S1OMNI), "serve", str(omnijev_package), "--port", "0", "--registry", str(registry)],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 3, done.stderr  # the package is refused
    assert done.stderr.strip().splitlines()[-1].startswith("s1omni serve: ") and "no registry entry" in done.stderr


@pytest.mark.parametrize("option", [["--max-queue", "4"], ["--profiles", "batching"], ["--profiles", "max_speed"], ["--reduced-copy", "copy"]])
def test_vela_only_options_are_refused(omnijev_package: Path, option: list[str]) -> None:
    command = [str(S1OMNI), "serve", str(omnijev_package), *option]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and f"{option[0]} apply to Vela 2.0 members only" in done.stderr
