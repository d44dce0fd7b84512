"""CUDA graph captures apart from every other device run of the process.

ONNX Runtime's CUDA EP captures a graph in ``cudaStreamCaptureModeGlobal``: while one thread
captures, a potentially unsafe CUDA call (an allocation, a synchronising copy) from any other thread
of the process fails with error 900 (``operation not permitted when stream is capturing``), and the
capture itself with 901 (the CUDA Runtime API's ``cudaStreamBeginCapture``, "cudaStreamCaptureMode").
``s1omni serve --instances 2 --profiles batching`` met it on the H200: merged batches bring new shapes,
one worker captured while the other ran, and 97 of 587 requests (52 at 8 clients, 45 at 16) failed with 500
(benchmarks/h200-0.8B-http/batching-instances2). ``exact`` warmed every shape before serving and never hit it.

So every device run holds ``CAPTURE_LOCK.shared()`` (any number of threads at once), and a capture
holds ``CAPTURE_LOCK.exclusive()`` (no other thread inside ``shared``). A thread that captures in the
middle of its own forward lets go of its shared hold while it waits, so two threads that both need a
capture cannot deadlock; a waiting capture keeps new forwards out, so a busy server cannot starve it.
Holds are per thread and re-entrant.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")


class CaptureLock:
    """A readers-writer lock: ``shared`` for runs, ``exclusive`` for captures (writers first)."""

    def __init__(self) -> None:
        self._condition = threading.Condition()
        self._readers = 0  # threads inside ``shared``
        self._writing = False
        self._waiting_writers = 0
        self._held = threading.local()  # this thread's ``shared`` depth

    def _depth(self) -> int:
        return getattr(self._held, "depth", 0)

    @contextmanager
    def shared(self) -> Iterator[None]:
        depth = self._depth()
        if depth == 0:
            with self._condition:
                self._condition.wait_for(lambda: not self._writing and not self._waiting_writers)
                self._readers += 1
        self._held.depth = depth + 1
        try:
            yield
        finally:
            self._held.depth = depth
            if depth == 0:
                with self._condition:
                    self._readers -= 1
                    self._condition.notify_all()

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        depth = self._depth()
        with self._condition:
            if depth:  # step out of this thread's own shared hold while waiting, and come back after
                self._readers -= 1
                self._condition.notify_all()
            self._waiting_writers += 1
            self._condition.wait_for(lambda: not self._writing and not self._readers)
            self._waiting_writers -= 1
            self._writing = True
        self._held.depth = depth + 1  # a run nested in the capture is inside it already
        try:
            yield
        finally:
            self._held.depth = depth
            with self._condition:
                self._writing = False
                if depth:
                    # Back in ahead of waiting writers: this thread's forward is under way and will end.
                    self._readers += 1
                self._condition.notify_all()


CAPTURE_LOCK = CaptureLock()


def device_run(method: Callable[P, R]) -> Callable[P, R]:
    """``method`` (a runner's entry point onto the device) inside ``CAPTURE_LOCK.shared()``."""

    @functools.wraps(method)
    def held(*args: P.args, **kwargs: P.kwargs) -> R:
        with CAPTURE_LOCK.shared():
            return method(*args, **kwargs)

    return held
