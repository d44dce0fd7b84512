"""The member registry: pins as data.

Built-in members live in the JSON files beside this module. A registry file (``--registry FILE`` or
the ``S1OMNI_REGISTRY`` environment variable) holds further members in the same format and is merged
over the built-in ones by name; private and synthetic members are added that way, never by code.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import PackageError

FORMAT = "s1omni-registry/1"
ENVIRONMENT = "S1OMNI_REGISTRY"
HOME_ENVIRONMENT = "S1OMNI_HOME"
BUILTIN = tuple(sorted(Path(__file__).parent.glob("*.json")))


@dataclass(frozen=True)
class Member:
    """One registry entry. ``files`` maps every pinned file name to its SHA-256."""

    name: str
    family: str
    repo: str
    revision: str
    files: dict[str, str] = field(default_factory=dict)
    model_sha256: str = ""
    manifest_sha256: str = ""
    loaded_parameters: int | None = None
    max_input_tokens: int | None = None
    licence: str = "unknown"
    synthetic: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, entry: dict[str, Any]) -> Member:
        known = {name for name in cls.__dataclass_fields__ if name != "extra"}
        missing = {"name", "family", "repo", "revision"} - set(entry)
        if missing:
            raise PackageError(f"registry entry {entry.get('name')!r} lacks {sorted(missing)}")
        for name in entry.get("files", {}):
            if not _plain_relative(name):
                raise PackageError(f"registry entry {entry['name']!r} pins a path outside the package: {name!r}")
        return cls(
            **{key: value for key, value in entry.items() if key in known},
            extra={key: value for key, value in entry.items() if key not in known},
        )

    def consents_to(self, copy: str, device: str) -> bool:
        """Whether the entry lets a reduced copy (``fp8``) of the member serve ``max_speed`` on ``device``:
        ``"reduced_copies": {"fp8": ["cuda"]}`` (``s1omni.runtime.reduced_copy``)."""
        copies = self.extra.get("reduced_copies")
        return isinstance(copies, dict) and isinstance(copies.get(copy), list) and device in copies[copy]

    def to_dict(self) -> dict[str, Any]:
        out = {name: getattr(self, name) for name in self.__dataclass_fields__ if name != "extra"}
        return {**out, **self.extra}


def home() -> Path:
    """Where s1omni keeps its own files (the demo member, the user registry): ``$S1OMNI_HOME``."""
    return Path(os.environ.get(HOME_ENVIRONMENT) or Path.home() / ".cache" / "s1omni")


def user_registry(explicit: str | os.PathLike[str] | None = None) -> Path:
    """The registry file merged over the built-in one: ``explicit``, ``$S1OMNI_REGISTRY`` or the home's."""
    return Path(explicit or os.environ.get(ENVIRONMENT) or home() / "registry.json")


def _plain_relative(name: str) -> bool:
    path = Path(name)
    return bool(name) and not path.is_absolute() and ".." not in path.parts and "\\" not in name


def _read(path: Path) -> list[dict[str, Any]]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise PackageError(f"cannot read registry {path}: {exc}") from exc
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("members"), list):
        raise PackageError(f"{path} is not an {FORMAT} registry file")
    return data["members"]


@dataclass(frozen=True)
class Registry:
    members: dict[str, Member]

    @classmethod
    def load(cls, extra: str | os.PathLike[str] | None = None) -> Registry:
        """The built-in members, then those of the user registry (``user_registry(extra)``) over them."""
        members: dict[str, Member] = {}
        paths: list[Path] = list(BUILTIN)
        extra_path = user_registry(extra)
        if extra_path.exists():
            paths.append(extra_path)
        for path in paths:
            for entry in _read(path):
                member = Member.from_dict(entry)
                members[member.name] = member
        return cls(members)

    def get(self, name: str) -> Member | None:
        return self.members.get(name)

    def by_identity(self, model_sha256: str) -> Member | None:
        return next((m for m in self.members.values() if m.model_sha256 and m.model_sha256 == model_sha256), None)

    def __iter__(self):
        return iter(self.members.values())


def write_entry(path: str | os.PathLike[str], member: Member) -> None:
    """Add or replace ``member`` in the registry file at ``path`` (created if absent), atomically."""
    path = Path(path)
    entries = [e for e in _read(path) if e.get("name") != member.name] if path.exists() else []
    entries.append(member.to_dict())
    entries.sort(key=lambda e: e["name"])
    path.parent.mkdir(parents=True, exist_ok=True)
    body = json.dumps({"format": FORMAT, "members": entries}, indent=2, ensure_ascii=False) + "\n"
    with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, encoding="utf-8", suffix=".tmp") as tmp:
        tmp.write(body)
    os.replace(tmp.name, path)
