"""The ``tensorrt`` backbone runner: a pair of plans (``prefill.plan``, ``continue.plan``) per GPU.

A plan holds kernels for one compute capability and structures for one library build, so before any
byte of it is deserialized ``check_plan`` compares the engine manifest with the device and the
installed library and refuses a mismatch, naming the command that rebuilds it. Standard TensorRT
(module ``tensorrt``) and TensorRT for RTX (module ``tensorrt_rtx_bindings`` from the PyPI wheels,
``tensorrt_rtx`` from NVIDIA's archives) share the runtime calls used here; RTX plans run only on the
compute capabilities of its ``ComputeCapability`` enum, which has no sm_90 (engines.md §8.1).

The graphs are those of ``s1omni.export.patches``: prefill takes ``(input_ids, position_ids, attention_mask,
readout_index)`` and returns the readout hidden states then the state tensors; continue takes
``(input_ids, position_ids, past_mask, readout_index, *state)`` and returns the readout hidden
states. Tensors are bound in the order the manifest recorded from the ONNX graphs.
"""

from __future__ import annotations

import importlib
import re
import sys
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from ..digest import sha256_file
from ..errors import EnvironmentMissing, PackageError
from .base import Block, BlockReady, Prefix, Tree, pad_blocks, run_one_by_one, text_positions

# Library name (as recorded in manifests) -> the Python modules that provide it, tried in order.
MODULES = {"tensorrt": ("tensorrt",), "tensorrt_rtx": ("tensorrt_rtx_bindings", "tensorrt_rtx")}
# TensorRT for RTX 1.7.1's ComputeCapability enum (SM75..SM121); nothing here runs on sm_90 or sm_100.
RTX_TARGETS = ("sm_75", "sm_80", "sm_86", "sm_89", "sm_120", "sm_121")
GRAPHS = ("prefill", "continue")


@dataclass(frozen=True)
class Library:
    name: str  # tensorrt | tensorrt_rtx
    version: str
    trt: ModuleType

    @property
    def rtx(self) -> bool:
        return self.name == "tensorrt_rtx"


def load_library(name: str | None = None) -> Library:
    """``name``'s module, or standard TensorRT when installed (it builds for the GPU at hand) else RTX."""
    for library in [name] if name else list(MODULES):
        for module_name in MODULES.get(library, ()):
            try:
                module = importlib.import_module(module_name)
            except ImportError:
                continue
            return Library(library, module.__version__, module)
    wanted = name or "TensorRT or TensorRT for RTX"
    raise EnvironmentMissing(f"{wanted} is not installed (pip install 's1omni[tensorrt]', or 's1omni[tensorrt-rtx]' for TensorRT for RTX)")


@cache
def library_logger(trt: ModuleType) -> Any:
    """One logger per library and process: the library keeps the first one it is given and ignores later ones."""

    class Logger(trt.ILogger):
        """Warnings and errors to stderr; the last errors also kept so a failed call can say why."""

        def __init__(self) -> None:
            super().__init__()
            self.errors: deque[str] = deque(maxlen=8)

        def log(self, severity: Any, msg: str) -> None:
            if severity <= trt.ILogger.Severity.ERROR:
                self.errors.append(msg)
            if severity <= trt.ILogger.Severity.WARNING:
                print(f"[{trt.__name__}] {severity.name}: {msg}", file=sys.stderr, flush=True)

    return Logger()


def normalize_target(value: str) -> str:
    """``sm_89`` from ``sm_89``, ``sm89``, ``SM89`` or ``8.9``."""
    text = value.strip().lower()
    if match := re.fullmatch(r"sm_?(\d{2,3})", text):
        return f"sm_{match.group(1)}"
    if match := re.fullmatch(r"(\d{1,2})\.(\d)", text):
        return f"sm_{match.group(1)}{match.group(2)}"
    raise ValueError(f"not a compute capability: {value!r} (expected sm_XX or X.Y)")


