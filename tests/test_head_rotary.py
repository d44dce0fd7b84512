"""A full-attention layer's q and k head norms and rotary embeddings as one op each (``s1omni build --fused-head-rotary``,
``s1omni.export.head_rotary``): on the tiny member the graphs it writes and what they compute, emulated on the CPU EP
(``tests.cuda_builds.head_rotary_emulated`` spells each ``HeadNormRotary`` as the nodes it replaced); the norms it leaves
alone; its Triton kernel run by Triton's interpreter against float64; and on the GPU the op against float64 and against
ONNX Runtime's nodes, timed, and the tiny member's rewritten graphs against the same graphs without the rewrite."""

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
from onnx import TensorProto, helper, numpy_helper

from s1omni.export.bf16_gemms import Bf16Weights
from s1omni.export.head_rotary import HEAD_ROTARY_OP, head_rotary_widths, use_head_rotary
from s1omni.export.naming import OP_DOMAIN, OP_TYPE
from s1omni.runtime.engine import read_manifest
from s1omni.runtime.runners.onnxruntime_runner import session_options
from tests.cli import run_s1omni
from tests.cuda_builds import head_rotary_emulated, microseconds_a_call, needs_cuda, op_library_built
from tests.graph_edits import node_making, rewritten_edits, set_initializer
from tests.test_bf16_convolutions import assert_cuda_ep_runs_the_rewrite_as_without, assert_the_op_spelled_back_is_the_graph

CUDA = [("CUDAExecutionProvider", {"use_tf32": 0}), "CPUExecutionProvider"]
EPSILON = 1e-6
ATTENTION_LAYERS = 1  # the tiny member's full-attention layers, each with its q and k
TINY = (4, 32, 8)  # the tiny member's q heads, head size and rotary width


def _built(export: Path, graph: str, weights: Bf16Weights, merged: bool, rotary: bool) -> onnx.ModelProto:
    return op_library_built(export, graph, weights, merged, fused_head_rotary=rotary)


@pytest.mark.parametrize("merged", [True, False], ids=["merged", "unmerged"])
def test_the_op_computes_what_the_graph_did(external_export: Path, tmp_path: Path, merged: bool) -> None:
    """Prefill then continue from its state (the keys through the past): every output of the rewritten graphs, the op
    spelled back, the same bit for bit as the graphs without the rewrite; an op turning the halves the other way is told
    apart."""
    assert_the_op_spelled_back_is_the_graph(external_export, tmp_path, merged, "fused_head_rotary", head_rotary_emulated,
                                            lambda model: head_rotary_emulated(model, turned=False))


def test_each_q_and_k_becomes_one_op(external_export: Path, tmp_path: Path) -> None:
    """Two ops a full-attention layer in every graph (q and k), each reading the projection's heads ``[B, T, H, D]``, the
    norm's weight and the layer's cos and sin; twelve nodes fewer each."""
    weights = Bf16Weights(external_export, tmp_path)
    for graph in ("prefill", "continue", "packed"):
        before = Counter(node.op_type for node in _built(external_export, graph, weights, False, False).graph.node)
        model = _built(external_export, graph, weights, False, True)
        nodes = list(model.graph.node)
        ops = [node for node in nodes if node.op_type == HEAD_ROTARY_OP]
        assert len(ops) == 2 * ATTENTION_LAYERS and all(node.domain == OP_DOMAIN for node in ops), graph
        assert len({op.input[2] for op in ops}) == len({op.input[3] for op in ops}) == 1  # one cos and one sin for both
        after = Counter(node.op_type for node in nodes)
        dropped = {"SimplifiedLayerNormalization": 1, "Transpose": 1, "Slice": 4, "Neg": 1, "Concat": 2, "Mul": 2, "Add": 1}
        assert {op: before[op] - after[op] for op in dropped} == {op: 2 * ATTENTION_LAYERS * count for op, count in dropped.items()}, graph
        assert head_rotary_widths(model) == [TINY[1]]


