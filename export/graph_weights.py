"""Where an export's weights come from, and how they go into the traced graphs.

The graphs are traced from the member's config alone (``s1omni.export.onnx_export``): the weights
the exporter's optimiser may fold by value (``FOLD_LIMIT`` elements or fewer: norms, gates, biases)
go to the trace, every larger one stays a placeholder there, named by its ``Binding``. Here the
placeholders are filled from the weights' source, one tensor at a time, straight into
``weights.data`` (into several files past ``WEIGHTS_FILE_BYTES``: ``weights_files``; into the graph,
for members small enough to keep their weights inside), so no copy of the member is ever held
beside the one being written.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Protocol

import numpy as np
import onnx
import torch
from onnx import TensorProto
from onnxscript.optimizer._constant_folding import DEFAULT_CONSTANT_FOLD_INPUT_SIZE_LIMIT
from safetensors import safe_open
from torch import nn

from s1omni.runtime.cpu_heads import torch_on_one_thread
from s1omni.runtime.digest import StreamDigest, record_written

from .naming import ALIGNMENT

# Weights up to this many elements may be folded by value (the onnxscript optimiser's own input limit);
# larger ones it only ever transposes, which the trace records as a ``Binding`` instead.
FOLD_LIMIT = DEFAULT_CONSTANT_FOLD_INPUT_SIZE_LIMIT
PLACEHOLDER = "unbound"  # the external-data location a traced graph gives a weight still to bind
WEIGHTS_FILE = "weights.data"
# Past this many bytes the weights are spread over several files, each hashed on a thread of its own as
# it is written: one SHA-256 runs at 1.45 GB/s on the H200 host, half what its writes reach (2.9 GB/s),
# so a single 31.7 GB file made hashing the 9B export's slowest step.
WEIGHTS_FILE_BYTES = 4 << 30
EXTERNAL_MIN_BYTES = 1024  # smaller constants stay in the graphs
_FLOAT32_BYTES = 4


@dataclass(frozen=True)
class Binding:
    """A graph initializer that is the weight ``weight``, transposed by ``perm`` if one is given."""

    weight: str
    perm: tuple[int, ...] | None = None


class TensorSource(Protocol):
    """A member's weights by name, each read when asked for, in the dtype they are stored in."""

    def shapes(self) -> dict[str, tuple[int, ...]]: ...

    def tensor(self, name: str) -> torch.Tensor: ...


def read_float32(source: TensorSource, name: str) -> np.ndarray:
    """The weight ``name`` of ``source`` as a float32 array."""
    return source.tensor(name).to(torch.float32).numpy()


class ModuleTensors:
    """The weights of a model already in memory."""

    def __init__(self, model: nn.Module):
        self.state = model.state_dict()

    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {name: tuple(value.shape) for name, value in self.state.items()}

    def tensor(self, name: str) -> torch.Tensor:
        return self.state[name].detach()


class PackageTensors:
    """The tensors named ``prefix*`` in a package's safetensors shards (prefix stripped), read lazily."""

    def __init__(self, shards: Sequence[Path], prefix: str):
        self.prefix = prefix
        self.where: dict[str, Path] = {}
        self._shapes: dict[str, tuple[int, ...]] = {}
        for path in shards:
            with safe_open(str(path), framework="pt") as handle:
                for key in handle.keys():  # noqa: SIM118 - safe_open is not iterable
                    if key.startswith(prefix):
                        self.where[key[len(prefix) :]] = path
                        self._shapes[key[len(prefix) :]] = tuple(handle.get_slice(key).get_shape())

    def shapes(self) -> dict[str, tuple[int, ...]]:
        return dict(self._shapes)

    def tensor(self, name: str) -> torch.Tensor:
        with safe_open(str(self.where[name]), framework="pt") as handle:
            return handle.get_tensor(self.prefix + name)


def foldable(source: TensorSource) -> dict[str, np.ndarray]:
    """The weights the trace gets by value: ``FOLD_LIMIT`` elements or fewer."""
    return {name: read_float32(source, name) for name, shape in source.shapes().items() if int(np.prod(shape)) <= FOLD_LIMIT}


