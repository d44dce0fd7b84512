"""The worker thread runs only the forward: over a real uvicorn server, in this process, on the tiny
member's ONNX Runtime CPU engine. Requests merged into one forward answer byte for byte as each
alone; a request's heads run while the next forward does; a request whose finish fails is answered
500 alone, the others of its forward as if nothing had happened.

The server is in process so that its model can be watched (``forward`` and ``readout`` stamp when
they run) and broken on purpose (a ``finish`` that raises for one request); everything else is what
``s1omni serve`` runs. Requests meant to share a forward are held in the batching window by bodies
whose last byte is not sent yet: the worker waits while a request is on its way.

Merged answers are compared for requests whose prefixes are of one length: the engine left-pads
a shorter prefix to its batch's widest, which moves that request's hidden states by about 5e-7
(float32 rounding in the padded prefill), enough to flip a probability's fourth decimal now and
then; a request whose finish fails is answered 500 whatever its length.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from collections import defaultdict
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from serving import Exchange, read_response

from s1omni.runtime.engine import load_engine_model
from s1omni.server.app import create_app
from s1omni.server.config import ServeConfig
from s1omni.server.scheduler import Limits
from s1omni.server.service import ModelSource, Service
from tests.cli import s1omni

WINDOW_S = 30.0  # the batching window: long, so that only the held bodies decide when a forward runs
TIMEOUT_S = 60.0
QUESTIONS = {
    "intent": {"type": "choice", "instructions": "What does the user want?", "criteria": {"refund": "money back", "other": "anything else"}},
    "urgent": {"type": "noul", "instructions": "Is it urgent?"},
    "mood": {"type": "score", "instructions": "How upset is the user?", "criteria": ["calm", "annoyed", "angry"]},
    "topics": {"type": "set", "instructions": "Which topics?", "criteria": {"billing": "payments", "shipping": "delivery"}},
}  # fmt: skip
# Three requests of one prefix length (32 tokens with these questions): nothing padded (see above).
TEXTS = (
    "Please resend the missing parcel to my house.",
    "The app crashes whenever I open settings.",
    "I want to cancel my order before it ships.",
)
BROKEN = "This request's finish raises."
HEAD = b"POST /v1/systemone HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"


@pytest.fixture(scope="module")
def engine_model(exported: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The tiny member's ONNX Runtime CPU engine, loaded as ``s1omni serve --engine`` loads it (not
    validated here: what is tested is the server around it)."""
    out = tmp_path_factory.mktemp("overlap") / "ort-cpu"
    s1omni("build", str(exported), "--backend", "onnxruntime", "--target", "cpu", "--out", str(out))
    return load_engine_model(out, allow_unvalidated=True)


def text_of(plan: Any) -> str:
    return plan.request.state.parts[0].text


def body(text: str) -> bytes:
    return json.dumps({"state": text, "questions": QUESTIONS}).encode()


class Watch:
    """Stamps each ``forward`` (the texts of its plans) and each ``readout`` of ``model`` with when
    it ran; ``hold(text)`` runs at the start of each readout (a test's own wait)."""

    def __init__(self, model: Any, monkeypatch: pytest.MonkeyPatch):
        self.forwards: list[tuple[list[str], float, float]] = []
        self.readouts: list[tuple[str, float, float]] = []
        self.forwarding: defaultdict[str, threading.Event] = defaultdict(threading.Event)
        self.reading: defaultdict[str, threading.Event] = defaultdict(threading.Event)
        self.hold = lambda text: None
        forward, readout = model.forward, model.readout

        def watched_forward(plans: Sequence[Any]) -> list[Any]:
            texts, started = [text_of(plan) for plan in plans], time.perf_counter()
            for text in texts:
                self.forwarding[text].set()
            out = forward(plans)
            self.forwards.append((texts, started, time.perf_counter()))
            return out

        def watched_readout(plan: Any, hidden: Any) -> Any:
            text, started = text_of(plan), time.perf_counter()
            self.reading[text].set()
            self.hold(text)
            out = readout(plan, hidden)
            self.readouts.append((text, started, time.perf_counter()))
            return out

        monkeypatch.setattr(model, "forward", watched_forward)
        monkeypatch.setattr(model, "readout", watched_readout)

    def forwards_of(self, text: str) -> list[tuple[list[str], float, float]]:
        return [forward for forward in self.forwards if text in forward[0]]


@dataclass(frozen=True)
class Running:
    url: str
    port: int
    service: Service


@contextmanager
def serving(model: Any) -> Iterator[Running]:
    """``model`` served as ``s1omni serve`` serves it (uvicorn, the app, its lifespan), on a free port, ready."""
    service = Service(ServeConfig(limits=Limits(batch_window_s=WINDOW_S)), ModelSource(model.id, lambda: model))
    config = uvicorn.Config(create_app(service), host="127.0.0.1", port=0, log_config=None, access_log=False, lifespan="on")
    server = uvicorn.Server(config)
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


