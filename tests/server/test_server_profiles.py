"""The speed profiles (``s1omni.server.profiles``) over HTTP.

In process (``inprocess``: real uvicorn, the tiny member's ONNX Runtime CPU engine, a server with
``batching`` enabled): ``exact`` requests of different prefix widths queued together behind a
forward in flight never share a forward and answer byte for byte as alone; ``batching`` requests
sent together share one forward and answer within the CPU float32 gate of alone (the same
decisions, probabilities within 1e-5), byte for byte where nothing was padded, a deadline kept.

Through ``s1omni serve --profiles batching`` (a subprocess): the card lists exactly the enabled
profiles, ``meta`` names the one a request ran, and a profile the server did not enable is 400
with the enabled ones in its message.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from inprocess import TIMEOUT_S, Watch, body, post, prefix_lengths, serving, together, wait_for
from serving import Server, error, metric

from s1omni.export.compare_answers import compare
from s1omni.export.gate import load_gates
from tests.cli import s1omni

PROFILES = ("exact", "batching")
# Three prefixes of three widths: merged, the two shorter would be left-padded to the widest.
WIDTHS = (
    "Refund it.",
    "Please refund the duplicate charge on my card from last week.",
    "Where is my parcel? It was due on Monday, the tracking page shows nothing, and nobody answers the phone.",
)
# As wide as the widest of WIDTHS: merged with them, it is not padded.
AS_WIDE = "Where is my order? It was due on Friday, the tracking page shows nothing, and nobody answers the mails."
GATE = load_gates("vela2")["cpu-fp32"]


def batch_requests(text: str, profile: str) -> tuple[float, float]:
    """(forwards, requests in them) of ``profile`` so far, from ``/metrics``."""
    return (
        metric(text, "s1omni_batch_requests_count", profile=profile),
        metric(text, "s1omni_batch_requests_sum", profile=profile),
    )


def texts_of_forwards(watch: Watch, texts: tuple[str, ...]) -> list[list[str]]:
    return [sorted(run) for run, _, _ in watch.forwards if set(run) & set(texts)]


@pytest.fixture(scope="module")
def widths(engine_model: Any) -> None:
    lengths = [prefix_lengths(engine_model, text) for text in (*WIDTHS, AS_WIDE)]
    assert all(len(length) == 1 for length in lengths)
    assert len(set().union(*lengths[:3])) == 3 and lengths[3] == lengths[2], lengths


def test_exact_requests_queued_together_run_alone_and_answer_byte_for_byte_as_alone(
    engine_model: Any, widths: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker is held in the first request's forward until the other two are queued together:
    a scheduler that merged them would run them in one forward, the narrower left-padded."""
    first, rest = WIDTHS[0], WIDTHS[1:]
    watch = Watch(engine_model, monkeypatch)
    with serving(engine_model, PROFILES) as running, ThreadPoolExecutor(len(WIDTHS)) as pool:
        before = running.metrics()

        def hold(texts: list[str]) -> None:
            if texts == [first]:
                assert running.service.scheduler is not None
                wait_for(lambda: running.service.scheduler.depth() == len(rest), "the others never queued behind the first")

        watch.hold_forward = hold
        early = pool.submit(post, running, body(first, profile="exact"))
        assert watch.forwarding[first].wait(TIMEOUT_S)
        queued = [pool.submit(post, running, body(text)) for text in rest]  # exact: the default
        concurrent = [future.result(TIMEOUT_S) for future in (early, *queued)]
        forwards = texts_of_forwards(watch, WIDTHS)
        counted = batch_requests(running.metrics(), "exact")
        watch.hold_forward = lambda texts: None
        alone = [post(running, body(text)) for text in WIDTHS]
    assert forwards[0] == [first] and sorted(forwards) == sorted([text] for text in WIDTHS)
    forwards_before, requests_before = batch_requests(before, "exact")
    assert counted == (forwards_before + 3, requests_before + 3)  # one request a forward
    for response, reference in zip(concurrent, alone, strict=True):
        assert response.status_code == reference.status_code == 200, response.text
        assert response.content == reference.content


