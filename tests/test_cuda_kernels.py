"""The CUDA build's ``GatedDeltaNet`` rewrite (``s1omni.export.cuda_kernels``), float16 q/k/v included.

``GatedDeltaNet`` has no CPU kernel, so here its nodes run in emulation
(``tests.cuda_builds.gated_delta_net_emulated``): each spelled back as the ``LinearAttention`` it
documents itself equal to (rank-4 activations, value-major state), its float16 q/k/v widened and its
output rounded to float16. That checks the rewrite's wiring (which input goes
where, the casts, reshapes and state transposes) against the export's own graph; the GPU tests run the
real kernel, its chunked engine included, against ``LinearAttention`` on the CUDA EP.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper

from s1omni.export.cuda_kernels import INPUT_TYPES, chunked_prefill, use_gated_delta_kernel
from s1omni.export.naming import CONTRIB_DOMAIN
from s1omni.runtime.runners.base import text_positions
from tests.cli import run_s1omni
from tests.cuda_builds import build_cuda_engine, gated_delta_net_emulated, needs_cuda

CPU, CUDA = ["CPUExecutionProvider"], [("CUDAExecutionProvider", {"use_tf32": 0})]


def _linear_attention_model(heads: int, size: int) -> onnx.ModelProto:
    """One ``LinearAttention`` node as the export writes it: q, k, v ``[B, T, heads*size]``, key-major state."""
    activations = [helper.make_tensor_value_info(name, TensorProto.FLOAT, ["batch", "sequence", heads * size]) for name in "qkv"]
    state = helper.make_tensor_value_info("state", TensorProto.FLOAT, ["batch", heads, size, size])
    gates = [helper.make_tensor_value_info(name, TensorProto.FLOAT, ["batch", "sequence", heads]) for name in ("decay", "beta")]
    node = helper.make_node(
        "LinearAttention", ["q", "k", "v", "state", "decay", "beta"], ["out", "present"], domain=CONTRIB_DOMAIN,
        q_num_heads=heads, kv_num_heads=heads, update_rule="gated_delta", name="la",
    )  # fmt: skip
    graph = helper.make_graph(
        [node], "linear_attention", [*activations, state, *gates],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["batch", "sequence", heads * size]),
         helper.make_tensor_value_info("present", TensorProto.FLOAT, ["batch", heads, size, size])],
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(CONTRIB_DOMAIN, 1)], ir_version=10)


def _feeds(heads: int, size: int, batch: int, tokens: int, seed: int) -> dict[str, np.ndarray]:
    """Inputs in the export's ranges: l2-normalised q and k, log-space decay below 0, beta in (0, 1), a state."""
    rng = np.random.default_rng(seed)
    q, k = (rng.standard_normal((batch, tokens, heads, size)) for _ in range(2))
    q, k = (x / np.linalg.norm(x, axis=-1, keepdims=True) for x in (q, k))
    feeds = {"q": q, "k": k, "v": rng.standard_normal((batch, tokens, heads, size))}
    feeds = {name: x.reshape(batch, tokens, -1).astype(np.float32) for name, x in feeds.items()}
    return {**feeds, "state": rng.standard_normal((batch, heads, size, size)).astype(np.float32) * np.float32(0.1),
            "decay": -rng.uniform(0, 1, (batch, tokens, heads)).astype(np.float32),
            "beta": rng.uniform(0, 1, (batch, tokens, heads)).astype(np.float32)}  # fmt: skip


def _run(model: onnx.ModelProto | str, feeds: dict[str, np.ndarray], providers: list) -> list[np.ndarray]:
    source = model if isinstance(model, str) else model.SerializeToString()
    return onnxruntime.InferenceSession(source, providers=providers).run(None, feeds)


def _casts(model: onnx.ModelProto) -> Counter[int]:
    return Counter(helper.get_attribute_value(node.attribute[0]) for node in model.graph.node if node.op_type == "Cast")


