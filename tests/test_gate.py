"""The gates reject wrong engines: hand-made engine records (the committed reference record of the tiny
member, altered in one place) judged at cpu-fp32, gpu and gpu-reduced, each failure naming its case;
ties pass, real flips fail, and a reduced engine is held to 1.5 x what its BF16 reference does; at
gpu-reduced-alone (a reduced engine's merged or packed forwards against its own alone) every decision
is held and the BF16 reference is measured against the float32 reference, not against alone."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest

from s1omni.calib import CALIB
from s1omni.export.compare_answers import compare
from s1omni.export.gate import CaseRecord, judge, load_gates
from s1omni.export.reference import cases_digest, find_record, load_cases, load_reference, record_dir
from s1omni.export.validate import print_table, recorded_cases

GATES = ("cpu-fp32", "gpu", "gpu-reduced", "gpu-reduced-alone")
RECORD = CALIB / "vela2" / "reference" / "vela2-synth-tiny-s0" / "cpu-fp32"


@pytest.fixture(scope="module")
def reference() -> list[CaseRecord]:
    return recorded_cases(*load_reference(RECORD))


def _noisy(case: CaseRecord, relative: float, seed: int = 0) -> CaseRecord:
    """The case with its hidden states moved by ``relative`` in relative L2."""
    hidden = case.tensors["hidden"]
    noise = np.random.default_rng(seed).standard_normal(hidden.shape)
    noise *= relative * np.linalg.norm(hidden) / np.linalg.norm(noise)
    return CaseRecord(case.name, case.layout, case.answers, {"hidden": (hidden + noise).astype(np.float32)}, case.tokens)


def _bf16(reference: list[CaseRecord], relative: float = 0.01) -> list[CaseRecord]:
    """A hand-made BF16 reference: the same answers, hidden states 1% off in every case."""
    return [_noisy(case, relative, seed) for seed, case in enumerate(reference)]


def _judge(gate: str, reference: list[CaseRecord], engine: list[CaseRecord], bf16: list[CaseRecord] | None = None) -> dict:
    bounds = load_gates("vela2")[gate]
    if gate.startswith("gpu-reduced") and bf16 is None:
        bf16 = _bf16(reference)
    return judge(gate, bounds, compare, reference, engine, bf16)


def _edited(reference: list[CaseRecord], name: str, edit) -> list[CaseRecord]:
    """The reference's cases with case ``name``'s answers passed through ``edit`` (a copy)."""
    out = []
    for case in reference:
        if case.name == name:
            answers = copy.deepcopy(case.answers)
            edit(answers)
            case = CaseRecord(case.name, case.layout, answers, case.tensors, case.tokens)
        out.append(case)
    return out


def _with_tensor(reference: list[CaseRecord], name: str, change) -> list[CaseRecord]:
    out = []
    for case in reference:
        if case.name == name:
            case = change(case)
        out.append(case)
    return out


def _infinite(case: CaseRecord) -> CaseRecord:
    hidden = case.tensors["hidden"].copy()
    hidden[0, 0] = np.inf
    return CaseRecord(case.name, case.layout, case.answers, {"hidden": hidden}, case.tokens)


def _flip_choice(answers: dict) -> None:
    """The choice moved to the least probable option, its probabilities left as they were (a wiring error)."""
    answer = answers["answers"]["domain"]
    answer["choice"] = min(answer["probabilities"], key=answer["probabilities"].get)


def _drop_span(key: str):
    def edit(answers: dict) -> None:
        answers["spans"][key] = [span for span in answers["spans"][key] if span["probability"] < 0.9]

    return edit


# Beyond gpu-reduced's allowance (the BF16 reference's count minus max(1, 2%)), a flip or a changed span
# set in one case passes that gate by design (gpu-reduced-alone: a changed span set); there the engine
# errs in as many cases as the allowance needs.
FLIPPED = ("golden", "all-kinds-one-row")
WRONG = {
    "infinite hidden state": lambda ref: _with_tensor(ref, "cjk", _infinite),
    "hidden states 5% off": lambda ref: _with_tensor(ref, "cjk", lambda case: _noisy(case, 0.05)),
    "dropped answer": lambda ref: _edited(ref, "cjk", lambda answers: answers["answers"].popitem()),
    "flipped clear decision": lambda ref: _edited(ref, "golden", _flip_choice),
    "changed span set": lambda ref: _edited(ref, "golden", _drop_span("halu")),
}


def _several(reference: list[CaseRecord], wrong: str) -> list[CaseRecord]:
    """At gpu-reduced: the decision flipped in 8 cases (allowance 6.8 of 338), the span set changed in 2 (allowance 1)."""
    if wrong == "flipped clear decision":
        names = [case.name for case in reference if any(
            a.get("type") == "choice" and _clear(a) for a in case.answers["answers"].values())][:8]  # fmt: skip
        for name in names:
            reference = _edited(reference, name, _flip_first_clear_choice)
        return reference
    if wrong == "changed span set":
        return _edited(_edited(reference, "golden", _drop_span("halu")), "golden", _drop_span("pii"))
    return WRONG[wrong](reference)


def _clear(answer: dict) -> bool:
    if "probabilities" not in answer:
        return False
    ranked = sorted(answer["probabilities"].values(), reverse=True)
    return ranked[0] - ranked[1] >= 0.1


def _flip_first_clear_choice(answers: dict) -> None:
    answer = next(a for a in answers["answers"].values() if a.get("type") == "choice" and _clear(a))  # noqa: RUF015
    answer["choice"] = min(answer["probabilities"], key=answer["probabilities"].get)


@pytest.mark.parametrize("gate", GATES)
def test_the_reference_itself_passes(reference: list[CaseRecord], gate: str) -> None:
    verdict = _judge(gate, reference, reference)
    assert verdict["passed"], verdict["failures"]


@pytest.mark.parametrize("gate", GATES)
@pytest.mark.parametrize("wrong", list(WRONG))
def test_a_wrong_engine_fails_naming_the_case(reference: list[CaseRecord], gate: str, wrong: str) -> None:
    counted = gate == "gpu-reduced" or (gate == "gpu-reduced-alone" and wrong == "changed span set")  # allowances, not single misses
    engine = _several(reference, wrong) if counted else WRONG[wrong](reference)
    verdict = _judge(gate, reference, engine)
    assert not verdict["passed"]
    named = {"infinite hidden state": "cjk", "hidden states 5% off": "cjk", "dropped answer": "cjk"}.get(wrong, "golden")
    assert any(f"case {named}" in failure for failure in verdict["failures"]), verdict["failures"]


def _noul(answers: dict, key: str, value: float) -> None:
    answers["answers"][key]["noul"] = value


def _case(reference: list[CaseRecord], name: str) -> CaseRecord:
    return next(case for case in reference if case.name == name)


def test_a_span_at_the_threshold_is_a_tie_and_a_clear_one_a_real_difference(reference: list[CaseRecord]) -> None:
    """The 4B float32 engine's miss, hand-made: a one-word span at p = threshold + 1e-7 that the engine
    does not find, in a case whose probabilities moved by 1e-6, is a tie; a span at 0.98 is not."""
    golden = _case(reference, "golden").answers
    threshold = golden["thresholds"]["halu"]

    def at_threshold(answers: dict) -> None:
        answers["spans"]["halu"].append({"label": "unsupported", "start": 900, "end": 905, "text": "x", "probability": threshold + 1e-7})

    ref = _edited(reference, "golden", at_threshold)
    engine = _edited(reference, "golden", lambda answers: _noul(answers, "jailbreak", golden["answers"]["jailbreak"]["noul"] + 1e-6))
    verdict = _judge("cpu-fp32", ref, engine)
    assert verdict["passed"], verdict["failures"]
    row = next(row for row in verdict["table"] if row["case"] == "golden")
    assert row["span_sets"] == "2/2" and row["ties"] and "tie" in row["ties"][0] and verdict["summary"]["ties"] == 1
    missed = _judge("cpu-fp32", reference, _edited(reference, "golden", _drop_span("halu")))
    assert not missed["passed"] and any("span sets 25/26" in failure and "golden" in failure for failure in missed["failures"])


def test_a_choice_flip_near_its_midpoint_is_a_tie_and_a_clear_one_fails() -> None:
    def answer(choice: str, a: float, b: float) -> dict:
        return {"usage": {"input_tokens": 3}, "answers": {"q": {"type": "choice", "choice": choice,
                "probabilities": {"x": a, "y": b}, "abstain_probability": 0.1}}}  # fmt: skip

    tie = compare(answer("x", 0.50001, 0.49999), answer("y", 0.49999, 0.50001), margin=0.0)
    assert (tie.same_decisions, tie.decisions, tie.problems) == (1, 1, []) and tie.ties
    flip = compare(answer("x", 0.7, 0.3), answer("y", 0.7, 0.3), margin=0.0)
    assert (flip.same_decisions, flip.ties) == (0, []) and flip.problems == ["q: y != x"]


def test_non_finite_probabilities_and_missing_answers_fail_every_case() -> None:
    reference = {"usage": {"input_tokens": 3}, "answers": {"a": {"type": "noul", "noul": 0.9}, "b": {"type": "noul", "noul": 0.2}}}
    nan = {"usage": {"input_tokens": 3}, "answers": {"a": {"type": "noul", "noul": float("nan")}, "c": {"type": "noul", "noul": 0.2}}}
    stats = compare(reference, nan, margin=0.05)
    assert sorted(stats.failures) == ["a: probability nan is not finite", "b: no answer where the reference answered", "c: an answer the reference did not give"]
    errored = {"usage": {"input_tokens": 3}, "answers": {"a": {"error": "deadline_exceeded"}, "b": {"type": "noul", "noul": 0.2}}}
    assert compare(reference, errored, margin=0.05).failures == ["a: error deadline_exceeded where the reference gave an answer"]


def _shift(reference: list[CaseRecord], name: str, key: str, by: float) -> list[CaseRecord]:
    return _edited(reference, name, lambda answers: _noul(answers, key, answers["answers"][key]["noul"] + by))


@pytest.mark.parametrize(("engine_dp", "passes"), [(0.05, True), (0.07, False)])
def test_a_reduced_engine_is_held_to_one_and_a_half_times_its_bf16_reference(reference: list[CaseRecord], engine_dp: float, passes: bool) -> None:
    """The BF16 reference moves a probability by 0.04: the bound is 0.06 (1.5 x, above the 0.02 floor)."""
    bf16 = _shift(_bf16(reference), "golden", "pii", -0.04)
    engine = _shift(_bf16(reference, 0.012), "golden", "pii", -engine_dp)
    verdict = _judge("gpu-reduced", reference, engine, bf16)
    assert verdict["figures"]["max_probability"] == pytest.approx({"engine": engine_dp, "bf16": 0.04, "bound": 0.06})
    assert verdict["passed"] is passes, verdict["failures"]
    if not passes:
        assert any(failure.startswith("case golden: max probability") for failure in verdict["failures"])


@pytest.mark.parametrize(("relative", "passes"), [(0.015, True), (0.02, False)])
def test_a_reduced_engines_hidden_states_are_held_per_case(reference: list[CaseRecord], relative: float, passes: bool) -> None:
    """The BF16 reference's hidden states are 1% off: the bound is 1.5 x 1% + 1e-3 = 1.6% in every case."""
    verdict = _judge("gpu-reduced", reference, _bf16(reference, relative), _bf16(reference))
    assert verdict["passed"] is passes
    assert passes or len([f for f in verdict["failures"] if "hidden rel l2" in f]) == len(reference)


