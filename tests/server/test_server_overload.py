"""Admission over HTTP: a burst against a small queue is answered 200 or 429, never anything else."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator

import httpx
import pytest
from serving import Server, error, metric, stages

SMALL = {"state": "Please refund the duplicate charge.", "questions": {"refund": {"type": "noul", "instructions": "A refund?"}}}


@pytest.fixture(scope="module")
def server(start, tiny_vela) -> Iterator[Server]:
    server = start(str(tiny_vela), "--max-queue", "4", "--profiles", "batching")
    server.wait_status("ready")
    yield server
    server.stop()


def burst(server: Server, count: int, body: dict) -> list[httpx.Response]:
    async def send() -> list[httpx.Response]:
        limits = httpx.Limits(max_connections=count, max_keepalive_connections=count)
        async with httpx.AsyncClient(base_url=server.url, limits=limits, timeout=300) as client:
            return await asyncio.gather(*(client.post("/v1/systemone", json=body) for _ in range(count)))

    return asyncio.run(send())


def check_burst(responses: list[httpx.Response]) -> Counter[int]:
    statuses = Counter(response.status_code for response in responses)
    assert set(statuses) == {200, 429}, statuses
    for response in responses:
        stages(response)
        if response.status_code == 429:
            assert error(response, 429, "overloaded") == "the request queue is full; retry later"
            assert response.headers["retry-after"] == "1"
        else:
            assert "noul" in response.json()["answers"]["refund"]
    return statuses


@pytest.mark.parametrize("profile", ["exact", "batching"])
def test_96_concurrent_requests_against_a_queue_of_4(server: Server, profile: str) -> None:
    before = server.metrics()
    statuses = check_burst(burst(server, 96, {**SMALL, "options": {"profile": profile}}))
    assert server.client.get("/health").status_code == 200
    after = server.metrics()
    refused = {"route": "/v1/systemone", "status": "429", "code": "overloaded"}
    assert metric(after, "s1omni_requests_total", **refused) - metric(before, "s1omni_requests_total", **refused) == statuses[429]
    assert metric(after, "s1omni_pending_jobs") == metric(after, "s1omni_pending_tokens") == 0
    assert metric(after, "s1omni_queue_depth") == 0
    forwards, requests = (
        metric(after, f"s1omni_batch_requests_{figure}", profile=profile) - metric(before, f"s1omni_batch_requests_{figure}", profile=profile)
        for figure in ("count", "sum")
    )
    if profile == "batching":  # requests that waited together shared a forward
        assert requests == statuses[200] and forwards < requests
    else:  # each in forwards of its own
        assert forwards == requests == statuses[200]
    assert server.post(SMALL).status_code == 200


def test_a_request_and_its_states_are_admitted_together_or_not_at_all(server: Server) -> None:
    states = {f"s{index}": {"state": f"State number {index}.", "questions": SMALL["questions"]} for index in range(4)}
    error(server.post({**SMALL, "states": states}), 429, "overloaded")  # 5 jobs > max-queue 4, even when idle
    del states["s3"]
    assert server.post({**SMALL, "states": states}).status_code == 200


def test_queued_tokens_are_bounded_too(start, tiny_vela) -> None:
    server = start(str(tiny_vela), "--max-queued-tokens", "1")
    server.wait_status("ready")
    # With nothing pending one request is admitted whatever its tokens; beside it, none.
    check_burst(burst(server, 8, SMALL))
    server.stop()
