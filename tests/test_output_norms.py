"""Each Gated DeltaNet layer's output norm as one op (``s1omni build --fused-output-norms``, ``s1omni.export.output_norms``):
on the tiny member the graphs it writes and what they compute, emulated on the CPU EP (``tests.cuda_builds.output_norms_emulated``
spells each ``GatedOutputNorm`` as the nodes it replaced); the norms it leaves alone; its Triton kernel run by Triton's
interpreter against float64; and on the GPU the op against float64 and against ONNX Runtime's nodes, timed, and the tiny
member's rewritten graphs against the same graphs without the rewrite."""

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
from s1omni.export.naming import CONTRIB_DOMAIN, OP_DOMAIN, OP_TYPE
from s1omni.export.output_norms import OUTPUT_NORM_OP, output_norm_widths, use_output_norms
from s1omni.runtime.engine import read_manifest
from s1omni.runtime.runners.onnxruntime_runner import session_options
from tests.cli import run_s1omni
from tests.cuda_builds import microseconds_a_call, needs_cuda, op_library_built, output_norms_emulated
from tests.graph_edits import node_making, rewritten_edits, set_initializer
from tests.test_bf16_convolutions import LAYERS, assert_cuda_ep_runs_the_rewrite_as_without, assert_the_op_spelled_back_is_the_graph

CUDA = [("CUDAExecutionProvider", {"use_tf32": 0}), "CPUExecutionProvider"]
EPSILON = 1e-6
TINY = (4, 16)  # the tiny member's value heads and head size


def _built(export: Path, graph: str, weights: Bf16Weights, merged: bool, norms: bool) -> onnx.ModelProto:
    return op_library_built(export, graph, weights, merged, fused_output_norms=norms)


@pytest.mark.parametrize("merged", [True, False], ids=["merged", "unmerged"])
def test_the_op_computes_what_the_graph_did(external_export: Path, tmp_path: Path, merged: bool) -> None:
    """Prefill then continue from its state: every output of the rewritten graphs, the op spelled back, the same bit for
    bit as the graphs without the rewrite; an op that left the gate out is told apart."""
    assert_the_op_spelled_back_is_the_graph(external_export, tmp_path, merged, "fused_output_norms", output_norms_emulated,
                                            lambda model: output_norms_emulated(model, gated=False))


@pytest.mark.parametrize("merged", [True, False], ids=["merged", "unmerged"])
def test_each_layer_s_norm_becomes_one_op(external_export: Path, tmp_path: Path, merged: bool) -> None:
    """One op a layer in every graph, reading the rule's float16 output and the z GEMM's bfloat16 product (merged: its
    part of the split), its rows reshaped (a view) straight into the out projection; no ``GatedRMSNorm`` left, and two
    casts fewer a layer (the rule's output and z widened) and one (the result narrowed)."""
    weights = Bf16Weights(external_export, tmp_path)
    for graph in ("prefill", "continue", "packed"):
        before = Counter(node.op_type for node in _built(external_export, graph, weights, merged, False).graph.node)
        model = _built(external_export, graph, weights, merged, True)
        nodes = list(model.graph.node)
        producers = {output: node for node in nodes for output in node.output}
        ops = [node for node in nodes if node.op_type == OUTPUT_NORM_OP]
        assert len(ops) == LAYERS and all(node.domain == OP_DOMAIN for node in ops), graph
        for op in ops:
            rule, product = producers[op.input[0]], producers[op.input[1]]
            assert rule.op_type == OP_TYPE and rule.output[0] == op.input[0]
            assert op.input[1].endswith("/bf16") and product.op_type == ("Split" if merged else "MatMul")
            readers = [node for node in nodes if op.output[0] in node.input]
            assert [node.op_type for node in readers] == ["Reshape"]
            assert [node.op_type for node in nodes if readers[0].output[0] in node.input] == ["MatMul"]
        after = Counter(node.op_type for node in nodes)
        assert (before["GatedRMSNorm"], after["GatedRMSNorm"], before["Cast"] - after["Cast"]) == (LAYERS, 0, 3 * LAYERS), graph
        assert output_norm_widths(model) == [TINY[1]]


