"""The fused Gated DeltaNet mixers (``s1omni.export.mixer_fusions``, ``--fused-mixers``) on the tiny member's
graphs and on small hand-made ones, run here: ``CausalConvWithState`` and ``GatedRMSNorm`` have CPU kernels."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

from s1omni.export.mixer_fusions import fuse_gated_norms, fuse_short_convolutions
from s1omni.runtime.runners.base import text_positions
from tests.cli import run_s1omni, s1omni
from tests.onnx_graphs import rms_norm_nodes

LAYERS = 3  # the tiny member's Gated DeltaNet layers
# Each output of a rewritten graph within this much of the largest value of the export's own: float32
# rounding through four layers (measured on these feeds: 2.7e-6 for the engines, 5.6e-6 for the Scan graphs).
RELATIVE_BOUND = 1e-5


def _run(model: onnx.ModelProto | str, feeds: dict[str, np.ndarray], providers: Sequence = ("CPUExecutionProvider",)) -> dict[str, np.ndarray]:
    session = onnxruntime.InferenceSession(model if isinstance(model, str) else model.SerializeToString(), providers=list(providers))
    return dict(zip((output.name for output in session.get_outputs()), session.run(None, feeds), strict=True))


def _rewritten(path: Path) -> onnx.ModelProto:
    model = onnx.load(str(path))
    assert (fuse_short_convolutions(model), fuse_gated_norms(model)) == (LAYERS, LAYERS)
    return model


def _prefill_feeds(lengths: list[int]) -> dict[str, np.ndarray]:
    """Rows of ``lengths`` tokens left-padded to the longest, as the runner pads them, read at every position."""
    width, rng = max(lengths), np.random.default_rng(5)
    ids, mask, positions = np.zeros((len(lengths), width), np.int64), np.zeros((len(lengths), width), np.int64), np.zeros((3, len(lengths), width), np.int64)
    for row, length in enumerate(lengths):
        ids[row, width - length :], mask[row, width - length :] = rng.integers(1, 2048, length), 1
        positions[:, row, width - length :] = text_positions(0, length)
    return {"input_ids": ids, "position_ids": positions, "attention_mask": mask, "readout_index": np.tile(np.arange(width), (len(lengths), 1))}


def _continue_feeds(prefill: dict[str, np.ndarray], state: dict[str, np.ndarray], tokens: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """A block of ``tokens`` per row of ``prefill`` (``_prefill_feeds``), continuing from its outputs ``state``."""
    lengths = prefill["attention_mask"].sum(axis=1)
    past = {f"past_{name}": value for name, value in state.items() if name != "hidden"}
    return {"input_ids": rng.integers(1, 2048, (len(lengths), tokens)), "position_ids": (lengths[:, None] + np.arange(tokens))[None].repeat(3, axis=0),
            "past_mask": prefill["attention_mask"], "readout_index": np.tile(np.arange(tokens), (len(lengths), 1)), **past}  # fmt: skip


def _largest_moves(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> dict[str, float]:
    """Each output's largest difference, as a fraction of the largest value of ``want``'s."""
    assert got.keys() == want.keys()
    return {name: float(np.abs(got[name] - want[name]).max() / np.abs(want[name]).max()) for name in want}


@pytest.mark.parametrize("graph", ["prefill", "continue"])
def test_each_gated_delta_net_layer_gets_one_conv_and_one_norm(exported: Path, graph: str) -> None:
    model = onnx.load(str(exported / f"{graph}.fused.onnx"))
    before = Counter(node.op_type for node in model.graph.node)
    assert (fuse_short_convolutions(model), fuse_gated_norms(model)) == (LAYERS, LAYERS)
    onnx.checker.check_model(model, full_check=True)
    after = Counter(node.op_type for node in model.graph.node)
    assert after["CausalConvWithState"] == after["GatedRMSNorm"] == LAYERS and not after["Conv"]
    # per layer: the conv's SiLU (Neg, Exp, Add, Div), the norm (Pow, ReduceMean, Add, Sqrt, Reciprocal, Mul, Mul by
    # its weight), the gate's SiLU and the product; continue's Concat too (prefill gathers its state from it)
    concats = 0 if graph == "prefill" else LAYERS
    assert before - after == Counter({"Conv": 3, "Neg": 6, "Exp": 6, "Div": 6, "Add": 9, "Mul": 9, "Pow": 3, "ReduceMean": 3,
                                      "Sqrt": 3, "Reciprocal": 3, "Concat": concats})  # fmt: skip
    assert sum(after.values()) == sum(before.values()) - (15 if graph == "prefill" else 16) * LAYERS
    used = {name for node in model.graph.node for name in node.input}
    assert all(tensor.name in used for tensor in model.graph.initializer)  # the freed eps and exponents are gone


def test_weights_outside_the_graph_are_matched_by_their_dims(external_export: Path) -> None:
    """A large member's graphs, loaded as a build loads them (their weights left in ``weights.data``): each conv's
    weight is read by its dims alone and stays where it was."""
    for graph in ("prefill", "continue"):
        model = onnx.load(str(external_export / f"{graph}.fused.onnx"), load_external_data=False)
        assert (fuse_short_convolutions(model), fuse_gated_norms(model)) == (LAYERS, LAYERS)
        external = {tensor.name for tensor in model.graph.initializer if tensor.data_location == TensorProto.EXTERNAL}
        weights = [node.input[1] for node in model.graph.node if node.op_type == "CausalConvWithState"]
        assert len(weights) == LAYERS and set(weights) <= external


def _graph_pairs(source: str, exported: Path, cuda_engine: Callable[..., tuple[Path, str]]) -> dict[str, tuple[str, onnx.ModelProto | str]]:
    """``{graph: (without fused mixers, with them)}`` for prefill and continue: ``engines``, the CUDA builds of the fused
    graphs (LinearAttention, float32, the norm and sigmoid fusion after the mixers) as ``s1omni build`` writes them
    with and without ``--fused-mixers``; ``scan``, the export's Scan graphs and their rewrite (no build of them takes it)."""
    if source == "engines":
        (plain, _), (fused, _) = (cuda_engine("--gated-delta-kernel", "LinearAttention", *extra) for extra in ((), ("--fused-mixers",)))
        return {graph: (str(plain / f"{graph}.onnx"), str(fused / f"{graph}.onnx")) for graph in ("prefill", "continue")}
    return {graph: (str(exported / f"{graph}.onnx"), _rewritten(exported / f"{graph}.onnx")) for graph in ("prefill", "continue")}


