"""The served model: loading, warm-up, readiness, draining, and answering one decisions request.

The model loads on a background thread so that ``/health`` answers at once (503 while it loads).
It becomes ready only after its golden request (``model.golden_request()``) has been answered
through the very path a client's request takes (envelope, plan, scheduler, finish, encoding) with
no question failing. A request runs ``model.plan`` (on the event loop for small bodies, else on a
thread), is admitted to the scheduler as one group with its ``states``, waits for its results and
is finished in request order (vllm-project/semantic-router:src/model-runtime/vllm_srun/runtime.py
``ServedModel.load``, ``Runtime._serve_parts``).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from starlette.concurrency import run_in_threadpool

from runtime.api import DecisionModel, Plan
from runtime.errors import RequestError

from . import envelope, wire
from .config import ServeConfig
from .metrics import Metrics
from .scheduler import EXPIRED, Arrival, Job, Scheduler
from .timing import Timing

log = logging.getLogger("s1omni.server")

# The contract version reported to clients (vela2-decoder.md §6.5).
API_VERSION = "2.1.0"
# Bodies up to this size are planned and finished on the event loop: cheaper than a thread hop.
INLINE_BYTES = 16 << 10
# What a card without its own profiles says: the one profile this server runs.
PROFILES = [{"name": "exact", "numerics": "exact", "description": "the reference computation, nothing approximated"}]

T = TypeVar("T")


@dataclass(frozen=True)
class ModelSource:
    """What to serve: a name to show before it loads, how to load it, and a notice for its card."""

    label: str
    load: Callable[[], DecisionModel]
    notice: str | None = None


class Service:
    def __init__(self, config: ServeConfig, source: ModelSource):
        self.config = config
        self.source = source
        self.metrics = Metrics()
        self.status, self.reason = "starting", "the server is starting"
        self.model: DecisionModel | None = None
        self.served: envelope.Served | None = None
        self.scheduler: Scheduler | None = None
        self._card: dict[str, Any] = {}
        self.inflight = 0  # decisions handlers between their first byte and their answer
        self.draining = False
        self.metrics.gauge("s1omni_ready", "1 once the warm-up request was answered.", lambda: float(self.ready))
        self.metrics.gauge("s1omni_requests_in_flight", "Decision requests between arrival and answer.", lambda: self.inflight)
        self.metrics.gauge("s1omni_queue_depth", "Jobs waiting for the model worker.", self._depth)
        self.metrics.gauge("s1omni_pending_jobs", "Admitted jobs not yet answered.", lambda: self._pending()[0])
        self.metrics.gauge("s1omni_pending_tokens", "Tokens of admitted jobs not yet answered.", lambda: self._pending()[1])

    # -- lifecycle -------------------------------------------------------------------------------

    @property
    def ready(self) -> bool:
        return self.status == "ready"

    def _set(self, status: str, reason: str | None = None) -> None:
        self.status, self.reason = status, reason

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Load and warm up on a daemon thread, so that a stop never waits for a load."""
        threading.Thread(target=self._load, args=(loop,), name="s1omni-load", daemon=True).start()

    def _load(self, loop: asyncio.AbstractEventLoop) -> None:
        try:
            self._set("loading", f"loading {self.source.label}")
            started = time.perf_counter()
            model = self.source.load()
            card = model.card()
            names = {model.id, card.get("id"), card.get("repo")}
            self.served = envelope.Served(
                id=model.id,
                names=frozenset(name for name in names if isinstance(name, str) and name),
                reads_images="image" in card.get("modalities", ("text",)),
            )
            self._card = card
            self.scheduler = Scheduler(model.execute, self.config.limits, self.metrics)
            self.scheduler.start()
            self.model = model
            log.info("loaded %s (%s on %s) in %.1f s", model.id, model.engine, model.device, time.perf_counter() - started)
            self._set("warming", "answering the golden request")
            asyncio.run_coroutine_threadsafe(self._warm_up(), loop).result()
            self._set("ready")
            log.info("ready: %s", model.id)
        except Exception as exc:
            log.exception("%s cannot be served", self.source.label)
            self._set("failed", f"{type(exc).__name__}: {exc}")

    async def _warm_up(self) -> None:
        assert self.model is not None
        timing = Timing()
        raw = wire.encode(self.model.golden_request())
        content, _ = await self.decide(wire.decode(raw), len(raw), timing)
        wire.encode(content)
        failed = {key: answer for key, answer in content["answers"].items() if "error" in answer}
        if failed:
            raise RuntimeError(f"the golden request's questions failed: {failed}")
        log.info("warm-up answered in %.1f ms", timing.total() * 1e3)

    def begin_drain(self) -> None:
        self.draining = True
        if self.ready:
            self._set("degraded", "shutting down: draining the requests in flight")

    def drained(self) -> bool:
        return self.inflight == 0

    def stop(self, timeout: float) -> None:
        if self.scheduler is not None and not self.scheduler.close(timeout):
            log.warning("the model worker was still running after %.0f s", timeout)

    # -- requests --------------------------------------------------------------------------------

    def arrive(self) -> Arrival:
        """A request on its way to the scheduler; 503 ``not_ready`` unless the server is ready."""
        if self.draining:
            raise RequestError("not_ready", "the server is shutting down")
        if not self.ready or self.scheduler is None:
            raise RequestError("not_ready", f"the model is {self.status}: {self.reason}")
        return self.scheduler.arrive()

    async def _maybe_offload(self, size: int, work: Callable[[], T]) -> T:
        return work() if size <= INLINE_BYTES else await run_in_threadpool(work)

    def _plan(self, bodies: Sequence[dict[str, Any]], names: Sequence[str]) -> list[Plan]:
        """A request and its states; it is refused only when no question in any of them is valid."""
        assert self.model is not None
        plans = [self.model.plan(bodies[0], require_valid=False)]
        for name, body in zip(names, bodies[1:], strict=True):
            try:
                plans.append(self.model.plan(body, require_valid=False))
            except RequestError as exc:
                raise RequestError(exc.code, f"states[{name!r}]: {exc.message}") from exc
        if not any(plan.valid_count for plan in plans):
            labels = ["request", *(f"states[{name!r}]" for name in names)]
            reasons = "; ".join(f"{label}: {plan.reasons()}" for label, plan in zip(labels, plans, strict=True))
            raise RequestError("invalid_request", f"no question is valid ({reasons})")
        return plans

    async def decide(self, body: Any, size: int, timing: Timing, arrival: Arrival | None = None) -> tuple[dict[str, Any], int]:
        """The response content of a decoded request, and the tokens the model processed for it.

        ``timing`` gets every stage up to ``post``; ``timing.started`` is when the request arrived,
        the origin of its deadline. ``arrival`` is closed when the request is admitted.
        """
        assert self.model is not None and self.served is not None and self.scheduler is not None
        model = self.model
        mark = time.perf_counter()
        request = envelope.read(body, self.served)
        timing.parse += time.perf_counter() - mark
        deadline = None if request.deadline_ms is None else timing.started + request.deadline_ms / 1e3

        mark = time.perf_counter()
        plans = await self._maybe_offload(size, lambda: self._plan(request.bodies, request.state_names))
        timing.tokenize = time.perf_counter() - mark

        jobs = [Job(plan, request.profile, deadline) for plan in plans]
        submitted = time.perf_counter()
        self.scheduler.submit(jobs, arrival)
        results = await asyncio.gather(*(asyncio.wrap_future(job.future) for job in jobs))
        ran = [job for job in jobs if job.batch >= 0]
        # Each forward counts once, however many of the request's jobs it ran; the rest is queue.
        timing.forward = sum({job.batch: job.ended - job.started for job in ran}.values())
        last = max((job.ended for job in ran), default=time.perf_counter())
        timing.queue = max(0.0, last - submitted - timing.forward)

        def finish() -> list[dict[str, Any]]:
            return [
                model.expired(job.plan) if result is EXPIRED else model.finish(job.plan, result)
                for job, result in zip(jobs, results, strict=True)
            ]

        mark = time.perf_counter()
        answers = await self._maybe_offload(size, finish)
        timing.post = time.perf_counter() - mark
        meta = self._meta(request.profile, timing) if request.return_meta else None
        tokens = sum(job.tokens for job, result in zip(jobs, results, strict=True) if result is not EXPIRED)
        return envelope.response(self.served.id, answers, request.state_names, meta), tokens

    def _meta(self, profile: str, timing: Timing) -> dict[str, Any]:
        assert self.model is not None
        card = self._card
        numerics = next(entry["numerics"] for entry in card.get("profiles", PROFILES) if entry["name"] == profile)
        return {
            "revision": card.get("revision"),
            "model_sha256": card.get("model_sha256"),
            "profile": profile,
            "numerics": numerics,
            "engine": self.model.engine,
            "accelerator": card.get("accelerator", self.model.device),
            "device": card.get("device", self.model.device),
            "queue_ms": round(timing.queue * 1e3, 3),
            "compute_ms": round(timing.forward * 1e3, 3),
        }

    # -- description -----------------------------------------------------------------------------

    def card(self) -> dict[str, Any]:
        state = {"ready": self.ready, "status": self.status, "reason": self.reason}
        if self.model is None:
            return {"id": self.source.label, "object": "model", "surfaces": [], **state}
        card = dict(self._card)
        card.setdefault("profile", "exact")
        card.setdefault("profiles", PROFILES)
        card.update(state)
        if self.source.notice:
            card["notice"] = self.source.notice
        return card

    def models(self) -> dict[str, Any]:
        limits = self._card.get("limits", {})
        return {
            "object": "list",
            "api_version": API_VERSION,
            "data": [self.card()],
            "limits": {
                "max_request_bytes": self.config.max_request_bytes,
                "max_input_tokens": limits.get("max_input_tokens"),
                "max_queue": self.config.limits.max_queue,
                "max_queued_tokens": self.config.limits.max_queued_tokens,
            },
        }

    def health(self) -> dict[str, Any]:
        return {
            "api_version": API_VERSION,
            "status": self.status,
            "reason": self.reason,
            "model": self.model.id if self.model is not None else None,
        }

    def _depth(self) -> float:
        return float(self.scheduler.depth()) if self.scheduler is not None else 0.0

    def _pending(self) -> tuple[int, int]:
        return self.scheduler.pending() if self.scheduler is not None else (0, 0)
