"""``--gated-delta-kernel ChunkedGatedDeltaRule``: flash-linear-attention's chunked kernels compiled ahead of time
(``s1omni.export.fla_kernels``), the custom op library (``s1omni.export.gdn_library``), the graph rewrite
(``s1omni.export.cuda_kernels``) and the build that carries the library.

The kernels compile for sm_90 on this CPU machine and the library builds and registers with ONNX Runtime
here; the op itself has only a CUDA kernel, so the rewrite's wiring is checked with each node spelled
back as the CPU's ``LinearAttention`` (``tests.cuda_builds.gated_delta_net_emulated``), and the GPU tests
run the op against ``LinearAttention`` on the CUDA EP, eagerly and replayed from a CUDA graph.
"""

from __future__ import annotations

import json
import subprocess
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper

from s1omni.export.cuda_kernels import use_gated_delta_kernel
from s1omni.export.fla_kernels import KernelSpec, compile_kernel, kernel_specs
from s1omni.export.gdn_library import ORT_INCLUDE_VARIABLE, build_library
from s1omni.export.naming import OP_DOMAIN, OP_TYPE
from s1omni.runtime.errors import InputError
from s1omni.runtime.runners.onnxruntime_runner import OP_LIBRARY, session_options
from s1omni.runtime.runners.tensorrt_runner import device_compute_capability
from tests.cli import run_s1omni
from tests.cuda_builds import build_cuda_engine, gated_delta_net_emulated, needs_cuda
from tests.test_cuda_kernels import CPU, CUDA, _feeds, _linear_attention_model, _run

TINY_SHAPE = (4, 16, 16)  # the tiny member's Gated DeltaNet heads: 4 of 16 x 16


@pytest.fixture(scope="module")
def library(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("gdn-library")
    return out, build_library(out, [TINY_SHAPE, TINY_SHAPE], 90)


def test_the_library_builds_for_sm_90_without_a_gpu(library: tuple[Path, dict]) -> None:
    """One variant however many layers share a shape; the facts name the architecture and the launch choices;
    the library needs no CUDA library to load (it opens the driver when it first runs) and exports one symbol."""
    out, facts = library
    assert sorted(path.name for path in out.iterdir()) == [OP_LIBRARY]
    assert facts["arch"] == "sm_90" and facts["shapes"] == [list(TINY_SHAPE)] and facts["fla_version"] == "0.6.0"
    assert list(facts["kernels"]) == ["cumsum", "kkt_solve", "recompute_w_u", "chunk_states", "output", "silu_product", "delta_gates"]
    assert facts["kernels"]["chunk_states"]["shared"] > 48 * 1024 or facts["kernels"]["output"]["shared"] > 0
    needed = subprocess.run(["ldd", str(out / OP_LIBRARY)], capture_output=True, text=True, check=True).stdout
    assert "libcuda" not in needed and "libonnxruntime" not in needed
    symbols = subprocess.run(["nm", "-D", "--defined-only", str(out / OP_LIBRARY)], capture_output=True, text=True, check=True).stdout
    assert [line.split()[-1] for line in symbols.splitlines() if " T " in line] == ["RegisterCustomOps"]


def _op_model() -> onnx.ModelProto:
    inputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT16, None) for name in "qkv"]
    inputs += [helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in ("decay", "beta", "state")]
    outputs = [helper.make_tensor_value_info("o", TensorProto.FLOAT16, None), helper.make_tensor_value_info("s", TensorProto.FLOAT, None)]
    node = helper.make_node(OP_TYPE, ["q", "k", "v", "decay", "beta", "state"], ["o", "s"], domain=OP_DOMAIN, scale=0.25)
    graph = helper.make_graph([node], "op", inputs, outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(OP_DOMAIN, 1)], ir_version=10)


