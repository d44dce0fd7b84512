"""Short convolutions in bfloat16 (``s1omni build --bf16-convolutions``, ``s1omni.export.bf16_convolutions``) on
the tiny member: the graphs it writes, and what they compute, emulated on the CPU EP (its
``CausalConvWithState`` runs either layout in float32; ``tests.cuda_builds.bfloat16_emulated`` rounds each
bfloat16 value where it is made)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper
from onnx.external_data_helper import load_external_data_for_tensor

from s1omni.export.bf16_convolutions import short_convolutions_in_bf16
from s1omni.export.bf16_gemms import BF16_FILE, Bf16Weights, float32_array, use_bf16_gemms
from s1omni.export.merged_projections import merge_projections
from s1omni.export.mixer_fusions import fuse_short_convolutions
from s1omni.runtime.runners.base import text_positions
from s1omni.runtime.engine import read_manifest
from s1omni.runtime.runners.onnxruntime_runner import session_options
from tests.cli import run_s1omni
from tests.cuda_builds import bfloat16_emulated, needs_cuda, op_library_built, op_library_on_the_cpu

LAYERS = 3  # the tiny member's Gated DeltaNet layers


def bf16_convolutions_built(export: Path, graph: str, weights: Bf16Weights, merged: bool, bf16_convolutions: bool) -> onnx.ModelProto:
    """``graph``'s fused export as a bf16 build with fused convolutions writes it, with or without the rewrite."""
    model = onnx.load(str(export / f"{graph}.fused.onnx"), load_external_data=False)
    assert fuse_short_convolutions(model) == LAYERS
    if merged:
        merge_projections(model, weights.concatenated)
    use_bf16_gemms(model, weights)
    if bf16_convolutions:
        assert short_convolutions_in_bf16(model, weights) == LAYERS
    return model


def _rounded_convolutions(model: onnx.ModelProto, export: Path) -> onnx.ModelProto:
    """``model`` (the float32 ``[B, C, T]`` convolutions) with each convolution's weight and output rounded to
    bfloat16: what the rewrite is to compute, spelled without it."""
    graph = model.graph
    weights = {node.input[1] for node in graph.node if node.op_type == "CausalConvWithState"}
    initializers = []
    for tensor in graph.initializer:
        if tensor.name in weights:
            values = torch.from_numpy(float32_array(tensor, export).copy()).bfloat16().float().numpy()
            tensor = numpy_helper.from_array(values, tensor.name)
        initializers.append(tensor)
    nodes = []
    for node in graph.node:
        nodes.append(node)
        if node.op_type == "CausalConvWithState":
            output = node.output[0]
            node.output[0] = f"{output}/exact"
            nodes += [helper.make_node("Cast", [f"{output}/exact"], [f"{output}/rounded"], to=TensorProto.BFLOAT16),
                      helper.make_node("Cast", [f"{output}/rounded"], [output], to=TensorProto.FLOAT)]  # fmt: skip
    del graph.initializer[:], graph.node[:]
    graph.initializer.extend(initializers)
    graph.node.extend(nodes)
    return model


def _session(model: onnx.ModelProto, directory: Path, export: Path) -> onnxruntime.InferenceSession:
    emulated = bfloat16_emulated(model, directory)
    onnx.load_external_data_for_model(emulated, str(export))
    onnx.checker.check_model(emulated)
    return onnxruntime.InferenceSession(emulated.SerializeToString(), providers=["CPUExecutionProvider"])