def test_a_broken_bf16_reference_bounds_nothing(reference: list[CaseRecord]) -> None:
    verdict = _judge("gpu-reduced", reference, _bf16(reference, 0.012), _with_tensor(_bf16(reference), "cjk", _infinite))
    assert not verdict["passed"] and any(f.startswith("the BF16 reference's case cjk: hidden") for f in verdict["failures"])


def test_gpu_reduced_without_a_bf16_reference_fails(reference: list[CaseRecord]) -> None:
    verdict = judge("gpu-reduced", load_gates("vela2")["gpu-reduced"], compare, reference, reference, None)
    assert not verdict["passed"] and "BF16 reference" in verdict["failures"][0]


def test_a_saved_reference_is_reused_only_for_the_same_cases_device_and_precision(tmp_path: Path) -> None:
    record = json.loads((RECORD / "answers.json").read_text())
    digest, sha = record["cases_sha256"], record["member"]["model_sha256"]
    assert digest == cases_digest(load_cases(CALIB / "vela2"))
    assert find_record([tmp_path, RECORD.parent], sha, digest, "cpu", "fp32") == RECORD
    changed = load_cases(CALIB / "vela2")
    changed[0]["request"]["text"] = "changed"
    assert find_record([RECORD.parent], sha, cases_digest(changed), "cpu", "fp32") is None
    assert find_record([RECORD.parent], sha, digest, "cuda", "fp32") is None
    assert find_record([RECORD.parent], sha, digest, "cpu", "bf16") is None
    assert find_record([RECORD.parent], "0" * 64, digest, "cpu", "fp32") is None  # another member's weights
    # A record under the right name that says it was made elsewhere is not taken either.
    where = record_dir(tmp_path, "cuda", "bf16")
    where.mkdir(parents=True)
    (where / "answers.json").write_text(json.dumps(record))
    assert find_record([tmp_path], sha, digest, "cuda", "bf16") is None


