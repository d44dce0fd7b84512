"""The Gated DeltaNet short convolutions as an op (``s1omni build --fused-short-convolutions``,
``s1omni.export.short_convolutions``) on the tiny member: the graphs it writes and what they compute, emulated on the
CPU EP (``tests.cuda_builds.short_convolutions_emulated`` spells each ``ShortConvolution`` as the
``CausalConvWithState`` it replaced; ``bfloat16_emulated`` rounds each bfloat16 value where it is made); its Triton
kernel compiled for sm_90 here and run by Triton's interpreter on the CPU; and on the GPU, the op against the float64
convolution of its inputs and against ONNX Runtime's own kernel."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper

from s1omni.export.bf16_gemms import Bf16Weights, bfloat16_bits
from s1omni.export.fla_kernels import compile_kernel
from s1omni.export.gdn_library import short_convolution_spec
from s1omni.export.mixer_fusions import fuse_short_convolutions
from s1omni.export.naming import CONTRIB_DOMAIN, OP_DOMAIN, OP_TYPE
from s1omni.export.short_convolutions import CONVOLUTION_OP, kernel_sizes, use_convolution_op
from s1omni.runtime.engine import read_manifest
from s1omni.runtime.runners.onnxruntime_runner import session_options
from tests.cli import run_s1omni
from tests.cuda_builds import needs_cuda, short_convolutions_emulated
from tests.test_bf16_convolutions import LAYERS, assert_cuda_ep_runs_the_rewrite_as_without, bf16_convolutions_built, emulated_variants

SIZE = 4  # the members' convolution taps, K
CUDA = [("CUDAExecutionProvider", {"use_tf32": 0}), "CPUExecutionProvider"]


def _built(export: Path, graph: str, weights: Bf16Weights, merged: bool, op: bool) -> onnx.ModelProto:
    """``graph`` as a bf16 build with fused mixers and bfloat16 convolutions writes it, with or without the op."""
    model = bf16_convolutions_built(export, graph, weights, merged, True)
    if op:
        assert use_convolution_op(model) == LAYERS
    return model


@pytest.mark.parametrize("merged", [True, False], ids=["merged", "unmerged"])
def test_the_op_computes_what_the_graph_did(external_export: Path, tmp_path: Path, merged: bool) -> None:
    """Prefill, then continue from its state: every output of the rewritten graphs, the op spelled back, the same bit
    for bit as the graphs without the rewrite; an op that left out the past window is told apart."""
    def built(graph: str, weights: Bf16Weights, op: bool) -> onnx.ModelProto:
        return _built(external_export, graph, weights, merged, op)

    spellings = {"op": short_convolutions_emulated, "no-past": lambda model: short_convolutions_emulated(model, past=False)}
    outputs = emulated_variants(external_export, tmp_path, built, spellings)
    assert all(np.array_equal(a, b) for a, b in zip(outputs["op"], outputs["graph"], strict=True))
    assert not all(np.array_equal(a, b) for a, b in zip(outputs["no-past"], outputs["graph"], strict=True))


@pytest.mark.parametrize("merged", [True, False], ids=["merged", "unmerged"])
def test_each_convolution_becomes_the_op_on_its_inputs_and_outputs(external_export: Path, tmp_path: Path, merged: bool) -> None:
    """In every graph each bfloat16 ``CausalConvWithState`` is one ``ShortConvolution`` in its place, its inputs and
    outputs in the same order; every other node is as it was, and the library compiles the members' 4 taps."""
    weights = Bf16Weights(external_export, tmp_path)
    for graph in ("prefill", "continue", "packed"):
        before = list(_built(external_export, graph, weights, merged, False).graph.node)
        model = _built(external_export, graph, weights, merged, True)
        after = list(model.graph.node)
        assert len(after) == len(before), graph
        replaced = 0
        for old, new in zip(before, after, strict=True):
            if old.op_type == "CausalConvWithState":
                assert (new.op_type, new.domain) == (CONVOLUTION_OP, OP_DOMAIN) and not new.attribute, graph
                assert list(new.input) == list(old.input) and list(new.output) == list(old.output), graph
                replaced += 1
            else:
                assert new == old, graph
        assert replaced == LAYERS and OP_DOMAIN in {opset.domain for opset in model.opset_import}
        assert kernel_sizes(model) == [SIZE]


