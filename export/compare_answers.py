"""Answer-level comparison of an engine's JSON answers with the reference's, per case.

Decisions are the choice key, the score's most probable level, a noul's side of 0.5, a set's
selected labels and a span question's set of (label, start, end). A decision's margin is the
reference's top-two probability gap (choice, score) or twice its distance to the decision boundary
(noul: 0.5; set: the nearest label to the threshold); gates with a margin hold only decisions at
least that clear. Probabilities are every
probability the answers report (choice and score probabilities, abstain, noul, set labels, the
probability of spans both sides found).

OmniJev answers (``compare_omnijev``) carry no ``type``: the kind shows in their fields. Their
decisions are the choice key (with ``valid``), the score's level key and a noul's side of 0.5;
their probabilities are noul, every choice and score probability and abstain; their score
expectation is the expected level position, 0 at the first level and 1 at the last.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class CaseStats:
    max_probability: float = 0.0
    max_score: float = 0.0
    decisions: int = 0
    same_decisions: int = 0
    margin_decisions: int = 0  # decisions whose reference top-two margin is at least the gate's margin
    same_margin_decisions: int = 0
    span_sets: int = 0
    same_span_sets: int = 0
    usage_equal: bool = True
    problems: list[str] = field(default_factory=list)

    def probability(self, a: float, b: float) -> None:
        self.max_probability = max(self.max_probability, abs(a - b))

    def decision(self, same: bool, top_two: float, margin: float, what: str) -> None:
        """One decision; ``top_two`` is the reference's margin, held to the gate's ``margin``."""
        self.decisions += 1
        self.same_decisions += same
        if top_two >= margin:
            self.margin_decisions += 1
            self.same_margin_decisions += same
        if not same:
            self.problems.append(what)


def _margin(probabilities: dict[str, float]) -> float:
    ranked = sorted(probabilities.values(), reverse=True)
    return ranked[0] - ranked[1] if len(ranked) > 1 else 1.0


def _argmax(probabilities: dict[str, float]) -> str:
    return max(probabilities, key=lambda key: probabilities[key])


def compare(reference: dict[str, Any], engine: dict[str, Any], margin: float) -> CaseStats:
    stats = CaseStats(usage_equal=reference["usage"] == engine["usage"])
    if not stats.usage_equal:
        stats.problems.append(f"usage {engine['usage']} != {reference['usage']}")

    probability = stats.probability

    def decision(same: bool, top_two: float, what: str) -> None:
        stats.decision(same, top_two, margin, what)

    for key, ref in reference["answers"].items():
        got = engine["answers"].get(key)
        if got is None or ("error" in ref) != ("error" in got):
            stats.problems.append(f"{key}: {got} vs {ref}")
            stats.decisions += 1
            continue
        if "error" in ref:
            decision(ref["error"] == got["error"], 1.0, f"{key}: error {got['error']} != {ref['error']}")
        elif ref["type"] == "choice":
            for option, p in ref["probabilities"].items():
                probability(p, got["probabilities"][option])
            probability(ref["abstain_probability"], got["abstain_probability"])
            decision(ref["choice"] == got["choice"], _margin(ref["probabilities"]), f"{key}: {got['choice']} != {ref['choice']}")
        elif ref["type"] == "score":
            for level, p in ref["probabilities"].items():
                probability(p, got["probabilities"][level])
            stats.max_score = max(stats.max_score, abs(ref["score"] - got["score"]))
            same = _argmax(ref["probabilities"]) == _argmax(got["probabilities"])
            decision(same, _margin(ref["probabilities"]), f"{key}: level {_argmax(got['probabilities'])}")
        else:
            probability(ref["noul"], got["noul"])
            same = (ref["noul"] > 0.5) == (got["noul"] > 0.5)
            decision(same, abs(ref["noul"] - 0.5) * 2, f"{key}: noul {got['noul']:.6f} vs {ref['noul']:.6f}")
    for key, ref in reference.get("sets", {}).items():
        got = engine.get("sets", {}).get(key, {"selected": None})
        threshold = reference["thresholds"][key]
        nearest = min(abs(p - threshold) for p in ref["probabilities"].values()) * 2
        decision(ref["selected"] == got["selected"], nearest, f"sets.{key}: {got['selected']} != {ref['selected']}")
    for key, ref in reference.get("spans", {}).items():
        got = engine.get("spans", {}).get(key, [])
        ref_set = {(s["label"], s["start"], s["end"]): s["probability"] for s in ref}
        got_set = {(s["label"], s["start"], s["end"]): s["probability"] for s in got}
        stats.span_sets += 1
        stats.same_span_sets += ref_set.keys() == got_set.keys()
        if ref_set.keys() != got_set.keys():
            stats.problems.append(_span_difference(key, ref_set, got_set, reference.get("thresholds", {}).get(key)))
        for span in ref_set.keys() & got_set.keys():
            probability(ref_set[span], got_set[span])
    for key, ref in reference.get("thresholds", {}).items():
        if abs(ref - engine.get("thresholds", {}).get(key, float("nan"))) > 1e-12:
            stats.problems.append(f"thresholds.{key} differs")
    return stats


def _span_difference(key: str, reference: dict[tuple[str, int, int], float], engine: dict[tuple[str, int, int], float],
                     threshold: float | None) -> str:
    """A span set that differs, with the spans only one side found and their mean probabilities: a
    span that comes and goes with a word at the threshold shows a probability near it."""

    def listed(spans: dict[tuple[str, int, int], float], others: dict[tuple[str, int, int], float]) -> str:
        only = sorted(spans.keys() - others.keys(), key=lambda span: span[1])
        shown = ", ".join(f"{label} [{start}, {end}) p={spans[label, start, end]:.6f}" for label, start, end in only[:3])
        return shown + (f" and {len(only) - 3} more" if len(only) > 3 else "") if only else "none"

    at = f" at threshold {threshold:.6f}" if threshold is not None else ""
    return (f"spans.{key}: {len(engine)} spans vs {len(reference)}{at}; reference only: {listed(reference, engine)};"
            f" engine only: {listed(engine, reference)}")


def compare_omnijev(reference: dict[str, Any], engine: dict[str, Any], margin: float) -> CaseStats:
    """One OmniJev response against the reference's (answers in the reference's key order)."""
    stats = CaseStats(usage_equal=reference["usage"] == engine["usage"])
    if not stats.usage_equal:
        stats.problems.append(f"usage {engine['usage']} != {reference['usage']}")
    if reference["model"] != engine["model"]:
        stats.decision(False, 1.0, margin, f"model {engine['model']} != {reference['model']}")
    for key, ref in reference["answers"].items():
        got = engine["answers"].get(key)
        if got is None or got.keys() != ref.keys():
            stats.decision(False, 1.0, margin, f"{key}: {got} vs {ref}")
        elif "choice" in ref:
            for option, p in ref["probabilities"].items():
                stats.probability(p, got["probabilities"][option])
            stats.probability(ref["abstain"], got["abstain"])
            same = (ref["choice"], ref["valid"]) == (got["choice"], got["valid"])
            stats.decision(same, _margin(ref["probabilities"]), margin, f"{key}: {got['choice']} != {ref['choice']}")
        elif "score" in ref:
            for level, p in ref["probabilities"].items():
                stats.probability(p, got["probabilities"][level])
            stats.max_score = max(stats.max_score, abs(_expected_level(ref) - _expected_level(got)))
            stats.decision(ref["score"] == got["score"], _margin(ref["probabilities"]), margin, f"{key}: level {got['score']} != {ref['score']}")
        else:
            stats.probability(ref["noul"], got["noul"])
            same = (ref["noul"] > 0.5) == (got["noul"] > 0.5)
            stats.decision(same, abs(ref["noul"] - 0.5) * 2, margin, f"{key}: noul {got['noul']:.6f} vs {ref['noul']:.6f}")
    return stats


def _expected_level(answer: dict[str, Any]) -> float:
    probabilities = list(answer["probabilities"].values())
    return sum(p * i for i, p in enumerate(probabilities)) / max(len(probabilities) - 1, 1)
