"""The fused attention (``s1omni.export.attention_fusions``, ``--fused-attention``) on the tiny member's fused graphs,
run here: ``MultiHeadAttention`` has a CPU kernel. Its CUDA kernels have not run (no GPU here)."""

from __future__ import annotations

import functools
import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

from s1omni.export.attention_fusions import KEY_MULTIPLE, SAFE_MASK, fuse_attention
from s1omni.export.cuda_kernels import INPUT_TYPES
from tests.cli import run_s1omni, s1omni
from tests.cuda_builds import build_cuda_engine, needs_cuda
from tests.test_mixer_fusions import _continue_feeds, _largest_moves, _prefill_feeds, _run

ATTENTION_LAYERS = 1  # the tiny member's full-attention layer (4 query heads over 2 key/value heads, head size 32)
# Each output of the fused engine within this much of the largest value of the plain engine's: float32 rounding
# through four layers. Measured on these feeds: 0 (prefill and both continues; the CPU kernel sums in the same order).
RELATIVE_BOUND = 1e-5
PLAIN = ("--gated-delta-kernel", "LinearAttention")  # float32, a kernel the CPU runs (tests.cuda_builds)


Run = Callable[[onnx.ModelProto | str, dict[str, np.ndarray]], dict[str, np.ndarray]]


def _answers(prefill: onnx.ModelProto | str, continued: onnx.ModelProto | str, lengths: tuple[int, int] = (37, 20), run: Run = _run) -> dict[str, np.ndarray]:
    """Every output of a prefill of two rows (one left-padded: its padding queries see no key) and of continues
    from its state, one token and six (the past keys under ``past_mask``, then the block's own causally)."""
    feeds = _prefill_feeds(list(lengths))
    state = run(prefill, feeds)
    # The padding queries' hidden states are read by nothing; their rows average over every key, so they move with
    # the key padding the op is given (``KEY_MULTIPLE``). Compared: the real positions.
    real = feeds["attention_mask"].astype(bool)[..., None]
    answers = {f"prefill {name}": np.where(real, value, 0) if name == "hidden" else value for name, value in state.items()}
    rng = np.random.default_rng(6)
    for tokens in (1, 6):
        answers.update({f"continue {tokens} {name}": value for name, value in run(continued, _continue_feeds(feeds, state, tokens, rng)).items()})
    return answers


@pytest.fixture(scope="module")
def engines(cuda_engine: Callable[..., tuple[Path, str]]) -> tuple[Path, Path]:
    """The plain CUDA build and the one with ``--fused-attention`` (as ``s1omni build`` writes them)."""
    return cuda_engine(*PLAIN)[0], cuda_engine(*PLAIN, "--fused-attention")[0]


@pytest.fixture(scope="module")
def plain_answers(engines: tuple[Path, Path]) -> dict[str, np.ndarray]:
    return _answers(*(str(engines[0] / f"{graph}.onnx") for graph in ("prefill", "continue")))


@pytest.mark.parametrize("inputs", ["fp32", "fp16"])
@pytest.mark.parametrize("graph", ["prefill", "continue"])
def test_each_attention_layer_gets_one_multi_head_attention(exported: Path, graph: str, inputs: str) -> None:
    model = onnx.load(str(exported / f"{graph}.fused.onnx"))
    before = Counter(node.op_type for node in model.graph.node)
    assert fuse_attention(model, inputs) == ATTENTION_LAYERS
    onnx.checker.check_model(model, full_check=True)
    after = Counter(node.op_type for node in model.graph.node)
    assert after["MultiHeadAttention"] == ATTENTION_LAYERS and not after["Softmax"]
    # per layer: k's Transpose, both MatMuls, the scale, the mask's Add, the Softmax and the output's Transpose and
    # Reshape, for q's Transpose and Reshape, k's and v's Pad and the op (float16: q, k, v and the output cast); once
    # for the mask every layer shares: its clamp (Max), its key count's pad (Shape, Neg, Mod, Concat), its Pad (and Cast)
    assert before - after == Counter({"MatMul": 2, "Mul": 1, "Add": 1, "Softmax": 1, "Transpose": 1})
    casts = {"Cast": 4 * ATTENTION_LAYERS + 1} if inputs == "fp16" else {}
    shared = {"Max": 1, "Shape": 1, "Neg": 1, "Mod": 1, "Concat": 1}
    assert after - before == Counter({"MultiHeadAttention": ATTENTION_LAYERS, "Pad": 2 * ATTENTION_LAYERS + 1, **shared, **casts})
    (attention,) = (node for node in model.graph.node if node.op_type == "MultiHeadAttention")
    assert {a.name: helper.get_attribute_value(a) for a in attention.attribute} == pytest.approx({"num_heads": 4, "scale": 32**-0.5})
    assert all(tensor.name in {name for node in model.graph.node for name in node.input} for tensor in model.graph.initializer)
    assert fuse_attention(model, inputs) == 0  # nothing left to match


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


