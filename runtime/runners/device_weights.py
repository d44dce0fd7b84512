"""One copy of an engine's weights on the GPU for every ONNX Runtime session of the process that reads them.

An ``InferenceSession`` places its own copy of every initializer it reads. A served Vela 2.0 engine opens
``prefill.onnx`` and ``continue.onnx`` per instance, and ``packed.onnx`` too for ``shared_context`` and
``batching``: three graphs over the same weight files, so ``--instances 2`` held six copies of the weights.
For the 4B member that is about 50 GB of bfloat16 weights, and it ran an 80 GB H100 out of memory at 8
clients (``benchmarks/h100-capture-policy/``; ``benchmarks/h100-device-weights/`` measures the sharing).

``SessionOptions.add_initializer`` hands a session a tensor that the caller owns. ONNX Runtime uses it in
place when it lives on the device the session planned it for, and copies it otherwise
(microsoft/onnxruntime: onnxruntime/core/framework/session_state_utils.cc, ``use_user_supplied_initializer``).
It refuses a tensor that owns its buffer (onnxruntime/core/framework/session_options.cc, ``CheckInitializer``),
so each weight is placed by ONNX Runtime's own allocator and handed over as a DLPack view of that tensor,
which owns nothing.

Only the initializers kept outside the graphs are shared (external data: every member but the tiny synthetic
one). They are keyed by file, offset and length, not by name: each graph is traced on its own, so the graphs
give one weight different names. CPU engines do not share: ONNX Runtime prepacks the CPU's GEMM weights for
each session, and a shared original would then stay in memory beside every packed copy instead of being freed.
"""

from __future__ import annotations

import threading
import weakref
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
from onnx import TensorProto, helper
from onnxruntime.capi import _pybind_state as ort_c

NVIDIA = 0x10DE  # the vendor id of the CUDA EP's device (OrtDevice::VendorIds::NVIDIA)
_STORAGE = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}  # raw bytes of an element, by its size


class DeviceWeights:
    """The external initializers of one engine's graphs on one device, each read from its file and placed once."""

    def __init__(self, device: str, device_id: int):
        kind = ort_c.OrtDevice.cuda() if device == "cuda" else ort_c.OrtDevice.cpu()
        self._device = ort_c.OrtDevice(kind, ort_c.OrtDevice.default_memory(), NVIDIA if device == "cuda" else 0, device_id)
        # Per (file, offset, length): the view sessions are handed (it keeps the placed tensor alive).
        self._placed: dict[tuple[str, int, int], onnxruntime.OrtValue] = {}
        self._lock = threading.Lock()
        self.bytes = 0  # placed so far

    def add_to(self, options: onnxruntime.SessionOptions, graph: Path) -> None:
        """Hand every external initializer of ``graph`` from here (placed on first use) to ``options``, the options
        of one session of ``graph`` (ONNX Runtime takes each name once)."""
        model = onnx.load(str(graph), load_external_data=False)
        for tensor in model.graph.initializer:
            if tensor.data_location == TensorProto.EXTERNAL:
                options.add_initializer(tensor.name, self._view(tensor, graph.parent))

    def _view(self, tensor: TensorProto, directory: Path) -> onnxruntime.OrtValue:
        entries = {entry.key: entry.value for entry in tensor.external_data}
        itemsize = helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
        count = int(np.prod(tensor.dims, dtype=np.int64))
        offset, length = int(entries.get("offset", 0)), int(entries.get("length", count * itemsize))
        key = (str((directory / entries["location"]).resolve()), offset, length)
        with self._lock:
            found = self._placed.get(key)
            if found is None:
                if length != count * itemsize:
                    raise ValueError(f"{tensor.name}: {length} bytes in {key[0]} for {count} elements of {itemsize}")
                raw = np.fromfile(key[0], np.uint8, count=length, offset=offset)
                if raw.size != length:
                    raise ValueError(f"{tensor.name}: {key[0]} ends before byte {offset + length}")
                host = raw.view(_STORAGE[itemsize]).reshape(tuple(tensor.dims))
                placed = ort_c.OrtValue.ortvalue_from_shape_and_onnx_type(list(tensor.dims), tensor.data_type, self._device)
                placed.update_inplace(ort_c.OrtValue.ortvalue_from_numpy_with_onnx_type(host, tensor.data_type))
                found = self._placed[key] = onnxruntime.OrtValue(ort_c.OrtValue.from_dlpack(placed.to_dlpack(), False))
                self.bytes += length
        return found


_REGISTRY: weakref.WeakValueDictionary[tuple[Path, str, int], DeviceWeights] = weakref.WeakValueDictionary()
_REGISTRY_LOCK = threading.Lock()


def device_weights(engine_dir: Path, device: str, device_id: int) -> DeviceWeights:
    """The process's ``DeviceWeights`` of ``engine_dir`` on this device: every runner of the engine holds the same
    one, and its memory goes with the last of them."""
    key = (engine_dir.resolve(), device, device_id)
    with _REGISTRY_LOCK:
        found = _REGISTRY.get(key)
        if found is None:
            found = _REGISTRY[key] = DeviceWeights(device, device_id)
        return found