def _unit_model(heads: int, width: int) -> onnx.ModelProto:
    """One Gated DeltaNet layer's output norm as a bf16 build writes it, after a ``ChunkedGatedDeltaRule`` (its float16
    output ``[B, T, H, D]``), on a float32 graph input ``z`` ``[B, T, H * D]`` rounded to bfloat16 as the GEMM's product
    is; shapes recorded as the export records them; the result reshaped to ``[B, T, -1]`` (its shape computed from ``z``'s,
    as the export computes it: a constant could not say B and T of ``[N, D]`` rows) and cast for the out projection's GEMM."""
    rng = np.random.default_rng(heads + width)
    def info(name: str, dims: list[int | str] | None, elem: int = TensorProto.FLOAT) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(name, elem, dims)

    initializers = [numpy_helper.from_array((1 + 0.1 * rng.standard_normal(width)).astype(np.float32), "weight"),
                    numpy_helper.from_array(np.array([0, 0, -1], np.int64), "packed"),
                    numpy_helper.from_array(np.array([-1, width], np.int64), "heads"),
                    numpy_helper.from_array(np.array([-1], np.int64), "last"),
                    numpy_helper.from_array(rng.standard_normal((heads * width, 8)).astype(np.float32), "out_proj")]  # fmt: skip
    nodes = [helper.make_node(OP_TYPE, ["q", "k", "v", "decay", "beta", "state"], ["o", "state/out"], domain=OP_DOMAIN, scale=0.1),
             helper.make_node("Cast", ["o"], ["o/wide"], to=TensorProto.FLOAT),
             helper.make_node("Reshape", ["o/wide", "packed"], ["o/packed"]), helper.make_node("Reshape", ["o/packed", "heads"], ["x"]),
             helper.make_node("Cast", ["z"], ["z/bf16"], to=TensorProto.BFLOAT16),
             helper.make_node("Cast", ["z/bf16"], ["z/wide"], to=TensorProto.FLOAT),
             helper.make_node("Reshape", ["z/wide", "heads"], ["gate"]),
             helper.make_node("GatedRMSNorm", ["x", "weight", "gate"], ["y"], domain=CONTRIB_DOMAIN, activation="silu", epsilon=EPSILON),
             helper.make_node("Shape", ["z"], ["z/leading"], end=2), helper.make_node("Concat", ["z/leading", "last"], ["tokens"], axis=0),
             helper.make_node("Reshape", ["y", "tokens"], ["y/tokens"]),
             helper.make_node("Cast", ["y/tokens"], ["y/bf16"], to=TensorProto.BFLOAT16),
             helper.make_node("Cast", ["out_proj"], ["out_proj/bf16"], to=TensorProto.BFLOAT16),
             helper.make_node("MatMul", ["y/bf16", "out_proj/bf16"], ["out/bf16"]),
             helper.make_node("Cast", ["out/bf16"], ["out"], to=TensorProto.FLOAT)]  # fmt: skip
    shapes = [info("o/packed", ["B", "T", heads * width]), info("x", ["N", width]), info("z/wide", ["B", "T", heads * width]),
              info("gate", ["N", width]), info("y", ["N", width]), info("y/tokens", ["B", "T", heads * width])]  # fmt: skip
    inputs = [*(info(name, ["B", "T", heads, width], TensorProto.FLOAT16) for name in ("q", "k", "v")), info("decay", ["B", "T", heads]),
              info("beta", ["B", "T", heads]), info("state", None), info("z", ["B", "T", heads * width])]  # fmt: skip
    graph = helper.make_graph(nodes, "output norm", inputs, [info("out", None), info("state/out", None)], initializers, value_info=shapes)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(OP_DOMAIN, 1),
                                                   helper.make_opsetid(CONTRIB_DOMAIN, 1)], ir_version=10)  # fmt: skip


