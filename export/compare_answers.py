"""Answer-level comparison of an engine's JSON answers with the reference's, per case.

Decisions are the choice key, the score's most probable level, a noul's side of 0.5, a set's
selected labels and a span question's set of (label, start, end). A decision's margin is the
reference's top-two probability gap (choice, score) or twice its distance to the decision boundary
(noul: 0.5; set: the nearest label to the threshold); gates with a margin hold only decisions at
least that clear. Probabilities are every probability the answers report (choice and score
probabilities, abstain, noul, set labels, the probability of spans both sides found).

Failures fail the case at every gate, whatever the figures: an answer missing, extra, or an error
where the reference answered (or the other way round), a probability that is not finite, other
usage or other thresholds, except a span question's threshold: the PII sparse gate
(``s1omni.runtime.vela2.calibration``) moves it by what the spans at its probe threshold are, so a
moved one is that span set decided otherwise (never a tie: the record keeps no probe spans). The
BF16 reference's own BF16 moved one on the tiny member on the H200 (case span-pii-sparse-gate-over-k).

Tie rule (``shared/DESIGN.md``, Numerical contract): a differing decision or span set whose only
differing items lie, in the reference's probabilities, within twice the case's measured max |dp|
of their boundary counts as identical and is listed as a tie. The items and their boundaries: a
noul's probability and 0.5; each set label selected by one side only and the threshold; the two
levels or options the sides chose and their midpoint (an argmax flips where they are equal); each
span only one side found and the threshold, at its mean word probability (the reference's for a
span only it found, the engine's for one only the engine found: the record keeps no word
probabilities). A span set that differs otherwise (a label changed, a span split) is no tie.

OmniJev answers (``compare_omnijev``) carry no ``type``: the kind shows in their fields. Their
decisions are the choice key (with ``valid``), the score's level key and a noul's side of 0.5;
their probabilities are noul, every choice and score probability and abstain; their score
expectation is the expected level position, 0 at the first level and 1 at the last.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

Span = tuple[str, int, int]


@dataclass
class CaseStats:
    max_probability: float = 0.0
    sum_probability: float = 0.0  # of |dp|, for the mean
    probabilities: int = 0
    max_score: float = 0.0
    decisions: int = 0
    same_decisions: int = 0  # ties included
    margin_decisions: int = 0  # decisions whose reference top-two margin is at least the gate's margin
    same_margin_decisions: int = 0
    span_sets: int = 0
    same_span_sets: int = 0  # ties included
    usage_equal: bool = True
    failures: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # differing decisions and span sets
    ties: list[str] = field(default_factory=list)

    @property
    def mean_probability(self) -> float:
        return self.sum_probability / self.probabilities if self.probabilities else 0.0


@dataclass(frozen=True)
class _Difference:
    """A decision (or span set) as compared: ``distances`` of its differing items to their boundary, in
    the reference's probabilities; None where no item explains the difference."""

    same: bool
    top_two: float
    distances: tuple[float, ...] | None
    what: str
    span_set: bool = False


class _Comparison:
    """Collects one case's probabilities and decisions, then settles ties against its max |dp|."""

    def __init__(self, reference: dict[str, Any], engine: dict[str, Any], margin: float):
        self.stats = CaseStats(usage_equal=reference["usage"] == engine["usage"])
        self.margin = margin
        self.differences: list[_Difference] = []
        if not self.stats.usage_equal:
            self.stats.failures.append(f"usage {engine['usage']} != {reference['usage']}")

    def probability(self, reference: float, engine: Any, where: str) -> None:
        if not isinstance(engine, (int, float)) or not math.isfinite(engine):
            self.stats.failures.append(f"{where}: probability {engine!r} is not finite")
            return
        difference = abs(reference - engine)
        self.stats.max_probability = max(self.stats.max_probability, difference)
        self.stats.sum_probability += difference
        self.stats.probabilities += 1

    def score(self, reference: float, engine: Any, where: str) -> None:
        if not isinstance(engine, (int, float)) or not math.isfinite(engine):
            self.stats.failures.append(f"{where}: score {engine!r} is not finite")
            return
        self.stats.max_score = max(self.stats.max_score, abs(reference - engine))

    def decision(self, same: bool, top_two: float, distances: tuple[float, ...] | None, what: str) -> None:
        self.differences.append(_Difference(same, top_two, distances, what))

    def span_set(self, same: bool, distances: tuple[float, ...] | None, what: str) -> None:
        self.differences.append(_Difference(same, 0.0, distances, what, span_set=True))

    def keys(self, section: str, reference: dict[str, Any], engine: Any) -> list[str]:
        """The keys both sides answered; a key only one side has is a failure."""
        engine = engine if isinstance(engine, dict) else {}
        for key in reference.keys() - engine.keys():
            self.stats.failures.append(f"{section}{key}: no answer where the reference answered")
        for key in engine.keys() - reference.keys():
            self.stats.failures.append(f"{section}{key}: an answer the reference did not give")
        return [key for key in reference if key in engine]

    def finish(self) -> CaseStats:
        stats, tolerance = self.stats, 2 * self.stats.max_probability
        for item in self.differences:
            tie = not item.same and bool(item.distances) and max(item.distances) <= tolerance  # type: ignore[arg-type]
            same = item.same or tie
            if tie:
                stats.ties.append(f"{item.what} (tie: within {tolerance:.3g} of the boundary)")
            elif not same:
                stats.problems.append(item.what)
            if item.span_set:
                stats.span_sets += 1
                stats.same_span_sets += same
                continue
            stats.decisions += 1
            stats.same_decisions += same
            if item.top_two >= self.margin:
                stats.margin_decisions += 1
                stats.same_margin_decisions += same
        return stats