def test_float16_attention_answers_as_the_exported_ops_here(engines: tuple[Path, Path], plain_answers: dict[str, np.ndarray]) -> None:
    """The float16 rewrite (what a bf16 build with ``--attention-inputs fp16`` runs) wired as the float32 one: its
    keys padded, its bias cast, its output cast back. ONNX Runtime's CPU EP has no float16 ``MultiHeadAttention``:
    at load it runs the op in float32 and drops the float16 round trips its own casts make redundant (seen in the
    optimized graph: the op reads the padded float32 keys), so here it answers as the exported ops to float32
    rounding. Its float16 rounding is the GPU's, held by the ``gpu-reduced`` gate there."""
    graphs = _fused_graphs(engines, "fp16")
    for model in graphs:
        (attention,) = (node for node in model.graph.node if node.op_type == "MultiHeadAttention")
        casts = [(node.input[0], node.output[0], helper.get_attribute_value(node.attribute[0])) for node in model.graph.node if node.op_type == "Cast"]
        assert {to for _, output, to in casts if output in (attention.input[0], attention.input[5])} == {TensorProto.FLOAT16}
        assert [to for source, _, to in casts if source == attention.output[0]] == [TensorProto.FLOAT]
    moves = _largest_moves(_answers(*graphs), plain_answers)
    assert max(moves.values()) <= RELATIVE_BOUND, moves


def _key_counts(model: onnx.ModelProto, feeds: dict[str, np.ndarray], inputs: str) -> list[int]:
    """The key count each ``MultiHeadAttention`` (its q/k/v in ``inputs``'s type) is given when ``model`` runs on ``feeds``."""
    keys = [node.input[1] for node in model.graph.node if node.op_type == "MultiHeadAttention"]
    probe = onnx.ModelProto.FromString(model.SerializeToString())
    probe.graph.output.extend(helper.make_tensor_value_info(name, INPUT_TYPES[inputs], None) for name in keys)
    session = onnxruntime.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])
    return [session.run([name], feeds)[0].shape[2] for name in keys]


@pytest.mark.parametrize("inputs", ["fp32", "fp16"])
def test_the_op_sees_a_multiple_of_eight_keys(engines: tuple[Path, Path], inputs: str) -> None:
    """The CUDA kernel's alignment (``KEY_MULTIPLE``): a prefill of 37 keys and a continue of 37 + 6 reach the op
    as 40 and 48, keys and values padded and their bias at the safe floor (the answers above hold it)."""
    prefill, continued = (onnx.load(str(engines[0] / f"{graph}.onnx")) for graph in ("prefill", "continue"))
    for model in (prefill, continued):
        fuse_attention(model, inputs)
    feeds = _prefill_feeds([37, 20])
    assert _key_counts(prefill, feeds, inputs) == [40] * ATTENTION_LAYERS
    state = _run(str(engines[0] / "prefill.onnx"), feeds)
    assert _key_counts(continued, _continue_feeds(feeds, state, 6, np.random.default_rng(6)), inputs) == [48] * ATTENTION_LAYERS
    assert KEY_MULTIPLE == 8


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


def _mask_pad(model: onnx.ModelProto) -> onnx.NodeProto:
    clamp = next(node for node in model.graph.node if node.op_type == "Max")
    return next(node for node in model.graph.node if node.op_type == "Pad" and node.input[0] == clamp.output[0])


def _padded_keys_unmasked(model: onnx.ModelProto) -> None:  # the padding keys (zero) given a bias of 0, not the floor
    _mask_pad(model).input[2] = ""


def _mask_unclamped(model: onnx.ModelProto) -> None:  # what the CPU runs either way: a control, not a break
    clamp = next(node for node in model.graph.node if node.op_type == "Max")
    _mask_pad(model).input[0] = clamp.input[0]


BROKEN: dict[str, Callable[[onnx.ModelProto], None]] = {
    "scale doubled": _scale_doubled,
    "mask dropped": _mask_dropped,
    "unidirectional instead of the mask": _own_causal_flag,
    "causal offset by one key": _causal_offset,
    "GQA heads tiled": _heads_tiled,
    "padding keys unmasked": _padded_keys_unmasked,
}


def _fused_graphs(engines: tuple[Path, Path], inputs: str) -> list[onnx.ModelProto]:
    """The prefill and continue graphs with the attention fused in ``inputs``'s type: the ``--fused-attention``
    build's (float32), or the plain build's rewritten here (float16)."""
    if inputs == "fp32":
        return [onnx.load(str(engines[1] / f"{graph}.onnx")) for graph in ("prefill", "continue")]
    graphs = [onnx.load(str(engines[0] / f"{graph}.onnx")) for graph in ("prefill", "continue")]
    assert all(fuse_attention(model, inputs) == ATTENTION_LAYERS for model in graphs)
    return graphs


