"""CUDA graph captures apart from every other device run (``s1omni.runtime.runners.capture_lock``): the lock
itself, and its use by the ONNX Runtime runner, on the CPU (a graphed runner there runs the same fixed-buffer
path, and takes the same locks). The failure it prevents, two instances of a served engine on one GPU, is
``tests/server/test_server_instances.py``'s GPU test."""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FuturesTimeout
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path

import numpy as np
import pytest

from s1omni.runtime.runners.base import Block, Prefix, Tree
from s1omni.runtime.runners.capture_lock import CAPTURE_LOCK, CAPTURES, CaptureLock
from s1omni.runtime.runners.cuda_graphs import GRAPH_ID, Graph
from s1omni.runtime.runners.onnxruntime_runner import OnnxRuntimeRunner

SETTLE_S = 0.2  # how long a thread that should be blocked is given to (wrongly) get through
DONE_S = 10.0  # how long a thread that should get through is given


class Holder:
    """A thread that holds ``enter()`` (a context) from ``start`` until ``release``; ``value`` is what it gave."""

    def __init__(self, enter: Callable[[], AbstractContextManager[object]], inside: Callable[[], None] = lambda: None):
        self.entered, self.released, self.done = threading.Event(), threading.Event(), threading.Event()
        self.value: object = None
        self._thread = threading.Thread(target=self._hold, args=(enter, inside), daemon=True)

    def _hold(self, enter: Callable[[], AbstractContextManager[object]], inside: Callable[[], None]) -> None:
        with enter() as self.value:
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


def capturing(lock: CaptureLock) -> Holder:
    """A thread holding a capture it was granted (the lock free when it asked)."""
    holder = Holder(lock.exclusive_if_alone).start()
    assert holder.entered.wait(DONE_S) and holder.value is True
    return holder


@pytest.fixture
def lock() -> Iterator[CaptureLock]:
    yield CaptureLock()


def test_runs_share_and_a_capture_is_refused_while_any_runs(lock: CaptureLock) -> None:
    first, second = Holder(lock.shared).start(), Holder(lock.shared).start()
    assert first.entered.wait(DONE_S) and second.entered.wait(DONE_S)  # two runs at once
    assert lock.busy_elsewhere()
    with lock.exclusive_if_alone() as alone:
        assert alone is False  # refused at once, not waited for
    first.release()
    with lock.exclusive_if_alone() as alone:
        assert alone is False  # one run still inside
    second.release()
    assert not lock.busy_elsewhere()
    capturing(lock).release()


def test_a_capture_keeps_every_run_and_every_other_capture_out(lock: CaptureLock) -> None:
    capture = capturing(lock)
    assert lock.busy_elsewhere()
    late = Holder(lock.shared).start()
    assert not late.entered.wait(SETTLE_S)
    other = Holder(lock.exclusive_if_alone).start()
    assert other.entered.wait(DONE_S) and other.value is False
    other.release()
    capture.release()
    assert late.entered.wait(DONE_S)
    late.release()


def test_a_run_alone_captures_inside_its_own_hold_and_is_back_in_it_after(lock: CaptureLock) -> None:
    captured, resume = threading.Event(), threading.Event()
    seen: list[object] = []

    def body() -> None:
        assert not lock.busy_elsewhere()  # its own hold does not count
        with lock.exclusive_if_alone() as alone:
            seen.append(alone)
            with lock.shared():  # a run nested in the capture is inside it already
                pass
        captured.set()
        resume.wait(DONE_S)

    forward = Holder(lock.shared, body).start()
    assert captured.wait(DONE_S) and seen == [True]
    assert lock.busy_elsewhere()  # back inside shared: another thread's capture is refused
    with lock.exclusive_if_alone() as alone:
        assert alone is False
    resume.set()
    forward.release()
    capturing(lock).release()  # every hold was given back


def test_two_runs_that_each_want_a_capture_are_both_refused_and_both_finish(lock: CaptureLock) -> None:
    seen: list[object] = []
    gate = threading.Barrier(2, timeout=DONE_S)

    def body() -> None:
        gate.wait()  # both inside shared before either tries
        with lock.exclusive_if_alone() as alone:
            seen.append(alone)
        gate.wait()

    forwards = [Holder(lock.shared, body).start() for _ in range(2)]
    for held in forwards:
        assert held.entered.wait(DONE_S)
        held.release()
    assert seen == [False, False]


def test_a_thread_that_deferred_a_capture_holds_its_next_forward_alone(lock: CaptureLock) -> None:
    other = Holder(lock.forward).start()  # another instance's forward
    assert other.entered.wait(DONE_S)
    late = Holder(lock.forward)  # a forward that arrives while the thread waits for the device
    deferred, inside = threading.Event(), threading.Event()
    seen: list[object] = []

    def worker() -> None:  # one instance's worker thread: a forward that defers its capture, then the next one
        with lock.forward():
            with lock.exclusive_if_alone() as alone:
                seen.append(alone)
            lock.want_alone()
        deferred.set()
        with lock.forward():
            inside.set()
            seen.append((lock.busy_elsewhere(), late.entered.is_set()))
            with lock.exclusive_if_alone() as alone:  # it captures what it meets
                seen.append(alone)
            with lock.shared():  # nested runs are inside its hold
                pass
        with lock.forward():  # the wish was spent: its forwards share again
            seen.append(lock._owns())

    thread = threading.Thread(target=worker, daemon=True)
    thread.start()
    assert deferred.wait(DONE_S) and not inside.wait(SETTLE_S)  # it waits for the other forward to end
    late.start()
    assert not late.entered.wait(SETTLE_S)  # a forward arriving meanwhile waits behind it
    other.release()
    thread.join(DONE_S)
    assert seen == [False, (False, False), True, False]
    assert late.entered.wait(DONE_S)  # and gets in after it
    late.release()


