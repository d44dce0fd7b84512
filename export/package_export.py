"""``s1omni export PKG --out DIR``: a verified package becomes the artifacts every engine is built from.

The export directory holds the backbone graphs, the heads as float32 safetensors for the CPU, the
tokenizer, config and calibration, and a manifest pinning every file. Builds read only this
directory, never the package, so engines are reproducible from the exported artifacts alone.
Each family writes its own files (OmniJev's: ``s1omni.export.omnijev_export``); the manifest is common.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from safetensors.numpy import save_file

from s1omni.runtime import progress
from s1omni.runtime.engine import write_manifest
from s1omni.runtime.errors import InputError
from s1omni.runtime.package import VerifiedPackage, verify
from s1omni.runtime.registry import Registry
from s1omni.runtime.staging import staged_directory
from s1omni.runtime.vela2.model import head_tensors, identity_of

from .patches import RECURRENCES

COPIED = ("tokenizer.json", "config.json", "calibration.json")


def export_heads(package: VerifiedPackage, out: Path) -> None:
    """Every head tensor (candidate, set bias, router and broad span heads) as float32."""
    save_file(head_tensors(package), str(out / "heads.safetensors"))


def move_into(directory: Path, target: Path) -> None:
    """Move the files of ``directory`` (an exporter's own atomic output) into ``target`` and remove it."""
    for path in sorted(directory.iterdir()):
        shutil.move(str(path), target / path.name)
    directory.rmdir()


def write_vela2(package: VerifiedPackage, stage: Path, recurrences: tuple[str, ...]) -> dict[str, Any]:
    """The backbone graphs, heads, tokenizer, config and calibration of a Vela 2.0 decoder package."""
    from .onnx_export import export_backbone

    progress.note(f"{package.member.name}: tracing the backbone to ONNX")
    move_into(export_backbone(package.root, stage / "graphs", recurrences=recurrences), stage)
    progress.note(f"{package.member.name}: writing heads and tokenizer")
    export_heads(package, stage)
    for name in COPIED:
        shutil.copyfile(package.root / name, stage / name)
    return {"max_tokens": int(package.details["config"]["max_length"])}


def _writer(family: str) -> Callable[[VerifiedPackage, Path, tuple[str, ...]], dict[str, Any]]:
    if family == "omnijev":
        from .omnijev_export import write_omnijev

        return write_omnijev
    return write_vela2


def export_package(
    package_dir: str | os.PathLike[str],
    out: str | os.PathLike[str],
    registry: Registry | None = None,
    recurrences: tuple[str, ...] = RECURRENCES,
) -> dict[str, Any]:
    """Verify, write the family's graphs, heads and settings, then the manifest; returns the manifest.

    ``recurrences``: the backbone forms to write (``s1omni.export.patches.RECURRENCES``: the portable ``Scan``
    graphs TensorRT parses, ONNX Runtime's fused kernels, or both)."""
    package = verify(package_dir, registry or Registry.load())
    if package.family not in ("vela2", "omnijev"):
        raise InputError(f"no export for the {package.family} family")
    with staged_directory(out, "export") as stage:
        fields = _writer(package.family)(package, stage, recurrences)
        manifest = {
            "family": package.family,
            "member": identity_of(package).__dict__,
            "source": {"package_files": package.files},
            "stage": "export",
            **fields,
        }
        write_manifest(stage, manifest)
    return json.loads((Path(out) / "manifest.json").read_text(encoding="utf-8"))
