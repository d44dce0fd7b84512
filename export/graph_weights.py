"""Where an export's weights come from, and how they go into the traced graphs.

The graphs are traced from the member's config alone (``s1omni.export.onnx_export``): the weights
the exporter's optimiser may fold by value (``FOLD_LIMIT`` elements or fewer: norms, gates, biases)
go to the trace, every larger one stays a placeholder there, named by its ``Binding``. Here the
placeholders are filled from the weights' source, one tensor at a time, straight into
``weights.data`` (or into the graph, for members small enough to keep their weights inside), so
no copy of the member is ever held beside the one being written.
"""

from __future__ import annotations

import hashlib
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

from s1omni.runtime.digest import StreamDigest, record_written

# Weights up to this many elements may be folded by value (the onnxscript optimiser's own input limit);
# larger ones it only ever transposes, which the trace records as a ``Binding`` instead.
FOLD_LIMIT = DEFAULT_CONSTANT_FOLD_INPUT_SIZE_LIMIT
PLACEHOLDER = "unbound"  # the external-data location a traced graph gives a weight still to bind
WEIGHTS_FILE = "weights.data"
EXTERNAL_MIN_BYTES = 1024  # smaller constants stay in the graphs
ALIGNMENT = 65536  # large tensors start at offsets ONNX Runtime can memory-map on any page size


@dataclass(frozen=True)
class Binding:
    """A graph initializer that is the weight ``weight``, transposed by ``perm`` if one is given."""

    weight: str
    perm: tuple[int, ...] | None = None


class TensorSource(Protocol):
    """A member's weights by name, each read when asked for, in float32."""

    def shapes(self) -> dict[str, tuple[int, ...]]: ...

    def read(self, name: str) -> np.ndarray: ...


class ModuleTensors:
    """The weights of a model already in memory."""

    def __init__(self, model: nn.Module):
        self.state = model.state_dict()

    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {name: tuple(value.shape) for name, value in self.state.items()}

    def read(self, name: str) -> np.ndarray:
        return self.state[name].detach().float().numpy()


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

    def read(self, name: str) -> np.ndarray:
        with safe_open(str(self.where[name]), framework="pt") as handle:
            return handle.get_tensor(self.prefix + name).to(torch.float32).numpy()


def foldable(source: TensorSource) -> dict[str, np.ndarray]:
    """The weights the trace gets by value: ``FOLD_LIMIT`` elements or fewer."""
    return {name: source.read(name) for name, shape in source.shapes().items() if int(np.prod(shape)) <= FOLD_LIMIT}


def _array(source: TensorSource, binding: Binding) -> np.ndarray:
    values = source.read(binding.weight)
    if binding.perm is None:
        return np.ascontiguousarray(values)
    # torch's copy of a transposed matrix runs blocked and on every core; numpy's is one strided loop.
    return torch.from_numpy(values).permute(binding.perm).contiguous().numpy()


class SharedWeights:
    """One external data file for several graphs: a tensor already written is referenced, not repeated.

    A bound weight is keyed by its ``Binding`` (read once for all graphs); a folded constant by its bytes.
    The file is hashed from the bytes written, as they are written (``finish`` records the digest for
    the manifest: ``s1omni.runtime.digest``), so a member's weights are never read back to be pinned."""

    def __init__(self, directory: Path):
        self.path = directory / WEIGHTS_FILE
        self.placed: dict[Binding | tuple[int, tuple[int, ...], bytes], tuple[int, int]] = {}  # key: (offset, length)
        self.digest = StreamDigest()

    def place(self, tensor: TensorProto, key: Binding | tuple[int, tuple[int, ...], bytes], raw: bytes | np.ndarray | None = None) -> None:
        """Point ``tensor`` at its bytes in the file, writing ``raw`` first if they are not there yet
        (``raw`` may be left out for a key the file holds)."""
        if key not in self.placed:
            if raw is None:
                raise ValueError(f"{key}: not written yet, and no bytes given")
            length = raw.nbytes if isinstance(raw, np.ndarray) else len(raw)
            with self.path.open("ab") as data:
                if length >= ALIGNMENT:
                    self._write(data, b"\0" * (-data.tell() % ALIGNMENT))
                self.placed[key] = data.tell(), length
                self._write(data, raw.data if isinstance(raw, np.ndarray) else raw)
        offset, length = self.placed[key]
        tensor.ClearField("raw_data")
        del tensor.external_data[:]
        tensor.data_location = TensorProto.EXTERNAL
        for name, value in (("location", WEIGHTS_FILE), ("offset", offset), ("length", length)):
            tensor.external_data.add(key=name, value=str(value))

    def _write(self, data: BinaryIO, chunk: bytes | memoryview) -> None:
        data.write(chunk)
        self.digest.update(chunk)

    def finish(self) -> None:
        """Record the file's digest, every tensor written (``s1omni.runtime.digest.record_written``)."""
        record_written(self.path, self.digest)


def _placeholder(tensor: TensorProto) -> bool:
    external = tensor.data_location == TensorProto.EXTERNAL
    return external and any(entry.key == "location" and entry.value == PLACEHOLDER for entry in tensor.external_data)


def _read_ahead(source: TensorSource, bindings: Sequence[Binding]) -> Iterator[np.ndarray]:
    """Each binding's array in turn, the next one read and converted (in a thread: safetensors and torch
    release the GIL) while the caller writes this one. Two arrays at most are held at a time (a third
    while ``SharedWeights`` hashes the one written before)."""
    if not bindings:  # every weight of this graph was written for the other one
        return
    with ThreadPoolExecutor(1) as reader:
        ahead = [reader.submit(_array, source, binding) for binding in bindings[:1]]
        for following in [*bindings[1:], None]:
            values = ahead.pop().result()
            if following is not None:
                ahead.append(reader.submit(_array, source, following))
            yield values
            del values


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
    for tensor, values in zip(unread, _read_ahead(source, [bindings[tensor.name] for tensor in unread]), strict=True):
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
