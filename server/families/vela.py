"""The Vela 2.0 family: the envelope with ``states`` and ``options``, per-question errors, profiles.

A request runs ``model.plan`` (on the event loop for small bodies, else on a thread), is admitted
to the scheduler as one group with its ``states`` under the profile it chose (429 ``overloaded``
past the limits, with ``Retry-After``; ``exact`` runs it in forwards of its own, ``batching`` may
merge it with concurrent requests: ``s1omni.server.profiles``), waits for its forwards and then,
on a thread of its own, runs its heads (``model.readout``) and is finished in request order
(vllm-project/semantic-router:src/model-runtime/vllm_srun/runtime.py ``Runtime._serve_parts``):
the worker is already on the next forward, and numpy lets go of the GIL in the heads' GEMMs. A
request whose heads or finish fail is answered 500 ``internal_error`` alone; the others of its
forward are not touched.
Refusals are ``{"error": {"code", "message"}}``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from starlette.concurrency import run_in_threadpool

from s1omni.runtime.api import DecisionModel, Plan
from s1omni.runtime.errors import RequestError

from .. import envelope, profiles, wire
from ..config import ServeConfig
from ..scheduler import EXPIRED, Arrival, Job, Scheduler
from ..timing import Timing
from .readout import read_and_finish

# The contract version reported to clients (vela2-decoder.md §6.5).
API_VERSION = "2.1.0"
# Bodies up to this size are planned on the event loop: cheaper than a thread hop.
INLINE_BYTES = 16 << 10
RETRY_AFTER_S = 1

T = TypeVar("T")


class Vela:
    name = "vela2"

    def __init__(self, config: ServeConfig):
        self.max_body = config.max_request_bytes
        self.limits = config.limits
        self.profiles = profiles.enabled(config.profiles)
        self._model: DecisionModel | None = None
        self._served: envelope.Served | None = None
        self._scheduler: Scheduler | None = None
        self._card: dict[str, Any] = {}

    def card(self, model: DecisionModel) -> dict[str, Any]:
        """The model's card, its ``profiles`` (the model's own: exact) with those this server enabled."""
        card = model.card()
        if profiles.BATCHING.name in self.profiles:
            card["profiles"] = [*card["profiles"], profiles.batching_entry(self.limits, profiles.packed_batching_check(model))]
        return card

    def bind(self, model: DecisionModel, card: dict[str, Any], scheduler: Scheduler) -> None:
        names = {model.id, card.get("id"), card.get("repo")}
        self._served = envelope.Served(
            id=model.id,
            names=frozenset(name for name in names if isinstance(name, str) and name),
            reads_images="image" in card.get("modalities", ("text",)),
            profiles=self.profiles,
        )
        self._model, self._card, self._scheduler = model, card, scheduler

    def read(self, raw: bytes) -> Any:
        return wire.decode(raw)

    def refusal(self, error: RequestError, status: int | None) -> tuple[int, dict[str, Any], dict[str, str]]:
        headers = {"Retry-After": str(RETRY_AFTER_S)} if error.code == "overloaded" else {}
        return status or error.status, error.body(), headers

    # -- answering -------------------------------------------------------------------------------

    async def _maybe_offload(self, size: int, work: Callable[[], T]) -> T:
        return work() if size <= INLINE_BYTES else await run_in_threadpool(work)

    def _plan(self, bodies: Sequence[dict[str, Any]], names: Sequence[str]) -> list[Plan]:
        """A request and its states; it is refused only when no question in any of them is valid."""
        assert self._model is not None
        plans = [self._model.plan(bodies[0], require_valid=False)]
        for name, body in zip(names, bodies[1:], strict=True):
            try:
                plans.append(self._model.plan(body, require_valid=False))
            except RequestError as exc:
                raise RequestError(exc.code, f"states[{name!r}]: {exc.message}") from exc
        if not any(plan.valid_count for plan in plans):
            labels = ["request", *(f"states[{name!r}]" for name in names)]
            reasons = "; ".join(f"{label}: {plan.reasons()}" for label, plan in zip(labels, plans, strict=True))
            raise RequestError("invalid_request", f"no question is valid ({reasons})")
        return plans

    async def answer(self, body: Any, size: int, timing: Timing, arrival: Arrival | None) -> tuple[dict[str, Any], int]:
        """``timing`` gets every stage up to ``post``; ``timing.started`` is when the request arrived,
        the origin of its deadline. ``arrival`` is closed when the request is admitted."""
        assert self._model is not None and self._served is not None and self._scheduler is not None
        model = self._model
        mark = time.perf_counter()
        request = envelope.read(body, self._served)
        timing.parse += time.perf_counter() - mark
        deadline = None if request.deadline_ms is None else timing.started + request.deadline_ms / 1e3

        mark = time.perf_counter()
        plans = await self._maybe_offload(size, lambda: self._plan(request.bodies, request.state_names))
        timing.tokenize = time.perf_counter() - mark

        jobs = [Job(plan, profiles.KNOWN[request.profile], deadline) for plan in plans]
        submitted = time.perf_counter()
        self._scheduler.submit(jobs, arrival)
        results = await asyncio.gather(*(asyncio.wrap_future(job.future) for job in jobs))
        ran = [job for job in jobs if job.batch >= 0]
        # Each forward counts once, however many of the request's jobs it ran; the rest is queue.
        timing.forward = sum({job.batch: job.ended - job.started for job in ran}.values())
        last = max((job.ended for job in ran), default=time.perf_counter())
        timing.queue = max(0.0, last - submitted - timing.forward)

        def finish() -> list[dict[str, Any]]:
            return [
                model.expired(job.plan) if result is EXPIRED else read_and_finish(model, job.plan, result, timing)
                for job, result in zip(jobs, results, strict=True)
            ]

        answers = await run_in_threadpool(finish)
        meta = self._meta(request.profile, timing) if request.return_meta else None
        tokens = sum(job.tokens for job, result in zip(jobs, results, strict=True) if result is not EXPIRED)
        return envelope.response(self._served.id, answers, request.state_names, meta), tokens

    def _meta(self, profile: str, timing: Timing) -> dict[str, Any]:
        assert self._model is not None
        card = self._card
        numerics = next(entry["numerics"] for entry in card["profiles"] if entry["name"] == profile)
        return {
            "revision": card.get("revision"),
            "model_sha256": card.get("model_sha256"),
            "profile": profile,
            "numerics": numerics,
            "engine": self._model.engine,
            "accelerator": card.get("accelerator", self._model.device),
            "device": card.get("device", self._model.device),
            "queue_ms": round(timing.queue * 1e3, 3),
            "compute_ms": round(timing.forward * 1e3, 3),
        }

    # -- description -----------------------------------------------------------------------------

    def health(self, status: str, reason: str | None, model: str | None) -> dict[str, Any]:
        return {"api_version": API_VERSION, "status": status, "reason": reason, "model": model}

    def live(self) -> dict[str, Any]:
        return {"api_version": API_VERSION, "status": "alive"}

    def models(self, card: dict[str, Any]) -> dict[str, Any]:
        limits = self._card.get("limits", {})
        return {
            "object": "list",
            "api_version": API_VERSION,
            "data": [card],
            "limits": {
                "max_request_bytes": self.max_body,
                "max_input_tokens": limits.get("max_input_tokens"),
                "max_queue": self.limits.max_queue,
                "max_queued_tokens": self.limits.max_queued_tokens,
            },
        }
