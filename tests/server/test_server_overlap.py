"""The worker thread runs only the forward: over a real uvicorn server, in this process, on the tiny
member's ONNX Runtime CPU engine (``inprocess``). Requests merged into one forward (the ``batching``
profile) answer byte for byte as each alone where their prefixes are of one width; a request's heads
run while the next forward does; a request whose finish fails is answered 500 alone, the others of
its forward as if nothing had happened.

Requests meant to share a forward are held in the batching window by bodies whose last byte is not
sent yet: the worker waits while a request is on its way.

Merged answers are compared byte for byte for requests whose prefixes are of one length: the engine
left-pads a shorter prefix to its batch's widest, which moves that request's hidden states by about
5e-7 (float32 rounding in the padded prefill), enough to flip a probability's fourth decimal now and
then (``test_server_profiles`` holds those to the gate); a request whose finish fails is answered
500 whatever its length.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from inprocess import TIMEOUT_S, Watch, body, post, prefix_lengths, serving, text_of, together

BATCHING = ("exact", "batching")
# Three requests of one prefix length (32 tokens with these questions): nothing padded (see above).
TEXTS = (
    "Please resend the missing parcel to my house.",
    "The app crashes whenever I open settings.",
    "I want to cancel my order before it ships.",
)
BROKEN = "This request's finish raises."


def merged(running: Any, texts: tuple[str, ...]) -> list[Any]:
    return together(running, [body(text, profile="batching") for text in texts])


def test_requests_merged_into_one_forward_answer_byte_for_byte_as_each_alone(engine_model: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    assert len(set().union(*(prefix_lengths(engine_model, text) for text in TEXTS))) == 1  # nothing padded (see TEXTS)
    watch = Watch(engine_model, monkeypatch)
    with serving(engine_model, BATCHING) as running:
        sent = merged(running, TEXTS)
        alone = [post(running, body(text)) for text in TEXTS]
    assert [sorted(texts) for texts, _, _ in watch.forwards_of(TEXTS[0])] == [sorted(TEXTS), [TEXTS[0]]]
    assert all(len(watch.forwards_of(text)) == 2 for text in TEXTS)  # one forward with the others, one alone
    for exchange, response in zip(sent, alone, strict=True):
        assert exchange.status == response.status_code == 200, exchange.body
        assert exchange.body == response.content
    assert len({exchange.body for exchange in sent}) == len(TEXTS)  # three different answers, each in its place


def test_the_next_forward_runs_while_a_request_is_in_its_heads(engine_model: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first request's heads wait until the second request's forward has begun: were the heads
    on the worker thread, that forward could not begin, and the wait would run out."""
    first, second = TEXTS[:2]
    watch = Watch(engine_model, monkeypatch)

    def hold(text: str) -> None:
        if text == first and not watch.forwarding[second].wait(TIMEOUT_S):
            raise AssertionError("the second forward never began while the first request's heads ran")

    watch.hold = hold
    with serving(engine_model) as running, ThreadPoolExecutor(1) as pool:
        early = pool.submit(post, running, body(first))
        assert watch.reading[first].wait(TIMEOUT_S)
        late = post(running, body(second))  # read, planned, queued and forwarded while the first waits in its heads
        answered = early.result(TIMEOUT_S)
    assert answered.status_code == late.status_code == 200, answered.text
    [(_, first_started, first_ended)] = watch.forwards_of(first)
    [(_, second_started, _)] = watch.forwards_of(second)
    [heads_started, heads_ended] = [(start, end) for text, start, end in watch.readouts if text == first][0]
    assert first_started < first_ended <= heads_started < second_started < heads_ended


def test_a_request_whose_finish_fails_is_answered_500_alone(
    engine_model: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    finish = engine_model.finish

    def breaking(plan: Any, result: Any) -> dict[str, Any]:
        if text_of(plan) == BROKEN:
            raise RuntimeError("finish broke on purpose")
        return finish(plan, result)

    watch = Watch(engine_model, monkeypatch)
    monkeypatch.setattr(engine_model, "finish", breaking)
    texts = (TEXTS[0], BROKEN, TEXTS[1])
    with caplog.at_level(logging.ERROR, logger="s1omni.server"), serving(engine_model, BATCHING) as running:
        sent = merged(running, texts)
        alone = [post(running, body(text)) for text in texts]
    assert [sorted(texts) for texts, _, _ in watch.forwards_of(BROKEN)] == [sorted(texts), [BROKEN]]
    refusal = {"error": {"code": "internal_error", "message": "RuntimeError: finish broke on purpose"}}
    for exchange, response in zip(sent, alone, strict=True):
        if exchange is sent[1]:
            assert exchange.status == response.status_code == 500 and exchange.json() == response.json() == refusal
        else:
            assert exchange.status == response.status_code == 200 and exchange.body == response.content
    failed = [record for record in caplog.records if record.getMessage() == "request failed"]
    assert len(failed) == 2 and all(record.exc_info and record.exc_info[0] is RuntimeError for record in failed)
