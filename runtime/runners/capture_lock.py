"""CUDA graph captures apart from every other device run of the process, and never waited for.

ONNX Runtime's CUDA EP captures a graph in ``cudaStreamCaptureModeGlobal``: while one thread
captures, a potentially unsafe CUDA call (an allocation, a synchronising copy) from any other thread
of the process fails with error 900 (``operation not permitted when stream is capturing``), and the
capture itself with 901 (the CUDA Runtime API's ``cudaStreamBeginCapture``, "cudaStreamCaptureMode").
``s1omni serve --instances 2 --profiles batching`` met it on the H200: merged batches bring new shapes,
one worker captured while the other ran, and 97 of 587 requests (52 at 8 clients, 45 at 16) failed with 500
(benchmarks/h200-0.8B-http/batching-instances2). ``exact`` warmed every shape before serving and never hit it.

So every device run holds ``CAPTURE_LOCK.shared()`` (any number of threads at once), and a capture
holds ``CAPTURE_LOCK.exclusive_if_alone()`` (no other thread inside ``shared``), which a thread gets only
where nothing else runs on the device at that moment, and is otherwise refused at once: a graph that finds
the device busy runs outside any graph and tries again on a later run (``cuda_graphs.Graph``). A capture
that waited for every other forward to end (and kept new ones out meanwhile) stalled the server instead: on an
H100 with two instances under ``batching``, the first forwards of each merged size took 1.0-4.7 s, 14 of them
25.7 s, against timed windows of 4.6 and 10.3 s at 8 and 16 clients (benchmarks/h100-host-gil,
0.8B-http-batching). A thread may capture inside its own shared hold, which it steps out of for the capture.
Holds are per thread and re-entrant. ``CAPTURES`` counts the captures and the deferred runs for ``/metrics`` (here, not
beside the graphs, so that the server reads them without importing ONNX Runtime).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")


class CaptureLock:
    """A readers-writer lock whose writer never waits: ``shared`` for runs, ``exclusive_if_alone`` for captures."""

    def __init__(self) -> None:
        self._condition = threading.Condition()
        self._readers = 0  # threads inside ``shared``
        self._writing = False
        self._held = threading.local()  # this thread's ``shared`` depth

    def _depth(self) -> int:
        return getattr(self._held, "depth", 0)

    @contextmanager
    def shared(self) -> Iterator[None]:
        depth = self._depth()
        if depth == 0:
            with self._condition:
                self._condition.wait_for(lambda: not self._writing)
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

    def _alone(self, depth: int) -> bool:
        """With the condition held: no capture, and no thread inside ``shared`` but this one (at ``depth``)."""
        return not self._writing and self._readers == (1 if depth else 0)

    def busy_elsewhere(self) -> bool:
        """Whether another thread runs on the device (inside ``shared``) or captures now."""
        with self._condition:
            return not self._alone(self._depth())

    @contextmanager
    def exclusive_if_alone(self) -> Iterator[bool]:
        """True, and no other thread inside ``shared`` until the block ends, where no other thread is inside
        ``shared`` now; False at once otherwise (the caller runs without capturing)."""
        depth = self._depth()
        with self._condition:
            alone = self._alone(depth)
            if alone:
                self._writing = True
                self._readers -= 1 if depth else 0  # out of this thread's own hold for the capture
        if not alone:
            yield False
            return
        self._held.depth = depth + 1  # a run nested in the capture is inside it already
        try:
            yield True
        finally:
            self._held.depth = depth
            with self._condition:
                self._writing = False
                self._readers += 1 if depth else 0
                self._condition.notify_all()


CAPTURE_LOCK = CaptureLock()


@dataclass
class CaptureCounts:
    """The process's graphs captured, the seconds their capturing runs took (the warm-up runs and the capture), and the
    runs of graphs not yet captured that found another forward on the device and ran outside any graph (/metrics)."""

    captured: int = 0
    capture_seconds: float = 0.0
    deferred_runs: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, captured: int = 0, seconds: float = 0.0, deferred_runs: int = 0) -> None:
        with self._lock:
            self.captured += captured
            self.capture_seconds += seconds
            self.deferred_runs += deferred_runs

    def totals(self) -> tuple[int, float, int]:
        with self._lock:
            return self.captured, self.capture_seconds, self.deferred_runs


CAPTURES = CaptureCounts()


def device_run(method: Callable[P, R]) -> Callable[P, R]:
    """``method`` (a runner's entry point onto the device) inside ``CAPTURE_LOCK.shared()``."""

    @functools.wraps(method)
    def held(*args: P.args, **kwargs: P.kwargs) -> R:
        with CAPTURE_LOCK.shared():
            return method(*args, **kwargs)

    return held