@pytest.mark.parametrize("heads", [(16, 128), (32, 128)], ids=["0.8B", "4B"])
def test_only_what_the_op_computes_is_rewritten(heads: tuple[int, int]) -> None:
    """The 0.8B's layer (16 heads of 128) and the 4B's (32) become the op; a norm that differs from what it computes in
    any one way stays as it was: another activation, a weight of another length, an input that is not the rule's output,
    a gate that is not a bfloat16 product, a widened value read elsewhere, the result read elsewhere or cast to float16,
    a reshape by a computed shape. The rewritten graph still defines each value once (its first naming of the op's rows
    took the name of the cast it replaces: ONNX Runtime refused the model)."""
    rewritten = _unit_model(*heads)
    assert use_output_norms(rewritten) == 1, heads
    defined = Counter(output for node in rewritten.graph.node for output in node.output)
    assert max(defined.values()) == 1, [name for name, count in defined.items() if count > 1]
    model = _unit_model(*heads)
    def from_input(graph: onnx.GraphProto) -> None:
        node_making(graph, "o/wide").input[0] = "v"

    def computed_shape(graph: onnx.GraphProto) -> None:
        graph.node.insert(0, helper.make_node("Identity", ["packed"], ["packed/computed"]))
        node_making(graph, "o/packed").input[1] = "packed/computed"

    edits: dict[str, Callable[[onnx.GraphProto], None]] = {
        "activation": lambda g: node_making(g, "y").attribute[0].CopyFrom(helper.make_attribute("activation", "sigmoid")),
        "weight": lambda g: set_initializer(g, "weight", np.ones(3, np.float32)),
        "input": from_input,
        "gate": lambda g: node_making(g, "z/wide").input.__setitem__(0, "z"),
        "widened read": lambda g: g.output.append(helper.make_tensor_value_info("o/wide", TensorProto.FLOAT, None)),
        "result read": lambda g: g.output.append(helper.make_tensor_value_info("y/tokens", TensorProto.FLOAT, None)),
        "float16": lambda g: node_making(g, "y/bf16").attribute[0].CopyFrom(helper.make_attribute("to", TensorProto.FLOAT16)),
        "computed shape": computed_shape,
    }  # fmt: skip
    assert rewritten_edits(model, edits, use_output_norms) == [], heads


def test_the_build_option_needs_its_prerequisites(exported: Path, tmp_path: Path, cuda_engine: Callable[..., tuple[Path, str]]) -> None:
    """Refused without --fused-mixers and without the op library, saying so and writing nothing; with them, every graph's
    output norms are the op and the library carries its kernel."""
    build = ["build", str(exported), "--backend", "onnxruntime", "--target", "cuda", "--precision", "bf16"]
    for missing, options, message in (("mixers", ["--gated-delta-kernel", OP_TYPE, "--cuda-arch", "90"], "add --fused-mixers"),
                                      ("library", ["--fused-mixers"], "--fused-output-norms runs the op library")):  # fmt: skip
        refused = run_s1omni(*build, *options, "--fused-output-norms", "--out", str(tmp_path / missing))
        assert refused.returncode == 2 and message in refused.stderr and not (tmp_path / missing).exists(), refused.stderr
    engine, progress = cuda_engine("--precision", "bf16", "--gated-delta-kernel", OP_TYPE, "--cuda-arch", "90", "--fused-mixers", "--fused-output-norms")
    assert f"{LAYERS} {OUTPUT_NORM_OP} nodes" in progress
    manifest = read_manifest(engine)
    assert manifest["fused_output_norms"] is True and f"gated_output_norm_{TINY[1]}" in manifest["gated_delta_library"]["kernels"]
    for graph in ("prefill", "continue", "packed"):
        ops = Counter(node.op_type for node in onnx.load(str(engine / f"{graph}.onnx"), load_external_data=False).graph.node)
        assert ops[OUTPUT_NORM_OP] == LAYERS and ops["GatedRMSNorm"] == 0, graph


def _bfloat16(values: np.ndarray) -> np.ndarray:
    return torch.from_numpy(values.astype(np.float32)).to(torch.bfloat16).to(torch.float32).numpy()


def _inputs(rng: np.random.Generator, rows: int, tokens: int, heads: int, width: int) -> dict[str, np.ndarray]:
    """The rule's float16 output and the bfloat16 z (as float32, z over the SiLU's whole range) and a weight."""
    return {"o": (rng.standard_normal((rows, tokens, heads, width)) * 0.5).astype(np.float16),
            "z": _bfloat16(rng.standard_normal((rows, tokens, heads * width)) * 4),
            "weight": (1 + 0.1 * rng.standard_normal(width)).astype(np.float32)}  # fmt: skip


