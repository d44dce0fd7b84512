"""Admission, deadlines and the model worker thread.

Requests are planned before they reach the queue, so the queue only holds runnable plans. Admission
counts every admitted job not yet answered (queued or running) and refuses a whole group (a
request and its ``states``) or none of it: 429 ``overloaded`` once the jobs would pass
``max_queue`` or, with anything pending, their tokens ``max_queued_tokens``
(vllm-project/semantic-router:src/model-runtime/vllm_srun/scheduler/scheduler.py ``submit_group``).

Each model instance (``s1omni serve --instances N``: copies of the model on the device, as Triton's
``instance_group`` count makes them) has one worker thread that owns it: a model is not re-entrant, but
the forwards of different instances run at once (each ONNX Runtime session on its own CUDA stream), so a
GPU that one forward leaves partly idle takes another request's forward meanwhile. A worker takes the
oldest job and what may share its forward, in arrival order, within one forward's token budget and plan
count (``max_batch_tokens``, ``max_batch_plans``); what may share it is the job's profile's to say
(``s1omni.server.profiles``):

- ``exact``: the other jobs of its own group only, never another request's, at once: a forward then
  has the shapes the request has alone, and its answers never depend on the load.
- ``batching``: the queued jobs of every ``batching`` group. Before it takes them, the worker holds
  a short window (``batch_window_s``) while other requests are on their way (read, parsed,
  planned, not yet admitted: ``Arrival``, whatever their profile), so that requests arriving
  together share a forward while a lone request never waits for nobody. With several instances a
  worker takes its share of what may merge: an equal split among the idle workers, and at most an
  equal split among all instances of the work in hand (what may merge plus the jobs in the busy
  workers' forwards). On the H200 a worker that took every queued request kept the other instance to
  the few that came back meanwhile, and at 16 clients two clients got 157 answers while the 14 others
  got 20 (benchmarks/h200-0.8B-http/batching-instances2, the reference server). The idle split alone
  did not change it (benchmarks/h200-0.8B-mixers-instances2: 157 and 156 against 20): the worker that
  took the long batch found the other busy, so its share was all of them again.

The worker runs only the forward of a batch (its instance's ``model.forward``): a job's result is its
share of it, and the heads, finish and encoding of each request run after, off the worker
(``s1omni.server.families``), while the worker runs the next forward. Which instance ran a job changes
nothing in its answer: every instance is the same engine, and an ``exact`` forward has the request's
own shapes on any of them. Nothing per request that
grows with the batch is left on the worker but the runner's own packing of the batch's inputs.

A job with a deadline is answered ``EXPIRED`` when its deadline passes while it is queued, however
long the forward in flight still runs: a second thread (the deadline watcher) sleeps until the
earliest queued deadline and takes such jobs out of the queue, so the worker never sees them. A
job whose deadline passes after the worker took it, before its forward starts, is not run either.
Once its forward has started a job runs to the end. Whatever happens to the client, an admitted job
runs (or expires) and is answered, and only then leaves the counts.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from typing import Any

from s1omni.runtime.api import Plan
from s1omni.runtime.errors import RequestError

from .metrics import Metrics
from .profiles import Profile

log = logging.getLogger("s1omni.server")

EXPIRED = object()  # a job's result when its deadline passed before it ran


@dataclass(frozen=True)
class Limits:
    max_queue: int = 256
    max_queued_tokens: int = 1 << 22
    batch_window_s: float = 0.002
    max_batch_tokens: int = 65_536
    max_batch_plans: int = 32


@dataclass(eq=False)
class Job:
    """One plan on its way through the worker; ``future`` gets its result or ``EXPIRED``."""

    plan: Plan
    profile: Profile
    deadline: float | None  # time.perf_counter() after which it is not run
    future: Future[Any] = field(default_factory=Future)
    enqueued: float = 0.0
    group: int = -1  # the admitted group (a request and its states) it came in
    batch: int = -1  # the forward that ran it, and when that forward started and ended
    started: float = 0.0
    ended: float = 0.0
    taken: bool = False  # by a worker (counted in its forward until answered)

    @property
    def tokens(self) -> int:
        return self.plan.input_tokens


def _shares_forward(first: Job, job: Job) -> bool:
    """Whether ``job`` may run in the forward ``first`` leads: of its profile, and of its group unless that merges requests."""
    return job.profile == first.profile and (first.profile.merges_requests or job.group == first.group)


class Arrival:
    """A request between its first byte and its admission; closing it twice is harmless."""

    def __init__(self, arrived: Callable[[], None]):
        self._arrived = arrived
        self._open = True

    def close(self) -> None:
        if self._open:
            self._open = False
            self._arrived()


Forward = Callable[[Sequence[Plan]], list[Any]]


@dataclass(frozen=True)
class Instance:
    """One copy of the model on the device: its forward, and a profile's own forward by the profile's name
    where that profile runs on another model (``max_speed``: the instance's reduced copy)."""

    forward: Forward
    forwards: Mapping[str, Forward] = field(default_factory=dict)

    def forward_for(self, profile: Profile) -> Forward:
        return self.forwards.get(profile.name, self.forward)


class Scheduler:
    def __init__(self, instances: Sequence[Instance], limits: Limits, metrics: Metrics):
        """One worker thread per instance; a batch is of one profile, so it runs on one model of its instance."""
        if not instances:
            raise ValueError("a scheduler needs at least one model instance")
        self._instances = list(instances)
        self.limits = limits
        self._metrics = metrics
        self._queue: deque[Job] = deque()
        self._lock = threading.Condition()
        self._pending_jobs = 0
        self._pending_tokens = 0
        self._arriving = 0
        self._idle = 0  # workers in ``_take``: between forwards
        self._in_forwards = 0  # jobs taken by a worker and not yet answered
        self._closed = False
        self._batches = itertools.count()
        self._groups = itertools.count()
        self._workers = [
            threading.Thread(target=self._loop, args=(instance,), name=f"s1omni-worker-{index}", daemon=True)
            for index, instance in enumerate(self._instances)
        ]
        self._watcher = threading.Thread(target=self._watch_deadlines, name="s1omni-deadlines", daemon=True)

    @property
    def instances(self) -> int:
        return len(self._instances)

    def start(self) -> None:
        for worker in self._workers:
            worker.start()
        self._watcher.start()

    def close(self, timeout: float) -> bool:
        """Admit nothing more, let the workers answer what is queued and exit; whether they have (within ``timeout`` in all)."""
        with self._lock:
            self._closed = True
            self._lock.notify_all()
        end = time.monotonic() + timeout
        for worker in self._workers:
            worker.join(max(0.0, end - time.monotonic()))
        return not any(worker.is_alive() for worker in self._workers)

    def depth(self) -> int:
        """Jobs waiting for the worker."""
        with self._lock:
            return len(self._queue)

    def pending(self) -> tuple[int, int]:
        """Admitted jobs not yet answered, and their tokens."""
        with self._lock:
            return self._pending_jobs, self._pending_tokens

    def arrive(self) -> Arrival:
        with self._lock:
            self._arriving += 1
        return Arrival(self._arrived)

    def _arrived(self) -> None:
        with self._lock:
            self._arriving -= 1
            self._lock.notify_all()

    def submit(self, jobs: Sequence[Job], arrival: Arrival | None = None) -> None:
        """Queue a group of jobs, all or none; ``RequestError`` 429 past the limits, 503 once closed."""
        if arrival is not None:
            arrival.close()
        tokens = sum(job.tokens for job in jobs)
        now = time.perf_counter()
        with self._lock:
            if self._closed:
                raise RequestError("not_ready", "the server is shutting down")
            if self._pending_jobs + len(jobs) > self.limits.max_queue or (
                self._pending_jobs and self._pending_tokens + tokens > self.limits.max_queued_tokens
            ):
                raise RequestError("overloaded", "the request queue is full; retry later")
            group = next(self._groups)
            for job in jobs:
                job.enqueued, job.group = now, group
            self._pending_jobs += len(jobs)
            self._pending_tokens += tokens
            self._queue.extend(jobs)
            self._lock.notify_all()

    def _take(self) -> list[Job] | None:
        """The next batch, after its batching window where its profile merges requests; None once closed and empty."""
        with self._lock:
            self._idle += 1
            try:
                batch = self._take_locked()
            finally:
                self._idle -= 1
            if batch:
                self._in_forwards += len(batch)
                for job in batch:
                    job.taken = True
            return batch

    def _take_locked(self) -> list[Job] | None:
        """``_take`` under the lock."""
        limits = self.limits
        while True:
            while not self._queue and not self._closed:
                self._lock.wait()
            if not self._queue:
                self._lock.notify_all()  # the deadline watcher ends too
                return None
            oldest = self._queue[0]
            end = oldest.enqueued + limits.batch_window_s
            merges = oldest.profile.merges_requests
            while merges and not self._closed and self._arriving and len(self._queue) < limits.max_batch_plans:
                remaining = end - time.perf_counter()
                if remaining <= 0:
                    break
                self._lock.wait(remaining)
            if self._queue:  # the deadline watcher may have emptied it meanwhile
                break
        first = self._queue.popleft()
        batch, tokens, kept = [first], first.tokens, deque()
        plans = limits.max_batch_plans
        if first.profile.merges_requests and len(self._instances) > 1:
            # An equal share among the idle workers, and no more than an equal share of the work in hand (what
            # may merge and what the busy workers run) among all instances: else a worker beside a busy one
            # takes every queued request into one long forward while the other cycles on the few answered
            # meanwhile.
            mergeable = 1 + sum(_shares_forward(first, job) for job in self._queue)
            in_hand = -(-(mergeable + self._in_forwards) // len(self._instances))
            plans = min(plans, -(-mergeable // self._idle), in_hand)
        while self._queue:
            job = self._queue.popleft()
            fits = len(batch) < plans and tokens + job.tokens <= limits.max_batch_tokens
            if fits and _shares_forward(first, job):
                batch.append(job)
                tokens += job.tokens
            else:
                kept.append(job)
        self._queue = kept
        return batch

    def _watch_deadlines(self) -> None:
        """Answer ``EXPIRED`` each queued job whose deadline passes, when it passes."""
        while True:
            with self._lock:
                if self._closed and not self._queue:
                    return
                now = time.perf_counter()
                due = [job for job in self._queue if job.deadline is not None and job.deadline <= now]
                if not due:
                    upcoming = min((job.deadline for job in self._queue if job.deadline is not None), default=None)
                    self._lock.wait(None if upcoming is None else upcoming - now)
                    continue
                self._queue = deque(job for job in self._queue if job not in due)
            for job in due:
                self._expire(job)

    def _expire(self, job: Job) -> None:
        self._metrics.expired.inc()
        self._answer(job, EXPIRED)

    def _answer(self, job: Job, result: Any = None, error: BaseException | None = None) -> None:
        with self._lock:
            self._pending_jobs -= 1
            self._pending_tokens -= job.tokens
            if job.taken:
                self._in_forwards -= 1
        try:
            if error is not None:
                job.future.set_exception(error)
            else:
                job.future.set_result(result)
        except InvalidStateError:
            pass  # its waiter was cancelled (a forced shutdown); the job still counted until now

    def _loop(self, instance: Instance) -> None:
        while (batch := self._take()) is not None:
            now = time.perf_counter()
            runnable = []
            for job in batch:
                if job.deadline is not None and now > job.deadline:
                    self._expire(job)
                else:
                    runnable.append(job)
            if runnable:
                self._run(runnable, instance)

    def _run(self, jobs: list[Job], instance: Instance) -> None:
        """One forward for ``jobs`` on ``instance``; if it fails, each job again alone, so only the culprit fails."""
        started = time.perf_counter()
        try:
            results = instance.forward_for(jobs[0].profile)([job.plan for job in jobs])
            if len(results) != len(jobs):
                raise RuntimeError(f"model.forward answered {len(results)} results for {len(jobs)} plans")
        except Exception as exc:
            if len(jobs) > 1:
                for job in jobs:
                    self._run([job], instance)
                return
            log.exception("model.forward failed")
            self._answer(jobs[0], error=exc)
            return
        ended = time.perf_counter()
        batch = next(self._batches)
        groups = len({job.group for job in jobs})
        self._metrics.forward(ended - started, len(jobs), sum(job.tokens for job in jobs), groups, jobs[0].profile.name)
        for job, result in zip(jobs, results, strict=True):
            job.batch, job.started, job.ended = batch, started, ended
            self._answer(job, result)
