"""The fused attention (``s1omni.export.attention_fusions``, ``--fused-attention``) on the tiny member's fused graphs,
run here: ``MultiHeadAttention`` has a CPU kernel. Its CUDA kernels have not run (no GPU here)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from s1omni.export.attention_fusions import SAFE_MASK, fuse_attention
from tests.cli import run_s1omni, s1omni
from tests.test_mixer_fusions import _continue_feeds, _largest_moves, _prefill_feeds, _run

ATTENTION_LAYERS = 1  # the tiny member's full-attention layer (4 query heads over 2 key/value heads, head size 32)
# Each output of the fused engine within this much of the largest value of the plain engine's: float32 rounding
# through four layers. Measured on these feeds: 0 (prefill and both continues; the CPU kernel sums in the same order).
RELATIVE_BOUND = 1e-5
PLAIN = ("--gated-delta-kernel", "LinearAttention")  # float32, a kernel the CPU runs (tests.cuda_builds)


def _answers(prefill: onnx.ModelProto | str, continued: onnx.ModelProto | str) -> dict[str, np.ndarray]:
    """Every output of a prefill of two rows (one left-padded: its padding queries see no key) and of continues
    from its state, one token and six (the past keys under ``past_mask``, then the block's own causally)."""
    feeds = _prefill_feeds([37, 20])
    state = _run(prefill, feeds)
    answers = {f"prefill {name}": value for name, value in state.items()}
    rng = np.random.default_rng(6)
    for tokens in (1, 6):
        answers.update({f"continue {tokens} {name}": value for name, value in _run(continued, _continue_feeds(feeds, state, tokens, rng)).items()})
    return answers


@pytest.fixture(scope="module")
def engines(cuda_engine: Callable[..., tuple[Path, str]]) -> tuple[Path, Path]:
    """The plain CUDA build and the one with ``--fused-attention`` (as ``s1omni build`` writes them)."""
    return cuda_engine(*PLAIN)[0], cuda_engine(*PLAIN, "--fused-attention")[0]


@pytest.fixture(scope="module")
def plain_answers(engines: tuple[Path, Path]) -> dict[str, np.ndarray]:
    return _answers(*(str(engines[0] / f"{graph}.onnx") for graph in ("prefill", "continue")))


@pytest.mark.parametrize("graph", ["prefill", "continue"])
def test_each_attention_layer_gets_one_multi_head_attention(exported: Path, graph: str) -> None:
    model = onnx.load(str(exported / f"{graph}.fused.onnx"))
    before = Counter(node.op_type for node in model.graph.node)
    assert fuse_attention(model) == ATTENTION_LAYERS
    onnx.checker.check_model(model, full_check=True)
    after = Counter(node.op_type for node in model.graph.node)
    assert after["MultiHeadAttention"] == ATTENTION_LAYERS and not after["Softmax"]
    # per layer: k's Transpose, both MatMuls, the scale, the mask's Add, the Softmax and the output's Transpose and
    # Reshape, for q's Transpose and Reshape and the op; one Max for the mask every layer shares
    assert before - after == Counter({"MatMul": 2, "Mul": 1, "Add": 1, "Softmax": 1, "Transpose": 1})
    assert after - before == Counter({"MultiHeadAttention": 1, "Max": 1})
    (attention,) = (node for node in model.graph.node if node.op_type == "MultiHeadAttention")
    assert {a.name: helper.get_attribute_value(a) for a in attention.attribute} == pytest.approx({"num_heads": 4, "scale": 32**-0.5})
    assert all(tensor.name in {name for node in model.graph.node for name in node.input} for tensor in model.graph.initializer)
    assert fuse_attention(model) == 0  # nothing left to match


def test_fused_attention_answers_as_the_exported_ops_to_float32_rounding(engines: tuple[Path, Path], plain_answers: dict[str, np.ndarray]) -> None:
    """The hidden states and every state output of both graphs, fused engine against plain engine."""
    fused = _answers(*(str(engines[1] / f"{graph}.onnx") for graph in ("prefill", "continue")))
    moves = _largest_moves(fused, plain_answers)
    # prefill: hidden, conv and recurrent per Gated DeltaNet layer, the attention layer's K and V; continue: hidden
    assert len(moves) == 1 + 2 * 3 + 2 + 2, sorted(moves)
    assert max(moves.values()) <= RELATIVE_BOUND, moves
    for graph in ("prefill", "continue"):
        ops = Counter(node.op_type for node in onnx.load(str(engines[1] / f"{graph}.onnx")).graph.node)
        assert ops["MultiHeadAttention"] == ATTENTION_LAYERS and not ops["Softmax"]


def _attention(model: onnx.ModelProto) -> onnx.NodeProto:
    return next(node for node in model.graph.node if node.op_type == "MultiHeadAttention")


def _before_attention(model: onnx.ModelProto, *nodes: onnx.NodeProto) -> None:
    at = list(model.graph.node).index(_attention(model))
    for offset, node in enumerate(nodes):
        model.graph.node.insert(at + offset, node)


def _constant(model: onnx.ModelProto, name: str, value: np.ndarray) -> str:
    model.graph.initializer.append(numpy_helper.from_array(value, name))
    return name


def _scale_doubled(model: onnx.ModelProto) -> None:
    attention = _attention(model)
    scale = next(a for a in attention.attribute if a.name == "scale")
    scale.f *= 2


def _mask_dropped(model: onnx.ModelProto) -> None:
    _attention(model).input[5] = ""


def _own_causal_flag(model: onnx.ModelProto) -> None:  # the op's causality in place of the key mask
    attention = _attention(model)
    attention.input[5] = ""
    attention.attribute.append(helper.make_attribute("unidirectional", 1))


def _causal_offset(model: onnx.ModelProto) -> None:  # each query allowed the keys of the query before it
    attention = _attention(model)
    mask = attention.input[5]
    pads = _constant(model, "broken.pads", np.array([0, 0, 0, 1, 0, 0, 0, 0], np.int64))
    starts, ends, axes = (_constant(model, f"broken.{name}", np.array([value], np.int64)) for name, value in (("starts", 0), ("ends", -1), ("axes", 3)))
    _before_attention(model, helper.make_node("Pad", [mask, pads], ["broken.padded"]), helper.make_node("Slice", ["broken.padded", starts, ends, axes], ["broken.mask"]))
    attention.input[5] = "broken.mask"


def _heads_tiled(model: onnx.ModelProto) -> None:  # query head h on key/value head h % 2, not h // 2
    attention = _attention(model)
    order = _constant(model, "broken.heads", np.array([0, 2, 1, 3], np.int64))
    nodes = [helper.make_node("Gather", [attention.input[i], order], [f"broken.{i}"], axis=1) for i in (1, 2)]
    _before_attention(model, *nodes)
    attention.input[1], attention.input[2] = "broken.1", "broken.2"


def _mask_unclamped(model: onnx.ModelProto) -> None:  # what the CPU runs either way: a control, not a break
    clamp = next(node for node in model.graph.node if node.op_type == "Max")
    _attention(model).input[5] = clamp.input[0]


BROKEN: dict[str, Callable[[onnx.ModelProto], None]] = {
    "scale doubled": _scale_doubled,
    "mask dropped": _mask_dropped,
    "unidirectional instead of the mask": _own_causal_flag,
    "causal offset by one key": _causal_offset,
    "GQA heads tiled": _heads_tiled,
}


@pytest.mark.parametrize("broken", list(BROKEN))
def test_a_broken_rewrite_misses_the_bound(engines: tuple[Path, Path], plain_answers: dict[str, np.ndarray], broken: str) -> None:
    """Each way the op could be wired wrong moves the answers past ``RELATIVE_BOUND``: the comparison above can fail."""
    graphs = [onnx.load(str(engines[1] / f"{graph}.onnx")) for graph in ("prefill", "continue")]
    for model in graphs:
        BROKEN[broken](model)
    moves = _largest_moves(_answers(*graphs), plain_answers)
    assert max(moves.values()) > 100 * RELATIVE_BOUND, moves


def test_the_clamp_keeps_the_cpu_answers(engines: tuple[Path, Path], plain_answers: dict[str, np.ndarray]) -> None:
    """The mask clamped at ``SAFE_MASK`` (for the CUDA kernel) answers as the unclamped one: a masked score's
    ``exp`` is 0 either way, and the padding queries' rows stay the uniform average."""
    graphs = [onnx.load(str(engines[1] / f"{graph}.onnx")) for graph in ("prefill", "continue")]
    for model in graphs:
        floor = next(node for node in model.graph.node if node.op_type == "Max").input[1]
        assert numpy_helper.to_array(next(t for t in model.graph.initializer if t.name == floor)) == np.float32(SAFE_MASK)
        _mask_unclamped(model)
    assert max(_largest_moves(_answers(*graphs), plain_answers).values()) <= RELATIVE_BOUND


def _node(model: onnx.ModelProto, op_type: str) -> onnx.NodeProto:
    return next(node for node in model.graph.node if node.op_type == op_type)


def _softmax_over_queries(model: onnx.ModelProto) -> None:
    softmax = _node(model, "Softmax")
    del softmax.attribute[:]
    softmax.attribute.append(helper.make_attribute("axis", 2))


def _scores_read_elsewhere(model: onnx.ModelProto) -> None:
    softmax = _node(model, "Softmax")
    model.graph.output.append(helper.make_tensor_value_info(softmax.input[0], TensorProto.FLOAT, None))


def _scale_not_constant(model: onnx.ModelProto) -> None:
    add = next(node for node in model.graph.node if node.output[0] == _node(model, "Softmax").input[0])
    scale = next(node for node in model.graph.node if node.output[0] in add.input and node.op_type == "Mul")
    model.graph.input.append(helper.make_tensor_value_info("scale", TensorProto.FLOAT, []))
    scale.input[1] = "scale"


def _unscaled(model: onnx.ModelProto) -> None:  # scores straight into the mask's Add
    add = next(node for node in model.graph.node if node.output[0] == _node(model, "Softmax").input[0])
    scale = next(node for node in model.graph.node if node.output[0] in add.input and node.op_type == "Mul")
    add.input[list(add.input).index(scale.output[0])] = scale.input[0]
    model.graph.node.remove(scale)


ALTERED: dict[str, Callable[[onnx.ModelProto], None]] = {
    "softmax over the queries": _softmax_over_queries,
    "scores read elsewhere": _scores_read_elsewhere,
    "scale not a constant": _scale_not_constant,
    "no scale": _unscaled,
}


@pytest.mark.parametrize("altered", list(ALTERED))
def test_an_altered_pattern_is_left_alone(exported: Path, altered: str) -> None:
    model = onnx.load(str(exported / "continue.fused.onnx"))
    ALTERED[altered](model)
    untouched = [node.SerializeToString() for node in model.graph.node]
    assert fuse_attention(model) == 0
    assert [node.SerializeToString() for node in model.graph.node] == untouched


def test_cuda_builds_record_fused_attention(cuda_engine: Callable[..., tuple[Path, str]]) -> None:
    engine, progress = cuda_engine(*PLAIN, "--fused-attention")
    assert json.loads((engine / "manifest.json").read_text())["fused_attention"] is True
    assert "prefill.onnx: 1 MultiHeadAttention nodes, 20 fused norms, 14 sigmoids" in progress, progress
    assert json.loads((cuda_engine(*PLAIN)[0] / "manifest.json").read_text())["fused_attention"] is False


@pytest.mark.parametrize("flag", ["--fused-attention", "--no-fused-attention"])
def test_build_json_reports_fused_attention(exported: Path, tmp_path: Path, flag: str) -> None:
    """What ``build --json`` says is what the manifest records, and what the graphs hold."""
    result = s1omni("build", str(exported), "--backend", "onnxruntime", "--target", "cuda", "--precision", "fp32", "--no-cuda-graphs",
                    flag, "--out", str(tmp_path / "engine"), "--json", "--quiet")  # fmt: skip
    fused = flag == "--fused-attention"
    assert json.loads(result.stdout)["fused_attention"] is json.loads((tmp_path / "engine" / "manifest.json").read_text())["fused_attention"] is fused
    ops = Counter(node.op_type for node in onnx.load(str(tmp_path / "engine" / "continue.onnx")).graph.node)
    assert (ops["MultiHeadAttention"], ops["Softmax"]) == ((ATTENTION_LAYERS, 0) if fused else (0, ATTENTION_LAYERS))


@pytest.mark.parametrize(("backend", "target"), [("onnxruntime", "cpu"), ("tensorrt", "sm_90")])
def test_fused_attention_is_a_usage_error_off_onnxruntime_cuda(exported: Path, tmp_path: Path, backend: str, target: str) -> None:
    """TensorRT parses no contrib op; CPU engines run the portable graphs, which attend in chunks. Refused before
    anything is written."""
    result = run_s1omni("build", str(exported), "--backend", backend, "--target", target, "--fused-attention", "--out", str(tmp_path / "engine"))
    assert result.returncode == 2 and "--fused-attention is for onnxruntime/cuda" in result.stderr, result.stderr
    assert not list(tmp_path.iterdir())