def _unit_model(op_type: str, weight: np.ndarray, bias: np.ndarray | None, past: bool, **attributes: object) -> onnx.ModelProto:
    """One convolution of bfloat16 ``[B, T, C]`` (float32 in and out around it, which numpy can feed), its weight and
    bias bfloat16 initializers: ``CausalConvWithState`` (``attributes``), or ``op_type`` in the op library's domain."""
    def initializer(name: str, values: np.ndarray) -> onnx.TensorProto:
        return helper.make_tensor(name, TensorProto.BFLOAT16, values.shape, bfloat16_bits(values).tobytes(), raw=True)

    contrib = op_type == "CausalConvWithState"
    inputs = ["x/bf16", "weight", "bias" if bias is not None else "", *(["past/bf16"] if past else [])]
    nodes = [helper.make_node("Cast", ["x"], ["x/bf16"], to=TensorProto.BFLOAT16),
             *([helper.make_node("Cast", ["past"], ["past/bf16"], to=TensorProto.BFLOAT16)] if past else []),
             helper.make_node(op_type, inputs, ["y/bf16", "present/bf16"], name="conv", domain=CONTRIB_DOMAIN if contrib else OP_DOMAIN,
                              **(attributes if contrib else {})),
             helper.make_node("Cast", ["y/bf16"], ["y"], to=TensorProto.FLOAT),
             helper.make_node("Cast", ["present/bf16"], ["present"], to=TensorProto.FLOAT)]  # fmt: skip
    values = [helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in ("x", *(["past"] if past else []))]
    outputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in ("y", "present")]
    initializers = [initializer("weight", weight), *([initializer("bias", bias)] if bias is not None else [])]
    graph = helper.make_graph(nodes, "conv", values, outputs, initializers)
    opsets = [helper.make_opsetid("", 18), helper.make_opsetid(CONTRIB_DOMAIN if contrib else OP_DOMAIN, 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=10)


def test_convolutions_the_op_does_not_compute_are_left_alone(external_export: Path) -> None:
    """Only a channels-last ``CausalConvWithState`` with the SiLU and no dilation or window, of a bfloat16 weight
    whose channels are a multiple of 8, becomes the op; any other node is left as it was, and so is a graph whose
    convolutions are float32 ``[B, C, T]`` (no ``--bf16-convolutions``)."""
    weight = np.ones((128, 1, SIZE), np.float32)
    assert use_convolution_op(_unit_model("CausalConvWithState", weight, None, True, activation="silu", channels_last=1)) == 1
    for channels, attributes in ((128, {"activation": "silu"}), (128, {"activation": "silu", "channels_last": 0}),
                                 (128, {"channels_last": 1}), (128, {"activation": "swish", "channels_last": 1}),
                                 (128, {"activation": "silu", "channels_last": 1, "dilation": 2}),
                                 (128, {"activation": "silu", "channels_last": 1, "state_window": 2}),
                                 (100, {"activation": "silu", "channels_last": 1})):  # fmt: skip
        model = _unit_model("CausalConvWithState", np.ones((channels, 1, SIZE), np.float32), None, True, **attributes)
        before = model.SerializeToString()
        assert use_convolution_op(model) == 0 and model.SerializeToString() == before, (channels, attributes)
    plain = onnx.load(str(external_export / "continue.fused.onnx"), load_external_data=False)
    assert fuse_short_convolutions(plain) == LAYERS
    before = plain.SerializeToString()
    assert use_convolution_op(plain) == 0 and plain.SerializeToString() == before


def test_the_build_option_needs_its_prerequisites(exported: Path, tmp_path: Path, cuda_engine: Callable[..., tuple[Path, str]]) -> None:
    """Refused without --bf16-convolutions, then without the op library's --gated-delta-kernel, each saying so and
    writing nothing; with both, every graph's convolutions are the op and the library carries its kernel."""
    build = ["build", str(exported), "--backend", "onnxruntime", "--target", "cuda", "--precision", "bf16", "--fused-mixers"]
    for options, says in (([], "--fused-short-convolutions runs the convolutions --bf16-convolutions writes"),
                          (["--bf16-convolutions"], "--fused-short-convolutions runs the op library")):  # fmt: skip
        refused = run_s1omni(*build, *options, "--fused-short-convolutions", "--out", str(tmp_path / "refused"))
        assert refused.returncode == 2 and says in refused.stderr and not (tmp_path / "refused").exists(), options
    engine, progress = cuda_engine("--precision", "bf16", "--gated-delta-kernel", OP_TYPE, "--cuda-arch", "90", "--fused-mixers",
                                   "--bf16-convolutions", "--fused-short-convolutions")  # fmt: skip
    assert f"{LAYERS} {CONVOLUTION_OP} nodes" in progress
    manifest = read_manifest(engine)
    assert manifest["fused_short_convolutions"] is True and f"short_convolution_{SIZE}" in manifest["gated_delta_library"]["kernels"]
    for graph in ("prefill", "continue", "packed"):
        ops = Counter(node.op_type for node in onnx.load(str(engine / f"{graph}.onnx"), load_external_data=False).graph.node)
        assert ops[CONVOLUTION_OP] == LAYERS and ops["CausalConvWithState"] == 0 and ops[OP_TYPE] == 3, graph


def test_the_kernel_compiles_for_sm_90_to_16_byte_accesses(tmp_path: Path) -> None:
    """Without a GPU: the kernel reads its rows and writes its outputs as 16-byte vectors (128-bit ``LDG``/``STG`` in
    the sm_90 machine code, disassembled by Triton's ``cuobjdump``; only the weight and the bias, a value a channel and
    tap, are read narrower). A kernel compiled without C's multiple of 8 reads and writes 2 bytes at a time."""
    import triton

    cuobjdump = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    kernel = compile_kernel(short_convolution_spec(SIZE), 90)
    (tmp_path / "kernel.cubin").write_bytes(kernel.cubin)
    sass = subprocess.run([str(cuobjdump), "-sass", str(tmp_path / "kernel.cubin")], capture_output=True, text=True, check=True).stdout
    stores = {word for word in sass.split() if word.startswith("STG")}
    loads = {word for word in sass.split() if word.startswith("LDG")}
    assert stores and all(store.startswith("STG.E.128") for store in stores), stores
    assert any(load.startswith("LDG.E.128") for load in loads) and all(load.startswith(("LDG.E.128", "LDG.E.U16")) for load in loads), loads


# Run by test_the_kernel_in_triton_s_interpreter in a process of its own: Triton's interpreter takes over
# triton.language only where TRITON_INTERPRET is set before Triton is first imported.
_INTERPRETER = """
import sys
import numpy as np, torch, triton
from s1omni.export.gdn_library import short_convolution_spec
from s1omni.export.short_convolution_kernel import short_convolution_kernel
cases = np.load(sys.argv[1])
constants = short_convolution_spec(int(cases["size"])).constants
ran = {}
for case in range(int(cases["count"])):
    x, weight, bias, past = (torch.from_numpy(cases[f"{name}{case}"]).view(torch.bfloat16) for name in ("x", "weight", "bias", "past"))
    rows, tokens, channels = x.shape
    y = torch.empty(rows, tokens, channels, dtype=torch.bfloat16)
    present = torch.empty(rows, constants["K"] - 1, channels, dtype=torch.bfloat16)
    grid = (triton.cdiv(channels, constants["BLOCK_C"]), max(1, triton.cdiv(tokens, constants["BLOCK_T"])), rows)
    short_convolution_kernel[grid](x, weight, bias, past, y, present, tokens, channels, bias.numel(), past.shape[1], **constants)
    ran[f"y{case}"], ran[f"present{case}"] = y.view(torch.int16).numpy(), present.view(torch.int16).numpy()
np.savez(sys.argv[2], **ran)
"""


def _bits(values: np.ndarray) -> np.ndarray:
    return bfloat16_bits(values).view(np.int16)


def _widened(bits: np.ndarray) -> np.ndarray:
    return (bits.view(np.uint16).astype(np.uint32) << 16).view(np.float32)


def _inputs(rng: np.random.Generator, rows: int, tokens: int, channels: int, bias: bool, past: bool) -> dict[str, np.ndarray]:
    """A convolution's bfloat16 inputs (as float32), on grids whose products and sums float32 holds exactly (the input
    and the past window multiples of 1/16 under 8, the weight and the bias multiples of 1/64 under 2: K + 1 terms, each
    a multiple of 2^-10 under 2^7), so that the SiLU and the output are all that rounds (near-zero sums of rounded
    float32 terms would lose their digits to cancellation); the bias ``[0]`` and the past ``[B, 0, C]`` where there is
    none."""
    def grid(shape: tuple[int, ...], scale: float, unit: int) -> np.ndarray:
        return (np.clip(np.round(rng.standard_normal(shape) * scale * unit), -127, 127) / unit).astype(np.float32)

    return {"x": grid((rows, tokens, channels), 2.0, 16), "weight": grid((channels, 1, SIZE), 0.5, 64),
            "bias": grid((channels if bias else 0,), 0.5, 64), "past": grid((rows, SIZE - 1 if past else 0, channels), 2.0, 16)}  # fmt: skip


def _exact(inputs: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The float64 convolution and SiLU of ``inputs``, and the window after the last token (the padded sequence's last
    K - 1 rows, zeros where the input and the past are shorter)."""
    x = inputs["x"].astype(np.float64)
    rows, tokens, channels = x.shape
    past = inputs["past"] if inputs["past"].shape[1] else np.zeros((rows, SIZE - 1, channels), np.float32)
    padded = np.concatenate([past.astype(np.float64), x], axis=1)
    weight = inputs["weight"][:, 0, :].astype(np.float64)
    total = sum(weight[:, k] * padded[:, k : k + tokens] for k in range(SIZE)) + (inputs["bias"] if inputs["bias"].size else 0.0)
    return total / (1.0 + np.exp(-total)), padded[:, tokens:].astype(np.float32)


def _within_a_step(got: np.ndarray, exact: np.ndarray) -> tuple[bool, float]:
    """Whether ``got`` is within one bfloat16 step of ``exact`` everywhere, and the share of it not ``exact``'s nearest
    bfloat16."""
    nearest = _widened(_bits(exact.astype(np.float32)))
    step = np.spacing(np.abs(nearest)) * 2.0**16  # a bfloat16 step: float32's, 16 mantissa bits coarser
    return bool(np.all(np.abs(got - exact) <= step)), float(np.mean(got != nearest)) if got.size else 0.0


def test_the_kernel_in_triton_s_interpreter(tmp_path: Path) -> None:
    """The kernel's indexing, run by Triton's interpreter on the CPU: within one bfloat16 step of the float64
    convolution everywhere and the window after the last token bit for bit, over inputs shorter than the window (1 and
    2 tokens, none), a channel block cut short (1,000 of 256-wide blocks) and a token block (37 of 16), with and
    without a past window and a bias. (The interpreter truncates where it rounds to bfloat16: the GPU test holds the
    rounding to the nearest.)"""
    rng = np.random.default_rng(5)
    shapes = [(1, 1, 96, True, True), (3, 2, 1000, False, True), (2, 37, 1000, True, False), (1, 64, 96, False, False), (2, 0, 64, False, True)]
    cases = [_inputs(rng, *shape) for shape in shapes]
    packed = {f"{name}{i}": _bits(value) for i, case in enumerate(cases) for name, value in case.items()}
    np.savez(tmp_path / "cases.npz", size=SIZE, count=len(cases), **packed)
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
    subprocess.run([sys.executable, "-c", _INTERPRETER, str(tmp_path / "cases.npz"), str(tmp_path / "ran.npz")], env=env, check=True)
    ran = np.load(tmp_path / "ran.npz")
    for i, (shape, case) in enumerate(zip(shapes, cases, strict=True)):
        exact, window = _exact(case)
        within, _ = _within_a_step(_widened(ran[f"y{i}"]), exact)
        assert within and np.array_equal(_widened(ran[f"present{i}"]), window), shape


def _feeds(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {"x": inputs["x"], **({"past": inputs["past"]} if inputs["past"].shape[1] else {})}


def _sessions(library: Path, inputs: dict[str, np.ndarray]) -> tuple[onnxruntime.InferenceSession, onnxruntime.InferenceSession]:
    """The op and ONNX Runtime's ``CausalConvWithState(channels_last=1)`` on ``inputs``' weight and bias, CUDA EP."""
    bias = inputs["bias"] if inputs["bias"].size else None
    past = bool(inputs["past"].shape[1])
    model = _unit_model("CausalConvWithState", inputs["weight"], bias, past, activation="silu", channels_last=1)
    ours = onnx.ModelProto()
    ours.CopyFrom(model)
    assert use_convolution_op(ours) == 1
    return (onnxruntime.InferenceSession(ours.SerializeToString(), session_options("cuda", library), providers=CUDA),
            onnxruntime.InferenceSession(model.SerializeToString(), providers=CUDA))  # fmt: skip


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("tokens", [1, 3, 64, 600, 2048])
@pytest.mark.parametrize("channels", [6144, 8192, 96, 1000])
def test_the_op_rounds_the_exact_convolution_on_the_gpu(gpu_library: Path, channels: int, tokens: int) -> None:
    """The op, built for this GPU, against float64: within one bfloat16 step of the exact convolution and SiLU of its
    bfloat16 inputs everywhere, at most 1% not its nearest bfloat16 (float32 sums and Triton's ``exp`` on the way), the
    window after the last token bit for bit; and at most a bfloat16 step from ONNX Runtime's own CUDA kernel on the
    same inputs, its window the same. One or three rows, with and without a past window and a bias; the 0.8B's and
    the 4B's 6,144 and 8,192 channels, and 96 and 1,000 (under and across the 256-channel blocks)."""
    rng = np.random.default_rng(channels + tokens)
    for rows, bias, past in ((1, False, False), (3, True, True), (1, True, False), (3, False, True)):
        inputs = _inputs(rng, rows, tokens, channels, bias, past)
        ours, theirs = _sessions(gpu_library, inputs)
        y, present = ours.run(None, _feeds(inputs))
        exact, window = _exact(inputs)
        within, not_nearest = _within_a_step(y, exact)
        case = (rows, tokens, channels, bias, past)
        assert y.shape == exact.shape and within and not_nearest <= 0.01 and np.array_equal(present, window), (case, not_nearest)
        their_y, their_present = theirs.run(None, _feeds(inputs))
        step = np.spacing(np.maximum(np.abs(y), np.abs(their_y))) * 2.0**16
        assert np.all(np.abs(y - their_y) <= step) and np.array_equal(present, their_present), case


def _chain(op: bool, convolutions: int, weight: np.ndarray) -> onnx.ModelProto:
    """``convolutions`` convolutions one after the other on bfloat16 ``[1, T, C]`` with a past window: the op's, or ONNX
    Runtime's; one cast in and one out, so that a longer chain's extra time is its convolutions'."""
    unit = _unit_model("CausalConvWithState", weight, None, True, activation="silu", channels_last=1)
    (conv,) = [node for node in unit.graph.node if node.op_type == "CausalConvWithState"]
    nodes = [node for node in unit.graph.node if node.op_type == "Cast" and node.output[0] in ("x/bf16", "past/bf16")]
    source = "x/bf16"
    for i in range(convolutions):
        step = onnx.NodeProto()
        step.CopyFrom(conv)
        del step.input[:], step.output[:]
        step.input.extend([source, "weight", "", "past/bf16"])
        step.output.extend([f"y{i}/bf16", f"present{i}/bf16"])
        step.name = f"conv{i}"
        nodes.append(step)
        source = f"y{i}/bf16"
    nodes.append(helper.make_node("Cast", [source], ["y"], to=TensorProto.FLOAT))
    graph = helper.make_graph(nodes, "chain", list(unit.graph.input), [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              list(unit.graph.initializer))  # fmt: skip
    model = helper.make_model(graph, opset_imports=list(unit.opset_import), ir_version=10)
    if op:
        assert use_convolution_op(model) == convolutions
    return model


@pytest.mark.gpu
@needs_cuda
def test_the_op_s_time_beside_onnx_runtime_s(gpu_library: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Printed, not held to anything: microseconds a call of the op and of ONNX Runtime's kernel, each from the
    difference between a chain of 21 convolutions and one (the casts, the copies and the launch of a run cancel),
    on the inputs resident on the GPU."""
    timings = {}
    for channels, tokens in ((6144, 600), (8192, 2048)):
        rng = np.random.default_rng(channels)
        inputs = _inputs(rng, 1, tokens, channels, False, True)
        for op in (False, True):
            seconds = []
            for convolutions in (1, 21):
                options = session_options("cuda", gpu_library)
                session = onnxruntime.InferenceSession(_chain(op, convolutions, inputs["weight"]).SerializeToString(), options, providers=CUDA)
                binding = session.io_binding()
                for name, value in _feeds(inputs).items():
                    binding.bind_ortvalue_input(name, onnxruntime.OrtValue.ortvalue_from_numpy(value, "cuda", 0))
                binding.bind_output("y", "cuda")
                for _ in range(5):
                    session.run_with_iobinding(binding)
                started = time.perf_counter()
                for _ in range(50):
                    session.run_with_iobinding(binding)
                seconds.append((time.perf_counter() - started) / 50)
            timings[f"{'op' if op else 'onnxruntime'} C={channels} T={tokens}"] = round((seconds[1] - seconds[0]) / 20 * 1e6, 2)
    with capsys.disabled():
        print(f"\nshort convolution, us a call: {json.dumps(timings)}")


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("merged", [True, False], ids=["merged", "unmerged"])
def test_the_cuda_ep_runs_the_rewrite_as_the_graph_without_it(gpu_library: Path, external_export: Path, tmp_path: Path, merged: bool) -> None:
    """Prefill, then continue from its state, through the rewritten graphs on the CUDA EP (bfloat16 GEMMs, the op
    library's short convolutions) against the same graphs without the rewrite there (ONNX Runtime's kernel): every
    output within a few bfloat16 steps (the two compute the same float32 sums, but a value near a rounding boundary
    may round the other way, and the difference travels)."""
    assert_cuda_ep_runs_the_rewrite_as_without(gpu_library, external_export, tmp_path, lambda graph, weights, op: _built(external_export, graph, weights, merged, op))
