"""The gated delta rule's gates as one op (``s1omni build --fused-delta-gates``, ``s1omni.export.delta_gates``): on the
tiny member the graphs it writes and what they compute, emulated on the CPU EP (``tests.cuda_builds.delta_gates_emulated``
spells each ``GatedDeltaGates`` as the nodes it replaced); the layers it leaves alone; its Triton kernel run by
Triton's interpreter against float64; and on the GPU the op against float64 and against ONNX Runtime's nodes, timed,
and the tiny member's rewritten graphs against the same graphs without the rewrite."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from s1omni.export.bf16_gemms import Bf16Weights
from s1omni.export.delta_gates import GATES_OP, use_delta_gates
from s1omni.export.naming import OP_DOMAIN, OP_TYPE
from s1omni.runtime.engine import read_manifest
from s1omni.runtime.runners.onnxruntime_runner import session_options
from tests.cli import run_s1omni
from tests.cuda_builds import delta_gates_emulated, microseconds_a_call, needs_cuda, op_library_built
from tests.graph_edits import node_making, rewritten_edits, set_initializer
from tests.test_bf16_convolutions import LAYERS, assert_cuda_ep_runs_the_rewrite_as_without, assert_the_op_spelled_back_is_the_graph

CUDA = [("CUDAExecutionProvider", {"use_tf32": 0}), "CPUExecutionProvider"]
THRESHOLD = 20.0  # torch's softplus threshold, which the export keeps
GATE_NODES = {"Cast": 2, "Add": 1, "Softplus": 1, "Greater": 1, "Where": 1, "Mul": 1, "Sigmoid": 1}  # a layer's, the prefill mask's Mul aside


def _built(export: Path, graph: str, weights: Bf16Weights, merged: bool, gates: bool) -> onnx.ModelProto:
    return op_library_built(export, graph, weights, merged, fused_delta_gates=gates)


@pytest.mark.parametrize("merged", [True, False], ids=["merged", "unmerged"])
def test_the_op_computes_what_the_graph_did(external_export: Path, tmp_path: Path, merged: bool) -> None:
    """Prefill (left-padded rows: the mask) then continue from its state: every output of the rewritten graphs, the op
    spelled back, the same bit for bit as the graphs without the rewrite; an op reading a and b the other way round is
    told apart."""
    assert_the_op_spelled_back_is_the_graph(external_export, tmp_path, merged, "fused_delta_gates", delta_gates_emulated,
                                            lambda model: delta_gates_emulated(model, swap=True))


@pytest.mark.parametrize("merged", [True, False], ids=["merged", "unmerged"])
def test_each_layer_s_gates_become_one_op(external_export: Path, tmp_path: Path, merged: bool) -> None:
    """One op a layer in every graph, reading the a and b GEMMs' bfloat16 products (with merged projections, the parts
    of the merged product's split), ``dt_bias`` and the decay scale (and in the prefill graph the padding mask), writing
    the rule's decay and beta; the nodes it replaced gone."""
    weights = Bf16Weights(external_export, tmp_path)
    for graph in ("prefill", "continue", "packed"):
        before = Counter(node.op_type for node in _built(external_export, graph, weights, merged, False).graph.node)
        model = _built(external_export, graph, weights, merged, True)
        nodes = list(model.graph.node)
        producers = {output: node for node in nodes for output in node.output}
        initializers = {tensor.name: tensor for tensor in model.graph.initializer}
        ops = [node for node in nodes if node.op_type == GATES_OP]
        assert len(ops) == LAYERS and all(node.domain == OP_DOMAIN for node in ops), graph
        for op in ops:
            assert all(name.endswith("/bf16") and producers[name].op_type == ("Split" if merged else "MatMul") for name in op.input[:2])
            assert [list(initializers[name].dims) for name in op.input[2:4]] == [[4], [4]]  # the tiny member's value heads
            assert len(op.input) == (5 if graph == "prefill" else 4), graph
            readers = [(node.op_type, list(node.input).index(name)) for name in op.output for node in nodes if name in node.input]
            assert readers == [(OP_TYPE, 3), (OP_TYPE, 4)]
            assert [attribute.f for attribute in op.attribute if attribute.name == "threshold"] == [THRESHOLD]
        after = Counter(node.op_type for node in nodes)
        masked = {"Mul": 1} if graph == "prefill" else {}
        assert {op: before[op] - after[op] for op in GATE_NODES} == {op: LAYERS * (count + masked.get(op, 0)) for op, count in GATE_NODES.items()}


