"""The served model: loading, warm-up, readiness and draining; its family answers the requests.

The model loads on a background thread so that ``/health`` answers at once (503 while it loads).
It becomes ready only after its golden request (``model.golden_request()``) has been answered
through the very path a client's request takes (its family's reading, admission, plan,
scheduler, heads, finish, encoding) with no question failing
(vllm-project/semantic-router:src/model-runtime/vllm_srun/runtime.py ``ServedModel.load``;
wire-contract.md §11.7). A load or warm-up that fails leaves the service ``failed`` for good, with the
error kept in ``failure``: ``/health/live`` then answers 503 and ``s1omni serve`` stops and exits
with that error's code (``s1omni.server.process``). The family of the package picks the rules
(``s1omni.server.families``) before it loads, so that a request refused while it loads is refused in that family's form too; the
loaded model must be of that family.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from s1omni.runtime.api import DecisionModel
from s1omni.runtime.errors import GateMissed, InputError, RequestError, S1omniError, UsageError
from s1omni.runtime.reduced_copy import ReducedCopy

from . import wire
from .config import ServeConfig
from .families import Family, family_for
from .metrics import Metrics
from .profiles import BATCHING, MAX_SPEED, SHARED_CONTEXT, max_speed_entry, packed_batching_check, shared_context_entry
from .scheduler import Arrival, Instance, Scheduler
from .timing import Timing

log = logging.getLogger("s1omni.server")


@dataclass(frozen=True)
class ModelSource:
    """What to serve: a name to show before it loads, its family, how to load it, a notice for its card, and
    how to load the reduced copy ``max_speed`` runs on (``s1omni.runtime.reduced_copy``), where it is enabled."""

    label: str
    load: Callable[[], DecisionModel]
    notice: str | None = None
    family: str = "vela2"
    reduced_copy: Callable[[], ReducedCopy] | None = None


class Service:
    def __init__(self, config: ServeConfig, source: ModelSource):
        self.config = config
        self.source = source
        self.metrics = Metrics()
        self.family: Family = family_for(source.family, config, self.metrics)
        self.status, self.reason = "starting", "the server is starting"
        self.model: DecisionModel | None = None
        self.failure: Exception | None = None  # why the load or warm-up failed
        self.scheduler: Scheduler | None = None
        self._card: dict[str, Any] = {}
        self.inflight = 0  # decisions handlers between their first byte and their answer
        self.draining = False
        # Why the server is not healthy although its own model is ready, None when nothing keeps it:
        # a Ray Serve replica speaks for every replica of its deployment (server.ray_serve).
        self.peers: Callable[[], str | None] = lambda: None
        self.metrics.gauge("s1omni_ready", "1 once the warm-up request was answered.", lambda: float(self.ready))
        self.metrics.gauge("s1omni_requests_in_flight", "Decision requests between arrival and answer.", lambda: self.inflight)
        self.metrics.gauge("s1omni_queue_depth", "Jobs waiting for the model worker.", self._depth)
        self.metrics.gauge("s1omni_pending_jobs", "Admitted jobs not yet answered.", lambda: self._pending()[0])
        self.metrics.gauge("s1omni_pending_tokens", "Tokens of admitted jobs not yet answered.", lambda: self._pending()[1])

    # -- lifecycle -------------------------------------------------------------------------------

    @property
    def ready(self) -> bool:
        return self.status == "ready"

    @property
    def alive(self) -> bool:
        """False once the load or warm-up failed: the process has nothing left to serve."""
        return self.failure is None

    @property
    def healthy(self) -> bool:
        """What ``/health`` says: ready, and nothing it speaks for (``peers``) is not."""
        return self.ready and self.peers() is None

    def _set(self, status: str, reason: str | None = None) -> None:
        self.status, self.reason = status, reason

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Load and warm up on a daemon thread, so that a stop never waits for a load."""
        threading.Thread(target=self._load, args=(loop,), name="s1omni-load", daemon=True).start()

    def _load(self, loop: asyncio.AbstractEventLoop) -> None:
        try:
            self._set("loading", f"loading {self.source.label}")
            started = time.perf_counter()
            if (MAX_SPEED.name in self.config.profiles) != (self.source.reduced_copy is not None):
                raise UsageError("max_speed runs on a reduced copy: enable it with one (--profiles max_speed --reduced-copy COPY), and a copy with it")
            instances = [self._instance() for _ in range(self.config.instances)]
            model = instances[0][0]  # plans, heads and finish run on the first; forwards on each worker's own
            card = self.family.card(model)
            copy = instances[0][1]
            if SHARED_CONTEXT.name in self.config.profiles:
                card["profiles"] = [*card["profiles"], shared_context_entry(model.packed_check)]
            if BATCHING.name in self.config.profiles:
                packed = packed_batching_check(model)
                log.info("batching merges requests %s", "in packed rows (its merged packed check passed)" if packed else
                         "in exact's layout (packed rows need a passed `s1omni validate ENG --merged N --shared-context`)")  # fmt: skip
            if copy is not None:
                card["profiles"] = [*card["profiles"], max_speed_entry(self.family.limits, copy.card())]
                log.info("max_speed on the reduced copy %s (consent: %s)", copy.path, copy.card()["consent"])
            self._warm_forwards([instance for instance, _ in instances])
            self.scheduler = Scheduler([self._forwards(*instance) for instance in instances], self.family.limits, self.metrics)
            self.scheduler.start()
            self.family.bind(model, card, self.scheduler)
            self._card = card
            self.model = model
            log.info("loaded %s (%s on %s, %d instance%s) in %.1f s", model.id, model.engine, model.device,
                     len(instances), "" if len(instances) == 1 else "s", time.perf_counter() - started)  # fmt: skip
            self._set("warming", "answering the golden request")
            asyncio.run_coroutine_threadsafe(self._warm_up(), loop).result()
            self._set("ready")
            log.info("ready: %s", model.id)
        except Exception as exc:
            self._set("failed", f"{type(exc).__name__}: {exc}")
            self.failure = exc
            # A refusal of ours says why in one line; a bug (one the golden request ran into too) keeps its traceback.
            cause = exc.__cause__
            ran_into = isinstance(exc, GateMissed) and cause is not None and not isinstance(cause, (S1omniError, RequestError))
            bug = not isinstance(exc, S1omniError) or ran_into
            log.error("%s cannot be served: %s", self.source.label, exc, exc_info=bug)

    def _packed_profiles(self, model: DecisionModel) -> list[str]:
        """The enabled profiles whose forwards run ``model``'s packed graph: ``shared_context``, and ``batching`` on an
        engine whose merged packed forwards passed their check (``packed_batching_check``)."""
        packed = [SHARED_CONTEXT.name] if SHARED_CONTEXT.name in self.config.profiles else []
        if BATCHING.name in self.config.profiles and packed_batching_check(model) is not None:
            packed.append(BATCHING.name)
        return packed

    def _warm_forwards(self, models: list[DecisionModel]) -> None:
        """The golden request's forwards, before any request: on each further copy of the model (the golden
        request then warms the first one's, answered as a client's), and the packed forward of each where a
        profile runs it (``_packed_profiles``), so that sessions start and CUDA graphs of its shapes are captured."""
        packed = self._packed_profiles(models[0])
        if len(models) == 1 and not packed:
            return
        golden = models[0].plan(models[0].golden_request())
        for index, model in enumerate(models):
            if index:
                model.forward([golden])
            if packed:
                model.forward_packed([golden])
        log.info("warmed the golden request's forwards on %d instance%s%s", len(models), "" if len(models) == 1 else "s",
                 f", packed ({' and '.join(packed)}) too" if packed else "")  # fmt: skip

    def _instance(self) -> tuple[DecisionModel, ReducedCopy | None]:
        """One copy of the model (and of its reduced copy, where ``max_speed`` is enabled) on the device."""
        model = self.source.load()
        if model.family != self.family.name:
            raise InputError(f"{self.source.label} loaded as a {model.family} model, not {self.family.name}")
        if SHARED_CONTEXT.name in self.config.profiles:
            check = getattr(model, "packed_check", None)
            if not (check and check.get("passed")):
                verdict = "its verdict is a miss" if check else "it has no verdict: run that check first"
                raise GateMissed(f"shared_context serves an engine whose packed forwards passed `s1omni validate ENG --shared-context`; "
                                 f"{self.source.label}: {verdict}")  # fmt: skip
        if self._packed_profiles(model):
            model.open_shared_context()
        copy = self.source.reduced_copy() if self.source.reduced_copy is not None else None  # GateMissed unless its consent stands
        return model, copy

    def _forwards(self, model: DecisionModel, copy: ReducedCopy | None) -> Instance:
        """The instance's forward per profile: exact's ``forward``, the packed one of the profiles that pack
        (``_packed_profiles``), max_speed's copy's; batching's is exact's where it does not pack."""
        forwards = {MAX_SPEED.name: copy.model.forward} if copy is not None else {}
        forwards.update({name: model.forward_packed for name in self._packed_profiles(model)})
        return Instance(model.forward, forwards)

    async def _warm_up(self) -> None:
        """The golden request, answered as a client's would be; however it fails, the model missed a gate."""
        assert self.model is not None
        timing = Timing()
        try:
            raw = wire.encode(self.model.golden_request())
            content, _ = await self.family.answer(self.family.read(raw), len(raw), timing, None)
            wire.encode(content)
        except Exception as exc:
            raise GateMissed(f"the golden request failed: {exc}") from exc
        failed = {key: answer for key, answer in content["answers"].items() if "error" in answer}
        if failed:
            raise GateMissed(f"the golden request failed: its questions answered {failed}")
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

    # -- description -----------------------------------------------------------------------------

    def card(self) -> dict[str, Any]:
        state = {"ready": self.ready, "status": self.status, "reason": self.reason}
        if self.model is None:
            return {"id": self.source.label, "object": "model", "surfaces": [], **state}
        card = {**self._card, **state}
        if self.source.notice:
            card["notice"] = self.source.notice
        return card

    def models(self) -> dict[str, Any]:
        return self.family.models(self.card())

    def health(self) -> dict[str, Any]:
        status, reason = self.status, self.reason
        if self.ready and (waiting := self.peers()) is not None:
            status, reason = "degraded", waiting
        return self.family.health(status, reason, self.model.id if self.model is not None else None)

    def _depth(self) -> float:
        return float(self.scheduler.depth()) if self.scheduler is not None else 0.0

    def _pending(self) -> tuple[int, int]:
        return self.scheduler.pending() if self.scheduler is not None else (0, 0)
