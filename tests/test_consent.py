"""The reduced copy's consent gate (``s1omni.export.consent``) and its standing when a server starts
(``s1omni.runtime.reduced_copy``): judged on hand-made records, then end to end on the tiny member's fp8
copy, which the CPU runs through the emulation (``tests.cuda_builds``; never served as max_speed on a CPU
in earnest: the test registry's consent to a CPU copy exists for these tests only)."""

from __future__ import annotations

import copy as copying
import json
import shutil
from pathlib import Path
from typing import Any

import onnx
import pytest

from s1omni.export.consent import count, decisions, verdict
from s1omni.runtime.engine import read_manifest, record_consent, write_manifest
from s1omni.runtime.reduced_copy import CONSENT_GATE, consent_problem, engine_pins
from s1omni.runtime.registry import Member, Registry, user_registry, write_entry
from tests.cli import run_s1omni, s1omni
from tests.cuda_builds import bfloat16_emulated, gated_delta_net_emulated, gemm_float8_emulated

FASTER = {"exact_s": 2.0, "copy_s": 1.0, "speedup": 2.0, "rounds": 1}
TYPES = CONSENT_GATE["answer_types"]


def _figures(**kept: tuple[int, int]) -> dict[str, dict[str, Any]]:
    figures = {kind: {"kept": 100, "compared": 100, "changed": []} for kind in TYPES}
    for kind, (same, compared) in kept.items():
        figures[kind] = {"kept": same, "compared": compared, "changed": [f"case: {kind}"] * (compared - same)}
    return figures


def test_a_copy_keeping_every_type_and_faster_is_granted() -> None:
    consent = verdict(_figures(span=(99, 100)), FASTER, True, "fp8", "cuda")
    assert consent["granted"] and consent["refusals"] == [] and consent["gate"]["name"] == "reduced-copy"


def test_98_9_percent_of_span_decisions_is_refused() -> None:
    consent = verdict(_figures(span=(89, 90)), FASTER, True, "fp8", "cuda")
    assert not consent["granted"] and consent["refusals"] == ["span 89/90 (98.9%) kept, below 99%"]


def test_a_slower_copy_is_refused_with_its_figures() -> None:
    slower = {**FASTER, "copy_s": 2.0, "speedup": 1.0}
    consent = verdict(_figures(), slower, True, "fp8", "cuda")
    assert not consent["granted"] and consent["refusals"] == ["not faster: 2000.0 ms against the exact engine's 2000.0 ms"]
    assert consent["speed"] == slower


def test_no_registry_consent_or_a_type_without_decisions_is_refused() -> None:
    consent = verdict(_figures(set=(0, 0)), FASTER, False, "fp8", "cuda")
    assert consent["refusals"] == ["the member's registry entry does not consent to a fp8 copy on cuda",
                                   "no set decisions in the cases: the gate cannot judge them"]  # fmt: skip


def _response(choice: str = "a", level: str = "1", noul: float = 0.7, selected: tuple[str, ...] = ("x",), end: int = 3) -> dict[str, Any]:
    return {
        "answers": {"c": {"type": "choice", "choice": choice}, "s": {"type": "score", "probabilities": {"0": 0.2, level: 0.8}},
                    "n": {"type": "noul", "noul": noul}, "e": {"type": "noul", "error": "invalid_question"}},
        "sets": {"t": {"selected": list(selected)}},
        "spans": {"p": [{"label": "NAME", "start": 0, "end": end}]},
    }  # fmt: skip


def test_each_answer_type_counts_its_own_changed_decisions() -> None:
    assert {kind: len(keys) for kind, keys in decisions(_response()).items()} == {"choice": 1, "noul": 2, "score": 1, "set": 1, "span": 1}
    changed = [_response(choice="b"), _response(level="2"), _response(noul=0.3), _response(selected=("x", "y")), _response(end=4)]
    figures = count(["one"] * 5 + ["same"], [_response()] * 6, [*changed, _response()])
    assert {kind: (f["kept"], f["compared"]) for kind, f in figures.items()} == {
        "choice": (5, 6), "noul": (11, 12), "score": (5, 6), "set": (5, 6), "span": (5, 6)}  # fmt: skip
    assert figures["span"]["changed"] == ["one: p"] and figures["noul"]["changed"] == ["one: n"]


