"""SIGTERM: admission stops (503) while the listener stays open, in-flight requests finish, then exit 0."""

from __future__ import annotations

import json
import signal
import socket
import time

from serving import error, metric

SMALL = {"state": "Please refund the duplicate charge.", "questions": {"refund": {"type": "noul", "instructions": "A refund?"}}}


def test_sigterm_drains_the_requests_in_flight_then_exits(start, tiny_vela) -> None:
    server = start(str(tiny_vela))
    server.wait_status("ready")
    body = json.dumps(SMALL).encode()
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=60) as slow:
        # A request whose body is still arriving is in flight: its handler has started.
        head = b"POST /v1/systemone HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
        slow.sendall(head % len(body) + body[:10])
        deadline = time.monotonic() + 30
        while metric(server.metrics(), "s1omni_requests_in_flight") != 1:
            assert time.monotonic() < deadline, server.log()
            time.sleep(0.02)

        server.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 30
        while (health := server.client.get("/health")).status_code == 200:
            assert time.monotonic() < deadline, server.log()
            time.sleep(0.02)
        assert health.status_code == 503 and health.json()["status"] == "degraded"
        assert error(server.post(SMALL), 503, "not_ready") == "the server is shutting down"
        assert server.process.poll() is None

        slow.sendall(body[10:])
        answer = b""
        while chunk := slow.recv(65536):
            answer += chunk
    head, _, payload = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), answer
    assert "noul" in json.loads(payload)["answers"]["refund"]
    assert server.process.wait(60) == 0
    assert "drained" in server.log()
