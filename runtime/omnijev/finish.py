"""Calibration and answers: ``MSO1._finish`` with ``choice_outputs`` and ``jev_confidence``.

From ``tinnel123666888/OmniJev:mso/infer.py`` and ``mso/head.py`` as omnijev.md §8 documents them
(and ``ThinkFlowLab/system1-omni:src/models/omnijev/native/src/contract.rs`` ``answer()``):

- ``_scale``: identity when |T - 1| < 1e-6, else ``max(1e-9, p)^(1/T)`` renormalised;
- Noul: the log-odds bias (clamped to [-40, 40]) before the temperature;
- Choice: a float32 sum decides ``valid`` (<= 1 + 1e-5), the abstain mass is the rest, the scaled
  vector is stored back into float32, confidence is over the K options plus abstain;
- Score: renormalised before and after scaling, the modal level is the answer.

Float32 round trips sit where the reference holds tensors; sums the reference does with
Python's ``sum`` (or a float32 tensor sum) accumulate left to right, as Python 3.10 did.
Values are rounded with Python's ``round(x, 4)``; ``digits=None`` keeps them unrounded, for the
validator, whose float32 gate (1e-5) lies below what four decimals can show.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .contract import Kind, Question

VALID_SLACK = np.float32(1 + 1e-5)


DIGITS = 4


def rounded(value: float, digits: int | None = DIGITS) -> float:
    return float(value) if digits is None else round(float(value), digits)


def _sum(values: Sequence[float]) -> float:
    total = 0.0
    for value in values:
        total += value
    return total


def _sum32(values: np.ndarray) -> np.float32:
    total = np.float32(0.0)
    for value in values:
        total = np.float32(total + value)
    return total


@dataclass(frozen=True)
class Calibration:
    """Per-kind temperatures and the Noul log-odds bias (the manifest's ``calibration``)."""

    temperatures: dict[str, float]
    noul_bias: float

    @classmethod
    def from_manifest(cls, value: Any) -> Calibration:
        """Positive, finite noul/choice/score temperatures and a finite bias, or ``ValueError``."""
        temperatures = value.get("temperatures") if isinstance(value, dict) else None
        kinds = ("noul", "choice", "score")
        if not (
            isinstance(temperatures, dict)
            and sorted(temperatures) == sorted(kinds)
            and all(_finite(temperatures[k]) and temperatures[k] > 0 for k in kinds)
        ):
            raise ValueError("export calibration needs positive noul, choice and score temperatures")
        if not _finite(value.get("noul_bias")):
            raise ValueError("export calibration needs a finite noul_bias")
        return cls({k: float(temperatures[k]) for k in kinds}, float(value["noul_bias"]))

    def scale(self, values: Sequence[float], kind: Kind) -> list[float]:
        """``MSO1._scale``: p^(1/T) renormalised; identity at T = 1."""
        temperature = self.temperatures[kind.label]
        if abs(temperature - 1.0) < 1e-6:
            return list(values)
        weights = [max(1e-9, float(x)) ** (1.0 / temperature) for x in values]
        total = _sum(weights)
        return [w / total for w in weights]


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def confidence(probabilities: np.ndarray) -> float:
    """Jev's (K p_max - 1) / (K - 1) in float32, clamped to [0, 1]; 1 for a single entry."""
    k = len(probabilities)
    if k < 2:
        return 1.0
    peak = np.asarray(probabilities, np.float32).max()
    value = (np.float32(k) * peak - np.float32(1.0)) / np.float32(k - 1)
    return float(np.clip(value, np.float32(0.0), np.float32(1.0)))


def _first_max(values: Sequence[float]) -> int:
    """The first maximum, as Python's ``max(range(n), key=...)`` picks it."""
    return max(range(len(values)), key=lambda i: values[i])


def noul(mu: np.ndarray, calibration: Calibration, digits: int | None = DIGITS) -> dict[str, Any]:
    p = float(mu[0])
    if calibration.noul_bias:  # temperature cannot move the 0.5 crossing; the bias can
        p = min(max(p, 1e-9), 1.0 - 1e-9)
        z = max(-40.0, min(40.0, math.log(p / (1.0 - p)) + calibration.noul_bias))
        p = 1.0 / (1.0 + math.exp(-z))
    return {"noul": rounded(calibration.scale([p, 1.0 - p], Kind.NOUL)[0], digits)}


def choice(keys: Sequence[str], mu: np.ndarray, calibration: Calibration, digits: int | None = DIGITS) -> dict[str, Any]:
    mu = np.asarray(mu, np.float32)
    total = _sum32(mu)
    valid = bool(total <= VALID_SLACK)
    if valid:
        probs, abstain = mu, max(np.float32(1.0) - total, np.float32(0.0))
    else:  # renormalised: option-set invariance is lost on this branch
        probs, abstain = (mu / total).astype(np.float32), np.float32(0.0)
    full = np.asarray(calibration.scale([*map(float, probs), float(abstain)], Kind.CHOICE), np.float32)
    probs, abstain = full[:-1], full[-1]
    values = [float(p) for p in probs]
    return {
        "choice": keys[_first_max(values)],
        "probabilities": {key: rounded(p, digits) for key, p in zip(keys, values, strict=True)},
        "abstain": rounded(abstain, digits),
        "valid": valid,
        "confidence": rounded(confidence(full), digits),
    }


def score(keys: Sequence[str], mu: np.ndarray, calibration: Calibration, digits: int | None = DIGITS) -> dict[str, Any]:
    mu = np.asarray(mu, np.float32)
    probs = (mu / max(_sum32(mu), np.float32(1e-6))).astype(np.float32)
    full = np.asarray(calibration.scale([*map(float, probs), 0.0], Kind.SCORE), np.float32)
    values = [float(p) for p in full[:-1]]
    total = _sum(values) or 1.0  # levels are exhaustive: renormalise
    values = [p / total for p in values]
    return {
        "score": keys[_first_max(values)],
        "probabilities": {key: rounded(p, digits) for key, p in zip(keys, values, strict=True)},
        "confidence": rounded(confidence(np.asarray(values, np.float32)), digits),
    }


def answer(
    question: Question,
    mu: np.ndarray,
    calibration: Calibration,
    total_seconds: float,
    questions: int,
    digits: int | None = DIGITS,
) -> dict[str, Any]:
    """One question's answer, with ``latency_s`` (the total over the questions) and ``latency_total_s``."""
    if question.kind == Kind.NOUL:
        body = noul(mu, calibration, digits)
    elif question.kind == Kind.CHOICE:
        body = choice(question.keys, mu, calibration, digits)
    else:
        body = score(question.keys, mu, calibration, digits)
    latency = {"latency_s": rounded(total_seconds / questions, digits), "latency_total_s": rounded(total_seconds, digits)}
    return {**body, **latency}