class _Converter:
    """Float32 copies of weights, transposed where their binding says, in one pass over row blocks on a
    pool of threads. Measured on a bf16 ``[9216, 2560]`` weight (2 cores): ``.float().t().contiguous()``
    0.57 GB/s of output; blocks of 128 source rows copied into the transposed output's columns 1.9 GB/s
    on one thread; the H200 export of the 4B spent 11.8 of its 21.9 s of writing in the former, and
    writes in 10.9 s with this (with several weights files, ``SharedWeights``). Each
    pool thread runs its copies with torch inline on it (``cpu_heads.torch_on_one_thread``): a copy
    this large would otherwise start an OpenMP team from every pool thread, and the cores are
    oversubscribed (0.14 GB/s). Not ``torch.set_num_threads(1)``, which also sets the count every
    thread started later adopts."""

    BLOCK_ROWS = 128

    def __init__(self, threads: int):
        self.threads = threads
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="weights")

    def __enter__(self) -> _Converter:
        return self

    def __exit__(self, *_: object) -> None:
        self._pool.shutdown()

    def float32(self, weight: torch.Tensor, perm: tuple[int, ...] | None) -> np.ndarray:
        # A matrix's transpose is copied by blocks of its rows (each a block of the output's columns);
        # any other order by blocks of the permuted view's leading axis.
        transposed = perm == (1, 0)
        if perm is not None and not transposed:
            weight = weight.permute(perm)
        out = torch.empty(tuple(reversed(weight.shape)) if transposed else weight.shape, dtype=torch.float32)
        if weight.ndim == 0 or weight.numel() == 0:
            out.copy_(weight.t() if transposed else weight)
            return out.numpy()
        starts = range(0, weight.shape[0], self.BLOCK_ROWS)

        def copy(rows: list[int]) -> None:
            with torch_on_one_thread():
                for start in rows:
                    block = slice(start, start + self.BLOCK_ROWS)
                    if transposed:
                        out[:, block].copy_(weight[block].t())
                    else:
                        out[block].copy_(weight[block])

        # Contiguous runs of blocks, one a thread: a task each rather than one a block.
        runs = [[int(start) for start in run] for run in np.array_split(np.asarray(starts), min(self.threads, len(starts)))]
        for done in [self._pool.submit(copy, run) for run in runs]:
            done.result()
        return out.numpy()


# What float32 holds exactly: a weight stored in any of these is bound as it is.
BOUND_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _array(source: TensorSource, binding: Binding, converter: _Converter) -> np.ndarray:
    weight = source.tensor(binding.weight)
    if weight.dtype not in BOUND_DTYPES:
        raise ValueError(f"{binding.weight}: {weight.dtype} where the graph has float32 (bound from {', '.join(map(str, BOUND_DTYPES))})")
    return converter.float32(weight, binding.perm)


