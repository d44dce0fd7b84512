"""The tracing workers an export starts before it needs them (``s1omni.export.workers``)."""

from __future__ import annotations

import multiprocessing
import sys
import time

import pytest

from s1omni.export import workers


def _exporter_imported() -> bool:
    return workers.EXPORTER in sys.modules


@pytest.mark.skipif(workers.worker_count(2) < 2, reason="one core: the export traces in its own process")
def test_started_workers_trace_with_the_exporter_imported_and_stop_after() -> None:
    with workers.started(2):
        with workers.workers(2) as taken:
            assert taken is not None and taken.submit(_exporter_imported).result()  # imported before any task
        with pytest.raises(RuntimeError):  # stopped with its block: it holds no memory after the tracing
            taken.submit(_exporter_imported)


@pytest.mark.skipif(workers.worker_count(2) < 2, reason="one core: the export traces in its own process")
def test_workers_no_export_took_are_killed_at_once() -> None:
    """A package that fails verification stops the workers started for it then and there: killed, not
    left to finish importing the exporter (seconds), which would keep the failed export from exiting."""
    before = set(multiprocessing.active_children())
    with pytest.raises(RuntimeError, match="verification failed"), workers.started(2):
        spawned = set(multiprocessing.active_children()) - before
        raise RuntimeError("verification failed")
    assert len(spawned) == 2
    deadline = time.monotonic() + 2.0  # well under the workers' imports on any machine
    while any(process.is_alive() for process in spawned) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(process.is_alive() for process in spawned)
