"""The package gate: a member package is loaded only after every byte of it is accounted for.

The gate refuses symbolic links, paths that leave the package, unpinned extra files (a
``__pycache__`` included), missing files and any file whose SHA-256 differs from its pin; then the
family checks its own manifest, identity and parameter count. Tensors are only ever read from
safetensors files (no pickle) and no bundled Python is imported.
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from . import families
from .digest import sha256_file, sha256_files
from .errors import PackageError
from .registry import Member, Registry

SUMS_FILE = "SHA256SUMS"


class FamilyGate(Protocol):
    """What a family tells the generic gate about its packages."""

    def detect(self, root: Path) -> bool: ...

    def claimed_name(self, root: Path) -> str | None: ...

    def loaded_files(self, root: Path) -> list[str]: ...

    def identity(self, root: Path, files: dict[str, str]) -> str: ...

    def match(self, root: Path, registry: Registry) -> Member | None:
        """The registry member a package declares itself to be, beyond a claimed name (None: no claim)."""
        ...

    def pins(self, root: Path, member: Member, files: dict[str, str]) -> dict[str, str]:
        """Every file the package must hold, with its SHA-256 (a member's own pins, or a self-pinning manifest's)."""
        ...

    def check(self, root: Path, files: dict[str, str], member: Member) -> dict[str, Any]: ...


@dataclass(frozen=True)
class VerifiedPackage:
    """A package whose files all match their pins, with what the family read while checking it."""

    root: Path
    member: Member
    files: dict[str, str]
    model_sha256: str
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def family(self) -> str:
        return self.member.family


def detect_family(root: Path) -> str:
    for face in families.FAMILIES.values():
        try:
            gate = face.gate()
        except ModuleNotFoundError:
            continue
        if gate.detect(root):
            return face.name
    raise PackageError(f"{root} is not a package of a known family ({', '.join(families.FAMILIES)})")


def layout_files(root: Path) -> set[str]:
    """The files a package of ``root``'s family may hold, by name (nothing is hashed): what its gate
    loads, and ``SHA256SUMS``. ``PackageError`` when ``root`` is no package of a known family."""
    return {*families.family(detect_family(root)).gate().loaded_files(root), SUMS_FILE}


def inside(root: Path, name: str) -> bool:
    """Whether ``name`` is a plain relative path that stays inside ``root``."""
    if not name or Path(name).is_absolute() or "\\" in name or ".." in Path(name).parts:
        return False
    return (root / name).resolve().is_relative_to(root.resolve())


def present_files(root: Path) -> list[str]:
    """Every regular file below ``root`` (relative, sorted); symlinks and special files are refused."""
    if root.is_symlink():
        raise PackageError(f"{root} is a symbolic link")
    if not root.is_dir():
        raise PackageError(f"{root} is not a directory")
    found = []
    for directory, dirs, names in os.walk(root, followlinks=False):
        for name in sorted(dirs + names):
            path = Path(directory) / name
            relative = path.relative_to(root).as_posix()
            mode = path.lstat().st_mode
            if stat.S_ISLNK(mode):
                raise PackageError(f"{relative} is a symbolic link; packages hold plain files only")
            if stat.S_ISREG(mode):
                found.append(relative)
            elif not stat.S_ISDIR(mode):
                raise PackageError(f"{relative} is not a regular file")
    return sorted(found)


def read_sums(root: Path) -> dict[str, str]:
    """``SHA256SUMS`` as {name: digest}; ``*name`` and one- or two-space separators are accepted."""
    path = root / SUMS_FILE
    if not path.is_file():
        return {}
    sums = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        digest, _, name = line.strip().partition(" ")
        name = name.strip().lstrip("*")
        if digest and name:
            sums[name] = digest.lower()
    return sums


def read_json(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise PackageError(f"{path.name} is missing") from exc
    except (OSError, ValueError) as exc:
        raise PackageError(f"{path.name} is not valid JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise PackageError(f"{path.name} is not a JSON object")
    return value


def _identify(gate: FamilyGate, root: Path, registry: Registry, identity: str, files: dict[str, str]) -> Member:
    """The registry member a package is: by the name its config claims, by what its manifest
    declares, else by its weights' identity."""
    claimed = gate.claimed_name(root)
    if claimed is not None and registry.get(claimed) is not None:
        return registry.get(claimed)  # type: ignore[return-value]
    declared = gate.match(root, registry)
    if declared is not None:
        return declared
    match = registry.by_identity(identity)
    if match is not None and (claimed is None or all(match.files.get(n) == d for n, d in files.items())):
        return match
    if claimed is not None:
        raise PackageError(f"config.json names member {claimed!r}, which the registry does not have")
    raise PackageError("the package names no member and its weights match no registry entry")


def _compare_pins(member: Member, pins: dict[str, str], root: Path, files: dict[str, str], present: list[str]) -> None:
    allowed = set(pins) | {SUMS_FILE}
    extra = [name for name in present if name not in allowed]
    if extra:
        raise PackageError(f"{extra[0]} is not pinned for {member.name}; packages hold only pinned files")
    missing = sorted(set(pins) - set(present))
    if missing:
        raise PackageError(f"{missing[0]} is missing from {member.name}@{member.revision}")
    for name, digest in sorted(pins.items()):
        actual = files.get(name) or sha256_file(root / name)
        if actual != digest:
            raise PackageError(f"{name} differs from {member.name}@{member.revision}: sha256 {actual} != pinned {digest}")


def verify(root: str | os.PathLike[str], registry: Registry | None = None, family: str | None = None) -> VerifiedPackage:
    """Verify the package at ``root`` against the registry; ``PackageError`` names what is wrong."""
    root = Path(root)
    registry = registry or Registry.load()
    present = present_files(root)
    gate = families.family(family or detect_family(root)).gate()
    loaded = gate.loaded_files(root)
    for name in loaded:
        if not inside(root, name):
            raise PackageError(f"{name!r} leaves the package directory")
    missing = [name for name in loaded if name not in present]
    if missing:
        raise PackageError(f"{missing[0]} is missing")
    files = dict(zip(loaded, sha256_files([root / name for name in loaded]), strict=True))
    identity = gate.identity(root, files)
    member = _identify(gate, root, registry, identity, files)
    _compare_pins(member, gate.pins(root, member, files), root, files, present)
    sums = read_sums(root)
    for name, digest in files.items():
        if name in sums and sums[name] != digest:
            raise PackageError(f"{name} differs from {SUMS_FILE}")
    if member.model_sha256 and identity != member.model_sha256:
        raise PackageError(f"identity {identity} differs from {member.name}'s pinned {member.model_sha256}")
    details = gate.check(root, files, member)
    return VerifiedPackage(root=root, member=member, files=files, model_sha256=identity, details=details)
