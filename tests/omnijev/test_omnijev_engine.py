"""The OmniJev engine pipeline on the tiny member, through the CLI a user runs.

export (language graphs with an ``inputs_embeds`` prefill, the vision tower, the tied embedding)
-> build (ONNX Runtime CPU) -> validate (Polygraphy from pixels, the cpu-fp32 gate over the
calibration cases) -> load and serve: the engine's answers equal the torch reference runner's,
in process and over HTTP from ``s1omni serve --engine``.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import onnx
import pytest

from s1omni.export.cpu_exp import exp_in_float64
from s1omni.runtime.errors import PackageError
from s1omni.runtime.omnijev.model import OmniJevModel
from s1omni.runtime.registry import user_registry
from tests.cli import s1omni
from tests.cuda_builds import needs_cuda
from tests.server.serving import Server

CALIB = Path(__file__).resolve().parents[2] / "calib" / "omnijev"
CASES = {case["name"]: case["request"] for case in json.loads((CALIB / "cases.json").read_text(encoding="utf-8"))["cases"]}
ANSWERED = ("golden", "choice-options-jpeg", "mixed-twelve-wide", "cjk-emoji")
# Rounded answers: one unit of the 4th decimal where the float32 values straddle a rounding boundary.
ROUNDED = 1e-4 + 1e-12
GATE = 1e-5  # the cpu-fp32 gate, on unrounded values


def assert_same_answers(expected: dict[str, Any], got: dict[str, Any], tolerance: float) -> None:
    """Same model, usage, questions in order, fields, decisions and flags; probabilities within ``tolerance``."""
    assert (got["model"], got["usage"], list(got["answers"])) == (expected["model"], expected["usage"], list(expected["answers"]))
    for key, answer in expected["answers"].items():
        other = got["answers"][key]
        assert list(other) == list(answer), key
        for field, value in answer.items():
            if field.startswith("latency"):
                continue
            if field == "probabilities":
                assert list(other[field]) == list(value), key
                assert all(abs(other[field][k] - p) <= tolerance for k, p in value.items()), (key, other[field], value)
            elif isinstance(value, float):
                assert abs(other[field] - value) <= tolerance, (key, field, other[field], value)
            else:
                assert other[field] == value, (key, field)


def patch_width(config: dict[str, Any]) -> int:
    """The values of one patch in ``pixel_values``: channels x temporal x patch²."""
    return int(config["in_channels"]) * int(config["temporal_patch_size"]) * int(config["patch_size"]) ** 2


@pytest.fixture(scope="session")
def exported(omnijev_package: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("omnijev-export") / "tiny"
    s1omni("export", str(omnijev_package), "--out", str(out))
    return out


@pytest.fixture(scope="session")
def engine(exported: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("omnijev-engine") / "ort-cpu"
    s1omni("build", str(exported), "--backend", "onnxruntime", "--target", "cpu", "--out", str(out))
    return out


@pytest.fixture(scope="session")
def report(engine: Path, omnijev_package: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """``s1omni validate`` over calib/omnijev (exit 0 asserted), its reference record kept out of the repository."""
    where = tmp_path_factory.mktemp("omnijev-validate")
    result = s1omni("validate", str(engine), "--package", str(omnijev_package), "--reference", str(where / "reference"),
                    "--report", str(where / "report.json"))  # fmt: skip
    assert "golden" in result.stdout and "MISS" not in result.stdout
    return json.loads((where / "report.json").read_text())


@pytest.fixture(scope="session")
def engine_model(engine: Path, report: dict[str, Any]) -> OmniJevModel:
    from s1omni.runtime.api import load_model

    return load_model(engine)


def test_export_holds_both_graphs_vision_and_embedding(exported: Path) -> None:
    manifest = json.loads((exported / "manifest.json").read_text())
    assert (manifest["stage"], manifest["family"], manifest["member"]["name"]) == ("export", "omnijev", "omnijev-synth-tiny-s0")
    assert {"prefill.onnx", "continue.onnx", "vision.onnx", "embedding.safetensors", "heads.safetensors", "tokenizer.json",
            "config.json", "preprocessor_config.json", "calibration.json", "release.json"} <= set(manifest["files"])  # fmt: skip
    assert max(manifest["vision_check"]["max_relative"].values()) <= 1e-4
    inputs = {name: [i.name for i in onnx.load(str(exported / f"{name}.onnx"), load_external_data=False).graph.input]
              for name in ("prefill", "continue", "vision")}  # fmt: skip
    assert inputs["prefill"] == ["inputs_embeds", "position_ids", "attention_mask", "readout_index"]
    assert inputs["continue"][:4] == ["input_ids", "position_ids", "past_mask", "readout_index"]
    assert inputs["vision"] == ["pixel_values", "position_ids", "interp_indices", "interp_weights", "cu_seqlens"]
    assert json.loads((exported / "release.json").read_text())["max_pixels"] == 602112


def test_build_carries_every_export_file(exported: Path, engine: Path) -> None:
    built = json.loads((engine / "manifest.json").read_text())
    source = json.loads((exported / "manifest.json").read_text())
    assert (built["stage"], built["family"], built["backend"], built["target"]) == ("engine", "omnijev", "onnxruntime", "cpu")
    assert built["source"]["export_files"] == source["files"] and built["recurrence"] == "scan"
    # Every export file but the fused graphs (a CPU engine runs the portable ones), the backbone graphs with
    # their exponentials in float64 (s1omni.export.cpu_exp) and otherwise the export's.
    rewritten = ("prefill.onnx", "continue.onnx")
    kept = {name: digest for name, digest in source["files"].items() if ".fused." not in name and name not in rewritten}
    assert {name: built["files"][name] for name in kept} == kept and set(built["files"]) == {*kept, *rewritten}
    for name in rewritten:
        expected = onnx.load(str(exported / name), load_external_data=False)
        assert exp_in_float64(expected) > 0
        assert onnx.load(str(engine / name), load_external_data=False) == expected


def test_an_unvalidated_engine_is_refused(exported: Path, tmp_path: Path) -> None:
    from s1omni.export.build import build
    from s1omni.runtime.api import load_model

    with pytest.raises(PackageError, match="has not passed validation"):
        load_model(build(exported, "onnxruntime", "cpu", tmp_path / "unvalidated"))


def test_validation_meets_the_cpu_gate(report: dict[str, Any], engine: Path) -> None:
    summary = report["summary"]
    assert report["passed"] and report["gate"]["name"] == "cpu-fp32" and report["cases"] == len(CASES) >= 12
    assert summary["layouts_identical"] and summary["usage_identical"]
    assert summary["max_probability"] <= GATE and summary["decisions"] == summary["margin_decisions"]
    decided, total = summary["decisions"].split("/")
    assert decided == total and int(total) >= len(CASES)
    assert summary["image_max_abs"] <= 1e-4 and summary["hidden_max_abs"] <= 1e-4
    assert json.loads((engine / "manifest.json").read_text())["validation"]["passed"]


@pytest.mark.parametrize("name", ANSWERED)
def test_engine_answers_equal_the_reference(name: str, engine_model: OmniJevModel, omnijev_model: OmniJevModel) -> None:
    assert (engine_model.engine, engine_model.card()["engine"]) == ("onnxruntime", "onnxruntime")
    results = {}
    for model in (omnijev_model, engine_model):
        plan = model.plan(copy.deepcopy(CASES[name]))
        result = model.execute([plan])[0]
        results[model.engine] = (model.finish(plan, result), model.finish(plan, result, digits=None))
    (expected, exact), (got, unrounded) = results["torch"], results["onnxruntime"]
    assert_same_answers(expected, got, ROUNDED)
    assert_same_answers(exact, unrounded, GATE)


def test_served_engine_answers_as_the_reference(engine: Path, report: dict[str, Any], omnijev_model: OmniJevModel,
                                                s1omni_home: Path) -> None:  # fmt: skip
    server = Server(s1omni_home, "--engine", str(engine), "--registry", str(user_registry()))
    try:
        server.wait_status("ready")
        card = server.client.get("/v1/models").json()["data"][0]
        assert (card["family"], card["engine"], card["id"]) == ("omnijev", "onnxruntime", omnijev_model.id)
        response = server.post(CASES["golden"])
        assert response.status_code == 200, response.text
        assert_same_answers(omnijev_model.answer(copy.deepcopy(CASES["golden"])), response.json(), ROUNDED)
    finally:
        server.stop()


def test_a_bf16_build_runs_the_vision_tower_s_linears_in_bfloat16(exported: Path, omnijev_package: Path, tmp_path: Path) -> None:
    """``s1omni build --target cuda --precision bf16``: the tower's ``Gemm``s (its linears: two per attention and
    two per MLP, per block, and the merger's two) run in bfloat16, as the backbone's GEMMs do. Run here in
    emulation (``tests.cuda_builds.bfloat16_emulated``): it follows the tower with bfloat16 linears up to what the two
    runtimes' float32 kernels make of the roundings, and a build with one bias dropped does not."""
    import numpy as np
    import onnxruntime
    from onnx import TensorProto

    from s1omni.export.vision_export import example
    from s1omni.runtime.omnijev.image import Pixels
    from s1omni.runtime.omnijev.vision import VisionTower
    from tests.cuda_builds import bfloat16_emulated, bfloat16_linears, build_cuda_engine

    engine = tmp_path / "engine"
    config = json.loads((exported / "config.json").read_text(encoding="utf-8"))["vision_config"]
    blocks = int(config["depth"])
    assert f"vision.onnx -> vision.onnx: {4 * blocks + 2} bfloat16 GEMMs" in build_cuda_engine(exported, engine, "--precision", "bf16")
    model = onnx.load(str(engine / "vision.onnx"))
    onnx.checker.check_model(model, full_check=True)
    bfloat16 = {tensor.name for tensor in model.graph.initializer if tensor.data_type == TensorProto.BFLOAT16}
    gemms = [node for node in model.graph.node if node.op_type == "Gemm"]
    assert len(gemms) == 4 * blocks + 2 and all(node.input[1] in bfloat16 and node.input[2] in bfloat16 for node in gemms)
    tower = VisionTower.load(config, omnijev_package / "vision.safetensors")
    grid = (1, 14, 20)
    feeds = example(tower, config, grid)
    run = lambda graph: onnxruntime.InferenceSession(graph, providers=["CPUExecutionProvider"]).run(None, feeds)[0]  # noqa: E731
    float32 = run(str(exported / "vision.onnx"))
    emulated = run(bfloat16_emulated(model, engine).SerializeToString())
    expected = VisionTower(bfloat16_linears(tower.model))(Pixels(feeds["pixel_values"], grid, int(config["spatial_merge_size"])))
    relative = lambda found, wanted: float(np.linalg.norm(found - wanted) / np.linalg.norm(wanted))  # noqa: E731
    rounding, wiring = relative(emulated, float32), relative(emulated, np.asarray(expected))
    # The rounding is there, and the wiring is torch's bfloat16 linears'. Not far inside the rounding: where torch's and
    # ONNX Runtime's float32 kernels round differently, a few bfloat16 roundings flip and the flips compound through the
    # blocks (on the 2-core AVX2 host of 2026-12-05: 0.0039 against a rounding of 0.0046; on earlier hosts far less).
    # A miswired GEMM is far past it: one bias dropped gives 0.18.
    assert rounding > 1e-3 and wiring < 2 * rounding, (rounding, wiring)
    miswired = onnx.ModelProto.FromString(model.SerializeToString())
    next(node for node in miswired.graph.node if node.op_type == "Gemm").input[2] = ""
    assert relative(run(bfloat16_emulated(miswired, engine).SerializeToString()), np.asarray(expected)) > 2 * rounding


