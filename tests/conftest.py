"""Shared fixtures: a private s1omni home and registry, and synthetic members (and the tiny one's export and
its engines) made once per session."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest

from s1omni.runtime.runners.qwen3_5 import modeling
from tests.cli import s1omni
from tests.members import make_vela_member

# Before any test module imports transformers' Qwen3.5 module: imported as the package imports it (its torch
# Gated DeltaNet functions, where flash-linear-attention is installed too).
modeling()

# Tests never touch the user's ~/.cache/s1omni: every registry write goes to a session home.
_HOME = Path(tempfile.mkdtemp(prefix="s1omni-tests-"))
os.environ["S1OMNI_HOME"] = str(_HOME)
os.environ.pop("S1OMNI_REGISTRY", None)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    shutil.rmtree(_HOME, ignore_errors=True)


@pytest.fixture(scope="session")
def s1omni_home() -> Path:
    return _HOME


@pytest.fixture(scope="session")
def tiny_vela(s1omni_home: Path) -> Path:
    """The tiny synthetic Vela 2.0 member (seed 0), verified by the gate whenever it is loaded."""
    return make_vela_member(s1omni_home / "vela2-tiny")


@pytest.fixture(scope="session")
def tiny_model(tiny_vela: Path):
    """The tiny member on the torch reference runner."""
    from s1omni.runtime.api import load_model

    return load_model(tiny_vela)


@pytest.fixture(scope="session")
def exported(tiny_vela: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny member exported as a user does (``s1omni export``: both recurrences, weights inside the graphs);
    what it printed is kept beside it, in ``export.stderr``."""
    out = tmp_path_factory.mktemp("export") / "tiny"
    result = s1omni("export", str(tiny_vela), "--out", str(out))
    (out.parent / "export.stderr").write_text(result.stderr, encoding="utf-8")
    return out


@pytest.fixture(scope="session")
def external_export(tiny_vela: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny member's fused graphs with every weight outside them, as a real-size member's export keeps them
    (the bf16 and fp8 GEMM rewrites' one-file-for-both-graphs path)."""
    from s1omni.export.onnx_export import export_model, load_package_backbone

    out = tmp_path_factory.mktemp("external") / "export"
    return export_model(load_package_backbone(tiny_vela), out, external_data_bytes=0, check=False, recurrences=("fused",))


@pytest.fixture(scope="session")
def cpu_engine(exported: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``exported``'s ONNX Runtime CPU engine (``s1omni build``), validated by ``cpu_validation``. Shared, so
    read only: a test that changes it changes a copy."""
    out = tmp_path_factory.mktemp("engine") / "ort-cpu"
    s1omni("build", str(exported), "--backend", "onnxruntime", "--target", "cpu", "--out", str(out))
    return out


@pytest.fixture(scope="session")
def cpu_validation(cpu_engine: Path, tiny_vela: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str], dict]:
    """``s1omni validate`` of ``cpu_engine`` over every calibration case (exit 0 asserted) and its report;
    once it has run, the engine is servable."""
    report = tmp_path_factory.mktemp("validation") / "report.json"
    result = s1omni("validate", str(cpu_engine), "--package", str(tiny_vela), "--report", str(report))
    return result, json.loads(report.read_text())


@pytest.fixture(scope="session")
def cuda_engine(exported: Path, tmp_path_factory: pytest.TempPathFactory) -> Callable[..., tuple[Path, str]]:
    """``tests.cuda_builds.build_cuda_engine`` of ``exported``, built once per list of options for the whole
    session: ``cuda_engine(*options)`` gives (the engine, its build's progress). Shared, so read only: a
    test that changes an engine (its manifest, a graph) changes a copy."""
    from tests.cuda_builds import build_cuda_engine

    built: dict[tuple[str, ...], tuple[Path, str]] = {}

    def engine(*options: str) -> tuple[Path, str]:
        if options not in built:
            out = tmp_path_factory.mktemp("cuda-engine") / "engine"
            built[options] = out, build_cuda_engine(exported, out, *options)
        return built[options]

    return engine


@pytest.fixture(scope="session")
def gpu_library(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The engine's op library for this GPU (``s1omni.export.gdn_library``) with the tiny member's Gated DeltaNet
    head shape (4 of 16 x 16) and the members' (128 x 128), the SiLU product, residual norms for rows up to 64,
    1,024 and 4,096 wide (the tiny member's, the 0.8B's and the 9B's hidden sizes), the short convolution of the
    members' 4 taps, the convolution writing q, k and v for the tiny member's heads (16, each twice), the 0.8B's
    (128) and the 4B's (128, each twice), the output norms of heads of 16 (the tiny member's) and 128 (the members'),
    and the attention's head norms and rotary embeddings of heads of 32 and 256; GPU tests only."""
    from s1omni.export.gdn_library import build_library
    from s1omni.runtime.runners.tensorrt_runner import device_compute_capability

    out = tmp_path_factory.mktemp("gdn-gpu")
    build_library(out, [(4, 16, 16), (4, 128, 128)], int(device_compute_capability().removeprefix("sm_")), norm_widths=[64, 1024, 4096],
                  convolution_sizes=[4], heads=[(4, 16, 2), (4, 128, 1), (4, 128, 2)], output_widths=[16, 128], rotary_widths=[32, 256])
    return out