@pytest.mark.parametrize("source", ["engines", "scan"])
def test_fused_mixers_answer_as_the_exported_ops_to_float32_rounding(exported: Path, cuda_engine: Callable[..., tuple[Path, str]], source: str) -> None:
    """Prefill of two rows (one left-padded: the realigned rows' present windows) then continue from its state,
    one token (the conv's decode path) and six: the hidden states and every state output of both graphs."""
    pairs = _graph_pairs(source, exported, cuda_engine)
    feeds = _prefill_feeds([37, 20])
    state = _run(pairs["prefill"][0], feeds)
    moves = {f"prefill {name}": move for name, move in _largest_moves(_run(pairs["prefill"][1], feeds), state).items()}
    rng = np.random.default_rng(6)
    for tokens in (1, 6):
        steps = _continue_feeds(feeds, state, tokens, rng)
        plain, fused = (_run(graph, steps) for graph in pairs["continue"])
        moves.update({f"continue {tokens} {name}": move for name, move in _largest_moves(fused, plain).items()})
    # prefill: hidden, conv and recurrent per Gated DeltaNet layer, the attention layer's K and V; continue: hidden
    assert len(moves) == 1 + 2 * LAYERS + 2 + 2, sorted(moves)
    assert max(moves.values()) <= RELATIVE_BOUND, moves
    assert 0 < max(moves.values()), "the fused ops round differently: an unchanged result means nothing was rewritten"


