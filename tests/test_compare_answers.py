"""Answer comparison: a differing span set names the spans only one side found (the validation table
prints it under its case: tests/test_gate.py)."""

from __future__ import annotations

from s1omni.export.compare_answers import compare


def _answer(spans: list[tuple[str, int, int, float]]) -> dict:
    return {
        "usage": {"input_tokens": 10},
        "answers": {"q": {"type": "noul", "noul": 0.7}},
        "spans": {"q": [{"label": label, "start": start, "end": end, "probability": p} for label, start, end, p in spans]},
        "thresholds": {"q": 0.5},
    }


def test_identical_span_sets_count_as_same() -> None:
    spans = [("PER", 0, 5, 0.9), ("LOC", 10, 14, 0.6)]
    stats = compare(_answer(spans), _answer(spans), margin=0.05)
    assert (stats.span_sets, stats.same_span_sets, stats.problems) == (1, 1, [])


def test_a_split_span_is_named_with_its_probabilities() -> None:
    reference = _answer([("PER", 0, 11, 0.51)])
    engine = _answer([("PER", 0, 5, 0.52), ("PER", 6, 11, 0.5)])
    stats = compare(reference, engine, margin=0.05)
    assert (stats.span_sets, stats.same_span_sets) == (1, 0)
    assert stats.problems == [
        "spans.q: 2 spans vs 1 at threshold 0.500000; reference only: PER [0, 11) p=0.510000;"
        " engine only: PER [0, 5) p=0.520000, PER [6, 11) p=0.500000"
    ]


def test_a_long_difference_is_cut_to_three_spans() -> None:
    engine = _answer([("PER", start, start + 1, 0.6) for start in range(0, 10, 2)])
    stats = compare(_answer([]), engine, margin=0.05)
    assert stats.problems[0].endswith("reference only: none; engine only: PER [0, 1) p=0.600000, PER [2, 3) p=0.600000, PER [4, 5) p=0.600000 and 2 more")


def test_a_span_threshold_moved_by_the_sparse_gate_is_a_span_set_decided_otherwise() -> None:
    spans = [("PER", 0, 5, 0.9)]
    engine = {**_answer(spans), "thresholds": {"q": 0.1}}
    stats = compare(_answer(spans), engine, margin=0.05)
    assert stats.failures == [] and (stats.span_sets, stats.same_span_sets) == (1, 0)
    assert stats.problems == ["spans.q: decoded at threshold 0.100000 where the reference decoded at 0.500000 (the PII sparse gate)"]


def test_another_threshold_fails_the_case() -> None:
    reference = {**_answer([]), "thresholds": {"q": 0.5, "labels": 0.4}}
    engine = {**_answer([]), "thresholds": {"q": 0.5, "labels": 0.3}}
    stats = compare(reference, engine, margin=0.05)
    assert stats.failures == ["thresholds.labels: 0.3 != 0.4"] and (stats.span_sets, stats.same_span_sets) == (1, 1)
