"""The numerical gates (``shared/DESIGN.md``, Numerical contract), judged on records: the float32
reference's cases, the engine's, and on a GPU the BF16 reference's, each case its layout digest, its
compared answers and its tensors at the readouts (``hidden``; a vision member's ``image_embeds``).

Every gate fails a case on a different layout, an answer missing, extra or an error where the
reference answered (``compare_answers``), a tensor or probability that is not finite, or a tensor
off its bound (per case: max abs and relative L2 at the readouts). Beyond that:

- ``cpu-fp32`` and ``gpu`` hold fixed bounds from ``calib/<family>/gates.json``: max |dp| and the
  score difference per case, every decision at least ``decision_margin`` clear identical, and a
  share of identical span sets over the run.
- ``gpu-reduced`` holds each figure to what the reference does at BF16 on the same cases: max |dp|,
  mean |dp| and the score difference each <= max(floor, factor x the BF16 reference's), the
  hidden states' relative L2 per case <= factor x the BF16 reference's in that case + slack, and the
  clear-margin decisions kept and the identical span sets each at least the BF16 reference's count
  minus max(1, 2% of those compared). Without a BF16 reference it cannot pass.
- ``gpu-reduced-alone`` judges a reduced-precision engine's merged or packed forwards against its own
  forwards alone (``s1omni.export.merged_check``): the same BF16-relative bounds, the BF16 reference
  measured against the float32 reference as validation measured it (``bf16_against``), and every
  decision identical (``"decisions": "identical"``, margin 0), the reference's bar for its approximate
  profiles (``../shared/reference/vela2.md`` §9.2: no choice, score, noul or set decision changes).

Ties (``compare_answers``) count as identical everywhere, the BF16 reference's too.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from s1omni.calib import CALIB

from .compare_answers import CaseStats

Compare = Callable[[dict[str, Any], dict[str, Any], float], CaseStats]
REDUCED = "gpu-reduced"
REDUCED_GATES = (REDUCED, "gpu-reduced-alone")  # the gates whose bounds follow the BF16 reference


def load_gates(family: str) -> dict[str, Any]:
    return json.loads((CALIB / family / "gates.json").read_text(encoding="utf-8"))


@dataclass(frozen=True)
class CaseRecord:
    """One case as a runner answered it: what the gate compares."""

    name: str
    layout: str  # digest of its token ids and readouts
    answers: dict[str, Any]  # the compared answers
    tensors: dict[str, np.ndarray]  # at the readouts, by output name
    tokens: int = 0


def tensor_figures(reference: dict[str, np.ndarray], other: dict[str, np.ndarray]) -> tuple[dict[str, dict[str, float]], list[str]]:
    """Per output: max abs difference and relative L2 (``||other - ref|| / ||ref||``); and what is wrong outright."""
    figures, failures = {}, []
    for name, expected in reference.items():
        got = other.get(name)
        if got is None or got.shape != expected.shape:
            failures.append(f"{name}: shape {None if got is None else got.shape} != {expected.shape}")
            continue
        if not np.isfinite(got).all():
            failures.append(f"{name}: {int((~np.isfinite(got)).sum())} values are not finite")
            figures[name] = {"max_abs": float("inf"), "rel_l2": float("inf")}
            continue
        difference = got.astype(np.float64) - expected
        scale = float(np.linalg.norm(expected.astype(np.float64)))
        figures[name] = {
            "max_abs": float(np.abs(difference).max()) if difference.size else 0.0,
            "rel_l2": float(np.linalg.norm(difference)) / scale if scale else float(np.linalg.norm(difference)),
        }
    for name in other.keys() - reference.keys():
        failures.append(f"{name}: an output the reference does not have")
    return figures, failures


@dataclass
class _Side:
    """One runner's cases against the float32 reference: per case figures and answer stats."""

    tensors: list[dict[str, dict[str, float]]]
    stats: list[CaseStats]
    failures: list[list[str]]

    @classmethod
    def of(cls, reference: list[CaseRecord], cases: list[CaseRecord], compare: Compare, margin: float) -> _Side:
        side = cls([], [], [])
        for expected, got in zip(reference, cases, strict=True):
            figures, failures = tensor_figures(expected.tensors, got.tensors)
            stats = compare(expected.answers, got.answers, margin)
            if got.layout != expected.layout:
                failures.insert(0, "token ids or readouts differ from the reference's")
            side.tensors.append(figures)
            side.stats.append(stats)
            side.failures.append(failures + stats.failures)
        return side

    def total(self, name: str) -> Any:
        values = [getattr(stats, name) for stats in self.stats]
        return max(values, default=0.0) if name.startswith("max_") else sum(values)

    def mean_probability(self) -> float:
        count = self.total("probabilities")
        return self.total("sum_probability") / count if count else 0.0