def _exact(inputs: dict[str, np.ndarray]) -> np.ndarray:
    """float64 ``rmsnorm(o) * weight * silu(z)`` over each head, as ``[N, D]`` rows."""
    width = inputs["weight"].size
    x = inputs["o"].astype(np.float64).reshape(-1, width)
    z = inputs["z"].astype(np.float64).reshape(-1, width)
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + EPSILON) * inputs["weight"] * (z / (1.0 + np.exp(-z)))


def _close_to_bfloat16(got: np.ndarray, exact: np.ndarray, not_nearest: float = 0.01) -> bool:
    """Every value within one bfloat16 step of ``exact``, at most a ``not_nearest`` share of them not its nearest bfloat16."""
    nearest = _bfloat16(exact)
    step = np.spacing(np.abs(nearest).astype(np.float32)) * 2.0**16
    return bool(np.all(np.abs(got - exact) <= np.maximum(step, 1e-30)) and np.mean(got != nearest) <= not_nearest)


# Run by test_the_kernel_in_triton_s_interpreter in a process of its own (TRITON_INTERPRET before Triton's import).
_INTERPRETER = """
import sys
import numpy as np, torch, triton
from s1omni.export.gdn_library import output_norm_spec
from s1omni.export.output_norm_kernel import gated_output_norm_kernel
cases = np.load(sys.argv[1])
ran = {}
for case in range(int(cases["count"])):
    o, z, weight = (torch.from_numpy(cases[f"{name}{case}"]) for name in ("o", "z", "weight"))
    width = weight.numel()
    rows = o.numel() // width
    constants = output_norm_spec(width).constants
    out = torch.empty(rows, width, dtype=torch.bfloat16)
    gated_output_norm_kernel[(triton.cdiv(rows, constants["ROWS"]),)](o, z.to(torch.bfloat16), weight, out, rows, width, float(cases["epsilon"]),
                                                                   **constants)
    ran[f"out{case}"] = out.to(torch.float32).numpy()
np.savez(sys.argv[2], **ran)
"""


def test_the_kernel_in_triton_s_interpreter(tmp_path: Path) -> None:
    """The kernel's indexing and arithmetic, run by Triton's interpreter on the CPU: every value within one bfloat16 step
    of the float64 norm (the interpreter truncates to bfloat16 where the GPU rounds to nearest, so nearest is not asked
    for here); the tiny member's heads (4 of 16), the 0.8B's (16 of 128) and a head size under its block (96), over row
    counts that end a program's rows short."""
    rng = np.random.default_rng(5)
    shapes = [(1, 1, *TINY), (2, 37, *TINY), (1, 3, 16, 128), (2, 5, 3, 96)]
    cases = [_inputs(rng, *shape) for shape in shapes]
    np.savez(tmp_path / "cases.npz", count=len(cases), epsilon=EPSILON, **{f"{name}{i}": value for i, case in enumerate(cases) for name, value in case.items()})
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
    subprocess.run([sys.executable, "-c", _INTERPRETER, str(tmp_path / "cases.npz"), str(tmp_path / "ran.npz")], env=env, check=True)
    ran = np.load(tmp_path / "ran.npz")
    for i, (shape, case) in enumerate(zip(shapes, cases, strict=True)):
        exact = _exact(case)
        assert ran[f"out{i}"].shape == exact.shape and _close_to_bfloat16(ran[f"out{i}"], exact, not_nearest=1.0), shape


