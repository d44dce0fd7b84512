"""The tracing workers an export starts before it needs them (``s1omni.export.workers``)."""

from __future__ import annotations

import multiprocessing
import os
import sys
import time
from pathlib import Path

import pytest

from s1omni.export import workers


def _exporter_imported() -> bool:
    return workers.EXPORTER in sys.modules


ONE_CORE = pytest.mark.skipif(workers.worker_count(2) == 0, reason="one core: the export traces in its own process")


@pytest.mark.parametrize(("cores", "jobs", "count"), [(1, 4, 0), (2, 4, 1), (2, 2, 1), (2, 1, 1), (4, 4, 3), (16, 4, 4)])
def test_this_process_takes_a_core_of_its_own_where_the_jobs_are_as_many(monkeypatch: pytest.MonkeyPatch, cores: int, jobs: int, count: int) -> None:
    monkeypatch.setattr(workers.os, "sched_getaffinity", lambda _: set(range(cores)))
    assert workers.worker_count(jobs) == count


@ONE_CORE
def test_started_workers_trace_with_the_exporter_imported_and_stop_after() -> None:
    with workers.started(2):
        with workers.workers(2) as taken:
            assert taken is not None and taken.submit(_exporter_imported).result()  # imported before any task
        with pytest.raises(RuntimeError):  # stopped with its block: it holds no memory after the tracing
            taken.submit(_exporter_imported)


@ONE_CORE
def test_workers_no_export_took_are_killed_at_once() -> None:
    """A package that fails verification stops the workers started for it then and there: killed, not
    left to finish importing the exporter (seconds), which would keep the failed export from exiting."""
    before = set(multiprocessing.active_children())
    with pytest.raises(RuntimeError, match="verification failed"), workers.started(2):
        spawned = set(multiprocessing.active_children()) - before
        raise RuntimeError("verification failed")
    assert len(spawned) == workers.worker_count(2)
    deadline = time.monotonic() + 2.0  # well under the workers' imports on any machine
    while any(process.is_alive() for process in spawned) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(process.is_alive() for process in spawned)


def _run(job: tuple[Path, str, float]) -> int:
    """Record the job's name, wait its seconds (or fail, given a negative number); the process it ran in."""
    log, name, seconds = job
    with log.open("a", encoding="utf-8") as records:
        records.write(f"{name}\n")
    if seconds < 0:
        raise ValueError(f"{name} failed")
    time.sleep(seconds)
    return os.getpid()


@pytest.fixture
def three_cores(monkeypatch: pytest.MonkeyPatch) -> int:
    """Three cores as far as ``worker_count`` knows (whatever this machine has): two workers for three or more jobs."""
    monkeypatch.setattr(workers.os, "sched_getaffinity", lambda _: {0, 1, 2})
    return 2


def _meet(job: tuple[Path, str, Path, int]) -> int:
    """Record the job's name in the log and in ``meeting``, then wait until ``meeting`` holds ``count``
    names: jobs meeting this way run side by side, each in a process of its own, however long the
    workers take to start. The process it ran in."""
    log, name, meeting, count = job
    for path in (log, meeting):
        with path.open("a", encoding="utf-8") as records:
            records.write(f"{name}\n")
    deadline = time.monotonic() + 120.0  # a spawned worker's imports on a loaded 2-core machine: seconds
    while len(meeting.read_text(encoding="utf-8").splitlines()) < count:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{name}: the other jobs never started beside it")
        time.sleep(0.01)
    return os.getpid()


def test_jobs_are_shared_between_the_workers_and_this_process(three_cores: int, tmp_path: Path) -> None:
    """The first jobs go to the workers at once, ``meanwhile`` runs here, and where the workers are fewer
    than the jobs, this process takes the rest: the workers are still busy with theirs, which wait for
    each other (a worker that ran both one after the other would wait forever)."""
    log, jobs = tmp_path / "log", 5
    on_workers = [(log, f"job {i}", tmp_path / "meeting", three_cores) for i in range(three_cores)]
    here = [(log, f"job {i}", tmp_path / f"alone {i}", 0) for i in range(three_cores, jobs)]
    found, meanwhile = workers.share(_meet, on_workers + here, lambda: "meanwhile")
    assert meanwhile == "meanwhile"
    assert sorted(log.read_text(encoding="utf-8").split("\n")[:-1]) == [f"job {i}" for i in range(jobs)]  # each once
    assert os.getpid() not in found[:three_cores] and len(set(found[:three_cores])) == three_cores  # one on each worker
    assert found[three_cores:] == [os.getpid()] * (jobs - three_cores)


def test_a_failed_job_stops_the_jobs_not_taken_yet(three_cores: int, tmp_path: Path) -> None:
    log = tmp_path / "log"
    jobs = [(log, f"worker {i}", 1.0) for i in range(three_cores)] + [(log, "fails here", -1.0)] + [(log, "never run", 0.0)] * 3
    with pytest.raises(ValueError, match="fails here"):
        workers.share(_run, jobs, lambda: None)
    assert "never run" not in log.read_text(encoding="utf-8")
