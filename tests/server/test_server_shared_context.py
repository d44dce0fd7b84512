"""``s1omni serve --profiles shared_context``: served only from an engine whose packed forwards passed
``s1omni validate ENG --shared-context``; its requests answer as exact does, within the gate."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from serving import Server

from s1omni.export.compare_answers import compare
from s1omni.export.gate import load_gates
from tests.cli import run_s1omni

GATE = load_gates("vela2")["cpu-fp32"]
# Several blocks behind one prefix: the questions pack into one row.
ROUTER = {
    "state": {"request": "Hi, I'm Tom Baker. Please refund the duplicate charge on card 4111 1111 1111 1111.", "answer": "Done."},
    "questions": {
        "refund": {"type": "noul", "instructions": "Does the customer ask for a refund?", "over": "request"},
        "topic": {"type": "choice", "instructions": "Which topic?", "over": "request",
                  "criteria": {"billing": "payments", "shipping": "parcels", "other": "anything else"}},  # fmt: skip
        "urgency": {"type": "score", "instructions": "How urgent?", "over": "request", "criteria": ["low", "medium", "high"]},
        "tags": {"type": "set", "instructions": "Which tags?", "over": "request", "criteria": {"card": "a card", "name": "a name"}},
        "pii": {"preset": "pii", "over": "request"},
    },
}


def _serve(*args: str) -> Any:
    return run_s1omni("serve", *args, "--port", "0", timeout=120)


@pytest.fixture(scope="module")
def checked_engine(cpu_engine: Path, cpu_validation: object, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the validated CPU engine whose packed forwards passed their check."""
    engine = tmp_path_factory.mktemp("shared-context") / "engine"
    shutil.copytree(cpu_engine, engine)
    result = run_s1omni("validate", str(engine), "--shared-context")
    assert result.returncode == 0, result.stderr
    return engine


@pytest.fixture(scope="module")
def server(start, checked_engine: Path) -> Iterator[Server]:
    server = start("--engine", str(checked_engine), "--profiles", "shared_context")
    server.wait_status("ready")
    yield server
    server.stop()


def test_the_card_lists_shared_context_with_its_check(server: Server) -> None:
    card = server.client.get("/v1/models").json()["data"][0]
    exact, shared = card["profiles"]
    assert exact["name"] == "exact" and (shared["name"], shared["numerics"]) == ("shared_context", "approximate")
    assert shared["check"]["gate"] == "cpu-fp32" and shared["check"]["max_probability"] <= 1e-5
    assert "packed into one row behind its prefix" in shared["description"]
    log = server.log()  # the packed forward started (its CUDA graphs captured, on a GPU) before the first request
    assert log.index("packed (shared_context) too") < log.index("ready: ")


def test_a_shared_context_request_answers_as_exact_within_the_gate(server: Server) -> None:
    exact = server.post({**ROUTER, "options": {"return_meta": True}})
    shared = server.post({**ROUTER, "options": {"profile": "shared_context", "return_meta": True}})
    assert exact.status_code == shared.status_code == 200, shared.text
    assert (shared.json()["meta"]["profile"], shared.json()["meta"]["numerics"]) == ("shared_context", "approximate")
    stats = compare(exact.json(), shared.json(), GATE["decision_margin"])
    assert not stats.failures and stats.same_decisions == stats.decisions > 0, stats
    assert stats.max_probability <= GATE["max_probability"] and stats.max_score <= GATE["max_score"], stats


def test_shared_context_is_refused_without_a_passed_check(cpu_engine: Path, cpu_validation: object, tiny_vela: Path, tmp_path: Path) -> None:
    unchecked = _serve("--engine", str(cpu_engine), "--profiles", "shared_context")
    assert unchecked.returncode == 1 and "it has no verdict: run that check first" in unchecked.stderr
    failed = tmp_path / "engine"
    shutil.copytree(cpu_engine, failed)
    from s1omni.runtime.engine import record_check

    record_check(failed, "shared_context", {"passed": False})
    refused = _serve("--engine", str(failed), "--profiles", "shared_context")
    assert refused.returncode == 1 and "its verdict is a miss" in refused.stderr
    package = _serve(str(tiny_vela), "--profiles", "shared_context")
    assert package.returncode == 2 and "serve --engine ENG" in package.stderr
