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
"""

from __future__ import annotations

import importlib
import multiprocessing
import os
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager

EXPORTER = "s1omni.export.onnx_export"
# The pools ``started`` and not yet taken by ``workers``, with their sizes.
_pools: list[tuple[ProcessPoolExecutor, int]] = []


def worker_count(jobs: int) -> int:
    """One worker per job, and no more than the cores this process may run on."""
    return min(jobs, len(os.sched_getaffinity(0)))


def _import_exporter() -> None:
    importlib.import_module(EXPORTER)


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
    if count < 2:
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
    if count < 2:
        yield None
        return
    ready = next((entry for entry in _pools if entry[1] >= count), None)
    if ready is not None:
        _pools.remove(ready)
    with ready[0] if ready is not None else _spawned(count) as pool:
        yield pool