def _unit_sessions(library: Path, heads: int, width: int) -> dict[str, onnxruntime.InferenceSession]:
    """The norm as a bf16 build writes it, on the CUDA EP, from a float16 graph input ``o`` (the rule taken out) to the
    bfloat16 rows, widened for numpy: ``graph`` (ONNX Runtime's nodes) and ``op`` (rewritten to the op)."""
    made = {}
    for name in ("graph", "op"):
        model = _unit_model(heads, width)
        if name == "op":
            assert use_output_norms(model) == 1
        graph = model.graph
        rule = next(node for node in graph.node if node.op_type == OP_TYPE)
        graph.node.remove(rule)
        for node in list(graph.node):
            if node.op_type == "MatMul" or node.output[0] in ("out", "out_proj/bf16"):
                graph.node.remove(node)
        graph.node.append(helper.make_node("Cast", ["y/bf16"], ["rows"], to=TensorProto.FLOAT))
        del graph.output[:], graph.input[:]
        graph.input.extend([helper.make_tensor_value_info("o", TensorProto.FLOAT16, None), helper.make_tensor_value_info("z", TensorProto.FLOAT, None)])
        graph.output.append(helper.make_tensor_value_info("rows", TensorProto.FLOAT, None))
        made[name] = onnxruntime.InferenceSession(model.SerializeToString(), session_options("cuda", library), providers=CUDA)
    return made


def _unit_inputs(rng: np.random.Generator, rows: int, tokens: int, heads: int, width: int) -> dict[str, np.ndarray]:
    """``_inputs`` with the unit model's own weight."""
    weight = next(tensor for tensor in _unit_model(heads, width).graph.initializer if tensor.name == "weight")
    return _inputs(rng, rows, tokens, heads, width) | {"weight": numpy_helper.to_array(weight)}


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("heads", [TINY, (16, 128), (32, 128)], ids=["tiny", "0.8B", "4B"])
@pytest.mark.parametrize("tokens", [1, 37, 2048])
def test_the_op_computes_float64_s_norm_on_the_gpu(gpu_library: Path, heads: tuple[int, int], tokens: int) -> None:
    """The op built for this GPU against the float64 norm of its inputs: within one bfloat16 step, at most 1% not the
    nearest; ONNX Runtime's nodes for it beside it, within one bfloat16 step of the op."""
    inputs = _unit_inputs(np.random.default_rng(tokens), 2, tokens, *heads)
    sessions = _unit_sessions(gpu_library, *heads)
    feeds = {"o": inputs["o"], "z": inputs["z"]}
    got, graph = (sessions[name].run(None, feeds)[0].reshape(-1, heads[1]) for name in ("op", "graph"))
    exact = _exact(inputs)
    assert _close_to_bfloat16(got, exact), (heads, tokens)
    assert np.all(np.abs(got - graph) <= np.spacing(np.abs(got).astype(np.float32)) * 2.0**16 + 1e-30), (heads, tokens)


@pytest.mark.gpu
@needs_cuda
def test_the_op_s_time_beside_the_graph_s(gpu_library: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Printed for the record, asserting only that both ran: one session call of the norm as ONNX Runtime's nodes and as
    the op, at the 0.8B's and the 4B's heads, 600 and 2,048 tokens (``tests.cuda_builds.microseconds_a_call``: inputs and
    outputs on the GPU, the session's own overhead included)."""
    timings = {}
    for heads in ((16, 128), (32, 128)):
        for tokens in (600, 2048):
            inputs = _unit_inputs(np.random.default_rng(0), 1, tokens, *heads)
            feeds = {"o": inputs["o"], "z": inputs["z"]}
            for variant, session in _unit_sessions(gpu_library, *heads).items():
                timings[f"{variant} H={heads[0]} T={tokens}"] = microseconds_a_call(session, feeds)
    with capsys.disabled():
        print(f"\noutput norms, us a call: {json.dumps(timings)}")
    assert len(timings) == 8


@pytest.mark.gpu
@needs_cuda
def test_the_cuda_ep_runs_the_rewrite_as_the_graph_without_it(gpu_library: Path, external_export: Path, tmp_path: Path) -> None:
    """Prefill, then continue from its state, through the tiny member's rewritten graphs on the CUDA EP (the op library's
    rule, convolution heads and output norms, bfloat16 GEMMs) against the same graphs without the norms rewritten there:
    every output within a few bfloat16 steps."""
    assert_cuda_ep_runs_the_rewrite_as_without(gpu_library, external_export, tmp_path,
                                               lambda graph, weights, norms: _built(external_export, graph, weights, False, norms))
