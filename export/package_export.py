"""``s1omni export PKG --out DIR``: a verified package becomes the artifacts every engine is built from.

The export directory holds the backbone graphs, the heads as float32 safetensors for the CPU, the
tokenizer, config and calibration, and a manifest pinning every file. Builds read only this
directory, never the package, so engines are reproducible from the exported artifacts alone.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from safetensors.numpy import save_file

from runtime.engine import write_manifest
from runtime.package import VerifiedPackage, verify
from runtime.registry import Registry
from runtime.staging import staged_directory
from runtime.vela2.heads import read_tensors
from runtime.vela2.model import HEAD_PREFIXES, identity_of

COPIED = ("tokenizer.json", "config.json", "calibration.json")


def export_heads(package: VerifiedPackage, out: Path) -> None:
    """Every head tensor (candidate, set bias, router and broad span heads) as float32."""
    shards = [package.root / name for name in package.details["shards"]]
    tensors = read_tensors(shards, HEAD_PREFIXES)
    if package.details["broad_head"]:
        tensors |= read_tensors([package.root / "broad_head.safetensors"], ("span_broad.",))
    save_file({name: value.astype("float32") for name, value in tensors.items()}, str(out / "heads.safetensors"))


def export_package(package_dir: str | os.PathLike[str], out: str | os.PathLike[str], registry: Registry | None = None) -> dict[str, Any]:
    """Verify, trace the backbone to ONNX, write the heads and the manifest; returns the manifest."""
    from .onnx_export import export_backbone

    package = verify(package_dir, registry or Registry.load())
    if package.family != "vela2":
        raise SystemExit(f"s1omni export: the {package.family} family exports with its own stage")
    identity = identity_of(package)
    with staged_directory(out) as stage:
        print(f"export {identity.name}: tracing the backbone to ONNX", file=sys.stderr, flush=True)
        graphs = export_backbone(package.root, stage / "graphs")
        for path in sorted(Path(graphs).iterdir()):
            shutil.move(str(path), stage / path.name)
        (stage / "graphs").rmdir()
        print(f"export {identity.name}: writing heads and tokenizer", file=sys.stderr, flush=True)
        export_heads(package, stage)
        for name in COPIED:
            shutil.copyfile(package.root / name, stage / name)
        manifest = {
            "family": package.family,
            "member": identity.__dict__,
            "source": {"package_files": package.files},
            "stage": "export",
            "max_tokens": int(package.details["config"]["max_length"]),
        }
        write_manifest(stage, manifest)
    return json.loads((Path(out) / "manifest.json").read_text(encoding="utf-8"))
