"""The CPU heads' threads (runtime/cpu_heads.py): numpy's BLAS on one thread once a model is loaded, torch's
counts left as they were, and span scores that do not depend on which thread scores a chunk."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch

from s1omni.runtime.cpu_heads import HEADS_POOLS, READOUT_THREADS_VARIABLE, gelu, heads_pool, readout_threads, torch_on_one_thread
from s1omni.runtime.errors import UsageError
from s1omni.runtime.vela2.heads import SPAN_TENSORS, WORD_CHUNK, SpanHead

from tests.cli import run_s1omni

# Run in a fresh process: the limit is process-wide, and a test process has loaded models already.
THREADS_AROUND_A_REQUEST = textwrap.dedent(
    """
    import json, os, sys, threading
    import numpy, torch
    from threadpoolctl import threadpool_info
    from s1omni.runtime.api import load_model

    def counts():
        fresh = []
        thread = threading.Thread(target=lambda: fresh.append(torch.get_num_threads()))
        thread.start(); thread.join()
        blas = {os.path.basename(os.path.dirname(lib["filepath"])): lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"}
        return {"blas": blas, "torch": torch.get_num_threads(), "torch_fresh_thread": fresh[0]}

    before = counts()
    model = load_model(sys.argv[1])
    model.answer(model.golden_request())  # candidate heads and the span head's pool
    print(json.dumps({"before": before, "after": counts()}))
    """
)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="one core: every library runs one thread already")
def test_a_loaded_model_runs_numpy_blas_on_one_thread_and_leaves_torch_its_threads(tiny_vela: Path) -> None:
    result = subprocess.run([sys.executable, "-c", THREADS_AROUND_A_REQUEST, str(tiny_vela)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    counts = json.loads(result.stdout.splitlines()[-1])
    before, after = counts["before"], counts["after"]
    assert before["blas"]["numpy.libs"] > 1  # OpenBLAS's default: the limit below is the heads'
    assert after["blas"]["numpy.libs"] == 1
    assert all(threads > 1 for folder, threads in after["blas"].items() if folder != "numpy.libs")  # scipy's: untouched
    assert before["torch"] > 1
    # torch's own thread and one that first runs torch after the heads ran keep the default count.
    assert after["torch"] == after["torch_fresh_thread"] == before["torch"] == before["torch_fresh_thread"]


def test_torch_runs_inline_within_the_block_and_gets_its_count_back() -> None:
    def inside_and_after() -> tuple[int, int]:
        with torch_on_one_thread():
            inside = torch.get_num_threads()
        return inside, torch.get_num_threads()

    default = torch.get_num_threads()
    with ThreadPoolExecutor(1) as pool:  # a thread whose first torch call is inside the block
        assert pool.submit(inside_and_after).result() == (1, default)
    assert inside_and_after() == (1, default)
    fresh: list[int] = []
    thread = threading.Thread(target=lambda: fresh.append(torch.get_num_threads()))
    thread.start()
    thread.join()
    assert fresh == [default]


def test_a_heads_pool_thread_runs_torch_inline_for_good_and_other_threads_keep_their_count() -> None:
    def inside_and_after() -> tuple[int, int, str]:
        with torch_on_one_thread():
            inside = torch.get_num_threads()
        return inside, torch.get_num_threads(), threading.current_thread().name

    default = torch.get_num_threads()
    pool = heads_pool(2, "test-heads")
    try:
        results = [pool.submit(inside_and_after).result() for _ in range(4)]
    finally:
        pool.shutdown()
    assert [(inside, after) for inside, after, _ in results] == [(1, 1)] * 4
    assert all(name.startswith("test-heads") for _, _, name in results)
    assert inside_and_after()[:2] == (1, default)  # this thread is not the pool's: its count comes back
    fresh: list[int] = []
    thread = threading.Thread(target=lambda: fresh.append(torch.get_num_threads()))
    thread.start()
    thread.join()
    assert fresh == [default]


def test_gelu_is_torchs_exact_form_on_a_new_array() -> None:
    x = np.linspace(-6, 6, 4099, dtype=np.float32)
    copy = x.copy()
    out = gelu(x)
    assert out.dtype == np.float32 and not np.shares_memory(out, x)
    np.testing.assert_array_equal(x, copy)
    np.testing.assert_array_equal(out, torch.nn.functional.gelu(torch.from_numpy(x), approximate="none").numpy())


def test_span_scores_are_bitwise_the_same_whichever_threads_score_the_chunks() -> None:
    rng = np.random.default_rng(5)
    hidden, d, slots = 64, 32, 4
    shapes = {"wn.weight": (hidden,), "wn.bias": (hidden,), "ln.weight": (hidden,), "ln.bias": (hidden,),
              "slot.weight": (slots, hidden), "K.weight": (d, hidden), "Q.weight": (d, hidden), "M.weight": (d, hidden),
              "M.bias": (d,), "N.weight": (d, hidden), "v.weight": (1, d), "o.weight": (1, d), "o.bias": (1,)}  # fmt: skip
    assert set(shapes) == SPAN_TENSORS
    head = SpanHead({name: rng.standard_normal(shape).astype(np.float32) for name, shape in shapes.items()}, "span2.")
    words = rng.standard_normal((5 * WORD_CHUNK + 3, hidden)).astype(np.float32)
    labels = rng.standard_normal((7, hidden)).astype(np.float32)
    alone = head(words, labels)
    with ThreadPoolExecutor(4) as callers:  # four calls at once: their chunks interleave on the pool
        for scores in callers.map(lambda _: head(words, labels), range(8)):
            np.testing.assert_array_equal(scores, alone)


def test_a_heads_pool_counts_its_tasks_their_wait_for_a_thread_and_their_run() -> None:
    """One thread: the second task waits while the first sleeps, and both ran at least their sleep; map's
    tasks and a task that raises count too. The pool is listed for ``/metrics`` while it lives."""
    pool = heads_pool(1, "test-timed")
    try:
        assert pool in HEADS_POOLS and pool.totals() == (0, 0.0, 0.0)
        first, second = pool.submit(time.sleep, 0.1), pool.submit(time.sleep, 0.05)
        first.result(), second.result()
        tasks, wait_s, run_s = pool.totals()
        assert tasks == 2 and 0.09 <= wait_s < 0.5 and 0.15 <= run_s < 0.6
        assert list(pool.map(abs, [-1, -2, -3])) == [1, 2, 3] and pool.totals()[0] == 5
        with pytest.raises(ZeroDivisionError):
            pool.submit(divmod, 1, 0).result()
        assert pool.totals()[0] == 6
    finally:
        pool.shutdown()


def test_the_readout_pool_takes_a_thread_a_core_from_4_to_16_unless_told(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(READOUT_THREADS_VARIABLE, raising=False)
    for cores, threads in ((2, 4), (6, 6), (16, 16), (64, 16)):
        monkeypatch.setattr(os, "sched_getaffinity", lambda _, cores=cores: set(range(cores)))
        assert readout_threads() == threads
    monkeypatch.setenv(READOUT_THREADS_VARIABLE, "3")
    assert readout_threads() == 3
    for bad in ("0", "-2", "four", "2.5", ""):
        monkeypatch.setenv(READOUT_THREADS_VARIABLE, bad)
        with pytest.raises(UsageError, match=f"{READOUT_THREADS_VARIABLE} takes a whole number of threads, 1 or more"):
            readout_threads()


def test_a_bad_readout_thread_count_stops_a_server_with_the_usage_exit_code(tiny_vela: Path) -> None:
    done = run_s1omni("serve", str(tiny_vela), env={READOUT_THREADS_VARIABLE: "none"}, timeout=120)
    assert done.returncode == 2 and f"{READOUT_THREADS_VARIABLE} takes a whole number of threads" in done.stderr, done.stderr[-2000:]
