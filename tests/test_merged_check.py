"""``s1omni validate ENG --merged N``: an engine's answers with requests merged into one forward, against alone."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from s1omni.calib import CALIB
from s1omni.export.gate import CaseRecord
from s1omni.export.merged_check import _records, check_label, judge_merged, run_merged
from s1omni.export.reference import load_cases
from s1omni.runtime.engine import engine_identity, load_engine_model, read_manifest
from s1omni.runtime.runners.onnxruntime_runner import OnnxRuntimeRunner
from tests.cli import run_s1omni

# Prefixes of different widths (one token, a few hundred, 722), so that merging left-pads them to the widest.
MERGED_CASES = ("prefix-one-token", "golden", "router-signals-600", "scan-budget")


@pytest.fixture(scope="module")
def four_cases(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cases = [case for case in load_cases(CALIB / "vela2") if case["name"] in MERGED_CASES]
    assert len(cases) == len(MERGED_CASES)
    path = tmp_path_factory.mktemp("cases") / "cases.json"
    path.write_text(json.dumps({"cases": cases}), encoding="utf-8")
    return path


def test_the_cpu_engine_answers_merged_requests_as_it_answers_each_alone(cpu_engine: Path, four_cases: Path, tmp_path: Path) -> None:
    engine = tmp_path / "engine"
    shutil.copytree(cpu_engine, engine)  # the session's engine is shared: its manifest stays as it is
    result = run_s1omni("validate", str(engine), "--merged", "4", "--cases", str(four_cases), "--report", str(tmp_path / "merged.json"))
    assert result.returncode == 0, result.stderr
    assert "PASSED gate cpu-fp32 (merged 4 to a forward against alone)" in result.stderr
    report = json.loads((tmp_path / "merged.json").read_text(encoding="utf-8"))
    recorded = read_manifest(engine)["merged"]
    assert recorded == {key: value for key, value in report.items() if key != "table"}
    assert (report["passed"], report["group"], report["cases"], report["gate"]["name"]) == (True, 4, 4, "cpu-fp32")
    summary = report["summary"]
    same, total = map(int, summary["decisions"].split("/"))
    assert same == total > 0 and summary["layouts_identical"] and summary["usage_identical"]
    assert summary["max_probability"] <= 1e-5 and summary["hidden_rel_l2"] <= 5e-5
    assert read_manifest(engine)["validation"] == read_manifest(cpu_engine)["validation"]  # validation untouched


def test_merged_packed_forwards_are_checked_and_recorded_apart(cpu_engine: Path, four_cases: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--merged N --shared-context``: N cases to a packed forward (what batching runs on packed rows), its verdict
    under ``merged_packed``, the padded check's ``merged`` untouched; the packed graph really ran, N plans a call."""
    engine = tmp_path / "engine"
    shutil.copytree(cpu_engine, engine)
    calls: list[int] = []
    run_packed = OnnxRuntimeRunner.run_packed
    monkeypatch.setattr(OnnxRuntimeRunner, "run_packed", lambda runner, trees, ready=None: calls.append(len(trees)) or run_packed(runner, trees, ready))
    report = run_merged(engine, 2, four_cases, tmp_path / "packed.json", packed=True)
    trees = [len(plan.trees) for plan in _plans(engine, four_cases)]
    assert calls == [trees[0] + trees[1], trees[2] + trees[3]]
    assert (report["check"], report["group"], report["passed"], report["gate"]["name"]) == ("merged_packed", 2, True, "cpu-fp32")
    assert check_label(report) == "merged 2 to a packed forward"
    manifest = read_manifest(engine)
    assert manifest["merged_packed"] == report and "merged" not in manifest and "shared_context" not in manifest
    # The report names the engine it judged, as a validation report does.
    assert report["engine"] == engine_identity(manifest) and report["engine"]["target"] == "cpu" and len(report["engine"]["files_sha256"]) == 64
    summary = report["summary"]
    same, total = map(int, summary["decisions"].split("/"))
    assert same == total > 0 and summary["max_probability"] <= 1e-5 and summary["hidden_rel_l2"] <= 5e-5
    result = run_s1omni("validate", str(engine), "--merged", "4", "--shared-context", "--cases", str(four_cases))
    assert result.returncode == 0 and "PASSED gate cpu-fp32 (merged 4 to a packed forward against alone)" in result.stderr, result.stderr
    assert read_manifest(engine)["merged_packed"]["group"] == 4