def test_float16_inputs_are_cast_around_each_node_and_the_rest_stays_float32(exported: Path) -> None:
    source = onnx.load(str(exported / "prefill.fused.onnx"))
    model = onnx.load(str(exported / "prefill.fused.onnx"))
    assert use_gated_delta_kernel(model, "GatedDeltaNet", "fp16") == 3
    onnx.checker.check_model(model)
    assert _casts(model) - _casts(source) == Counter({TensorProto.FLOAT16: 9, TensorProto.FLOAT: 3})
    producers = {output: node for node in model.graph.node for output in node.output}
    originals = [node for node in source.graph.node if node.op_type == "LinearAttention"]
    for node, original in zip((n for n in model.graph.node if n.op_type == "GatedDeltaNet"), originals, strict=True):
        assert node.domain == CONTRIB_DOMAIN and {a.name: helper.get_attribute_value(a) for a in node.attribute} == {"update_rule": b"gated_delta"}
        for name, was in zip(node.input[:3], original.input[:3], strict=True):  # q, k, v: cast, then reshaped to [B, T, H, D]
            cast = producers[producers[name].input[0]]
            assert cast.op_type == "Cast" and cast.input[0] == was and helper.get_attribute_value(cast.attribute[0]) == TensorProto.FLOAT16
        assert node.input[3] == "" and list(node.input[4:6]) == list(original.input[4:6])  # decay and beta as they were: float32
        assert producers[node.input[6]].op_type == "Transpose" and producers[node.input[6]].input[0] == original.input[3]
        (back,) = [n for n in model.graph.node if node.output[0] in n.input]
        assert back.op_type == "Cast" and helper.get_attribute_value(back.attribute[0]) == TensorProto.FLOAT
    assert [o.type.tensor_type.elem_type for o in model.graph.output] == [o.type.tensor_type.elem_type for o in source.graph.output]


@pytest.mark.parametrize("inputs", list(INPUT_TYPES))
def test_the_rewritten_graph_computes_the_export_s_own(exported: Path, inputs: str) -> None:
    """The tiny member's prefill, hidden states and every returned state: the same values with float32 q/k/v
    (reshapes and transposes are exact), within float16 rounding with float16 ones."""
    source = str(exported / "prefill.fused.onnx")
    model = onnx.load(source)
    use_gated_delta_kernel(model, "GatedDeltaNet", inputs)
    ids = np.random.default_rng(3).integers(1, 2048, 200)
    feeds = {"input_ids": ids[None], "position_ids": text_positions(0, len(ids))[:, None],
             "attention_mask": np.ones((1, len(ids)), np.int64), "readout_index": np.arange(len(ids))[None]}  # fmt: skip
    names = [output.name for output in model.graph.output]
    for name, got, want in zip(names, _run(gated_delta_net_emulated(model, inputs), feeds, CPU), _run(source, feeds, CPU), strict=True):
        moved = np.abs(got - want).max()
        if inputs == "fp32" or name == "conv.0":  # the first layer's conv window comes before any rule
            assert moved == 0, name
        else:  # the float16 roundings move the values, never by much (tiny member: states <= 1e-3 of their scale,
            # the hidden states 9e-3, the attention's keys after them 1.4e-2; its bf16 GEMMs move them more)
            assert 0 < moved <= 3e-2 * np.abs(want).max(), (name, moved / np.abs(want).max())


def test_a_state_transposed_the_wrong_way_is_caught() -> None:
    """The emulation is only as good as what it rejects: a rewrite that forgot the state's way back."""
    model, feeds = _linear_attention_model(2, 8), _feeds(2, 8, 2, 5, seed=0)
    want = _run(model, feeds, CPU)
    use_gated_delta_kernel(model, "GatedDeltaNet", "fp32")
    assert all(np.array_equal(g, w) for g, w in zip(_run(gated_delta_net_emulated(model, "fp32"), feeds, CPU), want, strict=True))
    (back,) = [node for node in model.graph.node if node.op_type == "Transpose" and node.output[0] == "present"]
    back.ClearField("attribute")
    back.attribute.append(helper.make_attribute("perm", [0, 1, 2, 3]))
    assert not np.allclose(_run(gated_delta_net_emulated(model, "fp32"), feeds, CPU)[1], want[1], atol=1e-3)


def test_the_build_says_whether_the_chunked_engine_can_run() -> None:
    eligible = _linear_attention_model(4, 128)
    assert chunked_prefill(eligible, "fp16") == (
        "GatedDeltaNet takes its chunked prefill engine for calls of 32 tokens a row or more on SM80 or newer"
    )
    assert chunked_prefill(eligible, "fp32").endswith("at every length: fp32 q/k/v (the chunked engine takes float16)")
    assert chunked_prefill(_linear_attention_model(4, 64), "fp16").endswith("head sizes (key, value) 64 and 64, not 128")