def device_compute_capability(device: int = 0) -> str | None:
    """The CUDA device's compute capability as ``sm_XX``, None without a visible GPU (or without torch)."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    major, minor = torch.cuda.get_device_capability(device)
    return f"sm_{major}{minor}"


def rebuild_command(manifest: dict[str, Any], target: str) -> str:
    """The build that makes this engine for ``target``, from the export it was built from."""
    return f"s1omni build {manifest.get('export_dir', 'EXPORT_DIR')} --backend tensorrt --target {target}"


def check_plan(manifest: dict[str, Any], device_cc: str | None, library: str, library_version: str) -> None:
    """Refuse (``PackageError``) plans built for another compute capability, library or library version.

    Plans are not portable across GPU architectures or library builds (engines.md §7.1), and a plan
    loaded anyway fails late or, worse, runs the wrong kernels; the message names the rebuild.
    """
    built = normalize_target(str(manifest.get("target", "")))
    label = f"plan built for {built} with {manifest.get('library')} {manifest.get('library_version')}"
    if device_cc is None:
        raise EnvironmentMissing(f"{label} needs a CUDA GPU and none is visible; on a GPU machine: {rebuild_command(manifest, built)}")
    device = normalize_target(device_cc)
    command = rebuild_command(manifest, device)
    if built != device:
        raise PackageError(f"{label} cannot run on this {device} GPU; rebuild it with: {command}{_rtx_note(library, device)}")
    if (manifest.get("library"), manifest.get("library_version")) != (library, library_version):
        raise PackageError(f"{label} cannot be loaded by the installed {library} {library_version}; rebuild it with: {command}")


def _rtx_note(library: str, device: str) -> str:
    if library == "tensorrt_rtx" and device not in RTX_TARGETS:
        return f" (TensorRT for RTX cannot target {device}: install standard TensorRT on this machine first)"
    return ""


# Engine data types -> torch dtypes, by the enum member's name (the same in both libraries).
TORCH_DTYPES = {"FLOAT": "float32", "HALF": "float16", "BF16": "bfloat16", "INT64": "int64", "INT32": "int32", "BOOL": "bool",
                "INT8": "int8", "UINT8": "uint8"}  # fmt: skip


class _Plan:
    """One deserialized plan and its execution context, run on torch's current CUDA stream."""

    def __init__(self, library: Library, data: bytes, inputs: Sequence[str], outputs: Sequence[str]):
        import torch

        self.log = library_logger(library.trt)
        self.log.errors.clear()
        self.engine = library.trt.Runtime(self.log).deserialize_cuda_engine(data)
        if self.engine is None:
            raise PackageError(f"{library.name} could not deserialize the plan: {self._errors()}")
        self.context = self.engine.create_execution_context()
        self.inputs, self.outputs = list(inputs), list(outputs)
        self.dtypes = {name: getattr(torch, TORCH_DTYPES[self.engine.get_tensor_dtype(name).name]) for name in self.inputs + self.outputs}
        # (min, opt, max) of the one optimization profile, per input.
        self.ranges = {name: self.engine.get_tensor_profile_shape(name, 0) for name in self.inputs}

    def max_dim(self, name: str, axis: int) -> int:
        return int(self.ranges[name][2][axis])

    def __call__(self, feeds: Sequence[Any]) -> list[Any]:
        """Outputs (torch CUDA tensors) for ``feeds`` in input order (numpy arrays or CUDA tensors)."""
        import torch

        keep = []  # the inputs must outlive the enqueue
        for name, value in zip(self.inputs, feeds, strict=True):
            tensor = torch.as_tensor(value, device="cuda").to(self.dtypes[name]).contiguous()
            keep.append(tensor)
            if not self.context.set_input_shape(name, tuple(tensor.shape)):
                low, _, high = self.ranges[name]
                raise ValueError(f"{name} of shape {tuple(tensor.shape)} is outside the plan's profile {tuple(low)}..{tuple(high)}")
            self.context.set_tensor_address(name, tensor.data_ptr())
        results = []
        for name in self.outputs:
            shape = tuple(self.context.get_tensor_shape(name))
            if any(dim < 0 for dim in shape):
                raise RuntimeError(f"output {name} has a data-dependent shape {shape}; the runner expects shapes from the inputs")
            tensor = torch.empty(shape, dtype=self.dtypes[name], device="cuda")
            self.context.set_tensor_address(name, tensor.data_ptr())
            results.append(tensor)
        stream = torch.cuda.current_stream()
        self.log.errors.clear()
        if not self.context.execute_async_v3(stream.cuda_stream):
            raise RuntimeError(f"enqueue failed: {self._errors()}")
        stream.synchronize()
        return results

    def _errors(self) -> str:
        return "; ".join(self.log.errors) or "no error was logged"


