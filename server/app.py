"""The HTTP routes: ``/v1/systemone`` (alias ``/v1/decisions``), ``/v1/models``, ``/health``,
``/health/live`` and ``/metrics`` (vllm-project/semantic-router:src/model-runtime/vllm_srun/api/app.py).

One handler serves every family; the served family (``service.family``) reads the body, answers
it, and gives each refusal its body and headers. The body is read against the family's limit: a
declared ``Content-Length`` over it is answered 413 before a byte is read, and a streamed body is
counted as it arrives and refused as soon as it passes the limit. The whole body must arrive
within ``body_timeout_s`` of the request's headers, else 400 ``invalid_request``: a body that
trickles in holds a connection, never an admission slot, which is taken only once the body is read.
Routes of surfaces other families serve answer 422 ``unsupported_surface``; an unknown route 404
and a wrong method 405, both ``invalid_request``.

A path with a trailing slash is an unknown route (404), not a redirect to the route without it as
Starlette's default (and so the reference's) would answer: a 307 on a POST makes a client send its
body twice, clients that do not follow redirects (httpx by default) get a 307 without a body, and
its ``Location`` is built from the ``Host`` header, which behind a proxy is not the client's. Nor
is it served as an alias: the contract names each route once, and a typo is better told than
hidden. The OmniJev reference (axum) answers 404 to it as well; the 404's message names the route
meant.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import anyio
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp

from s1omni.runtime.errors import RequestError

from . import openapi, wire
from .access import CLIENT_CLOSED, Access
from .service import Service

log = logging.getLogger("s1omni.server")

JSON = "application/json"
OTHER_SURFACES = ("/v1/classify", "/v1/embeddings", "/v1/rerank", "/v1/bundle")


def _json(content: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(wire.encode(content), status_code=status, headers=headers, media_type=JSON)


async def _read_body(request: Request, limit: int, timeout_s: float) -> bytes:
    too_large = RequestError("request_too_large", f"the request body exceeds {limit} bytes")
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise too_large
    body = bytearray()
    try:
        async with asyncio.timeout(timeout_s):
            async for chunk in request.stream():
                body += chunk
                if len(body) > limit:
                    raise too_large
    except TimeoutError:
        raise RequestError("invalid_request", f"the request body did not arrive within {timeout_s:g} s") from None
    return bytes(body)


def create_app(service: Service) -> ASGIApp:
    config, family = service.config, service.family

    def _error(
        request: Request, error: RequestError, status: int | None = None, headers: dict[str, str] | None = None
    ) -> Response:
        """The family's refusal; ``status`` overrides the code's own (404 and 405 are ``invalid_request``)."""
        request.state.code = error.code
        status, body, own = family.refusal(error, status)
        return _json(body, status, {**(headers or {}), **own})

    async def decisions(request: Request) -> Response:
        timing = request.state.timing
        service.inflight += 1
        arrival = None
        try:
            arrival = service.arrive()
            raw = await _read_body(request, family.max_body, config.body_timeout_s)
            body = family.read(raw)
            timing.parse = time.perf_counter() - timing.started
            content, request.state.tokens = await family.answer(body, len(raw), timing, arrival)
            mark = time.perf_counter()
            payload = wire.encode(content)
            timing.serialize = time.perf_counter() - mark
        except RequestError as exc:
            return _error(request, exc)
        except ClientDisconnect:  # gone while its body was arriving: nothing was admitted
            return Response(status_code=CLIENT_CLOSED)
        except Exception as exc:
            log.exception("request failed")
            return _error(request, RequestError("internal_error", f"{type(exc).__name__}: {exc}"))
        finally:
            service.inflight -= 1
            if arrival is not None:
                arrival.close()
        if await request.is_disconnected():
            return Response(status_code=CLIENT_CLOSED)
        return Response(payload, media_type=JSON)

    async def unsupported(request: Request) -> Response:
        message = f"{request.url.path} is not served here: this server answers /v1/systemone and /v1/decisions"
        return _error(request, RequestError("unsupported_surface", message))

    async def models(request: Request) -> Response:
        return _json(service.models())

    async def health(request: Request) -> Response:
        if not service.healthy:
            request.state.code = "not_ready"
            return _json(service.health(), 503)
        return _json(service.health())

    async def live(request: Request) -> Response:
        if not service.alive:  # the load failed: the health body says why
            return _json(service.health(), 503)
        return _json(family.live())

    async def metrics(request: Request) -> Response:
        body, content_type = service.metrics.render(request.headers.get("accept"))
        return Response(body, headers={"content-type": content_type})

    async def not_found(request: Request, exc: Exception) -> Response:
        path = request.url.path
        meant = path.rstrip("/")
        hint = f" (routes have no trailing slash: {meant})" if meant != path and meant in paths else ""
        return _error(request, RequestError("invalid_request", f"no route {path}{hint}"), 404)

    async def not_allowed(request: Request, exc: Exception) -> Response:
        allow = exc.headers if isinstance(exc, HTTPException) else None  # keeps the Allow header
        message = f"{request.method} is not allowed on {request.url.path}"
        return _error(request, RequestError("invalid_request", message), 405, allow)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await anyio.sleep(0)  # loads anyio's backend now rather than in the first request (~30 ms)
        service.start(asyncio.get_running_loop())
        yield
        service.stop(config.drain_timeout_s)

    routes = [
        Route("/v1/systemone", decisions, methods=["POST"]),
        Route("/v1/decisions", decisions, methods=["POST"]),
        *(Route(path, unsupported, methods=["POST"]) for path in OTHER_SURFACES),
        Route("/v1/models", models, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/health/live", live, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        *openapi.routes(family.name),
    ]
    paths = frozenset(route.path for route in routes)
    app = Starlette(routes=routes, exception_handlers={404: not_found, 405: not_allowed}, lifespan=lifespan)
    app.router.redirect_slashes = False  # see the module's docstring
    return Access(app, service.metrics, paths)