def _manifests(consent: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    shared = {name: f"{name}-digest" for name in ("heads.safetensors", "tokenizer.json", "config.json", "calibration.json")}
    member = {"name": "m", "revision": "r"}
    engine = {"member": member, "precision": "bf16", "device": "cuda", "files": {**shared, "prefill.onnx": "e"}}
    copy = {"member": member, "precision": "fp8", "device": "cuda", "files": {**shared, "prefill.onnx": "c"},
            "consent": {**consent, "exact": {"pins": engine_pins(engine)}}}  # fmt: skip
    return copy, engine


def _registry(devices: list[str] | None) -> Registry:
    extra = {} if devices is None else {"reduced_copies": {"fp8": devices}}
    return Registry({"m": Member("m", "vela2", "x/m", "r", extra=extra)})


def test_a_copy_stands_only_with_a_granted_current_consent_against_this_engine_and_the_registry_s() -> None:
    granted = verdict(_figures(), FASTER, True, "fp8", "cuda")
    copy, engine = _manifests(granted)
    assert consent_problem(copy, engine, _registry(["cuda"]), "cuda") is None
    assert "registry entry" in consent_problem(copy, engine, _registry(None), "cuda")
    assert "runs on cuda, not cpu" in consent_problem(copy, engine, _registry(["cuda", "cpu"]), "cpu")
    changed = {**engine, "files": {**engine["files"], "prefill.onnx": "other"}}
    assert "another engine" in consent_problem(copy, changed, _registry(["cuda"]), "cuda")
    old = copying.deepcopy(copy)
    old["consent"]["gate"]["version"] = 0
    assert "version 0, not the current" in consent_problem(old, engine, _registry(["cuda"]), "cuda")
    refused, _ = _manifests(verdict(_figures(span=(89, 90)), FASTER, True, "fp8", "cuda"))
    assert consent_problem(refused, engine, _registry(["cuda"]), "cuda") == "was refused its consent: span 89/90 (98.9%) kept, below 99%"
    assert "no consent recorded" in consent_problem({**copy, "consent": None}, engine, _registry(["cuda"]), "cuda")
    assert "not a reduced copy" in consent_problem(engine, engine, _registry(["cuda"]), "cuda")


# -- end to end on the tiny member: its fp8 copy emulated on the CPU ----------------------------------------------


@pytest.fixture(scope="module")
def cpu_registry(tiny_vela: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The session registry with the tiny member consenting to an fp8 copy on the CPU too (the emulated copy's device)."""
    path = tmp_path_factory.mktemp("registry") / "registry.json"
    shutil.copyfile(user_registry(), path)
    name = json.loads((tiny_vela / "config.json").read_text(encoding="utf-8"))["model_name"]  # the suite holds other tiny members too
    tiny = next(member for member in Registry.load(path) if member.name == name)
    write_entry(path, Member.from_dict({**tiny.to_dict(), "reduced_copies": {"fp8": ["cuda", "cpu"]}}))
    return path


@pytest.fixture(scope="module")
def emulated_copy(exported: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny member's fp8 copy as ``s1omni build`` writes it, its graphs emulated and its manifest pointed at the CPU."""
    copy = tmp_path_factory.mktemp("fp8-copy") / "copy"
    s1omni("build", str(exported), "--backend", "onnxruntime", "--target", "cuda", "--precision", "fp8", "--out", str(copy))
    for graph in ("prefill", "continue"):
        model = onnx.load(str(copy / f"{graph}.onnx"))
        onnx.save(bfloat16_emulated(gemm_float8_emulated(gated_delta_net_emulated(model, "fp32")), copy), str(copy / f"{graph}.onnx"))
    manifest = read_manifest(copy)
    write_manifest(copy, {**{k: v for k, v in manifest.items() if k != "files"}, "target": "cpu", "device": "cpu", "provider_options": {}})
    return copy


@pytest.fixture(scope="module")
def two_cases(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from s1omni.calib import CALIB
    from s1omni.export.reference import load_cases

    cases = [case for case in load_cases(CALIB / "vela2") if case["name"] in ("golden", "router-signals-600")]
    path = tmp_path_factory.mktemp("cases") / "cases.json"
    path.write_text(json.dumps({"cases": cases}), encoding="utf-8")
    return path


def test_the_consent_gate_runs_against_the_exact_engine_and_records_its_verdict(
    emulated_copy: Path, cpu_engine: Path, cpu_registry: Path, two_cases: Path, tmp_path: Path
) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(emulated_copy, copy)
    report = tmp_path / "consent.json"
    args = ("validate", str(copy), "--exact", str(cpu_engine), "--cases", str(two_cases), "--rounds", "1", "--registry", str(cpu_registry))
    result = run_s1omni(*args, "--report", str(report))
    consent = read_manifest(copy)["consent"]
    assert json.loads(report.read_text()) == consent and consent["cases"] == 2 and consent["registry_consents"]
    assert consent["exact"]["pins"] == engine_pins(read_manifest(cpu_engine))
    assert all(figure["compared"] for figure in consent["figures"].values()) and consent["speed"]["rounds"] == 1
    # The tiny member's random weights put decisions at boundaries: refused, as a synthetic member may be, exit 1.
    assert result.returncode == (0 if consent["granted"] else 1), result.stderr
    assert ("GRANTED" if consent["granted"] else "REFUSED") in result.stderr
    without = run_s1omni("validate", str(copy))
    assert without.returncode == 2 and "--exact" in without.stderr


def _serve(*args: str) -> Any:
    return run_s1omni("serve", *args, "--port", "0", timeout=120)


def test_a_refused_copy_is_never_served(emulated_copy: Path, cpu_engine: Path, cpu_validation: object, cpu_registry: Path, tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(emulated_copy, copy)
    record_consent(copy, {**verdict(_figures(span=(89, 90)), FASTER, True, "fp8", "cpu"), "exact": {"pins": engine_pins(read_manifest(cpu_engine))}})
    refused = _serve("--engine", str(cpu_engine), "--profiles", "max_speed", "--reduced-copy", str(copy), "--registry", str(cpu_registry))
    assert refused.returncode == 1 and "was refused its consent: span 89/90 (98.9%) kept, below 99%" in refused.stderr
    alone = _serve("--engine", str(copy), "--registry", str(cpu_registry))
    assert alone.returncode == 3 and "has not passed validation" in alone.stderr
    missing = _serve("--engine", str(cpu_engine), "--profiles", "max_speed")
    assert missing.returncode == 2 and "--reduced-copy" in missing.stderr


def test_a_granted_copy_serves_max_speed_and_its_card_names_it(
    emulated_copy: Path, cpu_engine: Path, cpu_validation: object, cpu_registry: Path, tmp_path: Path, s1omni_home: Path
) -> None:
    """Its consent written by the gate's own verdict on hand-made figures (the emulation is slower than the CPU engine)."""
    from tests.server.serving import Server

    copy = tmp_path / "copy"
    shutil.copytree(emulated_copy, copy)
    record_consent(copy, {**verdict(_figures(), FASTER, True, "fp8", "cpu"), "exact": {"pins": engine_pins(read_manifest(cpu_engine))}})
    server = Server(s1omni_home, "--engine", str(cpu_engine), "--profiles", "max_speed", "--reduced-copy", str(copy), "--registry", str(cpu_registry))
    try:
        server.wait_status("ready")
        card = server.client.get("/v1/models").json()["data"][0]
        entry = next(profile for profile in card["profiles"] if profile["name"] == "max_speed")
        assert entry["numerics"] == "approximate" and entry["copy"]["name"] == "copy" and entry["copy"]["precision"] == "fp8"
        question = {"type": "noul", "instructions": "Is it urgent?"}
        answer = server.post({"state": "Hi, I am Tom.", "questions": {"urgent": question}, "options": {"profile": "max_speed", "return_meta": True}})
        assert answer.status_code == 200 and answer.json()["meta"]["profile"] == "max_speed", answer.text
    finally:
        server.stop()
