"""Atomic directory outputs: build in a hidden sibling, then rename into place.

A process killed mid-write leaves only a ``.<name>.*.partial`` directory, which nothing loads.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def staged_directory(target: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield an empty staging directory that replaces ``target`` when the block succeeds."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".partial", dir=target.parent))
    umask = os.umask(0)
    os.umask(umask)
    stage.chmod(0o777 & ~umask)  # mkdtemp makes 0700; the result is an ordinary directory
    try:
        yield stage
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    if target.exists() or target.is_symlink():
        retired = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".old", dir=target.parent))
        os.replace(target, retired / "previous")
        os.replace(stage, target)
        shutil.rmtree(retired, ignore_errors=True)
    else:
        os.replace(stage, target)
