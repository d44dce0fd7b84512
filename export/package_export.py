"""``s1omni export PKG --out DIR``: a verified package becomes the artifacts every engine is built from.

The export directory holds the backbone graphs, the heads as float32 safetensors for the CPU, the
tokenizer, config and calibration, and a manifest pinning every file. Builds read only this
directory, never the package, so engines are reproducible from the exported artifacts alone.
Each family writes its own files (its writer in ``s1omni.export.families``); the manifest is common.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from s1omni.runtime import progress
from s1omni.runtime.engine import write_manifest
from s1omni.runtime.identity import identity_of
from s1omni.runtime.package import verify
from s1omni.runtime.registry import Registry
from s1omni.runtime.staging import check_output, staged_directory

from . import workers
from .families import export_family
from .naming import GRAPHS


def export_package(
    package_dir: str | os.PathLike[str],
    out: str | os.PathLike[str],
    registry: Registry | None,
    recurrences: tuple[str, ...],
) -> dict[str, Any]:
    """Verify, write the family's graphs, heads and settings, then the manifest; returns the manifest.

    ``recurrences``: the backbone forms to write (``s1omni.export.naming.RECURRENCES``: the portable ``Scan``
    graphs TensorRT parses, ONNX Runtime's fused kernels, or both)."""
    started = time.perf_counter()
    check_output(out, "export")  # an --out it may not replace is refused before any work
    # The tracing workers (a prefill, a continue and a packed graph per form) start first, before the package is
    # verified and this process imports torch and the exporter itself: their imports run beside those
    # rather than after them (a package that fails verification stops them at once).
    with workers.started(len(GRAPHS) * len(recurrences)):
        with progress.timed(f"verified {package_dir}") as verification:
            package = verify(package_dir, registry or Registry.load())
            verification.detail = f" ({package.member.name}, {len(package.files)} files hashed)"
        with progress.timed("imported torch and the exporter"):
            write = export_family(package.family).load_writer()
        with staged_directory(out, "export") as stage:
            with progress.timed(f"{package.member.name}: wrote the export files"):
                fields = write(package, stage, recurrences)
            manifest = {
                "family": package.family,
                "member": identity_of(package).__dict__,
                "source": {"package_files": package.files},
                "stage": "export",
                **fields,
            }
            with progress.timed("pinned the export's files in manifest.json"):
                write_manifest(stage, manifest)
    progress.note(f"exported {package.member.name} in {time.perf_counter() - started:.1f} s")
    return json.loads((Path(out) / "manifest.json").read_text(encoding="utf-8"))
