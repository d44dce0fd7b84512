"""One copy of an engine's weights for all its sessions in a process (``s1omni.runtime.runners.device_weights``):
checked on the CPU with sharing asked for (CPU engines do not share by default), and on the GPU as served."""

from __future__ import annotations

import gc
import shutil
import weakref
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from onnxruntime.capi import _pybind_state as ort_c

from s1omni.runtime.engine import read_manifest, write_manifest
from s1omni.runtime.runners.base import Block, Prefix, Tree
from s1omni.runtime.runners.onnxruntime_runner import OnnxRuntimeRunner
from s1omni.runtime.runners.device_weights import DeviceWeights, device_weights
from tests.cuda_builds import build_cuda_engine, needs_cuda

GRAPHS = ("prefill.onnx", "continue.onnx", "packed.onnx")
ONNX_TYPES = {"tensor(float)": TensorProto.FLOAT, "tensor(bfloat16)": TensorProto.BFLOAT16, "tensor(float16)": TensorProto.FLOAT16}


@pytest.fixture(scope="module")
def weights_outside(exported: Path, external_export: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny member's export with its fused graphs' weights outside them, as a real-size member's export is."""
    export = tmp_path_factory.mktemp("weights-outside") / "export"
    shutil.copytree(exported, export)
    for name in ("prefill.fused.onnx", "continue.fused.onnx", "packed.fused.onnx", "weights.data"):
        shutil.copy(external_export / name, export / name)
    write_manifest(export, {key: value for key, value in read_manifest(export).items() if key != "files"})
    return export


@pytest.fixture(scope="module")
def external_engine(weights_outside: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CUDA build of it whose ops the CPU also runs (float32, ``LinearAttention``), run here on the CPU EP."""
    out = tmp_path_factory.mktemp("external-engine") / "engine"
    build_cuda_engine(weights_outside, out, "--gated-delta-kernel", "LinearAttention")
    return out


def _trees() -> list[Tree]:
    rng = np.random.default_rng(7)
    return [
        Tree(Prefix(rng.integers(1, 2048, 23)), (Block(rng.integers(1, 2048, 9), np.array([2, 8])), Block(rng.integers(1, 2048, 4), np.array([3])))),
        Tree(Prefix(rng.integers(1, 2048, 6)), (Block(rng.integers(1, 2048, 12), np.array([11])),)),
    ]


def _external(engine: Path) -> dict[tuple[str, int], int]:
    """Every external initializer's (file, offset) in the engine's graphs, with its length."""
    found = {}
    for graph in GRAPHS:
        for tensor in onnx.load(str(engine / graph), load_external_data=False).graph.initializer:
            if tensor.data_location == TensorProto.EXTERNAL:
                entries = {entry.key: entry.value for entry in tensor.external_data}
                found[entries["location"], int(entries.get("offset", 0))] = int(entries["length"])
    return found


def _zero_every_weight(weights: DeviceWeights) -> None:
    """Write zeros into the shared copy itself (the views share its memory), on whichever device it is."""
    for view in weights._placed.values():
        data_type = ONNX_TYPES[view.data_type()]
        zeros = np.zeros(view.shape(), f"u{helper.tensor_dtype_to_np_dtype(data_type).itemsize}")
        view._ortvalue.update_inplace(ort_c.OrtValue.ortvalue_from_numpy_with_onnx_type(zeros, data_type))


def _answers(runner: OnnxRuntimeRunner) -> list[np.ndarray]:
    return [hidden for tree in runner.run(_trees()) for hidden in tree]


def test_the_runners_of_an_engine_read_one_copy_of_its_weights(external_engine: Path) -> None:
    external = _external(external_engine)
    assert len(external) > 10  # the engine keeps its weights outside the graphs, as the real members' do
    alone = OnnxRuntimeRunner(external_engine)
    assert alone.weights is None  # the CPU's default: ONNX Runtime prepacks its GEMM weights per session
    first, second = (OnnxRuntimeRunner(external_engine, share_weights=True) for _ in range(2))
    first.open_packed()
    second.open_packed()
    assert first.weights is second.weights is device_weights(external_engine, "cpu", 0)
    assert first.weights.bytes == sum(external.values())  # each tensor placed once, whichever graphs read it
    want = _answers(alone)
    for runner in (first, second):
        got = _answers(runner)
        assert all(np.array_equal(a, b) for a, b in zip(got, want, strict=True))
    packed = first.run_packed(_trees())
    assert all(np.array_equal(a, b) for a, b in zip([h for tree in packed for h in tree], want, strict=True))

    # The sessions read the shared copy itself: zeroing it changes what both runners answer, and not what a
    # runner with its own copies answers.
    _zero_every_weight(first.weights)
    for runner in (first, second):
        assert not any(np.array_equal(a, b) for a, b in zip(_answers(runner), want, strict=True))
    assert all(np.array_equal(a, b) for a, b in zip(_answers(alone), want, strict=True))


def test_the_copy_goes_with_the_last_runner(external_engine: Path) -> None:
    first, second = (OnnxRuntimeRunner(external_engine, share_weights=True) for _ in range(2))
    held = weakref.ref(first.weights)
    del first
    gc.collect()
    assert held() is second.weights
    del second
    gc.collect()
    assert held() is None


def test_a_short_weights_file_is_refused(external_engine: Path, tmp_path: Path) -> None:
    engine = tmp_path / "engine"
    shutil.copytree(external_engine, engine)
    (location, offset), length = max(_external(engine).items(), key=lambda item: item[0][1])
    with (engine / location).open("r+b") as data:
        data.truncate(offset + length - 1)
    with pytest.raises(ValueError, match="ends before byte"):
        OnnxRuntimeRunner(engine, share_weights=True)


@needs_cuda
@pytest.mark.gpu
def test_cuda_sessions_read_the_shared_copy_in_place(weights_outside: Path, tmp_path: Path) -> None:
    """As served on the GPU (bfloat16 GEMMs, CUDA graphs, weights shared by default): the same answers as a runner
    with its own copies, and zeroing the shared copy changes them, i.e. ONNX Runtime did not copy it."""
    engine = tmp_path / "engine"
    build_cuda_engine(weights_outside, engine, "--precision", "bf16", "--gated-delta-kernel", "LinearAttention", "--cuda-graphs")
    own = OnnxRuntimeRunner(engine, device="cuda", precision="bf16", cuda_graphs=True, share_weights=False)
    shared = OnnxRuntimeRunner(engine, device="cuda", precision="bf16", cuda_graphs=True)
    assert shared.weights is not None and shared.weights.bytes == sum(_external(engine).values())
    want = _answers(own)
    assert all(np.array_equal(a, b) for a, b in zip(_answers(shared), want, strict=True))
    _zero_every_weight(shared.weights)
    assert not any(np.array_equal(a, b) for a, b in zip(_answers(shared), want, strict=True))
