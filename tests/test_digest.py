"""Digests taken as a file is written, and what trusts them: pinning does, loading never does."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, numpy_helper

from s1omni.export import graph_weights
from s1omni.export.graph_weights import WEIGHTS_FILE, Binding, SharedWeights
from s1omni.export.naming import ALIGNMENT
from s1omni.runtime.digest import StreamDigest, pinned_sha256, record_written, sha256_file, sha256_files
from s1omni.runtime.engine import read_manifest, verify_files, write_manifest
from s1omni.runtime.errors import PackageError


def _weights(directory: Path) -> Path:
    """``weights.data`` as an export writes it: an aligned large tensor, a small one, a repeated one."""
    shared = SharedWeights(directory)
    large = np.arange(ALIGNMENT // 2, dtype=np.float32)  # 128 KiB: starts on an aligned offset
    for key, values in ((Binding("small"), np.ones(3, np.float32)), (Binding("large"), large), (Binding("small"), None)):
        dims = [3] if key.weight == "small" else [large.size]
        shared.place(TensorProto(name=key.weight, data_type=TensorProto.FLOAT, dims=dims), key, values)
    shared.finish()
    return shared.files[0].path


def test_large_weights_are_spread_over_files_each_pinned_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Past ``WEIGHTS_FILE_BYTES`` the weights go to several files, each tensor to the emptiest, so
    consecutive tensors are hashed side by side; every tensor reads back whole from its file, and every
    file (one no tensor reached too) is pinned with the digest of what it holds."""
    monkeypatch.setattr(graph_weights, "WEIGHTS_FILE_BYTES", 2 * ALIGNMENT)
    shared = SharedWeights(tmp_path, 5 * ALIGNMENT)
    assert shared.names == [f"weights-0000{index}-of-00003.data" for index in (1, 2, 3)]
    tensors = {}
    for index, size in enumerate([ALIGNMENT // 4, ALIGNMENT // 4, 3, ALIGNMENT // 2]):  # float32 elements
        values = np.arange(size, dtype=np.float32) + index
        tensors[f"w{index}"] = (TensorProto(name=f"w{index}", data_type=TensorProto.FLOAT, dims=[size]), values)
        shared.place(tensors[f"w{index}"][0], Binding(f"w{index}"), values)
    shared.finish()
    locations = {name: tensor.external_data[0].value for name, (tensor, _) in tensors.items()}
    assert locations == {"w0": shared.names[0], "w1": shared.names[1], "w2": shared.names[2], "w3": shared.names[2]}
    for tensor, values in tensors.values():
        assert numpy_helper.to_array(tensor, str(tmp_path)).tobytes() == values.tobytes()
    write_manifest(tmp_path, {"stage": "export"})
    pins = read_manifest(tmp_path)["files"]
    assert pins == {name: sha256_file(tmp_path / name) for name in shared.names}


def test_one_weights_file_up_to_the_limit() -> None:
    assert graph_weights.weights_files(0) == graph_weights.weights_files(graph_weights.WEIGHTS_FILE_BYTES) == [WEIGHTS_FILE]
    assert len(graph_weights.weights_files(graph_weights.WEIGHTS_FILE_BYTES + 1)) == 2


def test_stream_digest_is_the_digest_of_the_bytes_in_order() -> None:
    stream = StreamDigest()
    chunks = [b"abc", memoryview(np.arange(5, dtype=np.float32)), b""]
    for chunk in chunks:
        stream.update(chunk)
    assert stream.hexdigest() == hashlib.sha256(b"".join(bytes(chunk) for chunk in chunks)).hexdigest()
    assert stream.size == 3 + 20


def test_weights_written_are_pinned_with_their_digest_and_checked_on_load(tmp_path: Path) -> None:
    path = _weights(tmp_path)
    assert path.stat().st_size == ALIGNMENT + ALIGNMENT // 2 * 4  # the small tensor, padding, the large one
    (tmp_path / "other.json").write_text("{}", encoding="utf-8")
    write_manifest(tmp_path, {"stage": "export"})
    pins = read_manifest(tmp_path)["files"]
    assert pins == {name: sha256_file(tmp_path / name) for name in (WEIGHTS_FILE, "other.json")}
    assert pinned_sha256([path]) == [pins[WEIGHTS_FILE]] and sha256_files([path, path]) == [pins[WEIGHTS_FILE]] * 2

    # A byte changed behind the writer's back, size and modification time restored: pinning takes the
    # digest recorded as the file was written (it is not read again), and the loader refuses the file.
    status = path.stat()
    with path.open("r+b") as data:
        data.seek(ALIGNMENT + 7)
        data.write(b"\xff")
    os.utime(path, ns=(status.st_atime_ns, status.st_mtime_ns))
    assert pinned_sha256([path]) == [pins[WEIGHTS_FILE]] != [sha256_file(path)]
    with pytest.raises(PackageError, match=f"{WEIGHTS_FILE} differs from"):
        verify_files(tmp_path, read_manifest(tmp_path))

    # Written since (another modification time): pinning reads it.
    os.utime(path, ns=(status.st_atime_ns, status.st_mtime_ns + 1_000_000))
    assert pinned_sha256([path]) == [sha256_file(path)]


def test_a_file_that_is_not_what_was_written_is_not_recorded(tmp_path: Path) -> None:
    stream, path = StreamDigest(), tmp_path / "f"
    stream.update(b"abcd")
    path.write_bytes(b"abc")
    with pytest.raises(ValueError, match="3 bytes where 4 were written"):
        record_written(path, stream)
    assert pinned_sha256([path]) == [hashlib.sha256(b"abc").hexdigest()]
