"""``s1omni.runtime.host_memory``: a process that keeps freed memory does not fault a request's buffers in
again, one left alone does, and the user's or the platform's choice is kept. Each case runs in its own
interpreter: the setting is process-wide and set once."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

# Host buffers of an OmniJev screenshot plan's sizes (MiB), each alive while the next is made; minor page faults
# per round after a warm-up round, then whether keep_freed_memory set anything.
ROUNDS = """
import resource, sys
from s1omni.runtime import host_memory
kept = host_memory.keep_freed_memory()
MB = 1 << 20
def request():
    held = [bytearray(6 * MB), bytearray(4 * MB), bytearray(4 * MB)]
    held.append(bytearray(2 * MB)); del held[:2]
    held += [bytearray(7 * MB), bytearray(14 * MB)]
request()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    request()
print(kept, (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 10)
"""
LOADED = """
import sys
from s1omni.runtime import host_memory
from s1omni.runtime.api import load_model
load_model(sys.argv[1])
print(host_memory.keep_freed_memory.cache_info().currsize, host_memory.keep_freed_memory())
"""


def _run(script: str, *args: str, **environment: str) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("S1OMNI_MALLOC", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES")}
    done = subprocess.run([sys.executable, "-c", script, *args], env=env | environment, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def _faults(**environment: str) -> tuple[bool, float]:
    kept, faults = _run(ROUNDS, **environment)
    return kept == "True", float(faults)


GLIBC = platform.libc_ver()[0] == "glibc"
needs_glibc = pytest.mark.skipif(not GLIBC, reason="mallopt is glibc's; this C library is another")


@needs_glibc
def test_kept_memory_is_not_faulted_in_again() -> None:
    """The same rounds fault thousands of pages each under glibc's defaults and (almost) none with the setting:
    the comparison that shows the setting is what makes the difference."""
    kept, faults = _faults()
    left_kept, left_faults = _faults(S1OMNI_MALLOC="system")
    assert kept and not left_kept
    assert faults < 50, faults
    assert left_faults > 1000, left_faults


@needs_glibc
@pytest.mark.parametrize(
    "environment",
    [{"MALLOC_TRIM_THRESHOLD_": "131072"}, {"MALLOC_MMAP_THRESHOLD_": "131072"}, {"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=131072"}],
    ids=["trim", "mmap", "tunables"],
)
def test_the_users_own_malloc_settings_are_kept(environment: dict[str, str]) -> None:
    kept, faults = _faults(**environment)
    assert not kept
    assert faults > 1000, faults  # glibc's own behaviour, the user's thresholds: nothing kept


@needs_glibc
def test_other_glibc_tunables_do_not_stop_it() -> None:
    kept, faults = _faults(GLIBC_TUNABLES="glibc.pthread.rseq=0")
    assert kept and faults < 50


def test_loading_a_model_keeps_freed_memory(tiny_vela) -> None:
    """``load_model`` applies it (once), so every process that serves a model does."""
    calls, kept = _run(LOADED, str(tiny_vela))
    assert calls == "1"
    assert kept == str(GLIBC)
