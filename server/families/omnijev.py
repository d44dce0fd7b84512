"""The OmniJev family: wire-contract.md §11 over the shared app and scheduler.

A body is read against 12 MiB (413) and parsed strictly (400) before admission, so both come back
even while the worker is busy. Admission then counts the request until its work ends, whether or
not its client is still there: past 16 admitted (preparing, waiting or running) it is 503
"the worker is busy" with ``Retry-After: 1``. Two requests at most prepare at once (``model.plan``:
contract, decode, preprocess, tokenize, layout) on worker threads; a refusal there is 422. The
scheduler then runs one request's forward at a time in arrival order (``model.forward``: vision and
backbone), and its heads (``model.readout``) and ``model.finish`` run on a worker thread, beside the
next request's forward.
An execution error is 500 "inference failed"; what failed goes to the log only
(``ThinkFlowLab/system1-omni:src/models/omnijev/native/src/main.rs``; omnijev.md §14.2).
Every refusal is ``{"detail": ...}``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import anyio
import anyio.to_thread

from s1omni.runtime.errors import RequestError
from s1omni.runtime.omnijev import contract, layout

from ..metrics import Metrics
from ..profiles import EXACT
from ..scheduler import Arrival, Job, Limits, Scheduler
from ..timing import Timing
from .readout import read_and_finish

if TYPE_CHECKING:
    from s1omni.runtime.omnijev.model import OmniJevModel

log = logging.getLogger("s1omni.server")

ADMITTED = 16
PREPARING = 2
FAILED = "inference failed"
RETRY_AFTER = {"Retry-After": "1"}
# The scheduler only orders the admitted: one request per model.forward, never refused there.
LIMITS = Limits(
    max_queue=ADMITTED,
    max_queued_tokens=ADMITTED * layout.MAX_PROCESSED,
    batch_window_s=0.0,
    max_batch_plans=1,
)


class Admission:
    """Requests admitted and not yet answered; used from the event loop only, so a plain count."""

    def __init__(self, limit: int):
        self.limit = limit
        self.count = 0

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        if self.count >= self.limit:
            raise contract.ContractError(503, contract.BUSY)
        self.count += 1
        try:
            yield
        finally:
            self.count -= 1


class OmniJev:
    name = "omnijev"
    max_body = contract.MAX_BODY
    limits = LIMITS

    def __init__(self, metrics: Metrics):
        self.admission = Admission(ADMITTED)
        self.preparing = anyio.CapacityLimiter(PREPARING)
        self._model: OmniJevModel | None = None
        self._scheduler: Scheduler | None = None
        described = "Requests preparing, waiting or running (at most 16)."
        metrics.gauge("s1omni_admitted_requests", described, lambda: self.admission.count)

    def card(self, model: OmniJevModel) -> dict[str, Any]:
        return model.card()

    def bind(self, model: OmniJevModel, card: dict[str, Any], scheduler: Scheduler) -> None:
        self._model, self._scheduler = model, scheduler

    def read(self, raw: bytes) -> dict[str, Any]:
        return contract.parse_strict(raw)

    def refusal(self, error: RequestError, status: int | None) -> tuple[int, dict[str, Any], dict[str, str]]:
        status = status or error.status
        if status == 500:
            log.error("answered 500 %r for: %s", FAILED, error.message)  # the client never sees why
            return status, {"detail": FAILED}, {}
        return status, {"detail": error.message}, RETRY_AFTER if status == 503 else {}

    async def answer(self, body: Any, size: int, timing: Timing, arrival: Arrival | None) -> tuple[dict[str, Any], int]:
        assert self._model is not None and self._scheduler is not None
        model = self._model
        # Starlette does not cancel a handler whose client left, so the hold lasts until the work ends.
        with self.admission.hold():
            admitted = time.perf_counter()
            plan = await anyio.to_thread.run_sync(model.plan, body, limiter=self.preparing)
            timing.tokenize = plan.preparation_seconds
            job = Job(plan, EXACT, None)
            submitted = time.perf_counter()
            self._scheduler.submit([job], arrival)
            result = await asyncio.wrap_future(job.future)
            # Waiting for a preparing slot and for the worker are both queueing.
            timing.queue = (submitted - admitted - plan.preparation_seconds) + (job.started - submitted)
            timing.forward = job.ended - job.started
            content = await anyio.to_thread.run_sync(read_and_finish, model, plan, result, timing)
        return content, plan.input_tokens

    def health(self, status: str, reason: str | None, model: str | None) -> dict[str, Any]:
        if status == "ready":
            return {"status": status, "model": model}
        return {"status": status, "model": model, "detail": reason}

    def live(self) -> dict[str, Any]:
        return {"status": "alive"}

    def models(self, card: dict[str, Any]) -> dict[str, Any]:
        limits = {"max_request_bytes": self.max_body, "max_admitted": ADMITTED, "max_preparing": PREPARING}
        return {"object": "list", "data": [card], "limits": limits}