def _count(stats: list[CaseStats], same: str, total: str) -> tuple[int, int]:
    return sum(getattr(s, same) for s in stats), sum(getattr(s, total) for s in stats)


def _figure(engine: float, bound: float | None, bf16: float | None = None) -> dict[str, float | None]:
    return {"engine": engine, **({"bf16": bf16} if bf16 is not None else {}), "bound": bound}


def judge(gate_name: str, gate: dict[str, Any], compare: Compare, reference: list[CaseRecord], engine: list[CaseRecord],
          bf16: list[CaseRecord] | None = None, bf16_against: list[CaseRecord] | None = None) -> dict[str, Any]:  # fmt: skip
    """The report of ``engine`` at the gate: ``passed``, ``failures`` (each naming its case), ``summary``
    (the engine's figures), ``figures`` (the gated run figures: engine, BF16 reference where there is
    one, bound) and ``table`` (one row per case). The BF16 reference is measured against ``bf16_against``
    (the float32 reference's records of the same cases) where given, else against ``reference``."""
    margin = gate["decision_margin"]
    ours = _Side.of(reference, engine, compare, margin)
    theirs = _Side.of(bf16_against or reference, bf16, compare, margin) if bf16 is not None else None
    reduced = gate_name in REDUCED_GATES
    identical = not reduced or gate.get("decisions") == "identical"  # every decision at least the margin clear, not a count
    failures: list[str] = []
    if reduced and theirs is None:
        failures.append(f"{gate_name} holds the engine to the BF16 reference, which is recorded on a GPU only: validate on a GPU")
    for case, problems in zip(bf16 or [], theirs.failures if theirs is not None else [], strict=True):
        # A bound taken from a broken record would hold nothing (an infinite relative L2 allows any).
        failures.extend(f"the BF16 reference's case {case.name}: {problem}; make it again" for problem in problems)

    def bound(name: str) -> float:
        """A fixed gate's bound, or a reduced gate's max(floor, factor x the BF16 reference's run figure)."""
        if not reduced:
            return gate[name]
        if theirs is None:
            return gate["floors"][name]
        figure = theirs.mean_probability() if name == "mean_probability" else theirs.total(name)
        return max(gate["floors"][name], gate["factor"] * figure)

    bounds = {name: bound(name) for name in ("max_probability", "max_score")}
    rows = []
    for index, (case, stats) in enumerate(zip(engine, ours.stats, strict=True)):
        problems = list(ours.failures[index])
        tensor_bounds = {}
        for output, figures in ours.tensors[index].items():
            if reduced:
                bf16_l2 = theirs.tensors[index].get(output, {"rel_l2": 0.0})["rel_l2"] if theirs is not None else 0.0
                tensor_bounds[output] = {"rel_l2": gate["factor"] * bf16_l2 + gate["tensor"]["rel_l2_slack"]}
            else:
                tensor_bounds[output] = dict(gate["tensor"])
            for figure, limit in tensor_bounds[output].items():
                if not figures[figure] <= limit:
                    problems.append(f"{output} {figure.replace('_', ' ')} {figures[figure]:.3e} > {limit:.3e}")
        for name, limit in bounds.items():
            if not getattr(stats, name) <= limit:
                problems.append(f"{name.replace('_', ' ')} {getattr(stats, name):.3e} > {limit:.3e}")
        if identical and stats.same_margin_decisions < stats.margin_decisions:
            problems.append(f"{stats.margin_decisions - stats.same_margin_decisions} decisions at least {margin} clear differ")
        row = {
            "case": case.name, "tokens": case.tokens, "same_layout": case.layout == reference[index].layout,
            "tensors": ours.tensors[index], "tensor_bounds": tensor_bounds,
            "max_probability": stats.max_probability, "probability_bound": bounds["max_probability"],
            "mean_probability": stats.mean_probability, "max_score": stats.max_score,
            "decisions": f"{stats.same_decisions}/{stats.decisions}",
            "margin_decisions": f"{stats.same_margin_decisions}/{stats.margin_decisions}",
            "span_sets": f"{stats.same_span_sets}/{stats.span_sets}",
            "passed": not problems, "failures": problems, "problems": stats.problems[:5], "ties": stats.ties,
        }  # fmt: skip
        if theirs is not None:
            row["bf16"] = {"tensors": theirs.tensors[index], "max_probability": theirs.stats[index].max_probability,
                           "decisions": f"{theirs.stats[index].same_decisions}/{theirs.stats[index].decisions}",
                           "span_sets": f"{theirs.stats[index].same_span_sets}/{theirs.stats[index].span_sets}"}  # fmt: skip
        failures.extend(f"case {case.name}: {problem}" for problem in problems)
        rows.append(row)

    figures: dict[str, Any] = {}  # the run's figures: engine, BF16 reference where there is one, bound
    for name in ("max_probability", "mean_probability", "max_score"):
        figure = ours.mean_probability() if name == "mean_probability" else ours.total(name)
        bf16_figure = None if theirs is None else theirs.mean_probability() if name == "mean_probability" else theirs.total(name)
        limit = bound(name) if reduced or name != "mean_probability" else None  # the fixed gates bound no mean
        figures[name] = _figure(figure, limit, bf16_figure)
        if limit is not None and not figure <= limit:
            failures.append(f"{name.replace('_', ' ')} {figure:.3e} > {limit:.3e} over the run")
    counts = {}
    for name, same, total in (("margin_decisions", "same_margin_decisions", "margin_decisions"), ("span_sets", "same_span_sets", "span_sets")):
        kept, compared = _count(ours.stats, same, total)
        counts[name] = f"{kept}/{compared}"
        bf16_kept = _count(theirs.stats, same, total)[0] if theirs is not None else None
        if name == "margin_decisions" and identical:
            least = compared
        elif reduced:
            least = (compared if bf16_kept is None else bf16_kept) - max(gate["count_slack"]["least"], gate["count_slack"]["share"] * compared)
        else:
            least = gate["span_sets"] * compared
        figures[name] = _figure(kept, least, bf16_kept) | {"compared": compared}
        if kept < least:
            cases = [row["case"] for row, stats in zip(rows, ours.stats, strict=True) if getattr(stats, same) < getattr(stats, total)]
            failures.append(f"{name.replace('_', ' ')} {kept}/{compared} < {least:g}: differing in case {', case '.join(cases)}")
    same_decisions, decisions = _count(ours.stats, "same_decisions", "decisions")
    summary: dict[str, Any] = {
        **{name: figure["engine"] for name, figure in figures.items() if name not in counts},
        "decisions": f"{same_decisions}/{decisions}",
        **counts,
        "ties": sum(len(stats.ties) for stats in ours.stats),
        "layouts_identical": all(row["same_layout"] for row in rows),
        "usage_identical": all(stats.usage_equal for stats in ours.stats),
    }
    for output in rows[0]["tensors"] if rows else {}:
        short = output.removesuffix("_embeds")  # hidden, image
        summary[f"{short}_max_abs"] = max(row["tensors"].get(output, {}).get("max_abs", float("inf")) for row in rows)
        summary[f"{short}_rel_l2"] = max(row["tensors"].get(output, {}).get("rel_l2", float("inf")) for row in rows)
    return {"passed": not failures, "failures": failures, "summary": summary, "figures": figures, "table": rows}