CHANNELS, WINDOW, HEAD = 6, 3, 8
EPSILON = 1e-3  # far from GatedRMSNorm's default (1e-5): a rewrite that drops the norm's own fails here too


def _mixers(bias: bool = False, silu: str = "spelled") -> onnx.ModelProto:
    """A short convolution ``Concat(past, x) → Conv → SiLU`` on ``[B, C, T]`` and a gated norm on ``[rows, head]``,
    as the export spells them (``silu`` ``sigmoid``: written ``x · Sigmoid(x)``)."""
    rng = np.random.default_rng(2)
    constants = {"weight": rng.standard_normal((CHANNELS, 1, WINDOW + 1)), "two": np.float32(2), "last": np.array([-1]),
                 "eps": np.float32(EPSILON), "one": np.float32(1), "scale": rng.standard_normal(HEAD) + 1}  # fmt: skip
    if bias:
        constants["bias"] = rng.standard_normal(CHANNELS)

    def activation(x: str, out: str) -> list[onnx.NodeProto]:
        if silu == "sigmoid":
            return [helper.make_node("Sigmoid", [x], [f"{out}.s"]), helper.make_node("Mul", [x, f"{out}.s"], [out])]
        return [helper.make_node("Neg", [x], [f"{out}.n"]), helper.make_node("Exp", [f"{out}.n"], [f"{out}.e"]),
                helper.make_node("Add", ["one", f"{out}.e"], [f"{out}.d"]), helper.make_node("Div", [x, f"{out}.d"], [out])]  # fmt: skip

    nodes = [
        helper.make_node("Concat", ["past", "x"], ["window"], axis=-1),
        helper.make_node("Conv", ["window", "weight", *(["bias"] if bias else [])], ["convolved"], group=CHANNELS, kernel_shape=[WINDOW + 1],
                         pads=[0, 0], strides=[1], dilations=[1]),  # fmt: skip
        *activation("convolved", "mixed"),
        *rms_norm_nodes("h", "rms"),
        helper.make_node("Mul", ["scale", "rms"], ["weighted"]),
        *activation("z", "gate"),
        helper.make_node("Mul", ["weighted", "gate"], ["normed"]),
    ]
    inputs = [("x", ["batch", CHANNELS, "time"]), ("past", ["batch", CHANNELS, WINDOW]), ("h", ["rows", HEAD]), ("z", ["rows", HEAD])]
    graph = helper.make_graph(
        nodes, "mixers", [helper.make_tensor_value_info(name, TensorProto.FLOAT, shape) for name, shape in inputs],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in ("mixed", "normed")],
        [numpy_helper.from_array(np.asarray(value, np.float32 if name != "last" else np.int64), name) for name, value in constants.items()],
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)


def _silu(value: np.ndarray) -> np.ndarray:
    return value / (1 + np.exp(-value))


def _mixer_feeds() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(3)
    shapes = {"x": (2, CHANNELS, 9), "past": (2, CHANNELS, WINDOW), "h": (5, HEAD), "z": (5, HEAD)}
    return {name: (rng.standard_normal(shape) * 2).astype(np.float32) for name, shape in shapes.items()}