def test_exclusive_from_inside_a_hold_is_refused(lock: CaptureLock) -> None:
    with lock.shared():
        with pytest.raises(RuntimeError, match="wait for itself"):
            with lock.exclusive():
                pass
    capturing(lock).release()  # nothing was left held


def _tree(prefix: int, block: int) -> Tree:
    rng = np.random.default_rng(prefix * 1000 + block)
    return Tree(Prefix(rng.integers(1, 2048, prefix)), (Block(rng.integers(1, 2048, block), np.arange(block)),))


def _running(runner: OnnxRuntimeRunner, tree: Tree) -> tuple[threading.Event, list]:
    """``runner.run([tree])`` on a thread of its own: an event set once it returned, and a list that gets its answer."""
    returned, answer = threading.Event(), []
    threading.Thread(target=lambda: (answer.append(runner.run([tree])), returned.set()), daemon=True).start()
    return returned, answer


def _graphs(runner: OnnxRuntimeRunner) -> list[Graph]:
    sessions = runner._graphs or ()
    return [graph for session in sessions for graph in session.graphs.values()] + list(runner._row_graphs.values())


def _counted_since(before: tuple[int, float, int]) -> tuple[int, int]:
    """Graphs captured and runs deferred (``capture_lock.CAPTURES``) since ``before``."""
    captured, _, deferred = CAPTURES.totals()
    return captured - before[0], deferred - before[2]


def _counting_runs(runner: OnnxRuntimeRunner) -> list[str]:
    """From now on, a run option's graph id per run of the runner's graph sessions (each run appends one)."""
    runs: list[str] = []
    for session in (runner._prefill, runner._continue, runner._rows):
        def counted(binding: object, options: object, run: Callable = session.run_with_iobinding) -> None:
            runs.append(options.get_run_config_entry(GRAPH_ID))
            run(binding, options)

        session.run_with_iobinding = counted
    return runs


def test_the_runner_captures_alone_and_defers_to_its_next_forward(cuda_engine: Callable[..., tuple[Path, str]]) -> None:
    engine = cuda_engine("--gated-delta-kernel", "LinearAttention", "--cuda-graphs")[0]
    runner = OnnxRuntimeRunner(engine, device="cpu", cuda_graphs=True)
    counted = CAPTURES.totals()
    runner.run([_tree(23, 9)])  # alone: these shapes are captured at once
    first = _graphs(runner)
    assert first and all(graph.captured for graph in first)
    assert _counted_since(counted) == (len(first), 0)

    capture = capturing(CAPTURE_LOCK)  # a capture elsewhere keeps out every run, a replay too
    replay, _ = _running(runner, _tree(23, 9))
    assert not replay.wait(SETTLE_S)
    capture.release()
    assert replay.wait(DONE_S)

    worker = ThreadPoolExecutor(1)  # an instance's worker thread, as the server has one per instance
    running = Holder(CAPTURE_LOCK.shared).start()  # another instance's forward
    assert running.entered.wait(DONE_S)
    assert worker.submit(runner.run, [_tree(23, 9)]).result(DONE_S)  # captured shapes replay beside it
    session_runs, counted = _counting_runs(runner), CAPTURES.totals()
    busy_answer = worker.submit(runner.run, [_tree(70, 33)]).result(DONE_S)  # a new shape: one run, outside any graph
    fresh = [graph for graph in _graphs(runner) if graph not in first]
    assert fresh and not any(graph.captured for graph in fresh) and all(graph.runs == 1 for graph in fresh)
    assert len(session_runs) == len(fresh)  # no warm-up run beyond the one that answered
    assert _counted_since(counted) == (0, len(fresh))  # /metrics' deferred runs

    counted = CAPTURES.totals()
    alone = worker.submit(runner.run, [_tree(70, 33)])  # the worker's next forward waits for the device alone
    assert not alone.done() and not _wait(alone, SETTLE_S)
    late = Holder(CAPTURE_LOCK.shared).start()  # and a forward arriving meanwhile waits behind it
    assert not late.entered.wait(SETTLE_S)
    running.release()
    alone_answer = alone.result(DONE_S)  # captured on this run, with the same answer
    assert all(graph.captured for graph in fresh)
    assert _counted_since(counted) == (len(fresh), 0)
    assert CAPTURES.totals()[1] > counted[1]  # and their seconds
    np.testing.assert_array_equal(busy_answer[0][0], alone_answer[0][0])
    assert late.entered.wait(DONE_S)
    late.release()
    worker.shutdown()


def _wait(future: Future, seconds: float) -> bool:
    try:
        future.result(seconds)
    except FuturesTimeout:
        return False
    return True
