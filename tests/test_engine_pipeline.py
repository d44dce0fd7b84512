"""The whole engine pipeline on the tiny Vela member, through the CLI a user runs.

export -> build (ONNX Runtime CPU) -> validate (the cpu-fp32 gate) -> serve; over HTTP
the engine's answers equal the reference server's: identical decisions, identical usage, max
absolute probability difference <= 1e-5. The same export also builds a TensorRT plan ahead of time
with TensorRT for RTX where it is installed, and the runner refuses that plan on this machine.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from s1omni.export.compare_answers import compare
from s1omni.export.cpu_exp import exp_in_float64
from s1omni.calib import CALIB
from s1omni.export.reference import read_record
from s1omni.runtime.engine import VALIDATOR_VERSION, build_facts, files_digest, read_manifest, record_validation
from s1omni.runtime.errors import EnvironmentMissing, PackageError
from tests.cli import run_s1omni, s1omni
from tests.cuda_builds import needs_cuda
from tests.server.serving import Server

CASES = json.loads((Path(__file__).parent.parent / "calib" / "vela2" / "cases.json").read_text(encoding="utf-8"))["cases"]
SERVED = ("golden", "router-signals-600", "span-windowed-long", "all-kinds-one-row", "mixed-invalid", "cjk")


def test_export_manifest_pins_graphs_heads_and_source(exported: Path) -> None:
    manifest = json.loads((exported / "manifest.json").read_text())
    assert manifest["stage"] == "export" and manifest["member"]["name"] == "vela2-synth-tiny-s0"
    assert {"prefill.onnx", "continue.onnx", "heads.safetensors", "tokenizer.json"} <= set(manifest["files"])
    assert manifest["source"]["package_files"]["config.json"]


def _ops(graph: Path) -> list[str]:
    return [node.op_type for node in onnx.load(str(graph), load_external_data=False).graph.node]


def test_cpu_engine_runs_the_portable_graphs(cpu_engine: Path, exported: Path) -> None:
    manifest = json.loads((cpu_engine / "manifest.json").read_text())
    assert manifest["recurrence"] == "scan" and manifest["gated_delta_kernel"] == "Scan"
    assert manifest["precision"] == "fp32" and manifest["provider_options"] == {}
    for graph in ("prefill", "continue"):
        assert _ops(cpu_engine / f"{graph}.onnx").count("Scan") == 4  # the tiny member's 3 Gated DeltaNet layers, 1 attention
        # The export's graph, its exponentials in float64 and nothing else (s1omni.export.cpu_exp).
        expected = onnx.load(str(exported / f"{graph}.onnx"), load_external_data=False)
        assert exp_in_float64(expected) > 0
        assert onnx.load(str(cpu_engine / f"{graph}.onnx"), load_external_data=False) == expected
    assert not (cpu_engine / "prefill.fused.onnx").exists()


def test_cuda_build_swaps_in_gated_delta_net_and_leaves_the_export_alone(
    exported: Path, cuda_engine: Callable[..., tuple[Path, str]], tmp_path: Path
) -> None:
    """Built here (no GPU needed to build): bfloat16 GEMMs with CUDA graphs by default (the fastest
    precision, held to gpu-reduced), GatedDeltaNet nodes in the engine's graphs, the export's own fused
    graphs untouched (the engine's files are links where they are unchanged); --precision fp32 for parity."""
    out = tmp_path / "cuda"
    s1omni("build", str(exported), "--backend", "onnxruntime", "--target", "cuda", "--out", str(out))
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["precision"] == "bf16" and manifest["cuda_graphs"] and manifest["provider_options"]["use_tf32"] == 0
    assert manifest["gated_delta_kernel"] == "GatedDeltaNet" and manifest["recurrence"] == "fused"
    for graph in ("prefill", "continue"):
        engine_ops, export_ops = _ops(out / f"{graph}.onnx"), _ops(exported / f"{graph}.fused.onnx")
        assert engine_ops.count("GatedDeltaNet") == 3 and "LinearAttention" not in engine_ops
        assert export_ops.count("LinearAttention") == 3 and "GatedDeltaNet" not in export_ops
    assert (out / "heads.safetensors").stat().st_ino == (exported / "heads.safetensors").stat().st_ino
    fp32, _ = cuda_engine()  # --precision fp32 --no-cuda-graphs, shared with the other CUDA builds' tests
    manifest = json.loads((fp32 / "manifest.json").read_text())
    assert manifest["precision"] == "fp32" and not manifest["cuda_graphs"]
    tf32 = tmp_path / "cuda-tf32"
    s1omni("build", str(exported), "--backend", "onnxruntime", "--target", "cuda", "--precision", "tf32",
           "--gated-delta-kernel", "LinearAttention", "--out", str(tf32))  # fmt: skip
    manifest = json.loads((tf32 / "manifest.json").read_text())
    assert manifest["provider_options"]["use_tf32"] == 1 and manifest["gated_delta_kernel"] == "LinearAttention"


def _fast_options(graph: Path) -> dict[str, int]:
    """What ``graph`` holds of the three bf16 options the H200 records time: GatedDeltaNet q/k/v cast to float16
    (then reshaped to heads), the fused mixers' ops, MultiHeadAttention nodes and those whose q is cast to float16."""
    nodes = onnx.load(str(graph), load_external_data=False).graph.node
    producers = {output: node for node in nodes for output in node.output}

    def float16(name: str) -> bool:
        node = producers.get(name)
        node = producers.get(node.input[0]) if node is not None and node.op_type == "Reshape" else node
        return node is not None and node.op_type == "Cast" and helper.get_attribute_value(node.attribute[0]) == TensorProto.FLOAT16

    ops = Counter(node.op_type for node in nodes)
    return {"float16 GatedDeltaNet q/k/v": sum(float16(name) for n in nodes if n.op_type == "GatedDeltaNet" for name in n.input[:3]),
            "CausalConvWithState": ops["CausalConvWithState"], "GatedRMSNorm": ops["GatedRMSNorm"], "Conv": ops["Conv"],
            "MultiHeadAttention": ops["MultiHeadAttention"],
            "float16 MultiHeadAttention": sum(float16(n.input[0]) for n in nodes if n.op_type == "MultiHeadAttention")}  # fmt: skip


# The tiny member: 3 Gated DeltaNet layers (their short convolutions spelled as Conv when not fused), 1 full-attention layer.
ALL_THREE = {"float16 GatedDeltaNet q/k/v": 9, "CausalConvWithState": 3, "GatedRMSNorm": 3, "Conv": 0, "MultiHeadAttention": 1,
             "float16 MultiHeadAttention": 1}  # fmt: skip
NONE = {"float16 GatedDeltaNet q/k/v": 0, "CausalConvWithState": 0, "GatedRMSNorm": 0, "Conv": 3, "MultiHeadAttention": 0,
        "float16 MultiHeadAttention": 0}  # fmt: skip
FAST = ["--gated-delta-inputs", "fp16", "--fused-mixers", "--fused-attention", "--attention-inputs", "fp16"]


@pytest.mark.parametrize(
    ("target", "options", "recorded", "graphs"),
    [
        ("cuda", [], ("fp32", False, False, None), NONE),  # bf16, the default precision
        ("cuda", FAST, ("fp16", True, True, "fp16"), ALL_THREE),
        ("cuda", ["--gated-delta-kernel", "LinearAttention", "--fused-mixers", "--fused-attention"], ("fp32", True, True, "fp32"),
         {**ALL_THREE, "float16 GatedDeltaNet q/k/v": 0, "float16 MultiHeadAttention": 0}),
        ("cuda", ["--precision", "fp32"], ("fp32", False, False, None), NONE),
        ("cuda", ["--precision", "tf32"], ("fp32", False, False, None), NONE),
        ("cuda", ["--precision", "fp8"], ("fp32", False, False, None), NONE),
        ("cpu", [], ("fp32", False, False, None), NONE),
    ],
    ids=["bf16", "bf16-fast", "bf16-LinearAttention", "fp32", "tf32", "fp8", "cpu"],
)  # fmt: skip
def test_cuda_builds_take_the_fast_options_only_when_asked(
    exported: Path, tmp_path: Path, target: str, options: list[str], recorded: tuple, graphs: dict[str, int]
) -> None:
    """float16 GatedDeltaNet inputs, the fused mixers and the fused attention in float16 passed gpu-reduced on every
    member size on the H200 and are faster there, but stay opt-in: with all three, the tiny member's bf16 engine
    missed gpu-reduced on the H200 (``test_cuda_engine_passes_its_gate``'s build, one case's hidden relative L2
    0.082 against its bound 0.067; docs/validation.md). A build without them is the plain one, whatever the
    precision or target; asked for, each is recorded and in the graphs."""
    result = s1omni("build", str(exported), "--backend", "onnxruntime", "--target", target, *options, "--out", str(tmp_path / "e"),
                    "--json", "--quiet")  # fmt: skip
    keys = ("gated_delta_inputs", "fused_mixers", "fused_attention", "attention_inputs")
    manifest, reported = json.loads((tmp_path / "e" / "manifest.json").read_text()), json.loads(result.stdout)
    assert tuple(manifest[key] for key in keys) == tuple(reported[key] for key in keys) == recorded
    for graph in ("prefill", "continue"):
        assert _fast_options(tmp_path / "e" / f"{graph}.onnx") == graphs, graph


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--target", "cpu", "--gated-delta-kernel", "GatedDeltaNet"], "is for onnxruntime/cuda"),
        (["--target", "cpu", "--precision", "tf32"], "precisions are fp32"),
        (["--target", "cpu", "--precision", "bf16"], "precisions are fp32"),
        (["--target", "cpu", "--cuda-graphs"], "--cuda-graphs is for onnxruntime/cuda"),
        (["--target", "cuda", "--vision-cuda-graphs"], "--vision-cuda-graphs is for vision members"),
    ],
)
def test_build_refuses_options_its_target_cannot_honour(exported: Path, tmp_path: Path, args: list[str], message: str) -> None:
    result = run_s1omni("build", str(exported), "--backend", "onnxruntime", *args, "--out", str(tmp_path / "e"))
    assert result.returncode != 0 and message in result.stderr and not (tmp_path / "e").exists()