@dataclass
class PrefixState:
    """The prefix's state tensors (on the GPU, batch 1) and its token count (the blocks' past length)."""

    tensors: list[Any]
    length: int


class TensorRtRunner:
    name = "tensorrt"
    device = "cuda"

    def __init__(self, library: Library, manifest: dict[str, Any], plans: dict[str, bytes]):
        self.precision = str(manifest["precision"])
        self.library = library
        io = manifest["plans"]
        self.plans = {graph: _Plan(library, plans[graph], io[graph]["inputs"], io[graph]["outputs"]) for graph in GRAPHS}
        prefill = self.plans["prefill"]
        self.hidden_size = int(prefill.engine.get_tensor_shape(prefill.outputs[0])[-1])

    @classmethod
    def load(cls, directory: str | Path, manifest: dict[str, Any]) -> TensorRtRunner:
        """Check the manifest against this machine, then each plan's SHA-256, then deserialize."""
        try:
            library = load_library(manifest.get("library"))
        except EnvironmentMissing:
            library = load_library()  # check_plan names the rebuild for the library that is installed
        check_plan(manifest, device_compute_capability(), library.name, library.version)
        directory = Path(directory)
        plans = {}
        for graph in GRAPHS:
            entry = manifest["plans"][graph]
            path = directory / entry["file"]
            if sha256_file(path) != entry["sha256"]:
                raise PackageError(f"{path} differs from the plan its manifest records; rebuild it with: "
                                   f"{rebuild_command(manifest, manifest['target'])}")  # fmt: skip
            plans[graph] = path.read_bytes()
        return cls(library, manifest, plans)

    def prefill(self, prefix: Prefix) -> PrefixState:
        if prefix.embeds is not None:
            raise ValueError("the TensorRT backbone takes token ids only; image features need the vision graphs")
        length = len(prefix.ids)
        positions = prefix.positions if prefix.positions is not None else text_positions(0, length)
        feeds = [prefix.ids[None], positions[:, None, :], np.ones((1, length), np.int64), np.array([[length - 1]], np.int64)]
        _, *state = self.plans["prefill"](feeds)
        return PrefixState(state, length)

    def continue_blocks(self, state: PrefixState, prefix: Prefix, blocks: Sequence[Block]) -> list[np.ndarray]:
        """Blocks in batches of at most the plan's largest block count, each continuing from ``state``."""
        plan = self.plans["continue"]
        most = plan.max_dim(plan.inputs[0], 0)
        out: list[np.ndarray] = []
        for start in range(0, len(blocks), most):
            batch = blocks[start : start + most]
            ids, readouts = pad_blocks(batch)
            count, width = ids.shape
            positions = np.broadcast_to(text_positions(prefix.start, width)[:, None, :], (3, count, width)).copy()
            past = [tensor.expand(count, *tensor.shape[1:]) for tensor in state.tensors]
            (hidden,) = plan([ids, positions, np.ones((count, state.length), np.int64), readouts, *past])
            hidden = hidden.float().cpu().numpy()
            out += [hidden[row, : len(block.readouts)] for row, block in enumerate(batch)]
        return out

    def run(self, trees: Sequence[Tree], ready: BlockReady | None = None) -> list[list[np.ndarray]]:
        return run_one_by_one(self, trees, ready)
