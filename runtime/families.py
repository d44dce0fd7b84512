"""The model families: one ``Family`` face each, in the one table generic code looks a family up in.

A face gives what the layers below the server ask of a family: its package gate, its model from a
verified package or from an engine directory, and its synthetic member writer (the golden request
is the model's own, ``DecisionModel.golden_request``). The parts are the family's modules by
convention (``s1omni.runtime.<name>.package`` ``GATE``, ``.model``, ``.engine`` ``load_engine``,
``s1omni.runtime.synth.<name>``), imported only when asked for, so serving one family never imports
another and this table imports no family. The export and server layers keep their own faces under
the same names (``s1omni.export.families``, ``s1omni.server.families``). A name this table does not
hold is refused with ``UnknownFamily`` wherever it is looked up.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from .errors import PackageError

if TYPE_CHECKING:
    from .api import DecisionModel
    from .package import FamilyGate, VerifiedPackage


class UnknownFamily(PackageError):
    """A family name (of a package, an engine manifest or a command) that no face is registered for."""

    def __init__(self, name: object):
        super().__init__(f"no model family {name!r}; the families are {', '.join(FAMILIES)}")


@dataclass(frozen=True)
class Family:
    name: str  # the ``family`` of its registry members, manifests and models
    model: str  # its DecisionModel class in ``s1omni.runtime.<name>.model``
    images: bool  # its requests carry an image

    def _part(self, module: str) -> ModuleType:
        return importlib.import_module(f"s1omni.runtime.{self.name}.{module}")

    def gate(self) -> FamilyGate:
        return self._part("package").GATE

    def from_package(self, package: VerifiedPackage, device: str = "cpu", precision: str | None = None) -> DecisionModel:
        """The torch reference model over a verified package."""
        return getattr(self._part("model"), self.model).from_package(package, device=device, precision=precision)

    def from_engine(self, path: Path, manifest: dict[str, Any], device: str = "cpu") -> DecisionModel:
        """The model over an engine whose manifest has been read and its files checked."""
        return self._part("engine").load_engine(path, manifest, device)

    def synth(self) -> ModuleType:
        """The synthetic member writer: ``SIZES`` and ``write(out, size, seed) -> Member``."""
        return importlib.import_module(f"s1omni.runtime.synth.{self.name}")


FAMILIES = {face.name: face for face in (Family("vela2", "Vela2Model", images=False), Family("omnijev", "OmniJevModel", images=True))}


def family(name: object) -> Family:
    """The face of family ``name``; ``UnknownFamily`` when there is none."""
    face = FAMILIES.get(name) if isinstance(name, str) else None
    if face is None:
        raise UnknownFamily(name)
    return face
