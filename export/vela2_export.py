"""What ``s1omni export`` writes for a Vela 2.0 decoder package (the rest of the export is
``s1omni.export.package_export``'s): the backbone graphs, the heads as float32 safetensors, the
tokenizer, config and calibration."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from safetensors.numpy import save_file

from s1omni.runtime import progress
from s1omni.runtime.package import VerifiedPackage
from s1omni.runtime.vela2.model import head_tensors

from .onnx_export import export_backbone, move_into

COPIED = ("tokenizer.json", "config.json", "calibration.json")


def export_heads(package: VerifiedPackage, out: Path) -> None:
    """Every head tensor (candidate, set bias, router and broad span heads) as float32."""
    save_file(head_tensors(package), str(out / "heads.safetensors"))


def write_vela2(package: VerifiedPackage, stage: Path, recurrences: tuple[str, ...]) -> dict[str, Any]:
    """The backbone graphs, heads, tokenizer, config and calibration of a Vela 2.0 decoder package."""
    progress.note(f"{package.member.name}: tracing the backbone to ONNX")
    move_into(export_backbone(package.root, stage / "graphs", recurrences=recurrences), stage)
    with progress.timed(f"{package.member.name}: wrote heads and tokenizer"):
        export_heads(package, stage)
        for name in COPIED:
            shutil.copyfile(package.root / name, stage / name)
    return {"max_tokens": int(package.details["config"]["max_length"])}