def test_validate_meets_the_cpu_gate_and_records_it(cpu_engine: Path, cpu_validation: tuple[subprocess.CompletedProcess[str], dict],
                                                   s1omni_home: Path) -> None:  # fmt: skip
    """Against the reference record shipped in calib/ where it pins the member this host synthesized (not
    made again), else against one made here (or by an earlier test of the session, in its home); the case
    total in the progress and the table, the gate and the validator's version in the manifest. (A host
    whose torch draws the tiny member's random weights otherwise synthesizes a member of another identity:
    the shipped record is then not its reference.)"""
    result, report = cpu_validation
    assert "golden" in result.stdout and "MISS" not in result.stdout and "PASSED gate cpu-fp32" in result.stderr
    shipped = read_record(CALIB / "vela2" / "reference" / "vela2-synth-tiny-s0" / "cpu-fp32")
    member = read_manifest(cpu_engine)["member"]
    reused = shipped["member"]["model_sha256"] == member["model_sha256"]
    made = f"{len(CASES)} cases on torch" in result.stderr
    assert not (reused and made), result.stderr  # a shipped record of this member is read, never made again
    if not reused:  # made here, or read from the session's home where another validation made it
        home_record = read_record(s1omni_home / "references" / "vela2" / member["name"] / "cpu-fp32")
        assert home_record["member"]["model_sha256"] == member["model_sha256"], result.stderr
    assert f"gate cpu-fp32, {len(CASES)} cases" in result.stderr
    assert f"\n{len(CASES)}/{len(CASES)} " in result.stdout  # the table numbers every case against the total
    assert report["passed"] and report["gate"]["name"] == "cpu-fp32" and report["cases"] == len(CASES)
    assert report["summary"]["max_probability"] <= 1e-5 and report["summary"]["layouts_identical"]
    assert report["summary"]["hidden_rel_l2"] <= report["gate"]["tensor"]["rel_l2"] and report["bf16_reference"] is None
    manifest = json.loads((cpu_engine / "manifest.json").read_text())
    assert manifest["validation"]["passed"] and manifest["backend"] == "onnxruntime" and manifest["target"] == "cpu"
    # The report names what it judged: the build and one digest of the engine's pinned files.
    assert report["engine"] == manifest["validation"]["engine"] == {
        "member": manifest["member"]["name"], "files_sha256": files_digest(manifest), **build_facts(manifest)}  # fmt: skip
    assert report["engine"]["precision"] == "fp32" and report["engine"]["gated_delta_kernel"] == "Scan"
    assert manifest["validation"]["validator_version"] == VALIDATOR_VERSION and manifest["validation"]["gate"]["version"] >= 2


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda v: {**v, "gate": {**v["gate"], "version": v["gate"]["version"] - 1}}, "which has changed"),
        (lambda v: {**v, "gate": {**v["gate"], "rule": "an older rule"}}, "which has changed"),
        (lambda v: {**v, "gate": {**v["gate"], "name": "gpu"}}, "call for cpu-fp32"),
        (lambda v: {**v, "validator_version": VALIDATOR_VERSION - 1}, "validator version 1"),
    ],
)
def test_a_changed_gate_or_validator_asks_for_validation_again(
    cpu_engine: Path, cpu_validation: object, tmp_path: Path, change, message: str
) -> None:
    from s1omni.runtime.api import load_model

    copy = tmp_path / "engine"
    shutil.copytree(cpu_engine, copy)
    assert load_model(copy).card()["validation"]["gate"] == "cpu-fp32"  # the verdict stands until it changes
    record_validation(copy, change(read_manifest(copy)["validation"]))
    with pytest.raises(PackageError, match=f"{message}.*run `s1omni validate"):
        load_model(copy)