def test_an_engine_s_sessions_register_its_library(library: tuple[Path, dict], tmp_path: Path) -> None:
    """With the library registered ONNX Runtime knows the op (its CPU EP then has no kernel for it, as it should);
    without it the op is unknown."""
    out, _ = library
    model = _op_model().SerializeToString()
    with pytest.raises(Exception, match="ChunkedGatedDeltaRule|ai.s1omni") as without:
        onnxruntime.InferenceSession(model, session_options("cpu", tmp_path), providers=CPU)
    with pytest.raises(Exception) as registered:
        onnxruntime.InferenceSession(model, session_options("cpu", out), providers=CPU)
    assert str(registered.value) != str(without.value) and "No Op registered" not in str(registered.value)
    assert "No Op registered" in str(without.value) or "not a registered" in str(without.value)


def test_a_kernel_whose_signature_changed_fails_the_build_by_name() -> None:
    """A different fla whose kernel takes other parameters than the launcher passes is refused at build time."""
    (cumsum, *_) = kernel_specs(*TINY_SHAPE)
    renamed = KernelSpec(cumsum.name, cumsum.module, cumsum.function, (("x", "*fp32"), *cumsum.params[1:]), cumsum.constants)
    with pytest.raises(RuntimeError, match=r"chunk_local_cumsum_scalar_kernel takes \(s, o, scale"):
        compile_kernel(renamed, 90)


def test_missing_api_headers_are_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ORT_INCLUDE_VARIABLE, str(tmp_path))
    with pytest.raises(InputError, match="no onnxruntime_c_api.h: run `make setup`"):
        build_library(tmp_path, [TINY_SHAPE], 90)
    assert list(tmp_path.iterdir()) == []


def test_the_rewrite_computes_linear_attention_in_float16() -> None:
    """The rewritten node (emulated) against the original: q, k, v and output through float16, the state
    key-major both ways, the scale 1/sqrt(Dk) written out; a wrong scale or a swapped input is caught."""
    model, feeds = _linear_attention_model(2, 8), _feeds(2, 8, 2, 37, seed=1)
    want = _run(model, feeds, CPU)
    assert use_gated_delta_kernel(model, OP_TYPE) == 1
    ops = Counter(node.op_type for node in model.graph.node)
    assert ops == {"Cast": 4, "Reshape": 4, OP_TYPE: 1} and OP_DOMAIN in {opset.domain for opset in model.opset_import}
    (node,) = [node for node in model.graph.node if node.op_type == OP_TYPE]
    assert helper.get_attribute_value(node.attribute[0]) == pytest.approx(8**-0.5)
    got = _run(gated_delta_net_emulated(model, "fp16"), feeds, CPU)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == np.float32 and 0 < np.abs(g - w).max() <= 1e-2 * np.abs(w).max()
    node.attribute[0].f = 0.5
    assert not np.allclose(_run(gated_delta_net_emulated(model, "fp16"), feeds, CPU)[0], want[0], atol=1e-2)
    node.attribute[0].f = 8**-0.5
    node.input[3], node.input[4] = node.input[4], node.input[3]  # decay and beta swapped
    assert not np.allclose(_run(gated_delta_net_emulated(model, "fp16"), feeds, CPU)[1], want[1], atol=1e-2)


def test_the_build_carries_and_pins_the_library(exported: Path, tmp_path: Path) -> None:
    """A bf16 build for sm_90 on this CPU machine: every Gated DeltaNet node is the op, the manifest pins the
    library and records how it was made."""
    out = tmp_path / "engine"
    progress = build_cuda_engine(exported, out, "--precision", "bf16", "--gated-delta-kernel", OP_TYPE, "--cuda-arch", "90")
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["gated_delta_kernel"] == OP_TYPE and manifest["gated_delta_inputs"] == "fp16"
    assert manifest["gated_delta_library"]["arch"] == "sm_90" and manifest["gated_delta_library"]["shapes"] == [list(TINY_SHAPE)]
    assert OP_LIBRARY in manifest["files"] and f"compiling {OP_TYPE} for sm_90" in progress
    # fla and Triton, loaded to compile, leave neither their CPU-fallback warning nor their teardown report.
    assert "Triton is not supported" not in progress and "nanobind" not in progress, progress
    for graph in ("prefill", "continue", "packed"):
        ops = Counter(node.op_type for node in onnx.load(str(out / f"{graph}.onnx"), load_external_data=False).graph.node)
        assert ops[OP_TYPE] == 3 and ops["LinearAttention"] == 0 and ops["GatedDeltaNet"] == 0, graph