def test_fused_attention_takes_the_vision_tower_s_attention_too(exported: Path, omnijev_package: Path, tmp_path: Path) -> None:
    """``--fused-attention``: each vision block's attention (one image a call: its output ``[S, N·D]``) becomes one
    ``MultiHeadAttention`` too, and the tower's features move by float32 rounding only on the CPU EP, in float32
    and in float16 (which the CPU EP runs in float32); a doubled scale misses by far more."""
    import numpy as np
    import onnxruntime

    from s1omni.export.attention_fusions import fuse_attention
    from s1omni.export.vision_export import example
    from s1omni.runtime.omnijev.vision import VisionTower
    from tests.cuda_builds import build_cuda_engine

    config = json.loads((exported / "config.json").read_text(encoding="utf-8"))["vision_config"]
    blocks = int(config["depth"])
    engine = tmp_path / "engine"
    assert f"vision.onnx -> vision.onnx: {blocks} MultiHeadAttention nodes" in build_cuda_engine(exported, engine, "--fused-attention")
    feeds = example(VisionTower.load(config, omnijev_package / "vision.safetensors"), config, (1, 14, 20))
    run = lambda graph: onnxruntime.InferenceSession(graph, providers=["CPUExecutionProvider"]).run(None, feeds)[0]  # noqa: E731
    plain = run(str(exported / "vision.onnx"))
    fused = onnx.load(str(engine / "vision.onnx"))
    ops = [node.op_type for node in fused.graph.node]
    assert ops.count("MultiHeadAttention") == blocks and "Softmax" not in ops
    half = onnx.load(str(exported / "vision.onnx"))
    assert fuse_attention(half, "fp16") == blocks
    broken = onnx.ModelProto.FromString(fused.SerializeToString())
    next(node for node in broken.graph.node if node.op_type == "MultiHeadAttention").attribute[-1].f *= 2  # the scale
    moves = {name: np.abs(run(graph.SerializeToString()) - plain).max() / np.abs(plain).max() for name, graph in
             (("fp32", fused), ("fp16", half), ("broken", broken))}  # fmt: skip
    assert moves["fp32"] <= 1e-5 and moves["fp16"] <= 1e-5 and moves["broken"] > 1e-3, moves