def _unit_model(heads: int, width: int, rotary: int) -> onnx.ModelProto:
    """One projection's heads through its norm, transpose and rotary embedding as the export spells them, on float32 graph
    inputs ``x`` ``[B, T, H, D]`` and ``cos`` and ``sin`` ``[B, T, R]`` (unsqueezed to ``[B, 1, T, R]`` as the export's),
    shapes recorded as the export records them; the result ``[B, H, T, D]`` the output."""
    rng = np.random.default_rng(heads + width)
    def info(name: str, dims: list[int | str] | None) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, dims)

    def constant(name: str, value: int) -> onnx.TensorProto:
        return numpy_helper.from_array(np.array([value], np.int64), name)

    initializers = [numpy_helper.from_array((1 + 0.1 * rng.standard_normal(width)).astype(np.float32), "weight"),
                    constant("zero", 0), constant("half", rotary // 2), constant("rotary", rotary), constant("end", 2**63 - 1),
                    constant("axis", 3), constant("step", 1), numpy_helper.from_array(np.array([1], np.int64), "head_axis")]  # fmt: skip
    nodes = [helper.make_node("Unsqueeze", ["cos", "head_axis"], ["cos/heads"]), helper.make_node("Unsqueeze", ["sin", "head_axis"], ["sin/heads"]),
             helper.make_node("SimplifiedLayerNormalization", ["x", "weight"], ["normed"], axis=-1, epsilon=EPSILON, stash_type=1),
             helper.make_node("Transpose", ["normed"], ["heads"], perm=[0, 2, 1, 3]),
             helper.make_node("Slice", ["heads", "zero", "rotary", "axis", "step"], ["rotated"]),
             helper.make_node("Slice", ["heads", "rotary", "end", "axis", "step"], ["passed"]),
             helper.make_node("Mul", ["rotated", "cos/heads"], ["by_cos"]),
             helper.make_node("Slice", ["rotated", "zero", "half", "axis", "step"], ["low"]),
             helper.make_node("Slice", ["rotated", "half", "end", "axis", "step"], ["high"]),
             helper.make_node("Neg", ["high"], ["negated"]), helper.make_node("Concat", ["negated", "low"], ["turned"], axis=-1),
             helper.make_node("Mul", ["turned", "sin/heads"], ["by_sin"]), helper.make_node("Add", ["by_cos", "by_sin"], ["sum"]),
             helper.make_node("Concat", ["sum", "passed"], ["out"], axis=-1)]  # fmt: skip
    shapes = [info("x", ["B", "T", heads, width]), info("cos/heads", ["B", 1, "T", rotary]), info("sin/heads", ["B", 1, "T", rotary])]
    inputs = [info("x", ["B", "T", heads, width]), info("cos", ["B", "T", rotary]), info("sin", ["B", "T", rotary])]
    graph = helper.make_graph(nodes, "head rotary", inputs, [info("out", ["B", heads, "T", width])], initializers, value_info=shapes)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(OP_DOMAIN, 1)], ir_version=10)


def _turned_the_other_way(graph: onnx.GraphProto) -> None:
    turned = node_making(graph, "turned")
    turned.input[0], turned.input[1] = turned.input[1], turned.input[0]


@pytest.mark.parametrize("heads", [(8, 256, 64), (2, 256, 64), (16, 256, 64)], ids=["0.8B q", "0.8B k", "4B q"])
def test_only_what_the_op_computes_is_rewritten(heads: tuple[int, int, int]) -> None:
    """The 0.8B's q and k (8 and 2 heads of 256, 64 of them rotated) and the 4B's q become the op; a neighbourhood that
    differs from what it computes in any one way stays as it was: another transpose, a rotated part from another start,
    slices of step 2, the halves turned the other way, a ``Neg`` that is not one, a norm over another axis, a weight of
    another length, an angle of another shape, the rotated values read elsewhere."""
    assert use_head_rotary(_unit_model(*heads)) == 1, heads
    model = _unit_model(*heads)
    def cos_shape(graph: onnx.GraphProto) -> None:
        next(value for value in graph.value_info if value.name == "cos/heads").CopyFrom(
            helper.make_tensor_value_info("cos/heads", TensorProto.FLOAT, ["B", "T", 1, heads[2]]))

    edits: dict[str, Callable[[onnx.GraphProto], None]] = {
        "perm": lambda g: node_making(g, "heads").attribute[0].CopyFrom(helper.make_attribute("perm", [0, 2, 3, 1])),
        "start": lambda g: set_initializer(g, "zero", np.array([1], np.int64)),
        "step": lambda g: set_initializer(g, "step", np.array([2], np.int64)),
        "halves": _turned_the_other_way,
        "neg": lambda g: setattr(node_making(g, "negated"), "op_type", "Identity"),
        "axis": lambda g: node_making(g, "normed").attribute[0].CopyFrom(helper.make_attribute("axis", 2)),
        "weight": lambda g: set_initializer(g, "weight", np.ones(1, np.float32)),
        "cos": cos_shape,
        "read": lambda g: g.output.append(helper.make_tensor_value_info("rotated", TensorProto.FLOAT, None)),
    }  # fmt: skip
    assert rewritten_edits(model, edits, use_head_rotary) == [], heads


