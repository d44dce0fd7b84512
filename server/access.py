"""Per-request accounting around the app: request id, ``Server-Timing``, metrics and the log line.

A plain ASGI middleware, so that it sees every response, routed or not (404, 405), and adds nothing
to the path of a request but headers. Handlers leave what only they know in the request's state:
``code`` (the error code, if any) and ``tokens`` (tokens the model processed for it).

A response sent before its request's body was read to the end (413, 503, 422, 404, 405, a body
that timed out) closes the connection, but only after the rest of the body has been read and
discarded, up to ``DRAIN_BYTES`` and for ``DRAIN_S`` at most. A client that writes its whole body
before it reads (most do) would otherwise see the connection reset under its write, its response
lost, since a socket closed with unread input is reset. The response is written first, so a client
that reads while it writes has it at once; one that sends more, or slower, than the bounds allow
sees the connection close, most likely reset, when they run out. The drain holds no admission and
no count of requests in flight: the handler has returned.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import uuid
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .metrics import Metrics
from .timing import Timing

log = logging.getLogger("s1omni.server")

DECISION_ROUTES = frozenset({"/v1/systemone", "/v1/decisions"})
# Successful probes and scrapes are counted but not logged, so that the log is the requests.
QUIET_ROUTES = frozenset({"/health", "/health/live", "/metrics"})
CLIENT_CLOSED = 499  # recorded for a request whose client left before its answer (nginx's code)
_CLIENT_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
# The most of an early-refused request's body read and discarded before its connection closes.
DRAIN_BYTES = 32 << 20
DRAIN_S = 5.0


class Access:
    def __init__(self, app: ASGIApp, metrics: Metrics, routes: frozenset[str]):
        self.app = app
        self.metrics = metrics
        self.routes = routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        timing = Timing()
        state: dict[str, Any] = scope.setdefault("state", {})
        state["timing"] = timing
        request_id = _request_id(scope)
        status, total = CLIENT_CLOSED, None
        body_read = not _has_body(scope)

        async def counted() -> Message:
            nonlocal body_read
            message = await receive()
            if message["type"] == "http.request" and not message.get("more_body", False):
                body_read = True
            return message

        async def stamped(message: Message) -> None:
            nonlocal status, total
            if message["type"] == "http.response.start":
                status, total = message["status"], timing.total()
                headers = list(message.get("headers", []))
                headers.append((b"server-timing", timing.header(total).encode()))
                headers.append((b"x-request-id", request_id.encode()))
                if not body_read:
                    headers.append((b"connection", b"close"))
                message = {**message, "headers": headers}
            elif message["type"] == "http.response.body" and not message.get("more_body", False) and not body_read:
                await send({**message, "more_body": True})  # all of the response, its end held back
                await _drain(counted)
                message = {"type": "http.response.body", "body": b""}
            await send(message)

        try:
            await self.app(scope, counted, stamped)
        finally:
            self._account(scope, state, status, timing, timing.total() if total is None else total, request_id)

    def _account(self, scope: Scope, state: dict[str, Any], status: int, timing: Timing, total: float, request_id: str) -> None:
        path = scope["path"]
        route = path if path in self.routes else "unmatched"
        code = state.get("code") or ("client_closed" if status == CLIENT_CLOSED else "ok")
        tokens = state.get("tokens", 0)
        self.metrics.requests.inc(route, str(status), code)
        if route in DECISION_ROUTES:
            for stage, seconds in (*timing.stages().items(), ("total", total)):
                self.metrics.stage_seconds.observe(seconds, stage)
            self.metrics.input_tokens.inc(amount=tokens)
        if route in QUIET_ROUTES and status < 400:
            return
        stages = " ".join(f"{stage}={seconds * 1e3:.3f}" for stage, seconds in timing.stages().items())
        log.info(
            "%s %s %d code=%s id=%s tokens=%d %s total=%.3f ms",
            scope["method"], path, status, code, request_id, tokens, stages, total * 1e3,
        )  # fmt: skip


async def _drain(receive: Receive) -> None:
    """Read and discard the rest of a request's body, within ``DRAIN_BYTES`` and ``DRAIN_S``."""
    discarded = 0
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(DRAIN_S):
            while discarded <= DRAIN_BYTES:
                message = await receive()
                if message["type"] != "http.request" or not message.get("more_body", False):
                    return
                discarded += len(message.get("body", b""))


def _has_body(scope: Scope) -> bool:
    for name, value in scope["headers"]:
        if name == b"transfer-encoding" or (name == b"content-length" and value.strip() != b"0"):
            return True
    return False


def _request_id(scope: Scope) -> str:
    """The client's ``X-Request-Id`` when it is a plain token, else a new one."""
    for name, value in scope["headers"]:
        if name == b"x-request-id":
            text = value.decode("latin-1")
            if _CLIENT_ID.fullmatch(text):
                return text
    return uuid.uuid4().hex