@pytest.fixture(scope="module")
def servers(cpu_engine: Path, tiny_vela: Path, s1omni_home: Path, cpu_validation: object) -> Iterator[tuple[Server, Server]]:
    reference, compiled = Server(s1omni_home, str(tiny_vela)), Server(s1omni_home, "--engine", str(cpu_engine))
    try:
        reference.wait_status("ready")
        compiled.wait_status("ready")
        yield reference, compiled
    finally:
        reference.stop()
        compiled.stop()


@pytest.mark.parametrize("name", SERVED)
def test_engine_server_answers_as_the_reference_server(servers: tuple[Server, Server], name: str) -> None:
    request = next(case["request"] for case in CASES if case["name"] == name)
    reference, compiled = (server.post(request) for server in servers)
    assert reference.status_code == compiled.status_code == 200, (reference.text, compiled.text)
    expected, got = reference.json(), compiled.json()
    stats = compare(expected, got, margin=0.0)
    assert stats.usage_equal and stats.same_decisions == stats.decisions, stats.problems
    assert stats.same_span_sets == stats.span_sets and stats.max_probability <= 1e-5
    assert list(got) == list(expected) and list(got["answers"]) == list(expected["answers"])


def test_engine_card_names_its_backend_and_the_gate_it_met(servers: tuple[Server, Server]) -> None:
    card = servers[1].client.get("/v1/models").json()["data"][0]
    assert card["engine"] == "onnxruntime" and card["device"] == "cpu" and card["id"] == "vela2-synth-tiny-s0"
    assert card["validation"]["gate"] == "cpu-fp32" and card["validation"]["numerics"] == "exact"
    assert "validation" not in servers[0].client.get("/v1/models").json()["data"][0]  # the torch reference met no gate