def test_the_build_option_needs_the_op_library(exported: Path, tmp_path: Path, cuda_engine: Callable[..., tuple[Path, str]]) -> None:
    """Refused without ``--gated-delta-kernel ChunkedGatedDeltaRule``, saying so and writing nothing; with it, every
    graph's q and k are the op and the library carries its kernel."""
    refused = run_s1omni("build", str(exported), "--backend", "onnxruntime", "--target", "cuda", "--precision", "bf16", "--fused-head-rotary",
                         "--out", str(tmp_path / "refused"))  # fmt: skip
    assert refused.returncode == 2 and "--fused-head-rotary runs the op library" in refused.stderr and not (tmp_path / "refused").exists()
    engine, progress = cuda_engine("--precision", "bf16", "--gated-delta-kernel", OP_TYPE, "--cuda-arch", "90", "--fused-head-rotary")
    assert f"{2 * ATTENTION_LAYERS} {HEAD_ROTARY_OP} nodes" in progress
    manifest = read_manifest(engine)
    assert manifest["fused_head_rotary"] is True and f"head_norm_rotary_{TINY[1]}" in manifest["gated_delta_library"]["kernels"]
    for graph in ("prefill", "continue", "packed"):
        ops = Counter(node.op_type for node in onnx.load(str(engine / f"{graph}.onnx"), load_external_data=False).graph.node)
        assert ops[HEAD_ROTARY_OP] == 2 * ATTENTION_LAYERS and ops["Neg"] == 0, graph


def _inputs(rng: np.random.Generator, rows: int, tokens: int, heads: int, width: int, rotary: int) -> dict[str, np.ndarray]:
    """Heads of varied scale, a norm weight, and the cos and sin of rotary angles over many turns."""
    angles = rng.uniform(-50, 50, (rows, tokens, rotary)).astype(np.float32)
    return {"x": (rng.standard_normal((rows, tokens, heads, width)) * rng.uniform(0.1, 10, (rows, tokens, heads, 1))).astype(np.float32),
            "weight": (1 + 0.1 * rng.standard_normal(width)).astype(np.float32), "cos": np.cos(angles), "sin": np.sin(angles)}  # fmt: skip


