"""Build ``prefill.plan`` and ``continue.plan`` from the exported graphs with TensorRT or TensorRT for RTX.

One code path drives both libraries (``s1omni.runtime.runners.tensorrt_runner.load_library`` picks the one
installed): a strongly typed network parsed from the ONNX file's path (so external weights load from
beside it), one optimization profile per graph over the served ranges, and a plan written under a
temporary name and renamed into place once both graphs have built. The differences:

- standard TensorRT autotunes on the GPU it runs on, so the target must be that GPU's compute
  capability; the timing cache per compute capability and library version lives next to the plans,
  and ``HardwareCompatibilityLevel`` stays NONE (a plan bound to this architecture, the fastest);
- TensorRT for RTX compiles ahead of time on the CPU for one named compute capability of its
  ``ComputeCapability`` enum (no sm_90), and takes no timing cache: the docs say one forces a GPU
  query during the CPU build and has no effect on RTX plans
  (https://docs.nvidia.com/deeplearning/tensorrt-rtx/latest/inference-library/cpu-engines.html);
  1.7.1 calls the timing-cache calls no-ops and deprecated.

Profiles are given per graph and per *dimension name* of the ONNX inputs (``dim_param``), not per
input: the builder requires every input sharing a named dimension to share its range ("Profile kOPT
values are not self-consistent. Dimensions with name seq must be equal", seen with RTX 1.7.1).
"""

from __future__ import annotations

import hashlib
import math
import os
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import onnx

from s1omni.runtime import progress
from s1omni.runtime.runners.tensorrt_runner import GRAPHS, Library, device_compute_capability, library_logger, load_library, normalize_target

Range = tuple[int, int, int]  # min, opt, max of one dimension
Shape = tuple[int, ...]
Dim = int | str | None  # static size, dimension name, or unnamed dynamic
PRECISIONS = {onnx.TensorProto.FLOAT: "fp32", onnx.TensorProto.FLOAT16: "fp16", onnx.TensorProto.BFLOAT16: "bf16"}
WRITE_CHUNK = 64 << 20


def build_plans(
    onnx_dir: Path,
    out_dir: Path,
    target: str,
    profiles: Mapping[str, Mapping[str, Range]],
    library: str | None = None,
) -> dict[str, Any]:
    """Build both plans for ``target`` (``sm_89``...) and return what the engine manifest records.

    ``profiles[graph][dimension] = (min, opt, max)`` for every named dynamic dimension of that
    graph's inputs, e.g. prefill ``batch``/``sequence`` and continue ``blocks``/``block_length``/``past_length``
    with whatever names the exporter gave them; the caller decides the served ranges.
    """
    lib = load_library(library)
    target = normalize_target(target)
    capability = _check_target(lib, target)
    onnx_dir, out_dir = Path(onnx_dir), Path(out_dir)
    timing = None if lib.rtx else _TimingCache(out_dir / f"timing-{target}-{lib.name}-{lib.version}.cache")
    record: dict[str, Any] = {"backend": "tensorrt", "library": lib.name, "library_version": lib.version, "target": target,
                              "strongly_typed": True, "timing_cache": timing and timing.path.name, "profiles": {}, "plans": {}}  # fmt: skip
    # Read both graphs and check their profiles before spending minutes on the first build.
    graphs = {graph: read_graph(onnx_dir / f"{graph}.onnx") for graph in GRAPHS}
    shapes = {graph: profile_shapes(inputs, profiles.get(graph, {}), graph) for graph, (inputs, _, _) in graphs.items()}
    precisions = {precision for _, _, precision in graphs.values()}
    if len(precisions) != 1:
        raise ValueError(f"the graphs in {onnx_dir} disagree on precision: {sorted(precisions)}")
    record["precision"] = precisions.pop()
    out_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with _renamed_together() as pending:
        for graph, (inputs, outputs, _) in graphs.items():
            source = onnx_dir / f"{graph}.onnx"
            progress.note(f"{lib.name} {lib.version}: building {graph}.plan for {target} from {source}")
            clock = time.perf_counter()
            plan = _build(lib, source, shapes[graph], capability, timing)
            seconds = round(time.perf_counter() - clock, 2)
            digest, size = _write(pending, out_dir / f"{graph}.plan", plan)
            del plan  # a real backbone's plan is as large as its weights
            progress.note(f"{graph}.plan: {size / 2**20:.1f} MiB in {seconds} s")
            record["profiles"][graph] = {
                name: {"min": list(lo), "opt": list(opt), "max": list(hi)} for name, (lo, opt, hi) in shapes[graph].items()
            }
            record["plans"][graph] = {"file": f"{graph}.plan", "sha256": digest, "bytes": size, "build_seconds": seconds,
                                      "inputs": list(inputs), "outputs": outputs}  # fmt: skip
        if timing is not None and timing.cache is not None:
            _write(pending, timing.path, timing.cache.serialize())
    record["build_seconds"] = round(time.perf_counter() - started, 2)
    return record


