"""Directory outputs that never clobber a user's files: build in a hidden sibling, then rename into place.

``synth`` and ``fetch`` write packages, ``export`` an export directory, ``build`` an engine
directory, all through ``staged_directory``. Before any work starts it looks at the target: an
absent or empty directory, or a previous output of the same kind (recognised by its contents, see
``is_output``), may be replaced; anything else is refused with ``InputError`` and left as it is.
``set_aside`` (the CLI's ``--force``) renames such a directory to a kept sibling instead, so that
nothing of the user's is ever deleted.

A run killed mid-write leaves only a ``.<name>.<pid>.<random>.partial`` directory, which nothing
loads; the next run for the same target removes those whose process is gone (only names of that
exact form, never anything else).
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

from .errors import InputError

# Output kinds and the command that writes each (named in a refusal).
KINDS = {
    "package": "s1omni synth or fetch",
    "export": "s1omni export",
    "backbone": "backbone export (s1omni.export.onnx_export)",
    "engine": "s1omni build",
    "reference": "s1omni validate (a reference record)",
}
_STAGE_SUFFIXES = (".partial", ".old")
BACKBONE_RECORD = "export.json"
REFERENCE_FILES = ("answers.json", "hidden.json")  # a reference record: its answers and its hidden states


def is_output(path: Path, kind: str) -> bool:
    """Whether ``path`` holds nothing but a previous output of ``kind``: a package of a known family
    holding only the files its layout names; an export or engine directory whose ``manifest.json`` has
    that stage and pins every other file; a backbone export of graphs and the weights its record names."""
    from .engine import MANIFEST, read_manifest
    from .package import layout_files, present_files, read_json

    try:
        present = set(present_files(path))
        if kind == "package":
            return present <= layout_files(path)
        if kind == "reference":
            return present <= set(REFERENCE_FILES)
        if kind == "backbone":
            weights = read_json(path / BACKBONE_RECORD).get("weights") or []
            weights = [weights] if isinstance(weights, str) else weights  # one file's name, before format 3
            return all(name.endswith(".onnx") or name in (BACKBONE_RECORD, *weights) for name in present)
        manifest = read_manifest(path)
    except (OSError, ValueError):  # PackageError among them: not a readable output of this kind
        return False
    return manifest.get("stage") == kind and present - {MANIFEST} <= set(manifest.get("files") or {})


def _replaceable(target: Path, kind: str) -> bool:
    if not target.exists() and not target.is_symlink():
        return True
    if target.is_symlink() or not target.is_dir():
        return False
    return not any(target.iterdir()) or is_output(target, kind)


def check_output(target: str | os.PathLike[str], kind: str) -> None:
    """Refuse ``target`` unless it is absent, empty or a previous ``kind`` output (``InputError``)."""
    target = Path(target)
    if kind not in KINDS:
        raise ValueError(f"unknown output kind {kind!r}")
    if not _replaceable(target, kind):
        what = f"holds something other than a previous {KINDS[kind]} output" if target.is_dir() else "is not a directory"
        raise InputError(f"{target} {what}; choose another --out, or pass --force to keep it under a new name and write here")


def set_aside(target: str | os.PathLike[str], kind: str) -> Path | None:
    """Rename ``target`` to ``<target>.kept-<UTC time>`` unless ``staged_directory`` may replace it;
    the new path, or None when nothing was moved."""
    target = Path(target)
    if _replaceable(target, kind):
        return None
    kept = target.with_name(f"{target.name}.kept-{datetime.now(UTC).strftime('%Y%m%dT%H%M%S.%fZ')}")
    os.rename(target, kept)
    return kept


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return True


def clear_stale_stages(target: Path) -> list[Path]:
    """Remove the staging directories a killed run for ``target`` left behind; those removed."""
    pattern = re.compile(rf"\.{re.escape(target.name)}\.(\d+)\.[A-Za-z0-9_]{{8}}(?:{'|'.join(map(re.escape, _STAGE_SUFFIXES))})")
    removed = []
    if not target.parent.is_dir():
        return removed
    for entry in target.parent.iterdir():
        found = pattern.fullmatch(entry.name)
        if found and entry.is_dir() and not entry.is_symlink() and not _alive(int(found.group(1))):
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry)
    return removed


def _sibling(target: Path, suffix: str) -> Path:
    return Path(tempfile.mkdtemp(prefix=f".{target.name}.{os.getpid()}.", suffix=suffix, dir=target.parent))


@contextmanager
def staged_directory(target: str | os.PathLike[str], kind: str) -> Iterator[Path]:
    """Yield an empty staging directory that replaces ``target`` when the block succeeds.

    ``target`` is checked first (``check_output``), so a refusal costs no work."""
    target = Path(target)
    check_output(target, kind)
    target.parent.mkdir(parents=True, exist_ok=True)
    clear_stale_stages(target)
    stage = _sibling(target, ".partial")
    umask = os.umask(0)
    os.umask(umask)
    stage.chmod(0o777 & ~umask)  # mkdtemp makes 0700; the result is an ordinary directory
    try:
        yield stage
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    if not _replaceable(target, kind):  # something else took the name while this ran
        shutil.rmtree(stage, ignore_errors=True)
        check_output(target, kind)
    if target.exists() or target.is_symlink():
        retired = _sibling(target, ".old")
        os.replace(target, retired / "previous")
        os.replace(stage, target)
        shutil.rmtree(retired, ignore_errors=True)
    else:
        os.replace(stage, target)
