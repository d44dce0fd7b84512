"""The scheduler's own rules, deterministically, in-process, with the real tiny model's plans.

An open ``Arrival`` holds the worker in a ``batching`` job's window (here 30 s), so jobs stay queued
for as long as a test needs them there; closing it lets the worker run them. An ``exact`` job never
waits for a window: a forward held on an event keeps the worker busy instead.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

import pytest
from serving import metric

from s1omni.runtime.errors import RequestError
from s1omni.server.metrics import Metrics
from s1omni.server.profiles import BATCHING, EXACT
from s1omni.server.scheduler import EXPIRED, Instance, Job, Limits, Scheduler

QUESTIONS = {"refund": {"type": "noul", "instructions": "A refund?"}}
WINDOW_S = 30.0


def plan(model: Any, text: str = "Please refund the duplicate charge.") -> Any:
    return model.plan({"state": text, "questions": QUESTIONS})


def scheduler(model: Any, metrics: Metrics | None = None, forward: Any = None, **limits: Any) -> Scheduler:
    running = Scheduler([Instance(forward or model.forward)], Limits(batch_window_s=WINDOW_S, **limits), metrics or Metrics())
    running.start()
    return running


def answered(model: Any, job: Job) -> str:
    return model.finish(job.plan, model.readout(job.plan, result(job.future)))["answers"]["refund"]["type"]


def held_first_forward(model: Any) -> tuple[threading.Event, threading.Event, Callable[[Sequence[Any]], list[Any]]]:
    """A forward of ``model`` whose first call sets ``busy`` and waits for ``release``; later calls run at once."""
    busy, release = threading.Event(), threading.Event()

    def held(plans: Sequence[Any]) -> list[Any]:
        if not busy.is_set():
            busy.set()
            assert release.wait(60)
        return model.forward(plans)

    return busy, release, held


def result(future: Future[Any]) -> Any:
    return future.result(timeout=120)


def test_batching_jobs_waiting_together_share_one_forward(tiny_model: Any) -> None:
    metrics = Metrics()
    running = scheduler(tiny_model, metrics)
    arrival = running.arrive()
    jobs = [Job(plan(tiny_model, text), BATCHING, None) for text in ("One refund.", "Two refunds, please.")]
    running.submit(jobs[:1])
    running.submit(jobs[1:])
    assert running.depth() == 2  # held: a request is still on its way
    arrival.close()
    assert [answered(tiny_model, job) for job in jobs] == ["noul", "noul"]
    assert jobs[0].batch == jobs[1].batch >= 0
    text = metrics.render()[0].decode()
    assert metric(text, "s1omni_batch_requests_sum", profile="batching") == 2
    assert metric(text, "s1omni_batch_requests_count", profile="batching") == 1
    assert running.pending() == (0, 0)
    assert running.close(10)


def test_exact_jobs_share_a_forward_with_their_own_states_only(tiny_model: Any) -> None:
    """Three requests queued together behind a forward in flight (the second with a state of its own)
    and a batching one: each exact request gets forwards of its own, at once, whatever the window."""
    busy, release, held = held_first_forward(tiny_model)
    metrics = Metrics()
    running = scheduler(tiny_model, metrics, held)
    arrival = running.arrive()  # open the whole time: an exact job does not wait for it
    ahead = Job(plan(tiny_model), EXACT, None)
    running.submit([ahead])
    assert busy.wait(60)
    first = Job(plan(tiny_model, "One refund."), EXACT, None)
    second = [Job(plan(tiny_model, text), EXACT, None) for text in ("Two refunds, please.", "And a third.")]
    third = Job(plan(tiny_model, "Refund the fourth."), EXACT, None)
    merging = Job(plan(tiny_model, "Batch me."), BATCHING, None)
    for group in ([first], second, [third], [merging]):
        running.submit(group)
    release.set()
    exact = [ahead, first, *second, third]
    assert [answered(tiny_model, job) for job in exact] == ["noul"] * 5
    assert len({ahead.batch, first.batch, second[0].batch, third.batch}) == 4
    assert second[0].batch == second[1].batch  # a request's states share its forward
    text = metrics.render()[0].decode()
    assert metric(text, "s1omni_batch_requests_sum", profile="exact") == metric(text, "s1omni_batch_requests_count", profile="exact") == 4
    arrival.close()
    assert answered(tiny_model, merging) == "noul" and merging.batch not in {job.batch for job in exact}
    assert running.pending() == (0, 0)
    assert running.close(10)


def test_each_instance_runs_its_own_forward_at_the_same_time(tiny_model: Any) -> None:
    """Two instances: two exact requests queued together run on both workers at once (a barrier that only
    two forwards in flight together pass), and each answers as on one instance."""
    both = threading.Barrier(2, timeout=60)
    ran: list[tuple[str, int]] = []

    def instance(index: int) -> Instance:
        def forward(plans: Sequence[Any]) -> list[Any]:
            both.wait()  # BrokenBarrierError (the job fails) unless the other worker is in a forward too
            ran.append((threading.current_thread().name, index))
            return tiny_model.forward(plans)

        return Instance(forward)

    running = Scheduler([instance(0), instance(1)], Limits(batch_window_s=WINDOW_S), Metrics())
    running.start()
    assert running.instances == 2
    jobs = [Job(plan(tiny_model, text), EXACT, None) for text in ("One refund.", "Two refunds, please.")]
    for job in jobs:
        running.submit([job])
    assert [answered(tiny_model, job) for job in jobs] == ["noul", "noul"]
    assert sorted(ran) == [("s1omni-worker-0", 0), ("s1omni-worker-1", 1)]
    def finished(job: Job, forwarded: Any) -> Any:
        return tiny_model.finish(job.plan, tiny_model.readout(job.plan, forwarded))

    assert [finished(job, result(job.future)) for job in jobs] == [finished(job, tiny_model.forward([job.plan])[0]) for job in jobs]
    assert running.close(10)


def test_idle_instances_share_what_may_merge(tiny_model: Any) -> None:
    """Eight batching requests queued while two workers wait: each takes four, not one of them all eight."""
    running = Scheduler([Instance(tiny_model.forward), Instance(tiny_model.forward)], Limits(batch_window_s=WINDOW_S), Metrics())
    running.start()
    arrival = running.arrive()
    jobs = [Job(plan(tiny_model, f"Refund number {index}."), BATCHING, None) for index in range(8)]
    for job in jobs:
        running.submit([job])
    arrival.close()
    assert [answered(tiny_model, job) for job in jobs] == ["noul"] * 8
    sizes = sorted(sum(job.batch == batch for job in jobs) for batch in {job.batch for job in jobs})
    assert sizes == [4, 4]
    assert running.close(10)


def test_a_worker_beside_a_busy_one_takes_only_its_share(tiny_model: Any) -> None:
    """Seven batching requests queued while the other worker is held in a forward of one: the idle worker
    takes four (half the eight jobs in hand), not all seven, then half of what is left each time, so that
    none of them waits for the held worker either."""
    busy, release, held = held_first_forward(tiny_model)
    running = Scheduler([Instance(held), Instance(held)], Limits(batch_window_s=WINDOW_S), Metrics())
    running.start()
    ahead = Job(plan(tiny_model), EXACT, None)
    running.submit([ahead])
    assert busy.wait(60)
    jobs = [Job(plan(tiny_model, f"Refund number {index}."), BATCHING, None) for index in range(7)]
    running.submit(jobs)  # one group: all seven queued at once
    assert [answered(tiny_model, job) for job in jobs] == ["noul"] * 7  # the other worker still held
    sizes = [sum(job.batch == batch for job in jobs) for batch in sorted({job.batch for job in jobs})]
    assert sizes == [4, 2, 1] and not ahead.future.done()
    release.set()
    assert answered(tiny_model, ahead) == "noul"
    assert running.pending() == (0, 0) and running.close(10)


def test_a_scheduler_needs_an_instance() -> None:
    with pytest.raises(ValueError, match="at least one"):
        Scheduler([], Limits(), Metrics())


def test_admission_counts_jobs_and_tokens_until_they_are_answered(tiny_model: Any) -> None:
    tokens = plan(tiny_model).input_tokens
    running = scheduler(tiny_model, max_queue=3, max_queued_tokens=3 * tokens)
    arrival = running.arrive()
    running.submit([Job(plan(tiny_model), BATCHING, None)])
    with pytest.raises(RequestError) as refused:
        running.submit([Job(plan(tiny_model), BATCHING, None) for _ in range(3)])  # 1 + 3 jobs > 3: none admitted
    assert refused.value.code == "overloaded" and running.pending() == (1, tokens)
    running.submit([Job(plan(tiny_model), BATCHING, None)])
    with pytest.raises(RequestError):
        running.submit([Job(plan(tiny_model, "A much longer request about a refund " * 3), BATCHING, None)])  # tokens
    assert running.pending() == (2, 2 * tokens)
    arrival.close()
    assert running.close(120) and running.pending() == (0, 0)
    with pytest.raises(RequestError) as closed:
        running.submit([Job(plan(tiny_model), BATCHING, None)])
    assert closed.value.code == "not_ready"


def test_a_job_past_its_deadline_is_not_run(tiny_model: Any) -> None:
    running = scheduler(tiny_model)
    in_time = Job(plan(tiny_model), BATCHING, time.perf_counter() + 10)
    running.submit([in_time], running.arrive())  # no window: nobody else is on the way
    assert result(in_time.future) is not EXPIRED
    arrival = running.arrive()  # holds the worker in its window, as a forward in flight would
    expired = Job(plan(tiny_model), BATCHING, time.perf_counter() + 0.05)
    running.submit([expired])
    # Answered when its deadline passes, while the worker still waits: not when the worker gets to it.
    assert expired.future.result(timeout=5) is EXPIRED and expired.batch == -1
    assert running.depth() == 0 and running.pending() == (0, 0)
    arrival.close()
    assert running.close(10)


def test_a_plan_that_breaks_the_forward_fails_alone(tiny_model: Any) -> None:
    running = scheduler(tiny_model)
    good, bad = Job(plan(tiny_model), EXACT, None), Job(plan(tiny_model), EXACT, None)
    bad.plan.trees = [(None, [])]  # not a tree: the runner raises on it
    running.submit([good, bad])  # one group: one forward
    assert tiny_model.finish(good.plan, tiny_model.readout(good.plan, result(good.future)))["answers"]["refund"]["type"] == "noul"
    with pytest.raises(Exception):
        result(bad.future)
    assert running.pending() == (0, 0)
    assert running.close(10)