@pytest.mark.parametrize(("bias", "silu"), [(False, "spelled"), (True, "sigmoid")], ids=["exported", "bias-and-sigmoid"])
def test_the_fused_ops_compute_what_they_replace(bias: bool, silu: str) -> None:
    """Against numpy in float64: the convolution (a bias too) over ``[past | x]`` and the gated norm, with the
    SiLU spelled either way."""
    model = _mixers(bias, silu)
    assert (fuse_short_convolutions(model), fuse_gated_norms(model)) == (1, 1)
    assert [node.op_type for node in model.graph.node] == ["CausalConvWithState", "GatedRMSNorm"]  # the Concat read by the conv alone
    feeds = _mixer_feeds()
    got = _run(model, feeds)
    constants = {tensor.name: numpy_helper.to_array(tensor).astype(np.float64) for tensor in model.graph.initializer}
    wide = {name: value.astype(np.float64) for name, value in feeds.items()}
    padded, taps = np.concatenate([wide["past"], wide["x"]], axis=-1), constants["weight"][:, 0]
    time = wide["x"].shape[-1]
    convolved = sum(taps[None, :, k, None] * padded[..., k : k + time] for k in range(WINDOW + 1)) + constants.get("bias", np.zeros(CHANNELS))[None, :, None]
    h, z = wide["h"], wide["z"]
    normed = constants["scale"] * h / np.sqrt((h**2).mean(-1, keepdims=True) + EPSILON) * _silu(z)
    assert np.allclose(got["mixed"], _silu(convolved), rtol=1e-5, atol=1e-6)
    assert np.allclose(got["normed"], normed, rtol=1e-5, atol=1e-6)


def _set(node: onnx.NodeProto, **attributes: object) -> None:
    for name, value in attributes.items():
        del node.attribute[next(i for i, a in enumerate(node.attribute) if a.name == name)]
        node.attribute.append(helper.make_attribute(name, value))


def _node(model: onnx.ModelProto, output: str) -> onnx.NodeProto:
    return next(node for node in model.graph.node if output in node.output)


def _kernel_three(model: onnx.ModelProto) -> None:  # a window of 3 before a kernel of 3: one output too many
    weight = next(tensor for tensor in model.graph.initializer if tensor.name == "weight")
    weight.CopyFrom(numpy_helper.from_array(np.ones((CHANNELS, 1, WINDOW), np.float32), "weight"))
    _set(_node(model, "convolved"), kernel_shape=[WINDOW])


