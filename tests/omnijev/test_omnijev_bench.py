"""``s1omni bench`` on the tiny OmniJev member: the screenshot workloads (1600x900, N options)."""

from __future__ import annotations

import json
from pathlib import Path

from s1omni.bench.workloads import REFERENCE, SCREENSHOT_OPTIONS, resolve
from s1omni.cli.main import main


def test_screenshot_expands_to_the_reference_option_counts() -> None:
    names = [workload.name for workload in resolve(["screenshot", "backbone"], [64], "omnijev")]
    assert names == [f"screenshot-{n}" for n in SCREENSHOT_OPTIONS] + ["backbone-64"] == ["screenshot-1", "screenshot-12", "screenshot-255", "backbone-64"]
    workload = resolve(["screenshot-12"], [], "omnijev")[0]
    assert len(workload.body["questions"]["next"]["options"]) == 12 and workload.facts["image"] == "1600x900"


def test_screenshot_requests_are_answered_and_timed(omnijev_package: Path, tmp_path: Path) -> None:
    argv = ["bench", "--package", str(omnijev_package), "--workloads", "screenshot-1,screenshot-12",
            "--requests", "2", "--warmup", "0", "--out", str(tmp_path)]  # fmt: skip
    assert main(argv) == 0
    record = json.loads((tmp_path / "bench.json").read_text(encoding="utf-8"))
    assert [entry["name"] for entry in record["workloads"]] == ["screenshot-1", "screenshot-12"]
    one, twelve = record["workloads"]
    for entry in (one, twelve):
        result = entry["results"][REFERENCE]
        assert result["answer_errors"] == 0 and result["count"] == 2 and result["p50_ms"] > 0
    # Options cost tokens: twelve options make a longer prompt than one, about the same image.
    assert twelve["input_tokens"] > one["input_tokens"] > 0