def read_graph(path: Path) -> tuple[dict[str, list[Dim]], list[str], str]:
    """Input dims, output names and weight precision (the float type holding most weight elements), weights left on disk."""
    model = onnx.load(str(path), load_external_data=False)
    initializers = {init.name for init in model.graph.initializer}
    inputs = {
        value.name: [dim.dim_value if dim.HasField("dim_value") else (dim.dim_param or None) for dim in value.type.tensor_type.shape.dim]
        for value in model.graph.input
        if value.name not in initializers  # old exporters list initializers as inputs too
    }
    counts: dict[int, int] = {}
    for init in model.graph.initializer:
        counts[init.data_type] = counts.get(init.data_type, 0) + math.prod(init.dims)
    floats = {kind: count for kind, count in counts.items() if kind in PRECISIONS}
    precision = PRECISIONS[max(floats, key=floats.__getitem__)] if floats else "fp32"
    return inputs, [value.name for value in model.graph.output], precision


def profile_shapes(inputs: Mapping[str, list[Dim]], dims: Mapping[str, Range], graph: str) -> dict[str, tuple[Shape, Shape, Shape]]:
    """(min, opt, max) shapes of each dynamic input from the ranges of its named dimensions."""
    named = {dim for shape in inputs.values() for dim in shape if isinstance(dim, str)}
    if unknown := sorted(set(dims) - named):
        raise ValueError(f"{graph}: no input has the dimension(s) {unknown}; its dimensions are {sorted(named)}")
    for name, (lo, opt, hi) in dims.items():
        if not 0 <= lo <= opt <= hi:
            raise ValueError(f"{graph}: range of {name} must satisfy 0 <= min <= opt <= max, got {(lo, opt, hi)}")
    shapes = {}
    for name, shape in inputs.items():
        if all(isinstance(dim, int) for dim in shape):
            continue  # static inputs take no profile entry
        if None in shape:
            raise ValueError(f"{graph}: input {name} has an unnamed dynamic dimension {shape}; export it with a name")
        if missing := sorted({dim for dim in shape if isinstance(dim, str)} - set(dims)):
            raise ValueError(f"{graph}: no range given for dimension(s) {missing} of input {name}")
        shapes[name] = tuple(tuple(dim if isinstance(dim, int) else dims[dim][k] for dim in shape) for k in range(3))
    return shapes


def _check_target(lib: Library, target: str) -> Any:
    """RTX: the ``ComputeCapability`` member for ``target``. Standard TensorRT: None, once the GPU here is ``target``."""
    if lib.rtx:
        member = getattr(lib.trt.ComputeCapability, "SM" + target[3:], None)
        if member is None:
            known = sorted(int(name[2:]) for name in lib.trt.ComputeCapability.__members__ if name.startswith("SM"))
            raise ValueError(f"TensorRT for RTX {lib.version} cannot target {target}; it targets {', '.join(f'sm_{cc}' for cc in known)}")
        return member
    device = device_compute_capability()
    if device != target:
        raise ValueError(f"standard TensorRT builds for the GPU it runs on; asked for {target}, this machine has {device or 'no GPU'}")
    return None


