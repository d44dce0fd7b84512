"""``s1omni serve`` fails fast: an engine it cannot load ends the process within seconds, with one line
saying why and the input-refused code; its options come from ``S1OMNI_*`` variables too, and its log
(uvicorn's lines included) can be JSON lines."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

from tests.cli import run_s1omni, s1omni

FAIL_WITHIN_S = 30


@pytest.fixture(scope="module")
def validated_engine(cpu_engine: Path, cpu_validation: object) -> Path:
    """The session's CPU engine, validated (a passing report: servable); shared, so each test breaks a copy."""
    return cpu_engine


def serve_fails(*args: str, env: dict[str, str] | None = None) -> tuple[int, list[str]]:
    started = time.monotonic()
    result = run_s1omni("serve", *args, "--port", "0", env=env, timeout=FAIL_WITHIN_S + 30)
    assert time.monotonic() - started < FAIL_WITHIN_S, f"serve took {time.monotonic() - started:.0f} s to fail:\n{result.stderr}"
    return result.returncode, result.stderr.strip().splitlines()


def test_a_corrupted_engine_ends_the_server_within_seconds(validated_engine: Path, tmp_path: Path) -> None:
    engine = tmp_path / "corrupted"
    shutil.copytree(validated_engine, engine)
    with (engine / "heads.safetensors").open("ab") as heads:
        heads.write(b"\0")
    code, lines = serve_fails("--engine", str(engine))
    assert code == 3
    assert lines[-1] == f"s1omni serve: heads.safetensors differs from {engine / 'manifest.json'}; rebuild the engine"


def test_an_unvalidated_engine_ends_the_server(exported: Path, tmp_path: Path) -> None:
    engine = tmp_path / "unvalidated"
    s1omni("build", str(exported), "--backend", "onnxruntime", "--target", "cpu", "--out", str(engine), "--quiet")
    code, lines = serve_fails("--engine", str(engine))
    assert code == 3 and lines[-1].startswith(f"s1omni serve: the engine {engine} has not passed validation")


def test_options_from_the_environment_and_json_logs(validated_engine: Path, tmp_path: Path) -> None:
    """``S1OMNI_ENGINE`` and ``S1OMNI_LOG_FORMAT`` stand for ``--engine`` and ``--log-format``: every log
    line is a JSON object, uvicorn's too; the closing line is the CLI's one-line reason."""
    engine = tmp_path / "engine"
    shutil.copytree(validated_engine, engine)
    (engine / "manifest.json").write_text(
        (engine / "manifest.json").read_text(encoding="utf-8").replace('"tokenizer.json": "', '"tokenizer.json": "0'), encoding="utf-8"
    )
    code, lines = serve_fails(env={"S1OMNI_ENGINE": str(engine), "S1OMNI_LOG_FORMAT": "json"})
    assert code == 3 and lines[-1].startswith("s1omni serve: tokenizer.json differs from")
    records = [json.loads(line) for line in lines[:-1]]
    assert all({"time", "level", "logger", "message"} <= set(record) for record in records)
    assert {"uvicorn.error", "s1omni.server"} <= {record["logger"] for record in records}
    assert any(record["level"] == "ERROR" and "tokenizer.json differs" in record["message"] for record in records)


def test_a_wrong_environment_value_is_a_usage_error() -> None:
    result = run_s1omni("serve", env={"S1OMNI_LOG_FORMAT": "xml"})
    assert result.returncode == 2 and result.stderr.strip() == "s1omni serve: $S1OMNI_LOG_FORMAT='xml' is none of text, json"
    flag = run_s1omni("serve", env={"S1OMNI_RAY": "maybe"})  # an on/off flag's variable takes yes or no words
    assert flag.returncode == 2 and "$S1OMNI_RAY='maybe' is none of 1, true, yes, on, 0, false, no, off" in flag.stderr
    both = run_s1omni("serve", "--engine", "somewhere", env={"S1OMNI_PACKAGE": "elsewhere"})
    assert both.returncode == 2 and "not both" in both.stderr
    assert "[$S1OMNI_MAX_BATCH_TOKENS]" in s1omni("serve", "--help").stdout  # each option names its variable


def test_an_unknown_profile_is_a_usage_error_naming_the_known_ones() -> None:
    known = "the known profiles are exact, shared_context, batching, max_speed"
    given = run_s1omni("serve", "--profiles", "batching,turbo")
    assert given.returncode == 2 and given.stderr.strip() == f"s1omni serve: unknown profile 'turbo': {known}"
    from_environment = run_s1omni("serve", env={"S1OMNI_PROFILES": "fastest"})
    assert from_environment.returncode == 2 and from_environment.stderr.strip() == f"s1omni serve: unknown profile 'fastest': {known}"
    assert "[$S1OMNI_PROFILES]" in s1omni("serve", "--help").stdout
