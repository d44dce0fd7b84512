"""The worker processes the backbone's graphs are traced in (``s1omni.export.onnx_export.build_graphs``),
started before they are needed.

A spawned worker spends seconds importing torch, transformers and the exporter before it traces
anything (11 s on the H200 host, where the 4B's verification takes 2.7 s). ``started`` spawns them as
the export begins, before the package is verified and before this process has imported any of those
itself (this module imports none of them), so the workers' imports run beside the verification and
the parent's own imports rather than after them; a package that fails verification stops them at
once (``_stop_now``: they are killed, not waited for). ``workers`` hands them to the tracing (or
spawns its own where none were started) and stops them once the graphs are traced, so they hold no
memory while the weights are written and checked.

Where the cores are no more than the graphs, this process traces too (``share``), on the core a
worker would have taken: one import of torch, transformers and the exporter fewer (3.3 s of CPU on a
2-core machine, where an export's four graphs take 42 s), and each graph goes to whichever process is
free first, so the longer ones given first end side by side.
"""

from __future__ import annotations

import gc
import importlib
import multiprocessing
import os
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from contextlib import contextmanager
from functools import partial
from typing import TypeVar

Job = TypeVar("Job")
Result = TypeVar("Result")
T = TypeVar("T")

EXPORTER = "s1omni.export.onnx_export"
# The pools ``started`` and not yet taken by ``workers``, with their sizes.
_pools: list[tuple[ProcessPoolExecutor, int]] = []


def worker_count(jobs: int) -> int:
    """One worker per job where this process may run on more cores than there are jobs; else one per
    core but one, which this process traces on (``share``)."""
    cores = len(os.sched_getaffinity(0))
    return jobs if jobs < cores else cores - 1


def _import_exporter() -> None:
    importlib.import_module(EXPORTER)
    # What was imported lives as long as the worker: kept out of the collector's passes, which would
    # otherwise walk torch's and transformers' objects on every full collection while tracing, and
    # once more when the worker exits.
    gc.freeze()


def _spawned(count: int) -> ProcessPoolExecutor:
    # Spawned, not forked: the parent may already run torch's and ONNX Runtime's threads.
    pool = ProcessPoolExecutor(count, mp_context=multiprocessing.get_context("spawn"), initializer=_import_exporter)
    for _ in range(count):  # a pool spawns a worker per task submitted while none is idle: every one, now
        pool.submit(os.getpid)
    return pool


@contextmanager
def started(jobs: int) -> Iterator[None]:
    """The workers for ``jobs`` graphs, spawned now for the first ``workers`` call of the block (none on a
    single core); stopped at once when the block ends if nothing took them."""
    count = worker_count(jobs)
    if count == 0:
        yield
        return
    entry = (_spawned(count), count)
    _pools.append(entry)
    try:
        yield
    finally:
        if entry in _pools:  # not taken: the export failed before it traced
            _pools.remove(entry)
            _stop_now(entry[0])


def _stop_now(pool: ProcessPoolExecutor) -> None:
    """Stop ``pool``'s workers without waiting for them: a worker still importing would otherwise keep
    the process from exiting until its imports end."""
    terminate = getattr(pool, "terminate_workers", None)  # Python 3.14
    if terminate is not None:
        terminate()
        return
    processes = list(pool._processes.values())  # noqa: SLF001 - before 3.14, the pool's only handle on them
    pool.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        process.terminate()


@contextmanager
def workers(jobs: int) -> Iterator[ProcessPoolExecutor | None]:
    """Workers for ``jobs`` graphs, stopped when the block ends (their memory with them): those ``started``
    where there are enough, else spawned now; None where one core is all there is (the caller traces
    in this process)."""
    count = worker_count(jobs)
    if count == 0:
        yield None
        return
    ready = next((entry for entry in _pools if entry[1] >= count), None)
    if ready is not None:
        _pools.remove(ready)
    with ready[0] if ready is not None else _spawned(count) as pool:
        yield pool


def share(function: Callable[[Job], Result], jobs: list[Job], meanwhile: Callable[[], T]) -> tuple[list[Result], T]:
    """``function`` of every job, in order, and ``meanwhile()``: the jobs on the ``workers`` for them, the
    first ones at once, while ``meanwhile()`` runs here; then, where the workers are fewer than the jobs,
    here too. Whichever process is free takes the next job; one that fails stops the rest being taken."""
    pending = deque(enumerate(jobs))
    results: dict[int, Result] = {}

    def take() -> tuple[int, Job] | None:
        try:
            return pending.popleft()
        except IndexError:
            return None

    def run_from(first: tuple[int, Job] | None, run: Callable[[Job], Result]) -> None:
        taken = first
        while taken is not None:
            index, job = taken
            try:
                results[index] = run(job)
            except BaseException:
                pending.clear()
                raise
            taken = take()

    count = worker_count(len(jobs))
    # A thread here per worker, handing it a job at a time: the next one goes to whoever is free.
    with workers(len(jobs)) as pool, ThreadPoolExecutor(max(1, count), thread_name_prefix="tracing") as feeders:
        fed = [] if pool is None else [feeders.submit(run_from, take(), partial(_on_worker, pool, function)) for _ in range(count)]
        try:
            done = meanwhile()
        except BaseException:
            pending.clear()
            raise
        run_from(take(), function)
        for feeder in fed:
            feeder.result()
    return [results[index] for index in range(len(jobs))], done


def _on_worker(pool: ProcessPoolExecutor, function: Callable[[Job], Result], job: Job) -> Result:
    return pool.submit(function, job).result()