def _grouped(model: onnx.ModelProto) -> None:  # two channels a group: not depthwise
    weight = next(tensor for tensor in model.graph.initializer if tensor.name == "weight")
    weight.CopyFrom(numpy_helper.from_array(np.ones((CHANNELS, 2, WINDOW + 1), np.float32), "weight"))
    _set(_node(model, "convolved"), group=CHANNELS // 2)


def _conv_read_elsewhere(model: onnx.ModelProto) -> None:
    model.graph.output.append(helper.make_tensor_value_info("convolved", TensorProto.FLOAT, None))


def _ungated(model: onnx.ModelProto) -> None:  # the norm times z itself, no SiLU
    _node(model, "normed").input[1] = "z"


def _sigmoid_gate(model: onnx.ModelProto) -> None:  # times sigmoid(z) = 1 / (1 + exp(-z)), not z · sigmoid(z)
    _node(model, "gate").CopyFrom(helper.make_node("Reciprocal", ["gate.d"], ["gate"]))


def _broadcast_gate(model: onnx.ModelProto) -> None:  # a gate of another shape (one value a row)
    next(value for value in model.graph.input if value.name == "z").CopyFrom(helper.make_tensor_value_info("z", TensorProto.FLOAT, ["rows", 1]))


ALTERED: dict[str, tuple[Callable[[onnx.ModelProto], None], tuple[int, int]]] = {
    "kernel 3": (_kernel_three, (0, 1)),
    "grouped": (_grouped, (0, 1)),
    "dilated": (lambda model: _set(_node(model, "convolved"), dilations=[2]), (0, 1)),
    "padded": (lambda model: _set(_node(model, "convolved"), pads=[1, 0]), (0, 1)),
    "strided": (lambda model: _set(_node(model, "convolved"), strides=[2]), (0, 1)),
    "channels last": (lambda model: _set(_node(model, "window"), axis=1), (0, 1)),
    "conv read elsewhere": (_conv_read_elsewhere, (0, 1)),
    "norm without the gate": (_ungated, (1, 0)),
    "sigmoid gate": (_sigmoid_gate, (1, 0)),
    "broadcast gate": (_broadcast_gate, (1, 0)),
}


@pytest.mark.parametrize("altered", list(ALTERED))
def test_an_altered_pattern_is_left_alone(altered: str) -> None:
    """Each alteration keeps its part as it was (the other part still fuses)."""
    alter, expected = ALTERED[altered]
    model = _mixers()
    alter(model)
    untouched = {node.SerializeToString() for node in model.graph.node}
    assert (fuse_short_convolutions(model), fuse_gated_norms(model)) == expected
    kept = untouched & {node.SerializeToString() for node in model.graph.node}
    assert len(kept) == len(untouched) - (6 if expected[0] else 12)  # only the other part's nodes went (conv: Concat, Conv, SiLU)


def test_cuda_builds_record_fused_mixers(cuda_engine: Callable[..., tuple[Path, str]]) -> None:
    engine, progress = cuda_engine("--gated-delta-kernel", "LinearAttention", "--fused-mixers")
    assert json.loads((engine / "manifest.json").read_text())["fused_mixers"] is True
    for graph in ("prefill", "continue"):
        ops = Counter(node.op_type for node in onnx.load(str(engine / f"{graph}.onnx")).graph.node)
        assert ops["CausalConvWithState"] == ops["GatedRMSNorm"] == LAYERS and not ops["Conv"]
    # the norm and sigmoid fusion that follows finds the 20 norms and 14 sigmoids less the mixers' 3 and 6
    assert "prefill.onnx: 3 CausalConvWithState nodes, 3 GatedRMSNorm nodes, 17 fused norms, 8 sigmoids" in progress, progress
    plain, _ = cuda_engine("--gated-delta-kernel", "LinearAttention")
    assert json.loads((plain / "manifest.json").read_text())["fused_mixers"] is False


@pytest.mark.parametrize("flag", ["--fused-mixers", "--no-fused-mixers"])
def test_build_json_reports_fused_mixers(exported: Path, tmp_path: Path, flag: str) -> None:
    """What ``build --json`` says is what the manifest records, and what the graphs hold (beside the default
    GatedDeltaNet kernel's nodes, which the CPU cannot run)."""
    result = s1omni("build", str(exported), "--backend", "onnxruntime", "--target", "cuda", "--precision", "fp32", "--no-cuda-graphs",
                    flag, "--out", str(tmp_path / "engine"), "--json", "--quiet")  # fmt: skip
    reported = json.loads(result.stdout)
    fused = flag == "--fused-mixers"
    assert reported["fused_mixers"] is json.loads((tmp_path / "engine" / "manifest.json").read_text())["fused_mixers"] is fused
    ops = Counter(node.op_type for node in onnx.load(str(tmp_path / "engine" / "continue.onnx")).graph.node)
    assert (ops["CausalConvWithState"], ops["GatedRMSNorm"], ops["Conv"], ops["GatedDeltaNet"]) == ((LAYERS, LAYERS, 0, LAYERS) if fused else (0, 0, LAYERS, LAYERS))


@pytest.mark.parametrize(("backend", "target"), [("onnxruntime", "cpu"), ("tensorrt", "sm_90")])
def test_fused_mixers_are_a_usage_error_off_onnxruntime_cuda(exported: Path, tmp_path: Path, backend: str, target: str) -> None:
    """TensorRT parses no contrib op; on the CPU the ops' kernels are slower than the exported spelling (figures in
    ``s1omni.export.mixer_fusions``). Refused before anything is written."""
    result = run_s1omni("build", str(exported), "--backend", backend, "--target", target, "--fused-mixers", "--out", str(tmp_path / "engine"))
    assert result.returncode == 2 and "--fused-mixers is for onnxruntime/cuda" in result.stderr, result.stderr
    assert not list(tmp_path.iterdir())
