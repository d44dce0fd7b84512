"""Each family's export-layer face, under the names of ``s1omni.runtime.families``: the writer of its
export files and how validation feeds, runs and reads its cases (``s1omni.export.case_io``)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from s1omni.runtime.families import family
from s1omni.runtime.package import VerifiedPackage

from .case_io import TextCases, VisionCases


@dataclass(frozen=True)
class ExportFamily:
    writer: str  # "module:function" writing the family's files, imported when it writes: the exporters
    # import torch and transformers, which validation does not need
    cases: TextCases

    def load_writer(self) -> Callable[[VerifiedPackage, Path, tuple[str, ...]], dict[str, Any]]:
        """The function writing the family's files into an export stage (``package, stage, recurrences``)
        and returning the manifest fields they add; importing it imports torch and the exporter."""
        module, _, function = self.writer.partition(":")
        return getattr(importlib.import_module(module), function)


EXPORT_FAMILIES = {
    "vela2": ExportFamily("s1omni.export.vela2_export:write_vela2", TextCases()),
    "omnijev": ExportFamily("s1omni.export.omnijev_export:write_omnijev", VisionCases()),
}


def export_family(name: str) -> ExportFamily:
    """The export face of family ``name``; ``UnknownFamily`` (the runtime table's) when there is none."""
    return EXPORT_FAMILIES[family(name).name]
