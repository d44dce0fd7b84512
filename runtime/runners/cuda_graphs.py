"""Fixed-shape runs of an ONNX Runtime session, replayed as CUDA graphs on the CUDA EP.

With ``enable_cuda_graph`` the CUDA EP records a session run as one CUDA graph per ``gpu_graph_id``
run option and replays it on later runs with that id, one launch instead of thousands
(microsoft/onnxruntime:docs/execution-providers/CUDA-ExecutionProvider.md, "Using CUDA Graphs";
the run option is ``kOrtRunOptionsConfigCudaGraphAnnotation`` in
include/onnxruntime/core/session/onnxruntime_run_options_config_keys.h). A replay reads and writes the
addresses of its capture, so each graph owns a buffer per input and output, inputs are copied into
them in place, and shapes must repeat: callers round their widths up with ``bucket`` so a few graphs
serve every request. Every run of such a session names a graph id, or -1 for a run outside any
graph; a run naming none would capture the default graph and replay it at the wrong shapes.

The CUDA EP counts the ordinary runs it wants before a capture per session, not per graph id
(``IncrementRegularRunCountBeforeGraphCapture`` and ``min_num_runs_before_cuda_graph_capture_`` in
microsoft/onnxruntime:onnxruntime/core/providers/cuda/cuda_execution_provider.h): once a session has
run, each new id is captured on its first run. A shape needing more arena memory than any before
then allocates inside the capture, which CUDA refuses (error 901, seen on the 4B member's
6,942-token case). So a capture is preceded at once by ``WARMUP_RUNS`` runs outside any graph at its
shapes, which leave that memory in the arena. And it happens only where no other thread of the process
runs on the device (``capture_lock``): a graph first used while another forward runs answers from one run
outside any graph, and the thread's next forward holds the device alone, capturing what it meets.

On the CPU EP the same fixed-buffer runs happen with nothing to capture, which is how tests check
the padding and the buffer handling without a GPU.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import onnxruntime

from .capture_lock import CAPTURE_LOCK, CAPTURES

GRAPH_ID = "gpu_graph_id"
UNCAPTURED = -1
# Widths above 8 round up to a multiple of 1/8 of their octave: at most 12.5% padding, eight graphs an octave.
OCTAVE_SHIFT = 3
# Which shapes get a graph. A replay saves the launches, a fixed few ms a call whatever its size
# (benchmarks/h200-0.8B-graphs: 6.2 ms at 128 tokens, 5.2 ms at 2,048), while a capture costs about
# three forwards at its shape (WARMUP_RUNS, then the capture) and keeps its buffers, and the EP its
# graph, for the session's life. So only calls of at most MAX_GRAPH_TOKENS tokens (rows x width: a
# router request's calls take up to 1,280, a merged batch of many far more) are captured, at most
# MAX_GRAPHS of them, each with buffers of at most MAX_GRAPH_BYTES and all of them at most
# MAX_SESSION_GRAPH_BYTES; other calls run outside any graph. A merged batch's per-block copies of its
# prefix state (~20 MB a row for the 0.8B member, more for a long prefix's keys and values) would
# otherwise pin gigabytes.
MAX_GRAPH_TOKENS = 4096
MAX_GRAPHS = 48
MAX_GRAPH_BYTES = 1 << 30  # the 0.8B member's router request: ~0.6 GB of continue buffers
MAX_SESSION_GRAPH_BYTES = 8 << 30
# Ordinary runs before a graph's capture: the EP's own minimum (the second run can still allocate).
WARMUP_RUNS = 2

_NUMPY_TYPES = {"tensor(float)": np.float32, "tensor(int64)": np.int64}


def bucket(width: int) -> int:
    """``width`` rounded up to one of 1..16, 18, 20, ..32, 36, 40, ..64, 72, ...: steps of 1/8 of an octave."""
    step = 1 << max((width - 1).bit_length() - 1 - OCTAVE_SHIFT, 0)
    return -(-max(width, 1) // step) * step


@dataclass
class Graph:
    """One captured shape of a session: its buffers, its binding and the run options naming it."""

    session: onnxruntime.InferenceSession
    inputs: dict[str, onnxruntime.OrtValue]
    outputs: dict[str, onnxruntime.OrtValue]
    binding: onnxruntime.IOBinding
    options: onnxruntime.RunOptions
    runs: int = 0  # how many times its outputs were overwritten
    captured: bool = False

    def run(self, feeds: Mapping[str, np.ndarray]) -> None:
        """Copy ``feeds`` into their buffers (the other inputs were written in place) and replay; until the
        graph is captured, run outside any graph, capturing only where the device has no other run now."""
        for name, value in feeds.items():
            self.inputs[name].update_inplace(np.ascontiguousarray(value))
        if self.captured:
            self.session.run_with_iobinding(self.binding, self.options)
        else:
            self._capture_or_run()
        self.runs += 1

    def _capture_or_run(self) -> None:
        """The warm-up runs and the capture where no other thread runs on the device, else one run outside any graph
        (its outputs are this run's answer), the thread's next forward then holding the device alone (``capture_lock``)."""
        started = time.perf_counter()
        for _ in range(WARMUP_RUNS):
            self.session.run_with_iobinding(self.binding, run_options(UNCAPTURED))
            if CAPTURE_LOCK.busy_elsewhere():  # this run is the answer
                break
        else:
            with CAPTURE_LOCK.exclusive_if_alone() as alone:  # no other thread's CUDA call may fall inside the capture
                if alone:
                    self.session.run_with_iobinding(self.binding, self.options)  # captures, then replays
                    self.captured = True
        if self.captured:
            CAPTURES.add(captured=1, seconds=time.perf_counter() - started)
        else:
            CAPTURE_LOCK.want_alone()
            CAPTURES.add(deferred_runs=1)


@dataclass
class GraphedSession:
    """A session whose runs go through one ``Graph`` per set of input shapes, within the limits above."""

    session: onnxruntime.InferenceSession
    device: str
    device_id: int
    graphs: dict[tuple, Graph] = field(default_factory=dict)
    buffer_bytes: int = 0  # what the graphs' buffers take

    def __post_init__(self) -> None:
        self._inputs = {value.name: value for value in self.session.get_inputs()}
        self._outputs = self.session.get_outputs()

    def graph(self, shapes: Mapping[str, Sequence[int]], tokens: int, output_shapes: Mapping[str, Sequence[int]] | None = None) -> Graph | None:
        """The graph for inputs of these ``shapes`` (every input named) of a call of ``tokens`` tokens
        (rows x width), made on first use; None past the limits. ``output_shapes``: where the graph's outputs
        have dimensions its inputs do not name (read off the inputs otherwise)."""
        key = tuple(sorted((name, tuple(shape)) for name, shape in shapes.items()))
        found = self.graphs.get(key)
        if found is not None or len(self.graphs) >= MAX_GRAPHS or tokens > MAX_GRAPH_TOKENS:
            return found
        sizes = self._dimension_sizes(shapes)
        types = {value.name: value.type for value in self._outputs} | {name: self._inputs[name].type for name in shapes}
        if output_shapes is None:
            output_shapes = {value.name: [dim if isinstance(dim, int) else sizes[dim] for dim in value.shape] for value in self._outputs}
        wanted = sum(_nbytes(types[name], shape) for name, shape in {**shapes, **output_shapes}.items())
        if wanted > MAX_GRAPH_BYTES or self.buffer_bytes + wanted > MAX_SESSION_GRAPH_BYTES:
            return None
        self.buffer_bytes += wanted
        inputs = {name: self._buffer(types[name], shape) for name, shape in shapes.items()}
        outputs = {name: self._buffer(types[name], shape) for name, shape in output_shapes.items()}
        binding = self.session.io_binding()
        for name, value in inputs.items():
            binding.bind_ortvalue_input(name, value)
        for name, value in outputs.items():
            binding.bind_ortvalue_output(name, value)
        graph_id = len(self.graphs) + 1  # 0 is the EP's own default id
        self.graphs[key] = graph = Graph(self.session, inputs, outputs, binding, run_options(graph_id))
        return graph

    def _dimension_sizes(self, shapes: Mapping[str, Sequence[int]]) -> dict[str, int]:
        """The size of every named dimension, read off the inputs (outputs share their names)."""
        sizes: dict[str, int] = {}
        for name, shape in shapes.items():
            declared = self._inputs[name].shape
            if len(declared) != len(shape):
                raise ValueError(f"{name}: {len(shape)} dimensions given, the graph takes {len(declared)}")
            for dim, size in zip(declared, shape, strict=True):
                if isinstance(dim, str) and sizes.setdefault(dim, size) != size:
                    raise ValueError(f"dimension {dim!r} is {sizes[dim]} and {size} in the same run")
        return sizes

    def _buffer(self, onnx_type: str, shape: Sequence[int]) -> onnxruntime.OrtValue:
        return onnxruntime.OrtValue.ortvalue_from_shape_and_type(list(shape), _NUMPY_TYPES[onnx_type], self.device, self.device_id)


def _nbytes(onnx_type: str, shape: Sequence[int]) -> int:
    return int(np.prod(shape, dtype=np.int64)) * np.dtype(_NUMPY_TYPES[onnx_type]).itemsize


def capture_options(cuda_graphs: bool, device: str) -> dict[str, int]:
    """The CUDA EP options that let a session capture graphs: none off CUDA or without ``cuda_graphs``."""
    return {"enable_cuda_graph": 1} if cuda_graphs and device == "cuda" else {}


def run_options(graph_id: int) -> onnxruntime.RunOptions:
    """Run options naming the CUDA graph a run captures or replays (``UNCAPTURED``: none)."""
    options = onnxruntime.RunOptions()
    options.add_run_config_entry(GRAPH_ID, str(graph_id))
    return options
