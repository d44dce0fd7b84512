"""Canonical JSON and SHA-256 digests, the identity arithmetic of packages and engines."""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any, BinaryIO

CHUNK = 8 << 20
# Files at least this large report hashing progress on a terminal.
PROGRESS_BYTES = 256 << 20


def canonical_json(value: Any) -> str:
    """Keys sorted, no spaces, non-ASCII kept, NaN refused (the packages' canonical form)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def sha256_json(value: Any) -> str:
    return hashlib.sha256(canonical_json(value).encode("utf-8")).hexdigest()


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _stream(handle: BinaryIO, size: int, label: str) -> str:
    digest = hashlib.sha256()
    show = size >= PROGRESS_BYTES and sys.stderr.isatty()
    done = 0
    while chunk := handle.read(CHUNK):
        digest.update(chunk)
        done += len(chunk)
        if show:
            print(f"\rhashing {label}: {done * 100 // size:3d}%", end="", file=sys.stderr, flush=True)
    if show:
        print(file=sys.stderr)
    return digest.hexdigest()


def sha256_file(path: str | os.PathLike[str]) -> str:
    """The file's SHA-256, read in 8 MiB chunks (progress on a terminal for large files)."""
    path = Path(path)
    with path.open("rb") as handle:
        return _stream(handle, path.stat().st_size, path.name)