def test_tensorrt_plan_builds_ahead_of_time_and_is_refused_here(exported: Path, tmp_path: Path) -> None:
    pytest.importorskip("tensorrt_rtx_bindings", reason="TensorRT for RTX is not installed (pip install '.[tensorrt-rtx]')")
    from s1omni.runtime.runners.tensorrt_runner import TensorRtRunner

    out = tmp_path / "trt-sm89"
    s1omni("build", str(exported), "--backend", "tensorrt", "--target", "sm_89", "--out", str(out))
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["library"] == "tensorrt_rtx" and manifest["target"] == "sm_89" and manifest["strongly_typed"]
    assert set(manifest["plans"]) == {"prefill", "continue"}
    for plan in manifest["plans"].values():
        assert (out / plan["file"]).stat().st_size == plan["bytes"] > 0 and plan["sha256"] == manifest["files"][plan["file"]]
    # Refused with the rebuild command: for want of a GPU here (EnvironmentMissing), on a GPU for its compute capability.
    with pytest.raises((EnvironmentMissing, PackageError), match="--backend tensorrt --target"):
        TensorRtRunner.load(out, manifest)


# The gate each precision is held to on the GPU.
GATE = {"fp32": "gpu", "bf16": "gpu-reduced"}


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize(
    ("kernel", "precision", "options"),
    [("GatedDeltaNet", "fp32", ["--no-cuda-graphs"]), ("LinearAttention", "fp32", ["--no-cuda-graphs"]),
     ("GatedDeltaNet", "fp32", []), ("GatedDeltaNet", "bf16", []),
     pytest.param("ChunkedGatedDeltaRule", "bf16", [], id="ChunkedGatedDeltaRule-bf16")],
)  # fmt: skip
def test_cuda_engine_passes_its_gate(exported: Path, tiny_vela: Path, tmp_path: Path, kernel: str, precision: str, options: list[str]) -> None:
    """The ONNX Runtime CUDA engine (float32 with either Gated DeltaNet kernel, with and without CUDA
    graphs; the default bfloat16 GEMMs with CUDA graphs, and with the ChunkedGatedDeltaRule op) against the float32 torch reference on the
    same GPU (TF32 off), with the BF16 reference recorded beside it: the validator's verdict is PASSED
    at the engine's gate (a float32 word within 1e-5 of its threshold is a tie)."""
    engine = tmp_path / "ort-cuda"
    s1omni("build", str(exported), "--backend", "onnxruntime", "--target", "cuda", "--gated-delta-kernel", kernel,
           "--precision", precision, *options, "--out", str(engine))  # fmt: skip
    result = run_s1omni("validate", str(engine), "--package", str(tiny_vela), "--reference", str(tmp_path / "reference"),
                        "--report", str(tmp_path / "report.json"))  # fmt: skip
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["gate"]["name"] == GATE[precision] and report["bf16_reference"]["runner"]["precision"] == "bf16"
    assert result.returncode == 0 and report["passed"], report["failures"]
    assert (tmp_path / "reference" / "cuda-fp32").is_dir() and (tmp_path / "reference" / "cuda-bf16").is_dir()
    summary = report["summary"]
    assert summary["layouts_identical"] and summary["usage_identical"] and "bf16" in report["figures"]["max_probability"]


