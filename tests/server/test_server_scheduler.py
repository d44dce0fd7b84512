"""The scheduler's own rules, deterministically, in-process, with the real tiny model's plans.

An open ``Arrival`` holds the worker in its batching window (here 30 s), so jobs stay queued for as
long as a test needs them there; closing it lets the worker run them.
"""

from __future__ import annotations

import time
from concurrent.futures import Future
from typing import Any

import pytest

from s1omni.runtime.errors import RequestError
from s1omni.server.metrics import Metrics
from s1omni.server.scheduler import EXPIRED, Job, Limits, Scheduler

QUESTIONS = {"refund": {"type": "noul", "instructions": "A refund?"}}
WINDOW_S = 30.0


def plan(model: Any, text: str = "Please refund the duplicate charge.") -> Any:
    return model.plan({"state": text, "questions": QUESTIONS})


def scheduler(model: Any, **limits: Any) -> Scheduler:
    running = Scheduler(model.forward, Limits(batch_window_s=WINDOW_S, **limits), Metrics())
    running.start()
    return running


def result(future: Future[Any]) -> Any:
    return future.result(timeout=120)


def test_jobs_waiting_together_share_one_forward(tiny_model: Any) -> None:
    running = scheduler(tiny_model)
    arrival = running.arrive()
    jobs = [Job(plan(tiny_model, text), "exact", None) for text in ("One refund.", "Two refunds, please.")]
    running.submit(jobs[:1])
    running.submit(jobs[1:])
    assert running.depth() == 2  # held: a request is still on its way
    arrival.close()
    outputs = [result(job.future) for job in jobs]
    assert jobs[0].batch == jobs[1].batch >= 0
    for job, output in zip(jobs, outputs, strict=True):
        assert tiny_model.finish(job.plan, tiny_model.readout(job.plan, output))["answers"]["refund"]["type"] == "noul"
    assert running.pending() == (0, 0)
    assert running.close(10)


def test_admission_counts_jobs_and_tokens_until_they_are_answered(tiny_model: Any) -> None:
    tokens = plan(tiny_model).input_tokens
    running = scheduler(tiny_model, max_queue=3, max_queued_tokens=3 * tokens)
    arrival = running.arrive()
    running.submit([Job(plan(tiny_model), "exact", None)])
    with pytest.raises(RequestError) as refused:
        running.submit([Job(plan(tiny_model), "exact", None) for _ in range(3)])  # 1 + 3 jobs > 3: none admitted
    assert refused.value.code == "overloaded" and running.pending() == (1, tokens)
    running.submit([Job(plan(tiny_model), "exact", None)])
    with pytest.raises(RequestError):
        running.submit([Job(plan(tiny_model, "A much longer request about a refund " * 3), "exact", None)])  # tokens
    assert running.pending() == (2, 2 * tokens)
    arrival.close()
    assert running.close(120) and running.pending() == (0, 0)
    with pytest.raises(RequestError) as closed:
        running.submit([Job(plan(tiny_model), "exact", None)])
    assert closed.value.code == "not_ready"


def test_a_job_past_its_deadline_is_not_run(tiny_model: Any) -> None:
    running = scheduler(tiny_model)
    in_time = Job(plan(tiny_model), "exact", time.perf_counter() + 10)
    running.submit([in_time], running.arrive())  # no window: nobody else is on the way
    assert result(in_time.future) is not EXPIRED
    arrival = running.arrive()  # holds the worker in its window, as a forward in flight would
    expired = Job(plan(tiny_model), "exact", time.perf_counter() + 0.05)
    running.submit([expired])
    # Answered when its deadline passes, while the worker still waits: not when the worker gets to it.
    assert expired.future.result(timeout=5) is EXPIRED and expired.batch == -1
    assert running.depth() == 0 and running.pending() == (0, 0)
    arrival.close()
    assert running.close(10)


def test_a_plan_that_breaks_the_forward_fails_alone(tiny_model: Any) -> None:
    running = scheduler(tiny_model)
    arrival = running.arrive()
    good, bad = Job(plan(tiny_model), "exact", None), Job(plan(tiny_model), "exact", None)
    bad.plan.trees = [(None, [])]  # not a tree: the runner raises on it
    running.submit([good, bad])
    arrival.close()
    assert tiny_model.finish(good.plan, tiny_model.readout(good.plan, result(good.future)))["answers"]["refund"]["type"] == "noul"
    with pytest.raises(Exception):
        result(bad.future)
    assert running.pending() == (0, 0)
    assert running.close(10)
