"""Calibration and finishing against values worked out by hand from omnijev.md §8."""

from __future__ import annotations

import math

import numpy as np
import pytest

from s1omni.runtime.omnijev import finish
from s1omni.runtime.omnijev.contract import Kind, Question
from s1omni.runtime.omnijev.finish import Calibration


def calibration(noul: float = 1.0, choice: float = 1.0, score: float = 1.0, bias: float = 0.0) -> Calibration:
    return Calibration({"noul": noul, "choice": choice, "score": score}, bias)


def mu(*values: float) -> np.ndarray:
    return np.asarray(values, np.float32)


# ----------------------------------------------------------------------------- _scale


def test_scale_is_the_identity_within_1e_6_of_one() -> None:
    values = [0.2, 0.3, 0.1]
    assert calibration(choice=1.0000005).scale(values, Kind.CHOICE) == values


def test_scale_takes_the_root_and_renormalises() -> None:
    # T = 2: sqrt(0.2) : sqrt(0.8) = 1 : 2.
    scaled = calibration(choice=2.0).scale([0.2, 0.8], Kind.CHOICE)
    assert scaled == pytest.approx([1 / 3, 2 / 3], abs=1e-15)


def test_scale_floors_zero_at_1e_9() -> None:
    scaled = calibration(score=2.0).scale([1.0, 0.0], Kind.SCORE)
    floor = math.sqrt(1e-9)
    assert scaled == pytest.approx([1 / (1 + floor), floor / (1 + floor)], abs=1e-15)


def test_scale_uses_the_kinds_own_temperature() -> None:
    cal = calibration(noul=1.0, choice=2.0, score=4.0)
    assert cal.scale([0.25, 0.75], Kind.NOUL) == [0.25, 0.75]
    assert cal.scale([0.25, 0.75], Kind.CHOICE) != cal.scale([0.25, 0.75], Kind.SCORE)


def test_python_310_sum_is_left_to_right() -> None:
    # Python 3.12's sum compensates and gives 1.0; the reference (3.10) adds left to right.
    assert finish._sum([0.1] * 10) == 0.9999999999999999


# ----------------------------------------------------------------------------- noul


def test_noul_without_bias_or_temperature_is_mu() -> None:
    assert finish.noul(mu(0.48765), calibration()) == {"noul": 0.4877}
    assert finish.noul(mu(1e-12), calibration()) == {"noul": 0.0}


def test_noul_bias_shifts_the_log_odds() -> None:
    # logit(0.5) + 0.5 -> sigmoid(0.5) = 0.62246
    assert finish.noul(mu(0.5), calibration(bias=0.5)) == {"noul": 0.6225}


def test_noul_bias_comes_before_the_temperature() -> None:
    # p0 = sigmoid(0.5) = 0.622459; T = 2: sqrt(p0) / (sqrt(p0) + sqrt(1 - p0)) = 0.562177
    assert finish.noul(mu(0.5), calibration(noul=2.0, bias=0.5)) == {"noul": 0.5622}


def test_noul_temperature_alone() -> None:
    # sqrt(0.3) / (sqrt(0.3) + sqrt(0.7)) = 0.395644
    assert finish.noul(mu(0.3), calibration(noul=2.0)) == {"noul": 0.3956}


def test_noul_bias_clamps_the_probability_and_the_log_odds() -> None:
    # p0 = 1 is clamped to 1 - 1e-9 (log-odds 20.72), so the answer stays finite.
    assert finish.noul(mu(1.0), calibration(bias=0.1)) == {"noul": 1.0}
    # logit(0.999999) - 100 = -86.2 is clamped to -40: sigmoid(-40) = 4.2e-18.
    assert finish.noul(mu(0.999999), calibration(bias=-100.0)) == {"noul": 0.0}


# ----------------------------------------------------------------------------- choice


def test_choice_valid_keeps_mu_and_abstain_is_the_rest() -> None:
    answer = finish.choice(["a", "b", "c"], mu(0.2, 0.3, 0.1), calibration())
    assert answer == {
        "choice": "b",
        "probabilities": {"a": 0.2, "b": 0.3, "c": 0.1},
        "abstain": 0.4,
        "valid": True,
        # K' = 4 with the abstain entry, whose 0.4 is the maximum: (4 * 0.4 - 1) / 3 = 0.2
        "confidence": 0.2,
    }


def test_choice_above_one_is_invalid_and_renormalised() -> None:
    # float32 sum 1.05; probabilities mu / 1.05; no abstain; a tie goes to the first key.
    answer = finish.choice(list("abcde"), mu(0.3, 0.3, 0.2, 0.15, 0.1), calibration())
    assert answer["valid"] is False
    assert answer["abstain"] == 0.0
    assert answer["choice"] == "a"
    assert answer["probabilities"] == {"a": 0.2857, "b": 0.2857, "c": 0.1905, "d": 0.1429, "e": 0.0952}
    # K' = 6: (6 * 0.285714 - 1) / 5 = 0.142857
    assert answer["confidence"] == 0.1429


def test_choice_validity_allows_1e_5_in_float32() -> None:
    answer = finish.choice(["a", "b"], mu(0.5, 0.500005), calibration())
    assert answer["valid"] is True
    assert answer["abstain"] == 0.0  # max(1 - s, 0)
    assert finish.choice(["a", "b"], mu(0.5, 0.50002), calibration())["valid"] is False