def test_the_options_are_recorded_and_fp32_builds_keep_their_graph(exported: Path, cuda_engine: Callable[..., tuple[Path, str]]) -> None:
    """bf16 builds feed float16 q/k/v and merge projections when asked to (opt-in until validated on an H200);
    fp32 builds do neither."""
    facts, splits = {}, Counter(node.op_type for node in onnx.load(str(exported / "prefill.fused.onnx")).graph.node)["Split"]
    variants = {
        "bf16-both": ["--precision", "bf16", "--gated-delta-inputs", "fp16", "--merged-projections"],
        "bf16-unfused": ["--precision", "bf16", "--gated-delta-inputs", "fp16", "--merged-projections", "--no-op-fusion"],
        "bf16": ["--precision", "bf16"],
        "fp32": [],
    }
    engines = {}
    for name, options in variants.items():
        engines[name], progress = cuda_engine(*options)
        manifest = json.loads((engines[name] / "manifest.json").read_text())
        ops = Counter(node.op_type for node in onnx.load(str(engines[name] / "prefill.onnx")).graph.node)
        facts[name] = (manifest["gated_delta_inputs"], manifest["merged_projections"], ops["Split"] - splits,
                       _casts(onnx.load(str(engines[name] / "prefill.onnx")))[TensorProto.FLOAT16])  # fmt: skip
        # The tiny member's head size is 16: the build says the chunked engine cannot run, whatever the inputs.
        assert "prefill.onnx: GatedDeltaNet runs its sequential engine at every length" in progress
        assert "head sizes (key, value) 16 and 16, not 128" in progress
    assert facts == {"bf16-both": ("fp16", True, 8, 9), "bf16-unfused": ("fp16", True, 8, 9), "bf16": ("fp32", False, 0, 0),
                     "fp32": ("fp32", False, 0, 0)}  # fmt: skip
    for graph in ("prefill", "continue"):  # both rewrites together (the fused norms are ONNX Runtime's, which onnx does not know)
        onnx.checker.check_model(str(engines["bf16-unfused"] / f"{graph}.onnx"))
    matmuls = [Counter(n.op_type for n in onnx.load(str(path)).graph.node)["MatMul"] for path in
                (engines["fp32"] / "prefill.onnx", engines["bf16"] / "prefill.onnx", exported / "prefill.fused.onnx")]  # fmt: skip
    assert matmuls == [34, 34, 34]  # every projection its own GEMM, as exported


@pytest.mark.parametrize(
    ("options", "message"),
    [(["--precision", "fp32", "--gated-delta-inputs", "fp16"], "--gated-delta-inputs fp16 is for --precision bf16"),
     (["--precision", "bf16", "--gated-delta-kernel", "LinearAttention", "--gated-delta-inputs", "fp16"], "with the GatedDeltaNet kernel")],
)  # fmt: skip
def test_float16_inputs_are_refused_where_they_cannot_apply(exported: Path, tmp_path: Path, options: list[str], message: str) -> None:
    result = run_s1omni("build", str(exported), "--backend", "onnxruntime", "--target", "cuda", *options, "--out", str(tmp_path / "e"))
    assert result.returncode == 2 and message in result.stderr and not (tmp_path / "e").exists()


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("tokens", [8, 64, 300], ids=["sequential", "chunked", "chunked-partial"])
def test_gated_delta_net_with_float16_inputs_computes_linear_attention_on_the_gpu(tokens: int) -> None:
    """The real kernel at the synthetic members' head size (128): below 32 tokens its sequential engine,
    from 32 its chunked one (by the plan's rules), continuing from a state, against ``LinearAttention``
    in float32; both layouts (rank-4 activations, value-major state) are what the rewrite assumes."""
    model, feeds = _linear_attention_model(4, 128), _feeds(4, 128, 2, tokens, seed=tokens)
    want = _run(model, feeds, CUDA)
    use_gated_delta_kernel(model, "GatedDeltaNet", "fp16")
    got = _run(model, feeds, CUDA)
    for name, g, w in zip(("output", "state"), got, want, strict=True):
        assert g.dtype == np.float32 and g.shape == w.shape
        # float16 q/k/v/output: ~1e-3 relative (the doc measures 8.7e-4 against float64)
        assert np.abs(g - w).max() <= 1e-2 * np.abs(w).max(), (name, np.abs(g - w).max(), np.abs(w).max())


@pytest.mark.gpu
@needs_cuda
def test_the_float16_bf16_engine_runs_as_the_linear_attention_engine_on_the_gpu(exported: Path, tmp_path: Path) -> None:
    """The tiny member built with both options (bf16 GEMMs, merged projections, GatedDeltaNet with float16
    q/k/v) against the same build with ``LinearAttention``, prefill graphs on the CUDA EP."""
    build_cuda_engine(exported, tmp_path / "new", "--precision", "bf16", "--gated-delta-inputs", "fp16", "--merged-projections")
    build_cuda_engine(exported, tmp_path / "linear", "--precision", "bf16", "--gated-delta-kernel", "LinearAttention")
    ids = np.random.default_rng(5).integers(1, 2048, 300)
    feeds = {"input_ids": ids[None], "position_ids": text_positions(0, len(ids))[:, None],
             "attention_mask": np.ones((1, len(ids)), np.int64), "readout_index": np.arange(len(ids))[None]}  # fmt: skip
    got, want = (_run(str(tmp_path / name / "prefill.onnx"), feeds, CUDA) for name in ("new", "linear"))
    for g, w in zip(got, want, strict=True):  # float16 q/k/v moved the CPU emulation's by up to 1.4e-2; a miswiring by ~0.3
        assert np.abs(g - w).max() <= 5e-2 * np.abs(w).max()
