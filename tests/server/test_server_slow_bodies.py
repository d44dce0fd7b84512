"""The body-read timeout (``--body-timeout``) over HTTP, for both families: a body that trickles in
a byte at a time is refused 400 once the timeout passes, and while it trickles it holds no
admission slot, so requests behind it are admitted and answered."""

from __future__ import annotations

import base64
import select
import subprocess
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from serving import S1OMNI, Exchange, Server, connect, metric, read_response

from s1omni.runtime.omnijev.model import warmup_png

TIMEOUT_S = 1.0
# uvicorn's uvloop runs the timeout on libuv timers, which count whole milliseconds and may fire up to one
# early: CI once saw the 1 s refusal after 0.9998 s.
TIMER_SLACK_S = 0.002
DECLARED = 4096  # bytes the trickling clients promise; at 20 a second they never get there
VELA = {"state": "Please refund the duplicate charge.", "questions": {"refund": {"type": "noul", "instructions": "A refund?"}}}
PNG_URL = "data:image/png;base64," + base64.b64encode(warmup_png()).decode("ascii")
OMNIJEV = {"state": {"images": [PNG_URL]}, "questions": {"blue": {"type": "noul", "instructions": "The image is mostly blue."}}}


@pytest.fixture(scope="module")
def vela(start, tiny_vela: Path) -> Iterator[Server]:
    server = start(str(tiny_vela), "--body-timeout", str(TIMEOUT_S), "--max-queue", "1")
    server.wait_status("ready")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def omnijev(start, omnijev_package: Path) -> Iterator[Server]:
    server = start(str(omnijev_package), "--body-timeout", str(TIMEOUT_S))
    server.wait_status("ready")
    yield server
    server.stop()


def trickle(server: Server) -> tuple[Exchange, float]:
    """A client that sends its body one byte every 50 ms until the server answers; the answer and
    how long it took."""
    head = b"POST /v1/systemone HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
    started = time.monotonic()  # before connecting: the server's clock may start at the connection
    with connect(server) as connection:
        connection.sendall(head % DECLARED + b"{")
        for _ in range(DECLARED - 1):
            readable, _, _ = select.select([connection], [], [], 0.05)
            if readable:
                break
            connection.sendall(b" ")
        return read_response(connection), time.monotonic() - started


def trickling(server: Server, count: int, then: Callable[[], Any]) -> tuple[list[tuple[Exchange, float]], Any]:
    """``count`` trickling clients and, once all of them are in flight, ``then()``."""
    with ThreadPoolExecutor(count) as pool:
        slow = [pool.submit(trickle, server) for _ in range(count)]
        deadline = time.monotonic() + 30
        while metric(server.metrics(), "s1omni_requests_in_flight") < count:
            assert time.monotonic() < deadline and not any(future.done() for future in slow), server.log()
            time.sleep(0.01)
        meanwhile = then()
        return [future.result(timeout=60) for future in slow], meanwhile


def test_a_trickling_body_times_out_400_and_holds_no_queue_slot(vela: Server) -> None:
    refused, meanwhile = trickling(vela, 3, lambda: [vela.post(VELA) for _ in range(2)])  # 3 bodies, a queue of 1
    assert [response.status_code for response in meanwhile] == [200, 200], [response.text for response in meanwhile]
    for response, seconds in refused:
        assert response.status == 400 and response.headers["connection"] == "close"
        body = response.json()
        assert body == {"error": {"code": "invalid_request", "message": f"the request body did not arrive within {TIMEOUT_S:g} s"}}
        assert TIMEOUT_S - TIMER_SLACK_S <= seconds < TIMEOUT_S + 1
    text = vela.metrics()
    assert metric(text, "s1omni_requests_in_flight") == 0 and metric(text, "s1omni_pending_jobs") == 0
    assert vela.post(VELA).status_code == 200


def test_past_16_trickling_bodies_a_request_is_still_admitted(omnijev: Server) -> None:
    refused, meanwhile = trickling(omnijev, 17, lambda: omnijev.post(OMNIJEV))  # more than the 16 admitted
    assert meanwhile.status_code == 200, meanwhile.text
    for response, seconds in refused:
        assert response.status == 400 and response.json() == {"detail": f"the request body did not arrive within {TIMEOUT_S:g} s"}
        assert TIMEOUT_S - TIMER_SLACK_S <= seconds < TIMEOUT_S + 1
    text = omnijev.metrics()
    assert metric(text, "s1omni_admitted_requests") == 0 and metric(text, "s1omni_requests_in_flight") == 0
    assert omnijev.post(OMNIJEV).status_code == 200


def test_the_body_timeout_must_be_positive(omnijev_package: Path) -> None:
    command = [str(S1OMNI), "serve", str(omnijev_package), "--body-timeout", "0"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "--body-timeout must be > 0 seconds, not 0" in done.stderr
