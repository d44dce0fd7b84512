"""Canonical JSON and SHA-256 digests, the identity arithmetic of packages and engines.

Files are hashed side by side (``sha256_files``: ``hashlib`` releases the GIL), and a file this
process writes can be hashed from the very bytes it writes (``StreamDigest``) rather than read back:
``record_written`` keeps that digest for ``pinned_sha256``, which pins files (a manifest being
written) and takes it while the file is the one written, unchanged (same device, inode, size and
modification time; a rename keeps them). Whatever loads a pinned file reads every byte
(``sha256_file``), so a digest recorded in error is refused there, never served.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
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


def sha256_files(paths: Sequence[str | os.PathLike[str]]) -> list[str]:
    """``sha256_file`` of each path, in order, several files at a time (one per core, at most)."""
    if len(paths) < 2:
        return [sha256_file(path) for path in paths]
    with ThreadPoolExecutor(min(len(paths), len(os.sched_getaffinity(0)))) as pool:
        return list(pool.map(sha256_file, paths))


class StreamDigest:
    """The SHA-256 of the bytes a writer writes, in order, computed on a thread of its own while the
    writer goes on: ``update`` waits for the previous buffer only, so one buffer at a time is held."""

    def __init__(self) -> None:
        self._digest = hashlib.sha256()
        self._pool = ThreadPoolExecutor(1)
        self._pending: Future[None] | None = None
        self.size = 0

    def update(self, data: bytes | memoryview) -> None:
        self._wait()
        self._pending = self._pool.submit(self._digest.update, data)
        self.size += memoryview(data).nbytes

    def _wait(self) -> None:
        if self._pending is not None:
            self._pending.result()
            self._pending = None

    def hexdigest(self) -> str:
        """The digest of everything written; no update after it."""
        self._wait()
        self._pool.shutdown()
        return self._digest.hexdigest()


# Digests of files this process wrote, by the file's identity (``_identity``).
_written: dict[tuple[int, int, int, int], str] = {}


def _identity(path: Path) -> tuple[int, int, int, int]:
    status = path.stat()
    return status.st_dev, status.st_ino, status.st_size, status.st_mtime_ns


def record_written(path: str | os.PathLike[str], stream: StreamDigest) -> None:
    """Keep the digest of the file ``path`` that ``stream`` saw written, once its writer has closed it;
    ``ValueError`` if the file holds other than those bytes by size."""
    path = Path(path)
    digest = stream.hexdigest()
    if path.stat().st_size != stream.size:
        raise ValueError(f"{path} holds {path.stat().st_size} bytes where {stream.size} were written and hashed")
    _written[_identity(path)] = digest


def pinned_sha256(paths: Sequence[str | os.PathLike[str]]) -> list[str]:
    """The SHA-256 of each file to pin: the one recorded as it was written where the file is unchanged
    since (``record_written``), else read (``sha256_files``)."""
    known = [_written.get(_identity(Path(path))) for path in paths]
    read = iter(sha256_files([path for path, digest in zip(paths, known, strict=True) if digest is None]))
    return [digest or next(read) for digest in known]