def test_table_shows_the_case_total_the_three_columns_and_what_differs(reference: list[CaseRecord], capsys: pytest.CaptureFixture[str]) -> None:
    engine = _edited(reference, "golden", _drop_span("halu"))
    verdict = _judge("gpu-reduced", reference, engine)
    print_table(verdict["table"], bf16=True)
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split()[:8] == ["case", "tokens", "engine", "bf16", "bound", "engine", "bf16", "bound"]
    assert lines[3].startswith(f"1/{len(reference)} golden") and lines[3].endswith("1/2  ok")
    assert lines[4].strip().startswith("spans.halu:")


def test_against_alone_one_flipped_decision_fails_where_gpu_reduced_allows_it(reference: list[CaseRecord]) -> None:
    """One flipped clear choice is within gpu-reduced's allowance (the BF16 reference's count minus 6.8),
    and a flipped unclear one is not counted there at all; gpu-reduced-alone fails either (vela2.md §9.2)."""
    clear = _edited(reference, "golden", _flip_choice)
    assert _judge("gpu-reduced", reference, clear)["passed"]
    verdict = _judge("gpu-reduced-alone", reference, clear)
    assert not verdict["passed"] and any(f.startswith("case golden: 1 decisions at least 0.0 clear differ") for f in verdict["failures"])
    unclear = _edited(reference, "router-signals-600", _flip_unclear_choice)  # top two 0.170 and 0.166
    assert _judge("gpu-reduced", reference, unclear)["passed"]
    missed = _judge("gpu-reduced-alone", reference, unclear)
    assert not missed["passed"] and any(f.startswith("case router-signals-600: 1 decisions") for f in missed["failures"])