def test_choice_temperature_scales_options_and_abstain_together() -> None:
    # [0.5, 0.25, abstain 0.25] at T = 2: sqrt -> [0.7071, 0.5, 0.5] / 1.7071
    answer = finish.choice(["a", "b"], mu(0.5, 0.25), calibration(choice=2.0))
    assert answer["probabilities"] == {"a": 0.4142, "b": 0.2929}
    assert answer["abstain"] == 0.2929
    # (3 * 0.414214 - 1) / 2 = 0.121320
    assert answer["confidence"] == 0.1213


def test_choice_confidence_is_zero_when_abstain_ties_at_uniform() -> None:
    answer = finish.choice(["a"], mu(0.5), calibration())
    assert answer["abstain"] == 0.5
    assert answer["confidence"] == 0.0  # (2 * 0.5 - 1) / 1


# ----------------------------------------------------------------------------- score


def test_score_answers_the_modal_level() -> None:
    answer = finish.score(["low", "mid", "high"], mu(0.2, 0.5, 0.3), calibration())
    assert answer == {
        "score": "mid",
        "probabilities": {"low": 0.2, "mid": 0.5, "high": 0.3},
        "confidence": 0.25,  # (3 * 0.5 - 1) / 2
    }


def test_score_renormalises_after_the_temperature() -> None:
    # [0.25, 0.75, 0] at T = 2: sqrt -> [0.5, 0.866025, 3.16e-5]; the levels are renormalised
    # without the floor's share: 0.5 / 1.366025 = 0.366025.
    answer = finish.score(["a", "b"], mu(0.25, 0.75), calibration(score=2.0))
    assert answer["probabilities"] == {"a": 0.366, "b": 0.634}
    assert answer["score"] == "b"
    assert answer["confidence"] == 0.2679  # 2 * 0.633975 - 1


def test_score_divides_by_its_sum_first() -> None:
    answer = finish.score(["a", "b"], mu(0.6, 0.6), calibration())
    assert answer == {"score": "a", "probabilities": {"a": 0.5, "b": 0.5}, "confidence": 0.0}


def test_score_floors_a_vanishing_sum_at_1e_6() -> None:
    # s = 2e-8 is floored to 1e-6, so mu / s = 0.01 each; the renormalisation restores 0.5.
    answer = finish.score(["a", "b"], mu(1e-8, 1e-8), calibration())
    assert answer["probabilities"] == {"a": 0.5, "b": 0.5}


def test_score_with_one_level_is_fully_confident() -> None:
    assert finish.score(["only"], mu(0.3), calibration()) == {
        "score": "only",
        "probabilities": {"only": 1.0},
        "confidence": 1.0,
    }


def test_confidence_is_float32_and_clamped() -> None:
    assert finish.confidence(np.asarray([0.1, 0.1, 0.1], np.float32)) == 0.0
    assert finish.confidence(np.asarray([1.0, 0.0], np.float32)) == 1.0
    value = finish.confidence(np.asarray([0.7, 0.2, 0.1], np.float32))
    assert value == float((np.float32(3) * np.float32(0.7) - np.float32(1)) / np.float32(2))


# ----------------------------------------------------------------------------- answers and calibration values


def test_answer_adds_latencies_in_the_references_key_order() -> None:
    question = Question("q", Kind.CHOICE, "x", ("a", "b"), ("a", "b"))
    answer = finish.answer(question, mu(0.2, 0.3), calibration(), total_seconds=0.9, questions=3)
    assert list(answer) == ["choice", "probabilities", "abstain", "valid", "confidence", "latency_s", "latency_total_s"]
    assert (answer["latency_s"], answer["latency_total_s"]) == (0.3, 0.9)
    noul = finish.answer(Question("n", Kind.NOUL, "x", ("yes",), ("",)), mu(0.5), calibration(), 0.12345, 1)
    assert list(noul) == ["noul", "latency_s", "latency_total_s"]
    score = finish.answer(Question("s", Kind.SCORE, "x", ("a",), ("a",)), mu(1.0), calibration(), 0.1, 1)
    assert list(score) == ["score", "probabilities", "confidence", "latency_s", "latency_total_s"]


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ({"temperatures": {"noul": 0.0, "choice": 1.0, "score": 1.0}, "noul_bias": 0.0}, "temperatures"),
        ({"temperatures": {"noul": 1.0, "choice": float("inf"), "score": 1.0}, "noul_bias": 0.0}, "temperatures"),
        ({"temperatures": {"noul": 1.0, "choice": 1.0}, "noul_bias": 0.0}, "temperatures"),
        ({"temperatures": {"noul": 1.0, "choice": 1.0, "score": True}, "noul_bias": 0.0}, "temperatures"),
        ({"temperatures": {"noul": 1.0, "choice": 1.0, "score": 1.0}}, "noul_bias"),
        ({"temperatures": {"noul": 1.0, "choice": 1.0, "score": 1.0}, "noul_bias": float("nan")}, "noul_bias"),
        (None, "temperatures"),
    ],
)
def test_calibration_refuses_non_positive_or_non_finite_values(value, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        Calibration.from_manifest(value)


def test_calibration_reads_the_manifest() -> None:
    value = {"temperatures": {"noul": 1.1991, "choice": 1.1199, "score": 1.1909}, "noul_bias": 0.05310856608843584}
    cal = Calibration.from_manifest(value)
    assert cal.temperatures == value["temperatures"]
    assert cal.noul_bias == value["noul_bias"]
