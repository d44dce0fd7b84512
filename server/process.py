"""Run the app under uvicorn, with a drain on SIGTERM or SIGINT.

The first signal stops admission (new decisions requests and ``/health`` answer 503 ``not_ready``)
while the listener stays open, so that a load balancer sees the server leave rather than a refused
connection. Once no request is in flight (or ``drain_timeout_s`` has passed) uvicorn shuts down as
usual: it closes the listener, lets open responses finish, then the model worker stops. A second
signal skips the rest of the drain and the process ends by that signal.

HTTP/1.1 is parsed by h11 (uvicorn's ``h11`` protocol, also where httptools is installed, so that the
framing rules do not depend on what else is installed). What h11 refuses is answered here, not by
the app: conflicting ``Content-Length`` headers (identical repeats are one header, RFC 9110 §8.6),
a malformed chunk, an HTTP/1.1 request without ``Host``, a head still incomplete after 16 KiB, or
bytes that are not HTTP at all, such as a TLS hello on the plain port. uvicorn answers those with a
plain-text 400; here the 400 carries the family's JSON refusal (``invalid_request``, or
``{"detail"}``) with h11's reason, and the connection closes at once: what follows a request whose
framing is broken cannot be read as a body. Such a 400 has no ``Server-Timing`` or ``X-Request-Id``
and is not in the metrics; uvicorn logs it as "Invalid HTTP request received.". A malformed chunk
comes while the app reads that body: the app sees its client leave (499 in the access log).
"""

from __future__ import annotations

import logging
import sys
import time
from http import HTTPStatus
from types import FrameType

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from s1omni.runtime.errors import RequestError

from . import wire
from .app import JSON, create_app
from .service import Service

log = logging.getLogger("s1omni.server")
# Once drained, what is left are responses being written: this long at most.
CLOSE_TIMEOUT_S = 5


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, service: Service):
        super().__init__(config)
        self.service = service
        self.drain_until: float | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.drain_until is not None:
            super().handle_exit(sig, frame)
            return
        self.drain_until = time.monotonic() + self.service.config.drain_timeout_s
        self.service.begin_drain()
        log.info("draining: %d requests in flight", self.service.inflight)

    async def on_tick(self, counter: int) -> bool:
        if await super().on_tick(counter):
            return True
        if self.drain_until is None:
            return False
        if self.service.drained():
            log.info("drained; stopping")
            return True
        if time.monotonic() > self.drain_until:
            log.warning("stopping with %d requests still in flight", self.service.inflight)
            return True
        return False


def _protocol(service: Service) -> type[H11Protocol]:
    """uvicorn's h11 protocol whose 400 for a request that is not HTTP/1.1 is the family's refusal."""
    family = service.family

    class Protocol(H11Protocol):
        def send_400_response(self, msg: str) -> None:
            # uvicorn calls this while it handles h11's error, which says what was wrong.
            error = sys.exception()
            reason = f"the request is not valid HTTP/1.1: {error}" if isinstance(error, h11.RemoteProtocolError) else msg
            if self.conn.our_state not in (h11.IDLE, h11.SEND_RESPONSE):  # the app's response has begun
                self.transport.close()
                return
            status, body, own = family.refusal(RequestError("invalid_request", reason), 400)
            payload = wire.encode(body)
            headers = [
                ("content-type", JSON),
                ("content-length", str(len(payload))),
                ("connection", "close"),
                *own.items(),
            ]
            for event in (h11.Response(status_code=status, headers=headers, reason=HTTPStatus(status).phrase), h11.Data(data=payload), h11.EndOfMessage()):
                self.transport.write(self.conn.send(event))
            self.transport.close()

    return Protocol


def serve(service: Service, log_level: str = "info") -> None:
    config = service.config
    uvicorn_config = uvicorn.Config(
        create_app(service),
        host=config.host,
        port=config.port,
        http=_protocol(service),
        log_level=log_level,
        access_log=False,  # server.access logs each request with its timings
        lifespan="on",
        timeout_graceful_shutdown=CLOSE_TIMEOUT_S,
    )
    DrainingServer(uvicorn_config, service).run()