def _plans(engine: Path, cases_path: Path) -> list[Any]:
    model = load_engine_model(engine, allow_unvalidated=True)
    return [model.plan(case["request"]) for case in load_cases(cases_path)]


def test_merged_answers_that_are_not_the_cases_own_fail(cpu_engine: Path, four_cases: Path) -> None:
    """The check can fail: each case's merged record swapped for its neighbour's answers and states."""
    model = load_engine_model(cpu_engine, allow_unvalidated=True)
    cases = load_cases(four_cases)[:2]
    plans = [model.plan(case["request"]) for case in cases]
    alone = _records(model, cases, plans, [model.forward([plan])[0] for plan in plans])
    merged = _records(model, cases, plans, model.forward(plans))
    assert judge_merged("vela2", "cpu-fp32", alone, merged)["passed"]
    swapped = [replace(merged[0], answers=merged[1].answers, tensors=merged[1].tensors),
               replace(merged[1], answers=merged[0].answers, tensors=merged[0].tensors)]  # fmt: skip
    for gate, bf16 in (("cpu-fp32", None), ("gpu-reduced-alone", [_moved(case, 0.01) for case in alone])):
        assert judge_merged("vela2", gate, alone, merged, bf16, bf16 and alone)["passed"]
        verdict = judge_merged("vela2", gate, alone, swapped, bf16, bf16 and alone)
        assert not verdict["passed"] and any(failure.startswith(f"case {cases[0]['name']}") for failure in verdict["failures"])


def _moved(case: CaseRecord, relative: float) -> CaseRecord:
    """``case`` with its hidden states ``relative`` off in relative L2 (a stand-in BF16 reference's)."""
    hidden = case.tensors["hidden"]
    noise = np.random.default_rng(0).standard_normal(hidden.shape)
    return replace(case, tensors={"hidden": (hidden + noise * relative * np.linalg.norm(hidden) / np.linalg.norm(noise)).astype(np.float32)})


def test_a_reduced_engine_is_checked_against_its_saved_bf16_and_float32_references(cpu_engine: Path, four_cases: Path, tmp_path: Path) -> None:
    """An engine validated at gpu-reduced is held to gpu-reduced-alone, whose bounds are its BF16 reference's
    figures: without those records (made on a GPU by its validation) the check is refused before it runs."""
    engine = tmp_path / "engine"
    shutil.copytree(cpu_engine, engine)
    manifest = json.loads((engine / "manifest.json").read_text(encoding="utf-8"))
    (engine / "manifest.json").write_text(json.dumps({**manifest, "precision": "bf16"}), encoding="utf-8")
    result = run_s1omni("validate", str(engine), "--shared-context", "--cases", str(four_cases), "--reference", str(tmp_path / "none"))
    assert result.returncode == 2 and "no cuda-fp32 reference record of these cases" in result.stderr, result.stderr


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (("--merged", "1"), "at least 2"),
        (("--merged", "2", "--exact", "X"), "takes --cases, --report, and --package and --reference"),
        (("--shared-context", "--reference-device", "cpu"), "takes --cases, --report, and --package and --reference"),
        (("--rounds", "2"), "--rounds is for the consent gate"),
    ],
)
def test_merged_and_rounds_misused_are_usage_errors(cpu_engine: Path, extra: tuple[str, ...], message: str) -> None:
    result = run_s1omni("validate", str(cpu_engine), *extra)
    assert result.returncode == 2 and message in result.stderr