@pytest.mark.parametrize(
    ("options", "message"),
    [(["--precision", "fp32", "--gated-delta-kernel", OP_TYPE], "it is for --precision bf16 builds"),
     (["--precision", "bf16", "--gated-delta-kernel", OP_TYPE, "--gated-delta-inputs", "fp32"], "takes float16 q/k/v"),
     (["--precision", "bf16", "--cuda-arch", "90"], "--cuda-arch is the GPU architecture"),
     pytest.param(["--precision", "bf16", "--gated-delta-kernel", OP_TYPE], "no GPU here to compile for", id="no-gpu-no-arch",
                  marks=pytest.mark.skipif(device_compute_capability() is not None, reason="a GPU is visible: the build compiles for it"))],
)  # fmt: skip
def test_the_op_is_refused_where_it_cannot_apply(exported: Path, tmp_path: Path, options: list[str], message: str) -> None:
    result = run_s1omni("build", str(exported), "--backend", "onnxruntime", "--target", "cuda", *options, "--out", str(tmp_path / "e"))
    assert result.returncode == 2 and message in result.stderr and not (tmp_path / "e").exists()


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize(("heads", "size"), [(4, 16), (4, 128)], ids=["tiny", "members"])
@pytest.mark.parametrize(("batch", "tokens"), [(1, 1), (2, 8), (2, 64), (3, 300)])
def test_the_op_computes_linear_attention_on_the_gpu(gpu_library: Path, heads: int, size: int, batch: int, tokens: int) -> None:
    """The op, built for this GPU, continuing from a state, against ``LinearAttention`` in float32 on the CUDA EP:
    within float16 rounding (the same bound as GatedDeltaNet's float16 engine), whole and partial chunks."""
    model, feeds = _linear_attention_model(heads, size), _feeds(heads, size, batch, tokens, seed=tokens)
    want = _run(model, feeds, CUDA)
    use_gated_delta_kernel(model, OP_TYPE)
    got = onnxruntime.InferenceSession(model.SerializeToString(), session_options("cuda", gpu_library), providers=CUDA).run(None, feeds)
    for name, g, w in zip(("output", "state"), got, want, strict=True):
        assert g.dtype == np.float32 and g.shape == w.shape
        assert np.abs(g - w).max() <= 1e-2 * np.abs(w).max(), (name, np.abs(g - w).max(), np.abs(w).max())


@pytest.mark.gpu
@needs_cuda
def test_the_op_replays_from_a_cuda_graph(gpu_library: Path) -> None:
    """Captured by ONNX Runtime's CUDA graph after an ordinary run, then replayed with new inputs in the same
    buffers: each replay gives what an eager session gives for those inputs."""
    from s1omni.runtime.runners.cuda_graphs import capture_options

    model = _linear_attention_model(4, 128)
    use_gated_delta_kernel(model, OP_TYPE)
    providers = [("CUDAExecutionProvider", {"use_tf32": 0, **capture_options(True, "cuda")})]
    graphed = onnxruntime.InferenceSession(model.SerializeToString(), session_options("cuda", gpu_library), providers=providers)
    eager = onnxruntime.InferenceSession(model.SerializeToString(), session_options("cuda", gpu_library), providers=CUDA)
    first = _feeds(4, 128, 2, 100, seed=0)
    binding = graphed.io_binding()
    inputs = {name: onnxruntime.OrtValue.ortvalue_from_numpy(value, "cuda", 0) for name, value in first.items()}
    for name, value in inputs.items():
        binding.bind_ortvalue_input(name, value)
    for output in graphed.get_outputs():
        binding.bind_output(output.name, "cuda")
    for seed in range(4):  # the first run captures; the others replay
        feeds = _feeds(4, 128, 2, 100, seed=seed)
        for name, value in feeds.items():
            inputs[name].update_inplace(value)
        graphed.run_with_iobinding(binding)
        got = [value.numpy() for value in binding.get_outputs()]
        want = eager.run(None, feeds)
        for g, w in zip(got, want, strict=True):
            np.testing.assert_array_equal(g, w)
