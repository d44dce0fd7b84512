"""CUDA graph captures apart from every other device run of the process, at a cost of one forward's wait.

ONNX Runtime's CUDA EP captures a graph in ``cudaStreamCaptureModeGlobal``: while one thread
captures, a potentially unsafe CUDA call (an allocation, a synchronising copy) from any other thread
of the process fails with error 900 (``operation not permitted when stream is capturing``), and the
capture itself with 901 (the CUDA Runtime API's ``cudaStreamBeginCapture``, "cudaStreamCaptureMode").
``s1omni serve --instances 2 --profiles batching`` met it on the H200: merged batches bring new shapes,
one worker captured while the other ran, and 97 of 587 requests (52 at 8 clients, 45 at 16) failed with 500
(benchmarks/h200-0.8B-http/batching-instances2). ``exact`` warmed every shape before serving and never hit it.

So a capture happens only where no other thread runs on the device. Every forward holds ``CAPTURE_LOCK.forward()``:
``shared`` (any number of threads at once), or, where the thread's previous forward met a graph it could not
capture, ``exclusive`` (it waits for the other forwards to end, keeps new ones out, and captures whatever it
meets). Inside a shared hold, a graph not yet captured asks ``exclusive_if_alone()``, granted where no other
thread is inside ``shared`` and refused at once otherwise; refused, it runs outside any graph and the thread's
next forward holds the device alone (``want_alone``). Two earlier policies lost throughput on an H100 with two
instances under ``batching`` (0.8B router request, 16 clients):

- every capture waited for the device alone: a merged size's first forward brings 7-9 new graphs, each of
  which waited for the other instance's forward and kept new ones out, so the first forward of each size took
  1.0-4.7 s (14 of them 25.7 s; 40.35 req/s against 49 after the last, benchmarks/h100-host-gil);
- a capture never waited: with both instances always busy few graphs were ever captured (5 and 6 at 8 and 16
  clients, 641 and 453 runs outside any graph) and the server answered 7.8 and 13.3 req/s
  (benchmarks/h100-capture-policy).

Holds are per thread and re-entrant. ``CAPTURES`` counts the captures and the deferred runs for ``/metrics`` (here,
not beside the graphs, so that the server reads them without importing ONNX Runtime).
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
    """A readers-writer lock: ``shared`` for runs, ``exclusive`` for a forward that holds the device alone,
    ``exclusive_if_alone`` for a capture inside a run, never waited for."""

    def __init__(self) -> None:
        self._condition = threading.Condition()
        self._readers = 0  # threads inside ``shared``
        self._writing = False
        self._waiting = 0  # threads waiting for ``exclusive``: new runs wait behind them
        self._held = threading.local()  # this thread's hold depth, whether it holds ``exclusive``, whether it wants it

    def _depth(self) -> int:
        return getattr(self._held, "depth", 0)

    def _owns(self) -> bool:
        return getattr(self._held, "exclusive", False)

    @contextmanager
    def forward(self) -> Iterator[None]:
        """A forward's hold: ``exclusive`` where this thread wants it (``want_alone``) and holds nothing yet, else
        ``shared``."""
        hold = self.exclusive if self._depth() == 0 and getattr(self._held, "wanted", False) else self.shared
        with hold():
            yield

    def want_alone(self) -> None:
        """This thread's next forward holds the device alone (it met a graph it could not capture)."""
        self._held.wanted = True

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        """No other thread on the device until the block ends: waits for the runs inside ``shared`` (and any
        other exclusive hold) to end, new runs waiting meanwhile. Not from inside a hold of this thread's own."""
        if self._depth():
            raise RuntimeError("exclusive() from inside a hold of the same thread would wait for itself")
        self._held.wanted = False
        with self._condition:
            self._waiting += 1
            try:
                self._condition.wait_for(lambda: not self._writing and self._readers == 0)
            finally:
                self._waiting -= 1
            self._writing = True
        self._held.depth, self._held.exclusive = 1, True
        try:
            yield
        finally:
            self._held.depth, self._held.exclusive = 0, False
            with self._condition:
                self._writing = False
                self._condition.notify_all()

    @contextmanager
    def shared(self) -> Iterator[None]:
        depth = self._depth()
        if depth == 0:
            with self._condition:
                self._condition.wait_for(lambda: not self._writing and not self._waiting)
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
        if self._owns():
            return False
        with self._condition:
            return not self._alone(self._depth())

    @contextmanager
    def exclusive_if_alone(self) -> Iterator[bool]:
        """True, and no other thread inside ``shared`` until the block ends, where no other thread is inside
        ``shared`` now (or this thread holds ``exclusive``); False at once otherwise (the caller runs without
        capturing)."""
        if self._owns():
            yield True
            return
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
    """``method`` (a runner's entry point onto the device) inside ``CAPTURE_LOCK.forward()``."""

    @functools.wraps(method)
    def held(*args: P.args, **kwargs: P.kwargs) -> R:
        with CAPTURE_LOCK.forward():
            return method(*args, **kwargs)

    return held