class _TimingCache:
    """Standard TensorRT's timing cache for one compute capability and library version, shared by both builds."""

    def __init__(self, path: Path):
        self.path = path
        self.cache: Any = None

    def attach(self, config: Any) -> None:
        if self.cache is None:
            self.cache = config.create_timing_cache(self.path.read_bytes() if self.path.exists() else b"")
        config.set_timing_cache(self.cache, ignore_mismatch=False)


def _build(
    lib: Library, source: Path, shapes: Mapping[str, tuple[Shape, Shape, Shape]], capability: Any, timing: _TimingCache | None
) -> Any:
    """The serialized plan (an IHostMemory buffer)."""
    trt = lib.trt
    log = library_logger(trt)
    log.errors.clear()
    builder = trt.Builder(log)
    # Required on TensorRT 10 and RTX; accepted and ignored on TensorRT 11, where every network is strongly typed.
    network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
    parser = trt.OnnxParser(network, log)
    if not parser.parse_from_file(str(source)):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise RuntimeError(f"{lib.name} {lib.version} cannot parse {source}: {errors}")
    _allow_attention_fallback(trt, network)
    config = builder.create_builder_config()
    profile = builder.create_optimization_profile()
    for name, (lo, opt, hi) in shapes.items():
        profile.set_shape(name, lo, opt, hi)
    config.add_optimization_profile(profile)
    if lib.rtx:
        config.num_compute_capabilities = 1
        config.set_compute_capability(capability, 0)
    else:
        timing.attach(config)
    plan = builder.build_serialized_network(network, config)
    if plan is None:
        raise RuntimeError(f"{lib.name} {lib.version} could not build {source.name}: {'; '.join(log.errors) or 'no error was logged'}")
    return plan


def _allow_attention_fallback(trt: Any, network: Any) -> None:
    """Let ONNX ``Attention`` nodes fall back to MatMul/Softmax where no fused kernel fits.

    RTX 1.7.1 refuses float32 attention, and head size 8 in any precision, otherwise ("Attention
    operation was not supported by a dedicated kernel"); where a fused kernel exists (BF16/FP16, head
    sizes 16 to 256 seen) the plan is unchanged.
    Polygraphy's ``SetDecomposableAttentions`` does the same (NVIDIA/TensorRT:tools/Polygraphy/polygraphy/backend/trt/loader.py).
    """
    attention = getattr(trt.LayerType, "ATTENTION_INPUT", None)  # TensorRT before IAttention has none
    for index in range(network.num_layers):
        layer = network.get_layer(index)
        if layer.type == attention:
            layer.__class__ = trt.IAttentionInputLayer  # the bindings' downcast
            layer.attention.decomposable = True


@contextmanager
def _renamed_together() -> Iterator[dict[Path, Path]]:
    """Collect ``final -> temporary`` files; rename all into place when the block succeeds, else delete them."""
    pending: dict[Path, Path] = {}
    try:
        yield pending
    except BaseException:
        for temporary in pending.values():
            temporary.unlink(missing_ok=True)
        raise
    for final, temporary in pending.items():
        os.replace(temporary, final)


def _write(pending: dict[Path, Path], path: Path, data: Any) -> tuple[str, int]:
    """Write ``data`` (any buffer) beside ``path`` under a hidden temporary name; its SHA-256 and size."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.partial")
    pending[path] = temporary
    view = memoryview(data).cast("B")
    digest = hashlib.sha256()
    with temporary.open("wb") as handle:
        for start in range(0, len(view), WRITE_CHUNK):
            chunk = view[start : start + WRITE_CHUNK]
            digest.update(chunk)
            handle.write(chunk)
        handle.flush()
        os.fsync(handle.fileno())
    return digest.hexdigest(), len(view)