def _margin(probabilities: dict[str, float]) -> float:
    ranked = sorted(probabilities.values(), reverse=True)
    return ranked[0] - ranked[1] if len(ranked) > 1 else 1.0


def most_probable(probabilities: dict[str, float]) -> str:
    """A score's decision: its most probable level (the first of equal ones)."""
    return max(probabilities, key=lambda key: probabilities[key])


def _flip(probabilities: dict[str, float], reference: str, engine: Any) -> tuple[float, ...] | None:
    """Distance of the reference's pick and the engine's to their midpoint, in the reference's probabilities."""
    if engine not in probabilities:
        return None
    return ((probabilities[reference] - probabilities[engine]) / 2,)


def _noul(comparison: _Comparison, key: str, reference: float, engine: Any) -> None:
    comparison.probability(reference, engine, key)
    if not isinstance(engine, (int, float)):
        return
    same = (reference > 0.5) == (engine > 0.5)
    comparison.decision(same, abs(reference - 0.5) * 2, (abs(reference - 0.5),), f"{key}: noul {engine:.6f} vs {reference:.6f}")


def _levels(comparison: _Comparison, key: str, reference: dict[str, float], engine: Any) -> None:
    engine = engine if isinstance(engine, dict) else {}
    for level, p in reference.items():
        comparison.probability(p, engine.get(level), f"{key}.{level}")


def compare(reference: dict[str, Any], engine: dict[str, Any], margin: float) -> CaseStats:
    comparison = _Comparison(reference, engine, margin)
    failures = comparison.stats.failures
    for key in comparison.keys("", reference["answers"], engine.get("answers")):
        ref, got = reference["answers"][key], engine["answers"][key]
        if ("error" in ref) != ("error" in got) or ref.get("error") != got.get("error"):
            failures.append(f"{key}: {'error ' + str(got['error']) if 'error' in got else 'an answer'} "
                            f"where the reference gave {'error ' + str(ref['error']) if 'error' in ref else 'an answer'}")  # fmt: skip
        elif "error" in ref:
            continue
        elif ref["type"] != got.get("type"):
            failures.append(f"{key}: a {got.get('type')} answer where the reference gave a {ref['type']} answer")
        elif ref["type"] == "choice":
            _levels(comparison, key, ref["probabilities"], got.get("probabilities"))
            comparison.probability(ref["abstain_probability"], got.get("abstain_probability"), f"{key}.abstain")
            comparison.decision(ref["choice"] == got["choice"], _margin(ref["probabilities"]),
                                _flip(ref["probabilities"], ref["choice"], got["choice"]), f"{key}: {got['choice']} != {ref['choice']}")  # fmt: skip
        elif ref["type"] == "score":
            _levels(comparison, key, ref["probabilities"], got.get("probabilities"))
            comparison.score(ref["score"], got.get("score"), f"{key}.score")
            want, have = most_probable(ref["probabilities"]), most_probable(got["probabilities"])
            comparison.decision(want == have, _margin(ref["probabilities"]), _flip(ref["probabilities"], want, have),
                                f"{key}: level {have} != {want}")  # fmt: skip
        else:
            _noul(comparison, key, ref["noul"], got.get("noul"))
    thresholds = reference.get("thresholds", {})
    for key in comparison.keys("sets.", reference.get("sets", {}), engine.get("sets")):
        ref, got = reference["sets"][key], engine["sets"][key]
        threshold = thresholds[key]
        nearest = min(abs(p - threshold) for p in ref["probabilities"].values()) * 2
        flipped = set(ref["selected"]) ^ set(got["selected"])
        distances = tuple(abs(ref["probabilities"][label] - threshold) for label in flipped) if flipped <= ref["probabilities"].keys() else None
        comparison.decision(ref["selected"] == got["selected"], nearest, distances, f"sets.{key}: {got['selected']} != {ref['selected']}")
    moved = {key for key in comparison.keys("thresholds.", thresholds, engine.get("thresholds"))
             if abs(thresholds[key] - engine["thresholds"][key]) > 1e-12}  # fmt: skip
    for key in comparison.keys("spans.", reference.get("spans", {}), engine.get("spans")):
        if key in moved:
            # The PII sparse gate picks a span question's threshold from the spans its probe threshold finds:
            # a decision on the model's output (the rest of a threshold is the layout's, checked above).
            comparison.span_set(False, None, f"spans.{key}: decoded at threshold {engine['thresholds'][key]:.6f} "
                                             f"where the reference decoded at {thresholds[key]:.6f} (the PII sparse gate)")  # fmt: skip
            moved.discard(key)
        else:
            _spans(comparison, key, reference["spans"][key], engine["spans"][key], thresholds.get(key))
    failures.extend(f"thresholds.{key}: {engine['thresholds'][key]} != {thresholds[key]}" for key in sorted(moved))
    return comparison.finish()