def _unit_model(heads: int, mask: bool) -> onnx.ModelProto:
    """One Gated DeltaNet layer's gates as a bf16 build writes them, on float32 graph inputs ``a`` and ``b`` ``[B, T, H]``
    (rounded to bfloat16 as the GEMMs' products are) and ``mask`` ``[B, T, 1]``, shapes recorded as the export records
    them, ending in the ``ChunkedGatedDeltaRule`` that reads them."""
    rng = np.random.default_rng(heads)
    def info(name: str, dims: list[int | str] | None, elem: int = TensorProto.FLOAT) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(name, elem, dims)

    initializers = [numpy_helper.from_array(rng.standard_normal(heads).astype(np.float32), "dt_bias"),
                    numpy_helper.from_array(-np.exp(rng.standard_normal(heads)).astype(np.float32), "scale"),
                    numpy_helper.from_array(np.array(THRESHOLD, np.float32), "threshold")]  # fmt: skip
    nodes = [helper.make_node("Cast", [name], [f"{name}/bf16"], to=TensorProto.BFLOAT16) for name in ("a", "b")]
    nodes += [helper.make_node("Cast", [f"{name}/bf16"], [f"{name}/wide"], to=TensorProto.FLOAT) for name in ("a", "b")]
    nodes += [helper.make_node("Add", ["a/wide", "dt_bias"], ["x"]), helper.make_node("Softplus", ["x"], ["softplus"]),
              helper.make_node("Greater", ["x", "threshold"], ["above"]), helper.make_node("Where", ["above", "x", "softplus"], ["gated"]),
              helper.make_node("Mul", ["scale", "gated"], ["scaled" if mask else "decay"]),
              *([helper.make_node("Mul", ["scaled", "mask"], ["decay"])] if mask else []),
              helper.make_node("Sigmoid", ["b/wide"], ["beta"]),
              helper.make_node(OP_TYPE, ["q", "k", "v", "decay", "beta", "state"], ["out", "state/out"], domain=OP_DOMAIN, scale=0.1)]  # fmt: skip
    shapes = [info(name, ["B", "T", heads]) for name in ("a/wide", "b/wide", "x", "decay", "beta")]
    inputs = [info("a", ["B", "T", heads]), info("b", ["B", "T", heads]), *([info("mask", ["B", "T", 1])] if mask else []),
              *(info(name, None, TensorProto.FLOAT16) for name in ("q", "k", "v")), info("state", None)]  # fmt: skip
    graph = helper.make_graph(nodes, "gates", inputs, [info("out", None, TensorProto.FLOAT16), info("state/out", None)], initializers,
                              value_info=shapes)  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(OP_DOMAIN, 1)], ir_version=10)


def _widen_the_float32_input(graph: onnx.GraphProto) -> None:
    """``a`` cast from the float32 graph input: no bfloat16 GEMM product."""
    node_making(graph, "a/wide").input[0] = "a"


def _swap_inputs(node: onnx.NodeProto, first: int, second: int) -> None:
    node.input[first], node.input[second] = node.input[second], node.input[first]


@pytest.mark.parametrize("heads", [16, 32], ids=["0.8B", "4B"])
def test_only_what_the_op_computes_is_rewritten(heads: int) -> None:
    """The 0.8B's layer (16 value heads) and the 4B's (32), with and without the mask, become the op; a layer that
    differs from what it computes in any one way stays as it was: a softplus taken below the threshold, the branches of
    the ``Where`` swapped, a ``dt_bias`` or a scale of one value for every head, a product not from a bfloat16 GEMM, a
    gate or an intermediate read by another node, a mask of another shape, a threshold for each head, the rule reading
    beta as its decay."""
    for mask in (False, True):
        assert use_delta_gates(_unit_model(heads, mask)) == 1, (heads, mask)
    model = _unit_model(heads, True)
    edits: dict[str, Callable[[onnx.GraphProto], None]] = {
        "less": lambda g: setattr(node_making(g, "above"), "op_type", "Less"),
        "threshold": lambda g: set_initializer(g, "threshold", np.full(heads, THRESHOLD, np.float32)),
        "branches": lambda g: _swap_inputs(node_making(g, "gated"), 1, 2),
        "dt_bias": lambda g: set_initializer(g, "dt_bias", np.ones(1, np.float32)),
        "scale": lambda g: set_initializer(g, "scale", np.ones(1, np.float32)),
        "float32 a": _widen_the_float32_input,
        "beta read": lambda g: g.output.append(helper.make_tensor_value_info("beta", TensorProto.FLOAT, None)),
        "x read": lambda g: g.output.append(helper.make_tensor_value_info("x", TensorProto.FLOAT, None)),
        "mask": lambda g: next(i for i in g.input if i.name == "mask").CopyFrom(helper.make_tensor_value_info("mask", TensorProto.FLOAT, ["B", 1, "T"])),
        "rule": lambda g: _swap_inputs(node_making(g, "out"), 3, 4),
    }  # fmt: skip
    assert rewritten_edits(model, edits, use_delta_gates) == [], heads


