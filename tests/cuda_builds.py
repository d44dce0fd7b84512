"""CUDA builds of the tiny member checked on the CPU: built as a user builds them (``s1omni build``), then
validated with the CPU EP (``LinearAttention`` and every rewritten op have CPU kernels)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from runtime.engine import read_manifest, write_manifest


def build_cuda_engine(exported: Path, out: Path, *options: str) -> str:
    """``s1omni build EXPORT --backend onnxruntime --target cuda OPTIONS``; returns its progress (stderr)."""
    command = [sys.executable, "-m", "server.cli", "build", str(exported), "--backend", "onnxruntime", "--target", "cuda"]
    result = subprocess.run([*command, *options, "--out", str(out)], capture_output=True, text=True, env=os.environ)
    assert result.returncode == 0, result.stderr
    return result.stderr


def validate_on_the_cpu(engine: Path, package: Path, report: Path) -> dict[str, Any]:
    """``s1omni validate`` of a CUDA engine whose manifest now points at the CPU; the gate stays the
    engine's (its precision decides it). Returns the report."""
    manifest = read_manifest(engine)
    write_manifest(engine, {**{k: v for k, v in manifest.items() if k != "files"}, "target": "cpu", "device": "cpu", "provider_options": {}})
    command = [sys.executable, "-m", "server.cli", "validate", str(engine), "--package", str(package), "--report", str(report)]
    subprocess.run(command, capture_output=True, text=True, env=os.environ)
    return json.loads(report.read_text())
