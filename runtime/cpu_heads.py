"""How the families' CPU heads use threads: numpy's BLAS on one thread, torch on one thread per head call.

Heads run on many threads at once: each request's on its own thread (the server's, a Ray replica's,
``s1omni bench``'s), and the Vela 2.0 span head's word chunks on a pool besides. Their calls are small
(a 0.8B router request: one span call over 450 words x 17 labels, ~15 candidate calls of ~15 options,
d 256 over 1,024-wide states), so the parallelism is across those threads, and a library that starts
a team of threads for each small call only oversubscribes the cores (benchmarks/README.md "CPU
heads": 8 threads each running the heads of 0.8B router requests, 3.4 requests a second with
OpenBLAS's threads and scipy's erf, 42 with this module, on 2 shared cores).

- numpy's BLAS: ``single_threaded_numpy_blas`` limits numpy's own BLAS library, the one whose file
  belongs to numpy's distribution, to one thread for the whole process (OpenBLAS's count is global).
  Only that one: scipy's copy of OpenBLAS is another library, torch's MKL and OpenMP and ONNX
  Runtime's pool are untouched, so the torch reference runner keeps its threads. The heads call it
  when they are built, which is at model load in every process that runs heads (``s1omni serve``, a
  Ray replica, ``s1omni bench`` and ``s1omni validate`` in process); nothing in those processes uses
  numpy's BLAS for work that wants threads (the backbones run in torch or ONNX Runtime).
- torch: ``torch_on_one_thread`` makes torch's CPU kernels run inline on the calling thread for a
  block, then gives the thread its count back. Not ``torch.set_num_threads(1)``: besides the calling
  thread's OpenMP count it stores a process-wide one that every thread adopts when it first runs
  torch (ATen's ``init_num_threads``), so a server thread that first ran the torch reference after a
  head call would run it on one thread. Here the thread's own count is set through threadpoolctl's
  OpenMP controller (``omp_set_num_threads`` is per thread), after ATen's lazy per-thread start.
  torch's BLAS (MKL keeps a count of its own) is not called inside such a block. It is per call
  because request threads call heads too, and one of them may run the torch reference next.
- ``heads_pool``: a thread pool whose threads run nothing but heads (the Vela 2.0 span head's chunks,
  the heads begun during a forward) sets each thread's count to one once, when the thread starts, and
  ``torch_on_one_thread`` is then a no-op there. The per-call limit and restore are Python with the
  GIL held (threadpoolctl's limiter over ctypes): about 11 us a call alone, 0.6-0.9 ms of GIL for the
  ~23 GELU calls of a 0.8B router request with four threads at work, time every other thread of a
  loaded server waits through (benchmarks/cpu-host-path/gil). Each pool also counts its tasks and the time
  they waited for a thread and ran (``HeadsPool.totals``, ``/metrics``' ``s1omni_head_pool_*``).

torch is imported at the first GELU, not with this module. A process that loads heads imports it
already (the Vela 2.0 head tensors are read through safetensors' torch reader, OmniJev's model
imports torch), so the GELU adds nothing to a server's start.
"""

from __future__ import annotations

import functools
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from importlib.metadata import distribution
from typing import Any, TypeVar

import numpy as np
from threadpoolctl import ThreadpoolController

from .errors import UsageError


@functools.cache
def single_threaded_numpy_blas() -> tuple[str, ...]:
    """Limit numpy's own BLAS to one thread in this process (once); the library files limited."""
    numpy = distribution("numpy")
    own = {os.path.realpath(numpy.locate_file(name)) for name in numpy.files or ()}
    controller = ThreadpoolController()
    blas = [lib["filepath"] for lib in controller.info() if lib["user_api"] == "blas" and os.path.realpath(lib["filepath"]) in own]
    if blas:
        controller.select(filepath=blas).limit(limits=1)
    return tuple(blas)


@functools.cache
def _openmp() -> ThreadpoolController:
    return ThreadpoolController().select(user_api="openmp")


T = TypeVar("T")
# Set in the threads of ``heads_pool``, whose torch count is one for good.
_pool_thread = threading.local()


@contextmanager
def torch_on_one_thread() -> Iterator[None]:
    """torch's CPU kernels inline on this thread within the block (its count restored after)."""
    if getattr(_pool_thread, "pinned", False):
        yield
        return
    import torch

    torch.get_num_threads()  # ATen sets a thread's count at its first use: before the limit, not inside it
    with _openmp().limit(limits=1):
        yield


def _pin_to_one_thread() -> None:
    import torch

    torch.get_num_threads()
    _openmp().limit(limits=1)  # never restored: the thread belongs to its pool until the process ends
    _pool_thread.pinned = True


class HeadsPool(ThreadPoolExecutor):
    """A pool for head work only: torch runs inline on each of its threads, set once per thread. It keeps, for
    ``/metrics``, the tasks it finished, the seconds they waited for a thread and the seconds they ran: under
    load a head that waits for the pool and one that runs long (the GIL, the cores) look alike from outside."""

    def __init__(self, threads: int, name: str):
        super().__init__(max_workers=threads, thread_name_prefix=name, initializer=_pin_to_one_thread)
        self.name = name
        self._totals_lock = threading.Lock()
        self._tasks = 0
        self._wait_s = 0.0
        self._run_s = 0.0

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:  # map comes here too
        queued = time.perf_counter()

        def timed() -> T:
            started = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                ran = time.perf_counter() - started
                with self._totals_lock:
                    self._tasks += 1
                    self._wait_s += started - queued
                    self._run_s += ran

        return super().submit(timed)

    def totals(self) -> tuple[int, float, float]:
        """Tasks finished, seconds they waited for a thread, seconds they ran, since the pool started."""
        with self._totals_lock:
            return self._tasks, self._wait_s, self._run_s


HEADS_POOLS: weakref.WeakSet[HeadsPool] = weakref.WeakSet()  # the live pools heads_pool made, for /metrics

READOUT_THREADS_VARIABLE = "S1OMNI_READOUT_THREADS"


def readout_threads() -> int:
    """Threads of the pool that runs the heads begun during a forward: ``$S1OMNI_READOUT_THREADS``, else one a core
    this process may use, 4 to 16. A span block's task waits there for its word chunks on another pool, so a task holds
    its thread for several times its CPU time (the 0.8B at 16 clients on an H100: 13.8 ms held, 2.3 ms of CPU), and
    the size bounds the tasks in flight, not the cores used: 4 threads held 13.8 ms by 6 tasks a request serve at
    most 48 requests a second (benchmarks/README.md, ``h100-forward-alone``)."""
    configured = os.environ.get(READOUT_THREADS_VARIABLE)
    if configured is None:
        return max(4, min(16, len(os.sched_getaffinity(0))))
    if not configured.isdecimal() or int(configured) < 1:
        raise UsageError(f"{READOUT_THREADS_VARIABLE} takes a whole number of threads, 1 or more, not {configured!r}")
    return int(configured)


def heads_pool(threads: int, name: str) -> HeadsPool:
    """A new ``HeadsPool``, in ``HEADS_POOLS`` while it lives."""
    pool = HeadsPool(threads, name)
    HEADS_POOLS.add(pool)
    return pool


def gelu(x: np.ndarray) -> np.ndarray:
    """GELU with the exact erf, of a float32 array (a new one): torch's kernel on this thread alone."""
    import torch

    with torch_on_one_thread():
        return torch.nn.functional.gelu(torch.from_numpy(x)).numpy()