def test_the_build_option_needs_the_op_library(exported: Path, tmp_path: Path, cuda_engine: Callable[..., tuple[Path, str]]) -> None:
    """Refused without ``--gated-delta-kernel ChunkedGatedDeltaRule``, saying so and writing nothing; with it, every
    graph's gates are the op and the library carries its kernel."""
    refused = run_s1omni("build", str(exported), "--backend", "onnxruntime", "--target", "cuda", "--precision", "bf16", "--fused-delta-gates",
                         "--out", str(tmp_path / "refused"))  # fmt: skip
    assert refused.returncode == 2 and "--fused-delta-gates runs the op library" in refused.stderr and not (tmp_path / "refused").exists()
    engine, progress = cuda_engine("--precision", "bf16", "--gated-delta-kernel", OP_TYPE, "--cuda-arch", "90", "--fused-delta-gates")
    assert f"{LAYERS} {GATES_OP} nodes" in progress
    manifest = read_manifest(engine)
    assert manifest["fused_delta_gates"] is True and "delta_gates" in manifest["gated_delta_library"]["kernels"]
    for graph in ("prefill", "continue", "packed"):
        ops = Counter(node.op_type for node in onnx.load(str(engine / f"{graph}.onnx"), load_external_data=False).graph.node)
        assert ops[GATES_OP] == LAYERS and ops["Softplus"] == 0 and ops[OP_TYPE] == LAYERS, graph


def _inputs(rng: np.random.Generator, rows: int, tokens: int, heads: int, mask: bool) -> dict[str, np.ndarray]:
    """bfloat16 a and b (as float32) that take x = a + dt_bias across the softplus threshold and deep below zero, a 0/1
    mask ``[B, T, 1]`` (``[0]`` without), and the layer's ``dt_bias`` and scale."""
    def bfloat16(values: np.ndarray) -> np.ndarray:
        return torch.from_numpy(values.astype(np.float32)).to(torch.bfloat16).to(torch.float32).numpy()

    return {"a": bfloat16(rng.standard_normal((rows, tokens, heads)) * 12), "b": bfloat16(rng.standard_normal((rows, tokens, heads)) * 8),
            "mask": (rng.random((rows, tokens, 1)) > 0.3).astype(np.float32) if mask else np.zeros(0, np.float32),
            "dt_bias": rng.standard_normal(heads).astype(np.float32), "scale": -np.exp(rng.standard_normal(heads)).astype(np.float32)}  # fmt: skip


