"""The worker processes the backbone's graphs are traced in (``s1omni.export.onnx_export.build_graphs``),
started before they are needed.

A spawned worker spends seconds importing torch, transformers and the exporter before it traces
anything. ``started`` spawns them once the package is verified, before this process has imported
any of those itself (this module imports none of them), so the workers' imports run beside the
parent's rather than after it (a package that fails verification starts none); ``workers`` hands them to the
tracing (or spawns its own where none were started) and stops them once the graphs are traced, so
they hold no memory while the weights are written and checked.
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
    single core); stopped when the block ends if nothing took them."""
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
            entry[0].shutdown(wait=False, cancel_futures=True)


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