@pytest.mark.parametrize("inputs", ["fp32", "fp16"])
@pytest.mark.parametrize("broken", list(BROKEN))
def test_a_broken_rewrite_misses_the_bound(engines: tuple[Path, Path], plain_answers: dict[str, np.ndarray], broken: str, inputs: str) -> None:
    """Each way the op could be wired wrong moves the answers past ``RELATIVE_BOUND``: the comparisons above can fail."""
    graphs = _fused_graphs(engines, inputs)
    for model in graphs:
        BROKEN[broken](model)
    moves = _largest_moves(_answers(*graphs), plain_answers)
    assert max(moves.values()) > 100 * RELATIVE_BOUND, moves


def test_the_clamp_keeps_the_cpu_answers(engines: tuple[Path, Path], plain_answers: dict[str, np.ndarray]) -> None:
    """The mask clamped at ``SAFE_MASK`` (for the CUDA kernel) answers as the unclamped one: a masked score's
    ``exp`` is 0 either way, and the padding queries' rows stay the uniform average (of more keys: the padding
    ones too, whose values are 0; those rows are read by nothing)."""
    graphs = [onnx.load(str(engines[1] / f"{graph}.onnx")) for graph in ("prefill", "continue")]
    for model in graphs:
        floor = next(node for node in model.graph.node if node.op_type == "Max").input[1]
        assert numpy_helper.to_array(next(t for t in model.graph.initializer if t.name == floor)) == np.float32(SAFE_MASK["fp32"])
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


@pytest.mark.parametrize(
    ("options", "message"),
    [(["--precision", "bf16", "--attention-inputs", "fp16"], "add --fused-attention"),
     (["--precision", "fp32", "--fused-attention", "--attention-inputs", "fp16"], "--attention-inputs fp16 is for --precision bf16")],
)  # fmt: skip
def test_float16_attention_is_refused_where_it_cannot_apply(exported: Path, tmp_path: Path, options: list[str], message: str) -> None:
    result = run_s1omni("build", str(exported), "--backend", "onnxruntime", "--target", "cuda", *options, "--out", str(tmp_path / "e"))
    assert result.returncode == 2 and message in result.stderr, result.stderr
    assert not (tmp_path / "e").exists()


@pytest.mark.parametrize(("options", "recorded"), [((), None), (("--fused-attention",), "fp32"), (("--fused-attention", "--attention-inputs", "fp16"), "fp16")])
def test_the_manifest_records_the_attention_inputs(exported: Path, tmp_path: Path, options: tuple[str, ...], recorded: str | None) -> None:
    result = s1omni("build", str(exported), "--backend", "onnxruntime", "--target", "cuda", "--precision", "bf16", "--no-cuda-graphs",
                    *options, "--out", str(tmp_path / "engine"), "--json", "--quiet")  # fmt: skip
    assert json.loads(result.stdout)["attention_inputs"] == json.loads((tmp_path / "engine" / "manifest.json").read_text())["attention_inputs"] == recorded
    casts = Counter(helper.get_attribute_value(node.attribute[0]) for node in onnx.load(str(tmp_path / "engine" / "continue.onnx")).graph.node
                    if node.op_type == "Cast")  # fmt: skip
    assert (TensorProto.FLOAT16 in casts) is (recorded == "fp16")


# Each output of a bf16 build with the fused attention within this much of the largest value of the same build's
# without it, on the GPU: bf16 GEMMs through four layers move the CPU emulation's answers by ~1e-2; a miswiring ~0.3.
GPU_BOUND = 5e-2
CUDA_RUN = functools.partial(_run, providers=[("CUDAExecutionProvider", {"use_tf32": 0}), "CPUExecutionProvider"])


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("inputs", ["fp32", "fp16"])
@pytest.mark.parametrize("lengths", [(37, 20), (304, 290)], ids=["unfused-kernel", "memory-efficient-kernel"])
def test_the_fused_attention_runs_on_the_cuda_ep(exported: Path, tmp_path: Path, inputs: str, lengths: tuple[int, int]) -> None:
    """The op on the GPU, where its kernels need what the CPU's do not (the safe mask floor, a key count that is a
    multiple of ``KEY_MULTIPLE``): a bf16 build with it answers as the same build without it, every value finite.
    A prefill of 304 queries (a multiple of 16, over 256 keys) takes the CUTLASS memory-efficient kernel; 37 and the
    continues' 1 and 6 queries take the unfused one."""
    build_cuda_engine(exported, tmp_path / "plain", "--precision", "bf16")
    build_cuda_engine(exported, tmp_path / "fused", "--precision", "bf16", "--fused-attention", "--attention-inputs", inputs)
    want, got = (_answers(*(str(tmp_path / name / f"{graph}.onnx") for graph in ("prefill", "continue")), lengths, CUDA_RUN) for name in ("plain", "fused"))
    assert all(np.isfinite(value).all() for value in got.values())
    moves = _largest_moves(got, want)
    assert max(moves.values()) <= GPU_BOUND, moves