def test_batching_requests_sent_together_share_a_forward_within_the_gate_of_alone(
    engine_model: Any, widths: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    texts = (*WIDTHS, AS_WIDE)
    late = "This one's deadline passes while it waits for the others."
    watch = Watch(engine_model, monkeypatch)
    with serving(engine_model, PROFILES) as running:
        before = running.metrics()
        bodies = [body(text, profile="batching") for text in texts]
        sent = together(running, [*bodies, body(late, profile="batching", deadline_ms=1)])
        counted = batch_requests(running.metrics(), "batching")
        alone = [post(running, body(text)) for text in texts]
    assert texts_of_forwards(watch, (*texts, late)) == [sorted(texts), *([text] for text in texts)]
    forwards_before, requests_before = batch_requests(before, "batching")
    assert counted == (forwards_before + 1, requests_before + len(texts))
    *merged, expired = sent
    assert expired.status == 200 and {answer["error"] for answer in expired.json()["answers"].values()} == {"deadline_exceeded"}
    for text, exchange, reference in zip(texts, merged, alone, strict=True):
        assert exchange.status == reference.status_code == 200, exchange.body
        stats = compare(reference.json(), exchange.json(), GATE["decision_margin"])
        assert not stats.failures and stats.same_decisions == stats.decisions and not stats.ties, (text, stats)
        assert stats.max_probability <= GATE["max_probability"] and stats.max_score <= GATE["max_score"], (text, stats)
        if prefix_lengths(engine_model, text) == prefix_lengths(engine_model, WIDTHS[-1]):  # not padded
            assert exchange.body == reference.content, text


@pytest.fixture(scope="module")
def packed_model(exported: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The tiny member's CPU engine whose merged packed forwards passed ``s1omni validate --merged 2 --shared-context``
    (on two calibration cases: what is tested here is the server's use of the verdict), loaded as serve loads it."""
    from s1omni.calib import CALIB
    from s1omni.export.reference import load_cases
    from s1omni.runtime.engine import load_engine_model

    root = tmp_path_factory.mktemp("packed-batching")
    cases = root / "cases.json"
    cases.write_text(json.dumps({"cases": [case for case in load_cases(CALIB / "vela2") if case["name"] in ("golden", "prefix-one-token")]}))
    s1omni("build", str(exported), "--backend", "onnxruntime", "--target", "cpu", "--out", str(root / "engine"))
    s1omni("validate", str(root / "engine"), "--merged", "2", "--shared-context", "--cases", str(cases))
    return load_engine_model(root / "engine", allow_unvalidated=True)


def test_batching_on_an_engine_whose_merged_packed_forwards_passed_runs_packed_rows_within_the_gate_of_alone(
    packed_model: Any, widths: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vela2.md §8: batching is shared_context's layout, merged across requests. The four requests sent together
    run as one packed forward (their blocks packed behind each prefix); alone, exact runs them in its own layout."""
    texts = (*WIDTHS, AS_WIDE)
    watch = Watch(packed_model, monkeypatch)
    with serving(packed_model, PROFILES) as running:
        card = httpx.get(running.url + "/v1/models", timeout=TIMEOUT_S).json()["data"][0]
        sent = together(running, [body(text, profile="batching") for text in texts])
        alone = [post(running, body(text)) for text in texts]
    batching = card["profiles"][1]
    assert batching["name"] == "batching" and batching["check"]["gate"] == "cpu-fp32", batching
    assert "packed into one row behind its prefix" in batching["description"] and "2 calibration cases to a forward" in batching["description"]
    assert [sorted(run) for run, _, _ in watch.packed_forwards if set(run) & set(texts)] == [sorted(texts)]
    assert texts_of_forwards(watch, texts) == [[text] for text in texts]  # exact's, alone
    for text, exchange, reference in zip(texts, sent, alone, strict=True):
        assert exchange.status == reference.status_code == 200, exchange.body
        stats = compare(reference.json(), exchange.json(), GATE["decision_margin"])
        assert not stats.failures and stats.same_decisions == stats.decisions and not stats.ties, (text, stats)
        assert stats.max_probability <= GATE["max_probability"] and stats.max_score <= GATE["max_score"], (text, stats)


@pytest.mark.parametrize(("check", "packs"), [(None, False), ({"passed": False}, False), ({"passed": True}, True)])
def test_batching_packs_only_on_a_passed_merged_packed_verdict(check: dict[str, Any] | None, packs: bool) -> None:
    from types import SimpleNamespace

    from s1omni.server.profiles import packed_batching_check

    assert (packed_batching_check(SimpleNamespace(merged_packed_check=check)) is not None) == packs
    assert packed_batching_check(SimpleNamespace()) is None  # a model without the attribute (another family, a package)


# -- s1omni serve --profiles ---------------------------------------------------------------------

SMALL = {"state": "Please refund the duplicate charge.", "questions": {"refund": {"type": "noul", "instructions": "A refund?"}}}


@pytest.fixture(scope="module")
def server(start, tiny_vela: Path) -> Iterator[Server]:
    server = start(str(tiny_vela), "--profiles", "batching")
    server.wait_status("ready")
    yield server
    server.stop()


def test_the_card_lists_exactly_the_enabled_profiles(server: Server) -> None:
    card = server.client.get("/v1/models").json()["data"][0]
    assert card["profile"] == "exact"
    exact, batching = card["profiles"]
    assert list(exact) == list(batching) == ["name", "numerics", "description"]
    assert (exact["name"], exact["numerics"]) == ("exact", "exact") and "each request alone" in exact["description"]
    assert (batching["name"], batching["numerics"]) == ("batching", "approximate")
    assert "2 ms window" in batching["description"] and "gate of exact" in batching["description"]


@pytest.mark.parametrize("profile", PROFILES)
def test_meta_names_the_profile_a_request_ran(server: Server, profile: str) -> None:
    response = server.post({**SMALL, "options": {"profile": profile, "return_meta": True}})
    assert response.status_code == 200, response.text
    meta = response.json()["meta"]
    assert (meta["profile"], meta["numerics"]) == (profile, {"exact": "exact", "batching": "approximate"}[profile])


@pytest.mark.parametrize(
    ("profile", "message"),
    [
        ("fastest", "options.profile 'fastest' is not enabled on this server, which runs ['exact', 'batching']"),
        ("shared_context", "options.profile 'shared_context' is not enabled on this server, which runs ['exact', 'batching'] "
                           "(`s1omni serve --profiles shared_context` enables it)"),
        ("max_speed", "options.profile 'max_speed' is not enabled on this server, which runs ['exact', 'batching'] "
                      "(`s1omni serve --profiles max_speed --reduced-copy COPY` enables it)"),
        ("Batching", "options.profile must be a profile name ([a-z][a-z0-9_]*): one of ['exact', 'batching']"),
        (7, "options.profile must be a profile name ([a-z][a-z0-9_]*): one of ['exact', 'batching']"),
    ],
)
def test_a_profile_the_server_does_not_run_is_400_listing_those_it_does(server: Server, profile: Any, message: str) -> None:
    assert error(server.post({**SMALL, "options": {"profile": profile}}), 400, "invalid_request") == message