def _flip_unclear_choice(answers: dict) -> None:
    """The choice moved to the second most probable option, probabilities as they were."""
    answer = answers["answers"]["domain"]
    ranked = sorted(answer["probabilities"], key=answer["probabilities"].get, reverse=True)
    assert answer["choice"] == ranked[0] and answer["probabilities"][ranked[0]] - answer["probabilities"][ranked[1]] < 0.05
    answer["choice"] = ranked[1]


@pytest.mark.parametrize(("relative", "passes"), [(0.015, True), (0.03, False)])
def test_against_alone_the_bf16_reference_is_measured_against_the_float32_one(reference: list[CaseRecord], relative: float, passes: bool) -> None:
    """The engine alone is 5% off the float32 reference and the BF16 reference 1% off: merged is held to
    1.6% of alone per case. Measured against alone instead, the BF16 reference would allow about 8%."""
    alone = _bf16(reference, 0.05)
    merged = [_noisy(case, relative, seed + 100) for seed, case in enumerate(alone)]
    bf16 = _bf16(reference)
    gate = load_gates("vela2")["gpu-reduced-alone"]
    verdict = judge("gpu-reduced-alone", gate, compare, alone, merged, bf16, reference)
    assert verdict["passed"] is passes, verdict["failures"]
    assert passes or len([f for f in verdict["failures"] if "hidden rel l2" in f]) == len(reference)
    assert judge("gpu-reduced-alone", gate, compare, alone, merged, bf16)["passed"]  # the wrong baseline lets 3% through
