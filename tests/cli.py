"""The ``s1omni`` CLI as a user runs it: ``python -m s1omni`` in a subprocess of this interpreter."""

from __future__ import annotations

import os
import subprocess
import sys


def run_s1omni(*args: str, env: dict[str, str] | None = None, timeout: float | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``s1omni ARGS`` (with ``env`` over this process's environment) and return what it did, whatever its exit status."""
    command = [sys.executable, "-m", "s1omni", *args]
    return subprocess.run(command, capture_output=True, text=True, env={**os.environ, **(env or {})}, timeout=timeout)


def s1omni(*args: str) -> subprocess.CompletedProcess[str]:
    """Run ``s1omni ARGS``, which must succeed."""
    result = run_s1omni(*args)
    assert result.returncode == 0, f"s1omni {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}"
    return result