def weights_files(total_bytes: int) -> list[str]:
    """The external data files of an export with ``total_bytes`` of weights: ``weights.data``, or
    ``weights-00001-of-0000N.data``... where one file would pass ``WEIGHTS_FILE_BYTES``."""
    count = -(-total_bytes // WEIGHTS_FILE_BYTES)
    return [WEIGHTS_FILE] if count <= 1 else [f"weights-{index:05d}-of-{count:05d}.data" for index in range(1, count + 1)]


@dataclass(frozen=True)
class _DataFile:
    path: Path
    digest: StreamDigest  # of every byte written to ``path``; its ``size`` is the file's

    @property
    def size(self) -> int:
        return self.digest.size


class SharedWeights:
    """The external data files of several graphs: a tensor already written is referenced, not repeated.

    A bound weight is keyed by its ``Binding`` (read once for all graphs); a folded constant by its bytes.
    Each tensor goes to the file holding the fewest bytes so far (``weights_files`` names them for the
    ``total_bytes`` expected), so consecutive tensors land in different files and the files' digests
    run side by side. Every file is hashed from the bytes written, as they are written (``finish``
    records the digests for the manifest: ``s1omni.runtime.digest``), so a member's weights are never
    read back to be pinned."""

    def __init__(self, directory: Path, total_bytes: int = 0):
        self.files = [_DataFile(directory / name, StreamDigest()) for name in weights_files(total_bytes)]
        self.placed: dict[Binding | tuple[int, tuple[int, ...], bytes], tuple[str, int, int]] = {}  # key: (file, offset, length)

    @property
    def names(self) -> list[str]:
        return [file.path.name for file in self.files]

    def write(self, key: Binding | tuple[int, tuple[int, ...], bytes], raw: bytes | np.ndarray) -> None:
        """Write ``raw`` as ``key``'s bytes into the emptiest file, unless a file holds them already."""
        if key in self.placed:
            return
        length = raw.nbytes if isinstance(raw, np.ndarray) else len(raw)
        file = min(self.files, key=lambda candidate: candidate.size)  # the first of the emptiest
        with file.path.open("ab") as data:
            if length >= ALIGNMENT:
                self._write(file, data, b"\0" * (-file.size % ALIGNMENT))
            self.placed[key] = file.path.name, file.size, length
            self._write(file, data, raw.data if isinstance(raw, np.ndarray) else raw)

    def place(self, tensor: TensorProto, key: Binding | tuple[int, tuple[int, ...], bytes], raw: bytes | np.ndarray | None = None) -> None:
        """Point ``tensor`` at its bytes in a file, writing ``raw`` first if they are not there yet
        (``raw`` may be left out for a key a file holds)."""
        if key not in self.placed:
            if raw is None:
                raise ValueError(f"{key}: not written yet, and no bytes given")
            self.write(key, raw)
        location, offset, length = self.placed[key]
        expected = _FLOAT32_BYTES * int(np.prod(tensor.dims)) if isinstance(key, Binding) else length
        if length != expected:  # a weight written ahead of its graph (``write_ahead``) for another shape
            raise ValueError(f"{key}: {length} bytes written where the graph's {list(tensor.dims)} float32 takes {expected}")
        tensor.ClearField("raw_data")
        del tensor.external_data[:]
        tensor.data_location = TensorProto.EXTERNAL
        for name, value in (("location", location), ("offset", offset), ("length", length)):
            tensor.external_data.add(key=name, value=str(value))

    @staticmethod
    def _write(file: _DataFile, data: BinaryIO, chunk: bytes | memoryview) -> None:
        data.write(chunk)
        file.digest.update(chunk)  # waits for this file's previous chunk only

    def finish(self) -> None:
        """Record each file's digest, every tensor written (``s1omni.runtime.digest.record_written``);
        a file no tensor went to is written empty."""
        for file in self.files:
            file.path.touch()
            record_written(file.path, file.digest)


def _placeholder(tensor: TensorProto) -> bool:
    external = tensor.data_location == TensorProto.EXTERNAL
    return external and any(entry.key == "location" and entry.value == PLACEHOLDER for entry in tensor.external_data)


def _read_ahead(source: TensorSource, bindings: Sequence[Binding], threads: int) -> Iterator[np.ndarray]:
    """Each binding's array in turn, the next one read and converted (in a thread: safetensors and torch
    release the GIL; the conversion on ``threads`` threads) while the caller writes this one. Two arrays at
    most are held here at a time (and one a file while ``SharedWeights`` hashes the last written to it)."""
    if not bindings:  # every weight of this graph was written for the other one
        return
    with ThreadPoolExecutor(1) as reader, _Converter(threads) as converter:
        ahead = [reader.submit(_array, source, binding, converter) for binding in bindings[:1]]
        for following in [*bindings[1:], None]:
            values = ahead.pop().result()
            if following is not None:
                ahead.append(reader.submit(_array, source, following, converter))
            yield values
            del values


def write_ahead(bindings: Sequence[Binding], source: TensorSource, shared: SharedWeights, threads: int) -> None:
    """Write the weights of ``bindings`` into ``shared`` before any graph references them (the export does
    so while its graphs are traced); ``bind_weights`` then finds them written. A binding no graph turns
    out to have is written all the same, and only costs its bytes."""
    for binding, values in zip(bindings, _read_ahead(source, bindings, threads), strict=True):
        shared.write(binding, values)


def bind_weights(model: onnx.ModelProto, bindings: Mapping[str, Binding], source: TensorSource, shared: SharedWeights | None) -> None:
    """Fill ``model``'s placeholders from ``source``, in place: into ``shared``'s file if given (with every
    other constant of ``EXTERNAL_MIN_BYTES`` or more), else into the graph. A weight ``shared`` holds
    already (written for another graph) is referenced, not read again."""
    placeholders = [tensor for tensor in model.graph.initializer if _placeholder(tensor)]
    for tensor in placeholders:
        if tensor.name not in bindings:
            raise ValueError(f"the traced graph names no weight for its placeholder {tensor.name}")
    unread = []
    for tensor in placeholders:
        if shared and bindings[tensor.name] in shared.placed:
            shared.place(tensor, bindings[tensor.name])
        else:
            unread.append(tensor)
    reads = _read_ahead(source, [bindings[tensor.name] for tensor in unread], len(os.sched_getaffinity(0)))
    for tensor, values in zip(unread, reads, strict=True):
        binding = bindings[tensor.name]
        if values.dtype != np.float32 or tuple(values.shape) != tuple(tensor.dims):
            raise ValueError(f"{binding.weight}: {values.dtype}{list(values.shape)} where the graph has float32{list(tensor.dims)}")
        if shared:
            shared.place(tensor, binding, values)
        else:
            del tensor.external_data[:]
            tensor.data_location = TensorProto.DEFAULT
            tensor.raw_data = values.tobytes()
    if shared:
        for tensor in model.graph.initializer:
            if tensor.HasField("raw_data") and len(tensor.raw_data) >= EXTERNAL_MIN_BYTES:
                raw = tensor.raw_data
                shared.place(tensor, (tensor.data_type, tuple(tensor.dims), hashlib.sha256(raw).digest()), raw)
