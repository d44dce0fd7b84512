"""A real uvicorn server in this process around a model the test can watch, and ways to send it
requests that would share a forward.

Everything but the process boundary is what ``s1omni serve`` runs (uvicorn, the app, its lifespan,
the service and its scheduler); the model is in reach so that a test sees each ``forward`` (the
texts of its plans) and ``readout`` and when they ran, and can hold one on purpose.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections import defaultdict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import uvicorn
from serving import Exchange, read_response

from s1omni.server.app import create_app
from s1omni.server.config import ServeConfig
from s1omni.server.scheduler import Limits
from s1omni.server.service import ModelSource, Service

WINDOW_S = 30.0  # the batching window: long, so that only the held bodies decide when a batching forward runs
TIMEOUT_S = 60.0
QUESTIONS = {
    "intent": {"type": "choice", "instructions": "What does the user want?", "criteria": {"refund": "money back", "other": "anything else"}},
    "urgent": {"type": "noul", "instructions": "Is it urgent?"},
    "mood": {"type": "score", "instructions": "How upset is the user?", "criteria": ["calm", "annoyed", "angry"]},
    "topics": {"type": "set", "instructions": "Which topics?", "criteria": {"billing": "payments", "shipping": "delivery"}},
}  # fmt: skip
HEAD = b"POST /v1/systemone HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"


def text_of(plan: Any) -> str:
    return plan.request.state.parts[0].text


def request(text: str, **options: Any) -> dict[str, Any]:
    return {"state": text, "questions": QUESTIONS, **({"options": options} if options else {})}


def body(text: str, **options: Any) -> bytes:
    return json.dumps(request(text, **options)).encode()


def prefix_lengths(model: Any, text: str) -> set[int]:
    return {len(tree.prefix.ids) for tree, _ in model.plan(request(text)).trees}


class Watch:
    """Stamps each ``forward`` (the texts of its plans) and each ``readout`` of ``model`` with when
    it ran, and each ``forward_packed`` in ``packed_forwards``; ``hold_forward(texts)`` and ``hold(text)``
    run at the start of each forward and readout (a test's own wait)."""

    def __init__(self, model: Any, monkeypatch: pytest.MonkeyPatch):
        self.forwards: list[tuple[list[str], float, float]] = []
        self.packed_forwards: list[tuple[list[str], float, float]] = []
        self.readouts: list[tuple[str, float, float]] = []
        self.forwarding: defaultdict[str, threading.Event] = defaultdict(threading.Event)
        self.reading: defaultdict[str, threading.Event] = defaultdict(threading.Event)
        self.hold_forward = lambda texts: None
        self.hold = lambda text: None
        readout = model.readout

        def watched(forward: Any, stamps: list[tuple[list[str], float, float]]) -> Any:
            def watched_forward(plans: Sequence[Any]) -> list[Any]:
                texts, started = [text_of(plan) for plan in plans], time.perf_counter()
                for text in texts:
                    self.forwarding[text].set()
                self.hold_forward(texts)
                out = forward(plans)
                stamps.append((texts, started, time.perf_counter()))
                return out

            return watched_forward

        def watched_readout(plan: Any, hidden: Any) -> Any:
            text, started = text_of(plan), time.perf_counter()
            self.reading[text].set()
            self.hold(text)
            out = readout(plan, hidden)
            self.readouts.append((text, started, time.perf_counter()))
            return out

        monkeypatch.setattr(model, "forward", watched(model.forward, self.forwards))
        monkeypatch.setattr(model, "forward_packed", watched(model.forward_packed, self.packed_forwards))
        monkeypatch.setattr(model, "readout", watched_readout)

    def forwards_of(self, text: str) -> list[tuple[list[str], float, float]]:
        return [forward for forward in self.forwards if text in forward[0]]


@dataclass(frozen=True)
class Running:
    url: str
    port: int
    service: Service

    def metrics(self) -> str:
        return httpx.get(self.url + "/metrics", timeout=TIMEOUT_S).text


@contextmanager
def serving(model: Any, profiles: tuple[str, ...] = ("exact",)) -> Iterator[Running]:
    """``model`` served as ``s1omni serve --profiles ...`` serves it (uvicorn, the app, its lifespan),
    on a free port, ready."""
    config = ServeConfig(limits=Limits(batch_window_s=WINDOW_S), profiles=profiles)
    service = Service(config, ModelSource(model.id, lambda: model))
    uvicorn_config = uvicorn.Config(create_app(service), host="127.0.0.1", port=0, log_config=None, access_log=False, lifespan="on")
    server = uvicorn.Server(uvicorn_config)
    thread = threading.Thread(target=server.run, name="uvicorn", daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + TIMEOUT_S
        while not (server.started and service.ready):
            assert time.monotonic() < deadline and thread.is_alive(), f"not ready: {service.status} {service.reason}"
            time.sleep(0.01)
        port = server.servers[0].sockets[0].getsockname()[1]
        yield Running(f"http://127.0.0.1:{port}", port, service)
    finally:
        server.should_exit = True
        thread.join(TIMEOUT_S)


def post(running: Running, payload: bytes) -> httpx.Response:
    return httpx.post(running.url + "/v1/systemone", content=payload, headers={"content-type": "application/json"}, timeout=TIMEOUT_S)


def together(running: Running, bodies: Sequence[bytes]) -> list[Exchange]:
    """Requests sent so that a batching server merges them into one forward: every body but its last
    byte, and once all of them are in flight (the worker waits for them), the last bytes."""
    connections = [socket.create_connection(("127.0.0.1", running.port), timeout=TIMEOUT_S) for _ in bodies]
    try:
        for connection, payload in zip(connections, bodies, strict=True):
            connection.sendall(HEAD % len(payload) + payload[:-1])
        wait_for(lambda: running.service.inflight >= len(bodies), "the requests never were all in flight")
        for connection, payload in zip(connections, bodies, strict=True):
            connection.sendall(payload[-1:])
        return [read_response(connection) for connection in connections]
    finally:
        for connection in connections:
            connection.close()


def wait_for(condition: Any, failure: str) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while not condition():
        assert time.monotonic() < deadline, failure
        time.sleep(0.005)