def _exact(inputs: dict[str, np.ndarray]) -> np.ndarray:
    """The float64 ``[B, H, T, D]`` norm and rotation of ``inputs``."""
    x = inputs["x"].astype(np.float64)
    normed = (x / np.sqrt((x * x).mean(-1, keepdims=True) + EPSILON) * inputs["weight"]).transpose(0, 2, 1, 3)
    rotary = inputs["cos"].shape[-1]
    cos, sin = inputs["cos"][:, None].astype(np.float64), inputs["sin"][:, None].astype(np.float64)
    rotated = normed[..., :rotary]
    turned = np.concatenate([-rotated[..., rotary // 2 :], rotated[..., : rotary // 2]], axis=-1)
    return np.concatenate([rotated * cos + turned * sin, normed[..., rotary:]], axis=-1)


def _close(got: np.ndarray, exact: np.ndarray) -> bool:
    """Within 2e-6 of each head's largest value (a few float32 steps: the norm's sum and the rotation's products)."""
    scale = np.abs(exact).max(axis=-1, keepdims=True)
    return got.shape == exact.shape and bool(np.all(np.abs(got - exact) <= 2e-6 * scale))


# Run by test_the_kernel_in_triton_s_interpreter in a process of its own (TRITON_INTERPRET before Triton's import).
_INTERPRETER = """
import sys
import numpy as np, torch
from s1omni.export.gdn_library import head_rotary_spec
from s1omni.export.head_rotary_kernel import head_norm_rotary_kernel
cases = np.load(sys.argv[1])
ran = {}
for case in range(int(cases["count"])):
    x, weight, cos, sin = (torch.from_numpy(cases[f"{name}{case}"]) for name in ("x", "weight", "cos", "sin"))
    rows, tokens, heads, width = x.shape
    out = torch.empty(rows, heads, tokens, width)
    head_norm_rotary_kernel[(rows * tokens * heads,)](x, weight, cos, sin, out, heads, tokens, width, cos.shape[-1], float(cases["epsilon"]),
                                                     **head_rotary_spec(width).constants)
    ran[f"out{case}"] = out.numpy()
np.savez(sys.argv[2], **ran)
"""


def test_the_kernel_in_triton_s_interpreter(tmp_path: Path) -> None:
    """The kernel's indexing and arithmetic, run by Triton's interpreter on the CPU: within a few float32 steps of the
    float64 norm and rotation, written head-major; the tiny member's heads (4 of 32, 8 rotated), the 0.8B's q (8 of 256,
    64 rotated) and a head size under its block (96, 32 rotated)."""
    rng = np.random.default_rng(9)
    shapes = [(1, 1, *TINY), (2, 37, *TINY), (1, 5, 8, 256, 64), (2, 3, 2, 96, 32)]
    cases = [_inputs(rng, *shape) for shape in shapes]
    np.savez(tmp_path / "cases.npz", count=len(cases), epsilon=EPSILON, **{f"{name}{i}": value for i, case in enumerate(cases) for name, value in case.items()})
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
    subprocess.run([sys.executable, "-c", _INTERPRETER, str(tmp_path / "cases.npz"), str(tmp_path / "ran.npz")], env=env, check=True)
    ran = np.load(tmp_path / "ran.npz")
    for i, (shape, case) in enumerate(zip(shapes, cases, strict=True)):
        assert _close(ran[f"out{i}"], _exact(case)), shape


def _unit_sessions(library: Path, heads: int, width: int, rotary: int) -> dict[str, onnxruntime.InferenceSession]:
    """The unit model on the CUDA EP: ``graph`` (ONNX Runtime's nodes) and ``op`` (rewritten to the op)."""
    made = {}
    for name in ("graph", "op"):
        model = _unit_model(heads, width, rotary)
        if name == "op":
            assert use_head_rotary(model) == 1
        made[name] = onnxruntime.InferenceSession(model.SerializeToString(), session_options("cuda", library), providers=CUDA)
    return made


def _unit_inputs(rng: np.random.Generator, rows: int, tokens: int, heads: int, width: int, rotary: int) -> dict[str, np.ndarray]:
    """``_inputs`` with the unit model's own weight."""
    weight = next(tensor for tensor in _unit_model(heads, width, rotary).graph.initializer if tensor.name == "weight")
    return _inputs(rng, rows, tokens, heads, width, rotary) | {"weight": numpy_helper.to_array(weight)}


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("heads", [TINY, (8, 256, 64), (2, 256, 64)], ids=["tiny", "0.8B q", "0.8B k"])
@pytest.mark.parametrize("tokens", [1, 37, 2048])
def test_the_op_computes_float64_s_rotation_on_the_gpu(gpu_library: Path, heads: tuple[int, int, int], tokens: int) -> None:
    """The op built for this GPU against the float64 norm and rotation of its inputs, and ONNX Runtime's nodes for them
    beside it: both within a few float32 steps of float64."""
    inputs = _unit_inputs(np.random.default_rng(tokens), 2, tokens, *heads)
    sessions = _unit_sessions(gpu_library, *heads)
    feeds = {name: inputs[name] for name in ("x", "cos", "sin")}
    exact = _exact(inputs)
    for name, session in sessions.items():
        assert _close(session.run(None, feeds)[0], exact), (name, heads, tokens)


@pytest.mark.gpu
@needs_cuda
def test_the_op_s_time_beside_the_graph_s(gpu_library: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Printed for the record, asserting only that both ran: one session call of the 0.8B's q as ONNX Runtime's nodes and
    as the op, 600 and 2,048 tokens (``tests.cuda_builds.microseconds_a_call``)."""
    timings = {}
    for tokens in (600, 2048):
        inputs = _unit_inputs(np.random.default_rng(0), 1, tokens, 8, 256, 64)
        for variant, session in _unit_sessions(gpu_library, 8, 256, 64).items():
            timings[f"{variant} T={tokens}"] = microseconds_a_call(session, {name: inputs[name] for name in ("x", "cos", "sin")})
    with capsys.disabled():
        print(f"\nhead norm and rotary, us a call: {json.dumps(timings)}")
    assert len(timings) == 4


@pytest.mark.gpu
@needs_cuda
def test_the_cuda_ep_runs_the_rewrite_as_the_graph_without_it(gpu_library: Path, external_export: Path, tmp_path: Path) -> None:
    """Prefill, then continue from its state, through the tiny member's rewritten graphs on the CUDA EP against the same
    graphs without the head norms and rotations rewritten there: every output within a few bfloat16 steps."""
    assert_cuda_ep_runs_the_rewrite_as_without(gpu_library, external_export, tmp_path,
                                               lambda graph, weights, rotary: _built(external_export, graph, weights, False, rotary))
