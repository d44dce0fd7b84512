"""CUDA builds of the tiny member checked on the CPU: built as a user builds them (``s1omni build``), then
validated with the CPU EP (``LinearAttention`` and every rewritten op have CPU kernels)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from s1omni.runtime.engine import read_manifest, write_manifest
from tests.cli import run_s1omni, s1omni


def cuda_engine_available() -> bool:
    """A CUDA GPU torch sees and ONNX Runtime's CUDA EP (onnxruntime-gpu): the device, not CI."""
    try:
        import onnxruntime
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available() and "CUDAExecutionProvider" in onnxruntime.get_available_providers()


# The GPU tests: marked ``gpu`` (``pytest -m gpu`` on the device) and skipped, saying why, elsewhere.
needs_cuda = pytest.mark.skipif(not cuda_engine_available(), reason="needs a CUDA GPU and onnxruntime-gpu (runs on the device)")


def build_cuda_engine(exported: Path, out: Path, *options: str) -> str:
    """``s1omni build EXPORT --backend onnxruntime --target cuda OPTIONS``; returns its progress (stderr).
    Float32 without CUDA graphs unless ``options`` say otherwise: the CPU EP runs no bfloat16 GEMM."""
    parity = [*(() if "--precision" in options else ("--precision", "fp32")),
              *(() if {"--cuda-graphs", "--no-cuda-graphs"} & set(options) else ("--no-cuda-graphs",))]  # fmt: skip
    return s1omni("build", str(exported), "--backend", "onnxruntime", "--target", "cuda", *parity, *options, "--out", str(out)).stderr


def validate_on_the_cpu(engine: Path, package: Path, report: Path) -> dict[str, Any]:
    """``s1omni validate`` of a CUDA engine whose manifest now points at the CPU; the gate stays the
    engine's (its precision decides it). Returns the report."""
    manifest = read_manifest(engine)
    write_manifest(engine, {**{k: v for k, v in manifest.items() if k != "files"}, "target": "cpu", "device": "cpu", "provider_options": {}})
    run_s1omni("validate", str(engine), "--package", str(package), "--report", str(report))  # a missed gate exits 1
    return json.loads(report.read_text())
