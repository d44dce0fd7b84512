"""Canonical JSON and SHA-256 digests, the identity arithmetic of packages and engines."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, BinaryIO

from . import progress

CHUNK = 8 << 20
# Files at least this large show a hashing bar (on a terminal).
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
    with progress.bar(size, f"hashing {label}", "B", unit_scale=True, shown=size >= PROGRESS_BYTES) as hashed:
        while chunk := handle.read(CHUNK):
            digest.update(chunk)
            hashed.update(len(chunk))
    return digest.hexdigest()


def sha256_file(path: str | os.PathLike[str]) -> str:
    """The file's SHA-256, read in 8 MiB chunks (a bar on a terminal for large files)."""
    path = Path(path)
    with path.open("rb") as handle:
        return _stream(handle, path.stat().st_size, path.name)