def _prefill_feeds(rows: int, width: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(width)
    mask = np.ones((rows, width), np.int64)
    mask[1:, : width // 3] = 0  # left padding: the prefill graph's masked rows
    positions = np.stack([np.maximum(np.cumsum(row) - 1, 0) for row in mask])
    return {"input_ids": rng.integers(1, 2048, (rows, width)), "position_ids": np.repeat(positions[None], 3, axis=0),
            "attention_mask": mask, "readout_index": np.tile(np.arange(width), (rows, 1))}  # fmt: skip


def prefill_then_continue(prefill: onnxruntime.InferenceSession, continued: onnxruntime.InferenceSession) -> dict[str, list[np.ndarray]]:
    """The prefill graph's outputs on two left-padded rows of 70 tokens, and the continue graph's on a block of 9 from its state."""
    feeds = _prefill_feeds(2, 70)
    states = prefill.run(None, feeds)
    names = [value.name for value in prefill.get_outputs()]
    past = {f"past_{name}": value for name, value in zip(names[1:], states[1:], strict=True)}
    block = {"input_ids": np.random.default_rng(9).integers(1, 2048, (2, 9)), "position_ids": text_positions(70, 9)[:, None].repeat(2, axis=1),
             "past_mask": feeds["attention_mask"], "readout_index": np.tile(np.arange(9), (2, 1))}  # fmt: skip
    return {"prefill": states, "continue": continued.run(None, block | past)}


def inlined(model: onnx.ModelProto, export: Path, directory: Path) -> bytes:
    """A copy of a rewritten ``model`` serialized with its weights in it: the float32 ones read from the export, the
    bfloat16 ones from ``directory`` (where ``Bf16Weights`` wrote them), for a GPU session."""
    device = onnx.ModelProto()
    device.CopyFrom(model)
    for tensor in device.graph.initializer:
        if tensor.data_location == TensorProto.EXTERNAL:
            location = next(entry.value for entry in tensor.external_data if entry.key == "location")
            load_external_data_for_tensor(tensor, str(directory if location == BF16_FILE else export))
            tensor.data_location = TensorProto.DEFAULT
            del tensor.external_data[:]
    return device.SerializeToString()


def emulated_outputs(export: Path, directory: Path, build: Callable[[str, Bf16Weights], onnx.ModelProto]) -> list[np.ndarray]:
    """Every output of ``prefill_then_continue`` through the prefill and continue graphs ``build`` makes (given the
    graph's name and the bf16 weights it writes to the new ``directory``), bfloat16 emulated on the CPU EP."""
    directory.mkdir()
    weights = Bf16Weights(export, directory)
    sessions = []
    for graph in ("prefill", "continue"):
        emulated = bfloat16_emulated(build(graph, weights), directory)
        onnx.load_external_data_for_model(emulated, str(export))
        sessions.append(onnxruntime.InferenceSession(emulated.SerializeToString(), providers=["CPUExecutionProvider"]))
    ran = prefill_then_continue(*sessions)
    return [*ran["prefill"], *ran["continue"]]


def emulated_variants(export: Path, directory: Path, built: Callable[[str, Bf16Weights, bool], onnx.ModelProto],
                      spellings: dict[str, Callable[[onnx.ModelProto], onnx.ModelProto]]) -> dict[str, list[np.ndarray]]:
    """``emulated_outputs`` of the graphs ``built`` makes (given the graph's name, its bf16 weights and whether to
    rewrite) without the rewrite, as ``graph``, and with it, its op spelled back each of the ways ``spellings`` names,
    each in a folder of ``directory`` named after it."""
    def spelled(spelling: Callable[[onnx.ModelProto], onnx.ModelProto]) -> Callable[[str, Bf16Weights], onnx.ModelProto]:
        return lambda graph, weights: spelling(built(graph, weights, True))

    outputs = {name: emulated_outputs(export, directory / name, spelled(spelling)) for name, spelling in spellings.items()}
    return {**outputs, "graph": emulated_outputs(export, directory / "graph", lambda graph, weights: built(graph, weights, False))}


def assert_the_op_spelled_back_is_the_graph(export: Path, directory: Path, merged: bool, option: str,
                                            spell: Callable[[onnx.ModelProto], onnx.ModelProto],
                                            wrong: Callable[[onnx.ModelProto], onnx.ModelProto]) -> None:  # fmt: skip
    """Prefill, then continue from its state, through ``op_library_built``'s graphs with the rewrite ``option`` (a
    ``_graph_rewrites`` flag) and its op spelled back for the CPU EP by ``spell``: every output the same bit for bit as
    the graphs without the rewrite; spelled ``wrong`` (a mistake the test must catch), not."""
    def built(graph: str, weights: Bf16Weights, rewrite: bool) -> onnx.ModelProto:
        model = op_library_built(export, graph, weights, merged, **{option: rewrite})
        return model if rewrite else op_library_on_the_cpu(model)

    spellings = {"op": lambda model: op_library_on_the_cpu(spell(model)), "wrong": lambda model: op_library_on_the_cpu(wrong(model))}
    outputs = emulated_variants(export, directory, built, spellings)
    assert all(np.array_equal(a, b) for a, b in zip(outputs["op"], outputs["graph"], strict=True))
    assert not all(np.array_equal(a, b) for a, b in zip(outputs["wrong"], outputs["graph"], strict=True))


@pytest.mark.parametrize("merged", [True, False], ids=["merged", "unmerged"])
def test_the_rewrite_computes_the_convolutions_rounded_to_bfloat16(external_export: Path, tmp_path: Path, merged: bool) -> None:
    """Prefill, then continue from its state: every output the same bit for bit as the float32 ``[B, C, T]``
    convolutions with their weights and outputs rounded, and different from the unrounded ones."""
    outputs: dict[str, dict[str, list[np.ndarray]]] = {}
    for variant in ("rewritten", "rounded", "float32"):
        directory = tmp_path / variant
        directory.mkdir()
        weights = Bf16Weights(external_export, directory)
        models = {graph: bf16_convolutions_built(external_export, graph, weights, merged, variant == "rewritten") for graph in ("prefill", "continue")}
        if variant == "rounded":
            models = {graph: _rounded_convolutions(model, external_export) for graph, model in models.items()}
        outputs[variant] = prefill_then_continue(*(_session(models[graph], directory, external_export) for graph in ("prefill", "continue")))
    for graph in ("prefill", "continue"):
        rewritten, rounded, float32 = (outputs[variant][graph] for variant in ("rewritten", "rounded", "float32"))
        assert all(np.array_equal(a, b) for a, b in zip(rewritten, rounded, strict=True)), graph
        assert not np.array_equal(rewritten[0], float32[0])  # the rounding is there: the test can tell


@pytest.mark.parametrize("merged", [True, False], ids=["merged", "unmerged"])
def test_convolutions_read_the_bfloat16_product_sequence_major(external_export: Path, tmp_path: Path, merged: bool) -> None:
    weights = Bf16Weights(external_export, tmp_path)
    for graph in ("prefill", "continue", "packed"):
        model = bf16_convolutions_built(external_export, graph, weights, merged, True)
        nodes = list(model.graph.node)
        producers = {output: node for node in nodes for output in node.output}
        convolutions = [node for node in nodes if node.op_type == "CausalConvWithState"]
        assert len(convolutions) == LAYERS
        rounded = {tensor.name: tensor for tensor in model.graph.initializer}
        for conv in convolutions:
            assert helper.get_attribute_value(next(a for a in conv.attribute if a.name == "channels_last")) == 1
            source = producers[conv.input[0]]
            assert source.op_type == ("Split" if merged else "MatMul") and conv.input[0].endswith("/bf16")
            assert rounded[conv.input[1]].data_type == TensorProto.BFLOAT16
            assert conv.output[0].endswith("/bf16") and not [node for node in nodes if conv.output[1] in node.input]
            readers = [node for node in nodes if conv.output[0] in node.input]
            assert [node.op_type for node in readers] == ["Cast"]  # no transpose back
            # The float32 [B, C, T] copy is made only where the prefill's state window reads it.
            copies = [node for node in nodes if node.op_type == "Transpose" and node.input[0] == conv.input[0].removesuffix("/bf16")]
            assert len(copies) == (graph == "prefill"), graph
            assert all(reader.op_type == "Concat" for copy in copies for reader in nodes if copy.output[0] in reader.input)
        assert not any(t.name.endswith("conv1d.weight") for t in model.graph.initializer)  # the float32 weights went


def test_convolutions_elsewhere_are_left_alone(external_export: Path, tmp_path: Path) -> None:
    """Without bf16 GEMMs there is no bfloat16 product to read: nothing to rewrite, nothing changed."""
    model = onnx.load(str(external_export / "prefill.fused.onnx"), load_external_data=False)
    fuse_short_convolutions(model)
    before = model.SerializeToString()
    assert short_convolutions_in_bf16(model, Bf16Weights(external_export, tmp_path)) == 0
    assert model.SerializeToString() == before


def test_build_option_needs_fused_mixers_of_a_bf16_build(exported: Path, tmp_path: Path, cuda_engine: Callable[..., tuple[Path, str]]) -> None:
    for options in (("--precision", "bf16"), ("--precision", "fp32", "--fused-mixers")):
        done = run_s1omni("build", str(exported), "--backend", "onnxruntime", "--target", "cuda", *options, "--bf16-convolutions",
                          "--out", str(tmp_path / "refused"))  # fmt: skip
        assert done.returncode == 2 and "--bf16-convolutions" in done.stderr
        assert not (tmp_path / "refused").exists()
    engine, progress = cuda_engine("--precision", "bf16", "--fused-mixers", "--bf16-convolutions", "--merged-projections")
    assert f"{LAYERS} bfloat16 short convolutions" in progress
    assert read_manifest(engine)["bf16_convolutions"] is True


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("merged", [True, False], ids=["merged", "unmerged"])
def test_the_cuda_ep_runs_the_rewrite_as_emulated(external_export: Path, tmp_path: Path, merged: bool) -> None:
    """The rewritten prefill on the CUDA EP (bfloat16 GEMMs, channels-last bfloat16 convolutions) against its
    emulation here: the hidden states and the state within a few bfloat16 steps (cuBLAS and
    the CPU sum in other orders, and a product that lands near a rounding boundary rounds the other way)."""
    weights = Bf16Weights(external_export, tmp_path)
    model = bf16_convolutions_built(external_export, "prefill", weights, merged, True)
    # The CPU EP has no bfloat16 MatMul or CausalConvWithState: a session exists only with them on the GPU (ONNX
    # Runtime puts the small shape computations on the CPU whatever the providers, so those may not be refused).
    cuda = onnxruntime.InferenceSession(inlined(model, external_export, tmp_path), providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
    emulated = _session(model, tmp_path, external_export)
    feeds = _prefill_feeds(2, 70)
    for found, expected in zip(cuda.run(None, feeds), emulated.run(None, feeds), strict=True):
        scale = float(np.abs(expected).max())
        assert float(np.abs(found - expected).max()) <= 0.05 * scale and float(np.abs(found - expected).mean()) <= 2e-3 * scale


def assert_cuda_ep_runs_the_rewrite_as_without(library: Path, export: Path, directory: Path, built: Callable[[str, Bf16Weights, bool], onnx.ModelProto],
                                               mean: float = 2e-3) -> None:
    """Prefill, then continue from its state, through the graphs ``built`` makes (given the graph's name, its bf16
    weights and whether to rewrite) on the CUDA EP with the op ``library``, with the rewrite and without: every output
    within a few bfloat16 steps (the largest difference 5% of the output's largest value, the mean ``mean`` of it)."""
    weights = Bf16Weights(export, directory)
    providers = [("CUDAExecutionProvider", {"use_tf32": 0}), "CPUExecutionProvider"]
    ran = {}
    for rewrite in (True, False):
        sessions = [onnxruntime.InferenceSession(inlined(built(graph, weights, rewrite), export, directory), session_options("cuda", library),
                                                 providers=providers)
                    for graph in ("prefill", "continue")]  # fmt: skip
        outputs = prefill_then_continue(*sessions)
        ran[rewrite] = [*outputs["prefill"], *outputs["continue"]]
    for output, (got, want) in enumerate(zip(ran[True], ran[False], strict=True)):
        scale, difference = float(np.abs(want).max()), np.abs(got - want)
        assert float(difference.max()) <= 0.05 * scale and float(difference.mean()) <= mean * scale, (output, float(difference.max()), float(difference.mean()), scale)