def test_engine_graphs_follow_the_exported_recurrences(tmp_path: Path) -> None:
    from s1omni.export.build import backbone_variants, ort_files

    graphs = ("prefill.onnx", "continue.onnx", "packed.onnx", "prefill.fused.onnx", "continue.fused.onnx", "packed.fused.onnx")
    for name in (*graphs, "weights.data", "heads.safetensors"):
        (tmp_path / name).write_bytes(b"")
    assert set(backbone_variants(tmp_path)) == {"scan", "fused"}
    fused = {"weights.data": "weights.data", "prefill.onnx": "prefill.fused.onnx", "continue.onnx": "continue.fused.onnx",
             "packed.onnx": "packed.fused.onnx"}  # fmt: skip
    portable = {"weights.data": "weights.data", "prefill.onnx": "prefill.onnx", "continue.onnx": "continue.onnx", "packed.onnx": "packed.onnx"}
    assert ort_files(tmp_path, "cuda") == ("fused", fused) and ort_files(tmp_path, "cpu") == ("scan", portable)
    for name in ("prefill.onnx", "continue.onnx", "packed.onnx"):
        (tmp_path / name).unlink()
    assert ort_files(tmp_path, "cpu") == ("fused", fused)  # a fused-only export: the CPU runs it too
    (tmp_path / "packed.fused.onnx").unlink()  # an export from before the packed graph builds without it
    del fused["packed.onnx"]
    assert ort_files(tmp_path, "cuda") == ("fused", fused)


def test_the_files_digest_names_an_engine_s_files() -> None:
    """One digest of the pinned files, whatever their order in the manifest: any file's digest changes it, and so do
    a file added or renamed."""
    files = {"prefill.onnx": "a" * 64, "heads.safetensors": "b" * 64}
    digest = files_digest({"files": files})
    assert digest == files_digest({"files": dict(reversed(files.items()))}) and len(digest) == 64
    assert digest != files_digest({"files": {**files, "heads.safetensors": "c" * 64}})
    assert digest != files_digest({"files": {**files, "vision.onnx": "d" * 64}})
    assert digest != files_digest({"files": {"continue.onnx": "a" * 64, "heads.safetensors": "b" * 64}})
