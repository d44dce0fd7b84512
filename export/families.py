"""Each family's export-layer face, under the names of ``s1omni.runtime.families``: the writer of its
export files and how validation feeds, runs and reads its cases (``s1omni.export.case_io``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from s1omni.runtime.families import family
from s1omni.runtime.package import VerifiedPackage

from .case_io import TextCases, VisionCases
from .omnijev_export import write_omnijev
from .vela2_export import write_vela2

Writer = Callable[[VerifiedPackage, Path, tuple[str, ...]], dict[str, Any]]


@dataclass(frozen=True)
class ExportFamily:
    write: Writer  # the family's files into the export stage; returns the manifest fields they add
    cases: TextCases


EXPORT_FAMILIES = {"vela2": ExportFamily(write_vela2, TextCases()), "omnijev": ExportFamily(write_omnijev, VisionCases())}


def export_family(name: str) -> ExportFamily:
    """The export face of family ``name``; ``UnknownFamily`` (the runtime table's) when there is none."""
    return EXPORT_FAMILIES[family(name).name]
