"""The tracing workers an export starts before it needs them (``s1omni.export.workers``)."""

from __future__ import annotations

import sys

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
