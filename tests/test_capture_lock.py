"""CUDA graph captures apart from every other device run (``s1omni.runtime.runners.capture_lock``): the lock
itself, and its use by the ONNX Runtime runner, on the CPU (a graphed runner there runs the same fixed-buffer
path, and takes the same locks). The failure it prevents, two instances of a served engine on one GPU, is
``tests/server/test_server_instances.py``'s GPU test."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path

import numpy as np
import pytest

from s1omni.runtime.runners.base import Block, Prefix, Tree
from s1omni.runtime.runners.capture_lock import CAPTURE_LOCK, CaptureLock
from s1omni.runtime.runners.onnxruntime_runner import OnnxRuntimeRunner

SETTLE_S = 0.2  # how long a thread that should be blocked is given to (wrongly) get through
DONE_S = 10.0  # how long a thread that should get through is given


class Holder:
    """A thread that holds ``enter()`` (a context) from ``start`` until ``release``."""

    def __init__(self, enter: Callable[[], AbstractContextManager[None]], inside: Callable[[], None] = lambda: None):
        self.entered, self.released, self.done = threading.Event(), threading.Event(), threading.Event()
        self._thread = threading.Thread(target=self._hold, args=(enter, inside), daemon=True)

    def _hold(self, enter: Callable[[], AbstractContextManager[None]], inside: Callable[[], None]) -> None:
        with enter():
            self.entered.set()
            inside()
            self.released.wait(DONE_S)
        self.done.set()

    def start(self) -> Holder:
        self._thread.start()
        return self

    def release(self) -> None:
        self.released.set()
        assert self.done.wait(DONE_S), "the holder never got out"


@pytest.fixture
def lock() -> Iterator[CaptureLock]:
    yield CaptureLock()


def test_runs_share_and_a_capture_waits_for_them(lock: CaptureLock) -> None:
    first, second = Holder(lock.shared).start(), Holder(lock.shared).start()
    assert first.entered.wait(DONE_S) and second.entered.wait(DONE_S)  # two runs at once
    capture = Holder(lock.exclusive).start()
    assert not capture.entered.wait(SETTLE_S)
    first.release()
    assert not capture.entered.wait(SETTLE_S)  # one run still inside
    second.release()
    assert capture.entered.wait(DONE_S)
    capture.release()


def test_a_waiting_capture_keeps_new_runs_out_and_a_capture_keeps_every_run_out(lock: CaptureLock) -> None:
    running = Holder(lock.shared).start()
    assert running.entered.wait(DONE_S)
    capture = Holder(lock.exclusive).start()
    assert not capture.entered.wait(SETTLE_S)
    late = Holder(lock.shared).start()
    assert not late.entered.wait(SETTLE_S)  # writers first: a busy server cannot starve a capture
    running.release()
    assert capture.entered.wait(DONE_S)
    assert not late.entered.wait(SETTLE_S)
    capture.release()
    assert late.entered.wait(DONE_S)
    late.release()


def test_a_run_that_captures_steps_out_of_its_own_hold(lock: CaptureLock) -> None:
    """Two forwards that each need a capture midway both finish: neither waits for the other's shared hold."""
    order: list[str] = []
    gate = threading.Barrier(2, timeout=DONE_S)

    def forward(name: str) -> Callable[[], None]:
        def body() -> None:
            gate.wait()  # both inside shared before either captures
            with lock.exclusive():
                order.append(name)
                with lock.shared():  # a run nested in the capture does not wait for it
                    pass

        return body

    forwards = [Holder(lock.shared, forward(name)).start() for name in ("a", "b")]
    for held in forwards:
        assert held.entered.wait(DONE_S)
        held.release()
    assert sorted(order) == ["a", "b"]
    other = Holder(lock.exclusive).start()  # every hold was given back
    assert other.entered.wait(DONE_S)
    other.release()


def test_a_capture_waits_for_a_run_re_entered_after_anothers_capture(lock: CaptureLock) -> None:
    """After its own capture a forward is back inside shared, so a capture waiting meanwhile waits for it."""
    captured, resume = threading.Event(), threading.Event()

    def body() -> None:
        with lock.exclusive():
            pass
        captured.set()
        resume.wait(DONE_S)

    forward = Holder(lock.shared, body).start()
    assert captured.wait(DONE_S)
    capture = Holder(lock.exclusive).start()
    assert not capture.entered.wait(SETTLE_S)
    resume.set()
    forward.release()
    assert capture.entered.wait(DONE_S)
    capture.release()


def _tree(prefix: int, block: int) -> Tree:
    rng = np.random.default_rng(prefix * 1000 + block)
    return Tree(Prefix(rng.integers(1, 2048, prefix)), (Block(rng.integers(1, 2048, block), np.arange(block)),))


def _running(runner: OnnxRuntimeRunner, tree: Tree) -> threading.Event:
    """``runner.run([tree])`` on a thread of its own; the event is set once it returned."""
    returned = threading.Event()
    threading.Thread(target=lambda: (runner.run([tree]), returned.set()), daemon=True).start()
    return returned


def test_the_runner_runs_inside_shared_and_captures_inside_exclusive(cuda_engine: Callable[..., tuple[Path, str]]) -> None:
    engine = cuda_engine("--gated-delta-kernel", "LinearAttention", "--cuda-graphs")[0]
    runner = OnnxRuntimeRunner(engine, device="cpu", cuda_graphs=True)
    runner.run([_tree(23, 9)])  # these shapes have their graphs now

    capture = Holder(CAPTURE_LOCK.exclusive).start()  # a capture elsewhere keeps out every run, a replay too
    assert capture.entered.wait(DONE_S)
    replay = _running(runner, _tree(23, 9))
    assert not replay.wait(SETTLE_S)
    capture.release()
    assert replay.wait(DONE_S)

    running = Holder(CAPTURE_LOCK.shared).start()  # a run elsewhere keeps out a new shape's capture, not a replay
    assert running.entered.wait(DONE_S)
    assert _running(runner, _tree(23, 9)).wait(DONE_S)
    new_shape = _running(runner, _tree(70, 33))
    assert not new_shape.wait(SETTLE_S)
    running.release()
    assert new_shape.wait(DONE_S)
