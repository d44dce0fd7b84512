"""``s1omni build DIR --backend onnxruntime|tensorrt --target ... --out ENG``: an engine from an export.

A build reads only the export directory. ONNX Runtime engines carry the graphs themselves and the
execution provider to run them with (``cpu``, or ``cuda`` with TF32 off, since float32 parity is
measured on them); TensorRT engines carry one plan per graph for one compute capability and library
version. Every engine gets the heads, tokenizer, config, calibration and a manifest that pins them.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Any

import onnx

from runtime.engine import read_stage, write_manifest
from runtime.staging import staged_directory

SHARED_FILES = ("heads.safetensors", "tokenizer.json", "config.json", "calibration.json")
ORT_TARGETS = ("cpu", "cuda")
# Served ranges of the dynamic dimensions: rows of a batch, and token lengths (the member's input limit).
BATCH_RANGE = (1, 8, 64)


def default_engine_dir(manifest: dict[str, Any], backend: str, target: str) -> Path:
    return Path("engines") / manifest["member"]["name"] / backend / target


def _graph_files(export_dir: Path) -> list[str]:
    """The graphs and everything they reference (external weights), i.e. all but the shared files."""
    return sorted(p.name for p in export_dir.iterdir() if p.name not in ("manifest.json", *SHARED_FILES))


def tensorrt_profiles(export_dir: Path, max_tokens: int) -> dict[str, dict[str, tuple[int, int, int]]]:
    """A (min, opt, max) range for every named dynamic dimension of each graph's inputs."""
    profiles: dict[str, dict[str, tuple[int, int, int]]] = {}
    for graph in ("prefill", "continue"):
        model = onnx.load(str(export_dir / f"{graph}.onnx"), load_external_data=False)
        names = {d.dim_param for i in model.graph.input for d in i.type.tensor_type.shape.dim if d.dim_param}
        profiles[graph] = {
            name: BATCH_RANGE if any(k in name for k in ("batch", "block", "rows")) else (1, min(512, max_tokens), max_tokens)
            for name in sorted(names)
        }
    return profiles


def build(export_dir: str | os.PathLike[str], backend: str, target: str, out: str | os.PathLike[str] | None = None) -> Path:
    export_dir = Path(export_dir)
    manifest = read_stage(export_dir, "export")
    out = Path(out) if out else default_engine_dir(manifest, backend, target)
    record: dict[str, Any]
    with staged_directory(out) as stage:
        if backend == "onnxruntime":
            if target not in ORT_TARGETS:
                raise SystemExit(f"s1omni build: ONNX Runtime targets are {', '.join(ORT_TARGETS)}")
            import onnxruntime

            for name in _graph_files(export_dir):
                print(f"build onnxruntime/{target}: copying {name}", file=sys.stderr, flush=True)
                shutil.copyfile(export_dir / name, stage / name)
            record = {
                "backend": "onnxruntime",
                "library": "onnxruntime",
                "library_version": onnxruntime.__version__,
                "target": target,
                "device": target,
                "precision": "fp32",
                "provider_options": {"use_tf32": 0} if target == "cuda" else {},
            }
        elif backend == "tensorrt":
            from .tensorrt_build import build_plans

            max_tokens = int(manifest.get("max_tokens") or 16384)
            record = build_plans(export_dir, stage, target, tensorrt_profiles(export_dir, max_tokens))
            record["device"] = "cuda"
        else:
            raise SystemExit("s1omni build: --backend is onnxruntime or tensorrt")
        for name in SHARED_FILES:
            shutil.copyfile(export_dir / name, stage / name)
        write_manifest(
            stage,
            {
                "stage": "engine",
                "family": manifest["family"],
                "member": manifest["member"],
                "source": {"export_files": manifest["files"], **manifest["source"]},
                "export_dir": str(export_dir.resolve()),
                **record,
                "validation": None,
            },
        )
    return out