def test_the_vision_session_keeps_each_grid_s_inputs(engine_model: OmniJevModel, monkeypatch: pytest.MonkeyPatch) -> None:
    """The grid-derived inputs are computed once a grid and shared read-only: the features equal a run with
    freshly computed inputs, and two grids of as many patches (4x8, 8x4) each get their own."""
    import numpy as np

    from s1omni.runtime.omnijev import engine as omnijev_engine
    from s1omni.runtime.omnijev.image import Pixels

    vision = engine_model.vision
    config = vision.config
    width = patch_width(config)
    calls: list[tuple[int, int, int]] = []
    computed = omnijev_engine.grid_inputs
    monkeypatch.setattr(omnijev_engine, "grid_inputs", lambda grid, cfg: calls.append(grid) or computed(grid, cfg))
    vision.grid_feeds.cache_clear()
    values = np.random.default_rng(7).standard_normal((32, width)).astype(np.float32)
    features = {}
    for grid in ((1, 4, 8), (1, 8, 4), (1, 4, 8)):
        got = vision(Pixels(values, grid, engine_model.processor.merge_size))
        fresh = vision.session.run(None, {"pixel_values": values, **computed(grid, config)})[0]
        assert np.array_equal(got, fresh), grid
        features.setdefault(grid, got)
    assert calls == [(1, 4, 8), (1, 8, 4)]
    assert not np.array_equal(features[(1, 4, 8)], features[(1, 8, 4)])
    assert not any(value.flags.writeable for value in vision.grid_feeds((1, 4, 8)).values())


