"""Freed host memory stays with the process, so a request's buffers do not fault their pages in afresh.

A request allocates tens of megabytes of short-lived host buffers: an OmniJev screenshot's plan about 21 MB
(the decoded image, its RGB array, the resized image, the float32 patches twice over), a Vela 2.0 request its
hidden states and head inputs. glibc's ``malloc`` serves blocks past its mmap threshold (128 KiB at start,
raised on the fly only up to the largest block freed so far) with fresh ``mmap`` pages and gives them back on
``free``, and trims the heap's top past 128 KiB, so a request may touch its buffers' pages for the first time
again. How often depends on the process's history; an OmniJev JPEG screenshot's plan took 3,288 minor page
faults and a p50 of 24.4 ms under glibc's defaults on the 2-core host here, against 64 and 12.4 ms with this
module's setting (``benchmarks/README.md``, "Where an OmniJev plan goes").

``keep_freed_memory`` sets both thresholds with ``mallopt(3)``: blocks under 32 MiB (glibc's largest mmap
threshold on 64-bit) come from the heaps, and a heap's free top is kept up to 256 MiB. The cost is resident
memory: each heap keeps what its busiest moment held, up to that bound, as jemalloc or tcmalloc would.
Models load through ``s1omni.runtime.api.load_model`` or ``s1omni.runtime.engine.load_engine_model``, which
call it, so ``s1omni serve``, Ray replicas, ``s1omni bench`` and ``s1omni validate`` run with it. It leaves
the allocator alone where the C library is not glibc, where the environment already sets glibc's own malloc
knobs (``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_``, ``glibc.malloc.*`` in ``GLIBC_TUNABLES``), and
where ``S1OMNI_MALLOC=system``.
"""

from __future__ import annotations

import ctypes
import functools
import os
import platform

# mallopt(3) parameters (glibc's malloc.h).
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20  # glibc refuses more on 64-bit (DEFAULT_MMAP_THRESHOLD_MAX)
TRIM_THRESHOLD = 256 << 20
ENVIRONMENT = "S1OMNI_MALLOC"  # "system" leaves glibc's defaults
GLIBC_KNOBS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")


def _left_alone() -> bool:
    """Whether the user or the platform keeps the allocator as it is."""
    if os.environ.get(ENVIRONMENT, "keep") == "system":
        return True
    if any(name in os.environ for name in GLIBC_KNOBS) or "glibc.malloc." in os.environ.get("GLIBC_TUNABLES", ""):
        return True
    return platform.libc_ver()[0] != "glibc"


@functools.cache
def keep_freed_memory() -> bool:
    """Keep freed blocks under 32 MiB and heap tops up to 256 MiB in this process (once); whether it did."""
    if _left_alone():
        return False
    mallopt = ctypes.CDLL(None).mallopt  # the process's own C library
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