def _spans(comparison: _Comparison, key: str, reference: list[dict[str, Any]], engine: list[dict[str, Any]], threshold: float | None) -> None:
    ref_set = {(s["label"], s["start"], s["end"]): s["probability"] for s in reference}
    got_set = {(s["label"], s["start"], s["end"]): s["probability"] for s in engine}
    for span in ref_set.keys() & got_set.keys():
        comparison.probability(ref_set[span], got_set[span], f"spans.{key} {span[0]} [{span[1]}, {span[2]})")
    only = [ref_set[span] for span in ref_set.keys() - got_set.keys()] + [got_set[span] for span in got_set.keys() - ref_set.keys()]
    distances = tuple(abs(p - threshold) for p in only) if threshold is not None else None
    what = _span_difference(key, ref_set, got_set, threshold) if only else f"spans.{key}"
    comparison.span_set(not only, distances, what)


def _span_difference(key: str, reference: dict[Span, float], engine: dict[Span, float], threshold: float | None) -> str:
    """A span set that differs, with the spans only one side found and their mean probabilities: a
    span that comes and goes with a word at the threshold shows a probability near it."""

    def listed(spans: dict[Span, float], others: dict[Span, float]) -> str:
        only = sorted(spans.keys() - others.keys(), key=lambda span: span[1])
        shown = ", ".join(f"{label} [{start}, {end}) p={spans[label, start, end]:.6f}" for label, start, end in only[:3])
        return shown + (f" and {len(only) - 3} more" if len(only) > 3 else "") if only else "none"

    at = f" at threshold {threshold:.6f}" if threshold is not None else ""
    return (f"spans.{key}: {len(engine)} spans vs {len(reference)}{at}; reference only: {listed(reference, engine)};"
            f" engine only: {listed(engine, reference)}")


def compare_omnijev(reference: dict[str, Any], engine: dict[str, Any], margin: float) -> CaseStats:
    """One OmniJev response against the reference's (answers in the reference's key order)."""
    comparison = _Comparison(reference, engine, margin)
    failures = comparison.stats.failures
    if reference["model"] != engine.get("model"):
        failures.append(f"model {engine.get('model')} != {reference['model']}")
    for key in comparison.keys("", reference["answers"], engine.get("answers")):
        ref, got = reference["answers"][key], engine["answers"][key]
        if got.keys() != ref.keys():
            failures.append(f"{key}: fields {sorted(got)} where the reference gave {sorted(ref)}")
        elif "choice" in ref:
            _levels(comparison, key, ref["probabilities"], got["probabilities"])
            comparison.probability(ref["abstain"], got["abstain"], f"{key}.abstain")
            same = (ref["choice"], ref["valid"]) == (got["choice"], got["valid"])
            flip = _flip(ref["probabilities"], ref["choice"], got["choice"]) if ref["valid"] == got["valid"] else None
            comparison.decision(same, _margin(ref["probabilities"]), flip, f"{key}: {got['choice']} != {ref['choice']}")
        elif "score" in ref:
            _levels(comparison, key, ref["probabilities"], got["probabilities"])
            comparison.score(_expected_level(ref), _expected_level(got), f"{key}.score")
            comparison.decision(ref["score"] == got["score"], _margin(ref["probabilities"]),
                                _flip(ref["probabilities"], ref["score"], got["score"]), f"{key}: level {got['score']} != {ref['score']}")  # fmt: skip
        else:
            _noul(comparison, key, ref["noul"], got["noul"])
    return comparison.finish()


def _expected_level(answer: dict[str, Any]) -> float:
    probabilities = list(answer["probabilities"].values())
    return sum(p * i for i, p in enumerate(probabilities)) / max(len(probabilities) - 1, 1)