def test_vision_cuda_graphs_replay_the_tower_per_patch_count(engine: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--vision-cuda-graphs``' fixed-buffer runs, on the CPU where nothing is captured: one graph per patch count
    (4x8 and 8x4 share one, their grid inputs copied in each run), features equal to the plain session's, a
    returned array not overwritten by the next replay, and past the limits an eager run."""
    import numpy as np

    from s1omni.runtime.omnijev.engine import VISION_GRAPH, VisionSession
    from s1omni.runtime.omnijev.image import Pixels
    from s1omni.runtime.runners import cuda_graphs

    config = json.loads((engine / "config.json").read_text(encoding="utf-8"))["vision_config"]
    width = patch_width(config)
    merge = int(config["spatial_merge_size"])
    plain = VisionSession(engine / VISION_GRAPH, config)
    graphed = VisionSession(engine / VISION_GRAPH, config, cuda_graphs=True)
    rng = np.random.default_rng(11)
    grids = [(1, 4, 8), (1, 8, 4), (1, 6, 6), (1, 4, 8)]
    pixels = [Pixels(rng.standard_normal((t * h * w, width)).astype(np.float32), (t, h, w), merge) for t, h, w in grids]
    got = [graphed(image) for image in pixels]
    for image, features in zip(pixels, got, strict=True):
        assert np.array_equal(features, plain(image)), image.grid
    assert sorted(graph.runs for graph in graphed.graphs.graphs.values()) == [1, 3]
    monkeypatch.setattr(cuda_graphs, "MAX_GRAPH_TOKENS", 16)
    eager = VisionSession(engine / VISION_GRAPH, config, cuda_graphs=True)
    assert np.array_equal(eager(pixels[0]), got[0]) and not eager.graphs.graphs


def test_vision_cuda_graphs_build_and_validate(exported: Path, omnijev_package: Path, tmp_path: Path) -> None:
    """``s1omni build --target cuda --vision-cuda-graphs`` records it, and the engine (its manifest pointed at the
    CPU, its Gated DeltaNet the CPU's ``LinearAttention``) passes its gate through the graphed tower; a CPU build
    refuses the option (exit 2, nothing left)."""
    from tests.cli import run_s1omni
    from tests.cuda_builds import build_cuda_engine, validate_on_the_cpu

    engine = tmp_path / "engine"
    build_cuda_engine(exported, engine, "--vision-cuda-graphs", "--gated-delta-kernel", "LinearAttention")  # a CPU kernel
    assert json.loads((engine / "manifest.json").read_text())["vision_cuda_graphs"] is True
    assert validate_on_the_cpu(engine, omnijev_package, tmp_path / "report.json")["passed"]
    refused = run_s1omni("build", str(exported), "--backend", "onnxruntime", "--target", "cpu", "--vision-cuda-graphs",
                         "--out", str(tmp_path / "cpu"))  # fmt: skip
    assert refused.returncode == 2 and "--vision-cuda-graphs is for onnxruntime/cuda" in refused.stderr
    assert not (tmp_path / "cpu").exists()


@pytest.mark.gpu
@needs_cuda
def test_vision_cuda_graphs_capture_and_replay_on_the_gpu(exported: Path, tmp_path: Path) -> None:
    """On the CUDA EP: the tower captured once a patch count and replayed, its features those of the eager
    session (the same kernels; 1e-6 of the largest value allows a reduction order), a returned array kept."""
    import numpy as np

    from s1omni.runtime.omnijev.engine import VISION_GRAPH, VisionSession
    from s1omni.runtime.omnijev.image import Pixels
    from tests.cuda_builds import build_cuda_engine

    engine = tmp_path / "engine"
    build_cuda_engine(exported, engine, "--precision", "bf16", "--fused-attention", "--attention-inputs", "fp16", "--vision-cuda-graphs")
    manifest = json.loads((engine / "manifest.json").read_text())
    config = json.loads((engine / "config.json").read_text(encoding="utf-8"))["vision_config"]
    width = patch_width(config)
    eager = VisionSession(engine / VISION_GRAPH, config, "cuda", manifest["provider_options"])
    graphed = VisionSession(engine / VISION_GRAPH, config, "cuda", manifest["provider_options"], cuda_graphs=True)
    rng = np.random.default_rng(5)
    images = [Pixels(rng.standard_normal((t * h * w, width)).astype(np.float32), (t, h, w), int(config["spatial_merge_size"]))
              for t, h, w in [(1, 4, 8), (1, 8, 4), (1, 14, 20), (1, 4, 8)]]  # fmt: skip
    got = [graphed(image) for image in images]
    for image, features in zip(images, got, strict=True):
        expected = eager(image)
        assert np.abs(features - expected).max() <= 1e-6 * np.abs(expected).max(), image.grid
    assert sorted(graph.runs for graph in graphed.graphs.graphs.values()) == [1, 3]