def post(running: Running, text: str) -> httpx.Response:
    return httpx.post(running.url + "/v1/systemone", content=body(text), headers={"content-type": "application/json"}, timeout=TIMEOUT_S)


def merged(running: Running, texts: Sequence[str]) -> list[Exchange]:
    """Requests for ``texts`` sent so that they share one forward: every body but its last byte,
    and once all of them are in flight (the worker waits for them), the last bytes."""
    bodies = [body(text) for text in texts]
    connections = [socket.create_connection(("127.0.0.1", running.port), timeout=TIMEOUT_S) for _ in bodies]
    try:
        for connection, payload in zip(connections, bodies, strict=True):
            connection.sendall(HEAD % len(payload) + payload[:-1])
        deadline = time.monotonic() + TIMEOUT_S
        while running.service.inflight < len(bodies):
            assert time.monotonic() < deadline, "the requests never were all in flight"
            time.sleep(0.01)
        for connection, payload in zip(connections, bodies, strict=True):
            connection.sendall(payload[-1:])
        return [read_response(connection) for connection in connections]
    finally:
        for connection in connections:
            connection.close()


def test_requests_merged_into_one_forward_answer_byte_for_byte_as_each_alone(engine_model: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    prefixes = {len(tree.prefix.ids) for text in TEXTS for tree, _ in engine_model.plan(json.loads(body(text))).trees}
    assert len(prefixes) == 1  # nothing padded (see TEXTS)
    watch = Watch(engine_model, monkeypatch)
    with serving(engine_model) as running:
        together = merged(running, TEXTS)
        alone = [post(running, text) for text in TEXTS]
    assert [sorted(texts) for texts, _, _ in watch.forwards_of(TEXTS[0])] == [sorted(TEXTS), [TEXTS[0]]]
    assert all(len(watch.forwards_of(text)) == 2 for text in TEXTS)  # one forward with the others, one alone
    for exchange, response in zip(together, alone, strict=True):
        assert exchange.status == response.status_code == 200, exchange.body
        assert exchange.body == response.content
    assert len({exchange.body for exchange in together}) == len(TEXTS)  # three different answers, each in its place


def test_the_next_forward_runs_while_a_request_is_in_its_heads(engine_model: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first request's heads wait until the second request's forward has begun: were the heads
    on the worker thread, that forward could not begin, and the wait would run out."""
    first, second = TEXTS[:2]
    watch = Watch(engine_model, monkeypatch)

    def hold(text: str) -> None:
        if text == first and not watch.forwarding[second].wait(TIMEOUT_S):
            raise AssertionError("the second forward never began while the first request's heads ran")

    watch.hold = hold
    with serving(engine_model) as running, ThreadPoolExecutor(1) as pool:
        early = pool.submit(post, running, first)
        assert watch.reading[first].wait(TIMEOUT_S)
        late = post(running, second)  # read, planned, queued and forwarded while the first waits in its heads
        answered = early.result(TIMEOUT_S)
    assert answered.status_code == late.status_code == 200, answered.text
    [(_, first_started, first_ended)] = watch.forwards_of(first)
    [(_, second_started, _)] = watch.forwards_of(second)
    [heads_started, heads_ended] = [(start, end) for text, start, end in watch.readouts if text == first][0]
    assert first_started < first_ended <= heads_started < second_started < heads_ended


def test_a_request_whose_finish_fails_is_answered_500_alone(
    engine_model: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    finish = engine_model.finish

    def breaking(plan: Any, result: Any) -> dict[str, Any]:
        if text_of(plan) == BROKEN:
            raise RuntimeError("finish broke on purpose")
        return finish(plan, result)

    watch = Watch(engine_model, monkeypatch)
    monkeypatch.setattr(engine_model, "finish", breaking)
    texts = (TEXTS[0], BROKEN, TEXTS[1])
    with caplog.at_level(logging.ERROR, logger="s1omni.server"), serving(engine_model) as running:
        together = merged(running, texts)
        alone = [post(running, text) for text in texts]
    assert [sorted(texts) for texts, _, _ in watch.forwards_of(BROKEN)] == [sorted(texts), [BROKEN]]
    refusal = {"error": {"code": "internal_error", "message": "RuntimeError: finish broke on purpose"}}
    for exchange, response in zip(together, alone, strict=True):
        if exchange is together[1]:
            assert exchange.status == response.status_code == 500 and exchange.json() == response.json() == refusal
        else:
            assert exchange.status == response.status_code == 200 and exchange.body == response.content
    failed = [record for record in caplog.records if record.getMessage() == "request failed"]
    assert len(failed) == 2 and all(record.exc_info and record.exc_info[0] is RuntimeError for record in failed)