def _exact(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """float64 decay and beta of ``inputs``, from x = a + dt_bias rounded to float32 as the op and the graph add them."""
    x = (inputs["a"] + inputs["dt_bias"]).astype(np.float64)
    softplus = np.where(x > THRESHOLD, x, np.logaddexp(0.0, x))
    decay = inputs["scale"].astype(np.float64) * softplus * (inputs["mask"] if inputs["mask"].size else 1.0)
    return {"decay": decay, "beta": 1.0 / (1.0 + np.exp(-inputs["b"].astype(np.float64)))}


def _within_ulps(got: np.ndarray, exact: np.ndarray, ulps: int) -> bool:
    """Whether every value of ``got`` is within ``ulps`` float32 steps of ``exact`` (the steps at ``exact``)."""
    return bool(np.all(np.abs(got.astype(np.float64) - exact) <= ulps * np.spacing(np.abs(exact).astype(np.float32)).astype(np.float64)))


# Run by test_the_kernel_in_triton_s_interpreter in a process of its own (TRITON_INTERPRET before Triton's import).
_INTERPRETER = """
import sys
import numpy as np, torch, triton, triton.language as tl
from triton.runtime.interpreter import TensorHandle
from s1omni.export import delta_gates_kernel as module
from s1omni.export.delta_gates_kernel import delta_gates_kernel
from s1omni.export.gdn_library import DELTA_GATES

class NumpyLibdevice:  # the interpreter makes no extern call: libdevice's functions as numpy's, float32 in and out
    exp = staticmethod(lambda x: tl.tensor(TensorHandle(np.exp(x.handle.data), x.handle.dtype), x.type))
    log1p = staticmethod(lambda x: tl.tensor(TensorHandle(np.log1p(x.handle.data), x.handle.dtype), x.type))
    div_rn = staticmethod(lambda a, b: tl.tensor(TensorHandle(np.divide(a.handle.data, b.handle.data), b.handle.dtype), b.type))

module.libdevice = NumpyLibdevice
cases = np.load(sys.argv[1])
ran = {}
for case in range(int(cases["count"])):
    a, b, mask, dt_bias, scale = (torch.from_numpy(cases[f"{name}{case}"]) for name in ("a", "b", "mask", "dt_bias", "scale"))
    a, b = a.to(torch.bfloat16), b.to(torch.bfloat16)
    decay, beta = torch.empty(a.shape), torch.empty(a.shape)
    block = DELTA_GATES.constants["BLOCK"]
    delta_gates_kernel[(triton.cdiv(a.numel(), block),)](a, b, dt_bias, scale, mask, decay, beta, a.numel(), a.shape[-1], int(mask.numel() > 0),
                                                         float(cases["threshold"]), BLOCK=block)
    ran[f"decay{case}"], ran[f"beta{case}"] = decay.numpy(), beta.numpy()
np.savez(sys.argv[2], **ran)
"""


def test_the_kernel_in_triton_s_interpreter(tmp_path: Path) -> None:
    """The kernel's arithmetic and indexing, run by Triton's interpreter on the CPU (libdevice's ``expf``, ``log1pf`` and
    rounded division taken as numpy's, the interpreter making no extern call): decay and beta within 4 float32 steps of
    float64 over x deep below zero, around it and past the threshold, each head its own ``dt_bias`` and scale, each
    token its mask; the tiny member's heads (4), the 0.8B's (16) and the 4B's (32), across the 1,024-value block."""
    rng = np.random.default_rng(3)
    shapes = [(1, 1, 4, True), (2, 37, 16, True), (3, 70, 32, False), (1, 600, 16, False)]
    cases = [_inputs(rng, *shape) for shape in shapes]
    np.savez(tmp_path / "cases.npz", count=len(cases), threshold=THRESHOLD, **{f"{name}{i}": value for i, case in enumerate(cases) for name, value in case.items()})
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
    subprocess.run([sys.executable, "-c", _INTERPRETER, str(tmp_path / "cases.npz"), str(tmp_path / "ran.npz")], env=env, check=True)
    ran = np.load(tmp_path / "ran.npz")
    x = np.concatenate([(case["a"] + case["dt_bias"]).ravel() for case in cases])
    assert (x > THRESHOLD).any() and (x < -15).any() and (np.abs(x) < 1).any()  # every branch of the softplus taken
    for i, (shape, case) in enumerate(zip(shapes, cases, strict=True)):
        exact = _exact(case)
        for name in ("decay", "beta"):
            assert ran[f"{name}{i}"].shape == exact[name].shape and _within_ulps(ran[f"{name}{i}"], exact[name], 4), (shape, name)
        if case["mask"].size:
            assert np.all(ran[f"decay{i}"][case["mask"][..., 0] == 0] == 0), shape


def _unit_sessions(library: Path, heads: int, mask: bool) -> dict[str, onnxruntime.InferenceSession]:
    """The layer's gates as a build writes them, on the CUDA EP, decay and beta its outputs: ``graph`` (ONNX Runtime's
    nodes) and ``op`` (rewritten to the op)."""
    made = {}
    for name in ("graph", "op"):
        model = _unit_model(heads, mask)
        if name == "op":
            assert use_delta_gates(model) == 1
        model.graph.node.remove(next(node for node in model.graph.node if node.op_type == OP_TYPE))
        del model.graph.output[:]
        model.graph.output.extend([helper.make_tensor_value_info(gate, TensorProto.FLOAT, None) for gate in ("decay", "beta")])
        kept = [value for value in model.graph.input if value.name in ("a", "b", "mask")]
        del model.graph.input[:]
        model.graph.input.extend(kept)
        made[name] = onnxruntime.InferenceSession(model.SerializeToString(), session_options("cuda", library), providers=CUDA)
    return made


def _unit_feeds(inputs: dict[str, np.ndarray], session: onnxruntime.InferenceSession) -> dict[str, np.ndarray]:
    return {value.name: inputs[value.name] for value in session.get_inputs()}


def _unit_inputs(rng: np.random.Generator, rows: int, tokens: int, heads: int, mask: bool) -> dict[str, np.ndarray]:
    """``_inputs`` with the unit model's own ``dt_bias`` and scale (its initializers)."""
    inputs = _inputs(rng, rows, tokens, heads, mask)
    model = _unit_model(heads, mask)
    return inputs | {tensor.name: numpy_helper.to_array(tensor) for tensor in model.graph.initializer if tensor.name in ("dt_bias", "scale")}


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("heads", [4, 16, 32], ids=["tiny", "0.8B", "4B"])
@pytest.mark.parametrize("tokens", [1, 37, 2048])
def test_the_op_computes_float64_s_gates_on_the_gpu(gpu_library: Path, heads: int, tokens: int) -> None:
    """The op built for this GPU, with and without the mask: decay and beta within 4 float32 steps of float64, and the
    masked tokens' decay zero; ONNX Runtime's nodes for them beside it, within 1e-6 of its decay's scale and of beta's
    largest value (their ``log(exp(x) + 1)`` below zero and ``1 - 1 / (1 + e)`` lose float32 digits the op keeps:
    ``microsoft/onnxruntime:onnxruntime/core/providers/cuda/activation/activations_impl.cu``)."""
    for mask in (False, True):
        inputs = _unit_inputs(np.random.default_rng(tokens + heads), 2, tokens, heads, mask)
        sessions = _unit_sessions(gpu_library, heads, mask)
        got = dict(zip(("decay", "beta"), sessions["op"].run(None, _unit_feeds(inputs, sessions["op"])), strict=True))
        graph = dict(zip(("decay", "beta"), sessions["graph"].run(None, _unit_feeds(inputs, sessions["graph"])), strict=True))
        exact = _exact(inputs)
        for name in ("decay", "beta"):
            assert _within_ulps(got[name], exact[name], 4), (heads, tokens, mask, name)
            assert float(np.abs(graph[name] - got[name]).max()) <= 1e-6 * max(1.0, float(np.abs(exact[name]).max())), (heads, tokens, mask, name)
        if mask:
            assert np.all(got["decay"][inputs["mask"][..., 0] == 0] == 0)


@pytest.mark.gpu
@needs_cuda
def test_the_op_s_time_beside_the_graph_s(gpu_library: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Printed for the record, asserting only that both ran: one session call of the gates as ONNX Runtime's nodes and as
    the op, at the 0.8B's and the 4B's value heads, 600 and 2,048 tokens, masked as the prefill graph
    (``tests.cuda_builds.microseconds_a_call``: inputs and outputs on the GPU, the session's own overhead included)."""
    timings = {}
    for heads in (16, 32):
        for tokens in (600, 2048):
            inputs = _unit_inputs(np.random.default_rng(0), 1, tokens, heads, True)
            for variant, session in _unit_sessions(gpu_library, heads, True).items():
                timings[f"{variant} H={heads} T={tokens}"] = microseconds_a_call(session, _unit_feeds(inputs, session))
    with capsys.disabled():
        print(f"\ndelta gates, us a call: {json.dumps(timings)}")
    assert len(timings) == 8


@pytest.mark.gpu
@needs_cuda
def test_the_cuda_ep_runs_the_rewrite_as_the_graph_without_it(gpu_library: Path, external_export: Path, tmp_path: Path) -> None:
    """Prefill, then continue from its state, through the tiny member's rewritten graphs on the CUDA EP (the op library's
    rule, convolution heads and gates, bfloat16 GEMMs) against the same graphs without the gates rewritten there: every
    output within a few bfloat16 steps: the largest difference 5% of the output's largest value, the mean one bfloat16 step
    of it (2**-8). The op's gates differ from ONNX Runtime's nodes by up to 1e-6 of their scale (the unit test above), and
    each such difference that moves a bfloat16 rounding downstream spreads through the tiny member's random weights: on an
    H100 one output's mean difference came to 0.24% of its largest value (0.0094 of 3.83), over the 0.2% the other
    rewrites' tests hold to."""
    assert_cuda_ep_runs_the_rewrite_as_without(gpu_library, external_export, tmp_path,
                                               lambda graph, weights, gates: _built(external_export, graph, weights, False, gates), mean=2.0**-8)
