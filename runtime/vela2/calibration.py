"""A package's ``calibration.json``: temperatures, thresholds, the PII rules and the Noul refit.

Probabilities are float64 (softmax for choice and score, sigmoids for set labels and span words).
Thresholds go, first match wins: the question's own; the broad head's; the PII length rule (log
threshold linear in log token count, clamped at the end anchors) then the sparse-document gate;
``span:halu`` / ``span:toxic``; ``span:<key>``; ``span:*``
(vllm-project/semantic-router:src/model-runtime/vllm_srun/families/vela2/calibration.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .words import decode_spans

ROUTER, BROAD = "router", "broad"
SPAN_HEADS = (ROUTER, BROAD)


def sigmoid(values: Any) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-np.asarray(values, dtype=np.float64)))


def softmax(values: Any) -> np.ndarray:
    values = np.asarray(values, dtype=np.float64)
    exponentials = np.exp(values - values.max())
    return exponentials / exponentials.sum()


@dataclass(frozen=True)
class Calibration:
    raw: dict[str, Any]

    @property
    def pii_types(self) -> frozenset[str]:
        return frozenset(self.raw.get("pii_types", ()))

    @property
    def broad(self) -> dict[str, Any] | None:
        return self.raw.get("broad_head") or None

    def schema(self, name: str) -> dict[str, Any] | None:
        """A trained question schema (``pii``, ``halu``, ``relevance``); a preset exists only with one."""
        value = self.raw.get(f"{name}_schema")
        return value if isinstance(value, dict) else None

    def temperature(self, engine_type: str) -> float:
        return float(self.raw["temperature"].get(engine_type, 1.0))

    def span_temperature(self, head: str) -> float:
        return float(self.raw["broad_head"]["temperature"]) if head == BROAD else self.temperature("span")

    def set_threshold(self, key: str) -> float:
        thresholds = self.raw["thresholds"]
        return float(thresholds.get(f"set:{key}", thresholds["set:*"]))

    def is_pii(self, key: str, labels: list[str]) -> bool:
        return key == "pii" or bool(labels and set(labels) <= self.pii_types)

    def pii_length_threshold(self, tokens: int) -> float:
        anchors = self.raw["pii_length_rule"]["anchors"]
        return float(
            np.exp(
                np.interp(
                    np.log(max(tokens, 1)),
                    [np.log(anchor["n_tokens"]) for anchor in anchors],
                    [np.log(anchor["threshold"]) for anchor in anchors],
                )
            )
        )

    def span_threshold(self, key: str, labels: list[str], tokens: int, head: str) -> tuple[float, str]:
        """The threshold before the sparse gate and the rule that chose it; ``tokens`` counts the whole part."""
        if head == BROAD:
            return float(self.raw["broad_head"]["threshold"]), BROAD
        thresholds = self.raw["thresholds"]
        if self.is_pii(key, labels):
            if "pii_length_rule" in self.raw:
                return self.pii_length_threshold(tokens), "pii:length"
            for bucket in self.raw["pii_buckets"]:
                if tokens <= bucket["max_tokens"]:
                    return float(bucket["threshold"]), f"pii:{bucket['name']}"
        if key in ("halu", "toxic"):
            return float(thresholds[f"span:{key}"]), key
        if f"span:{key}" in thresholds:
            return float(thresholds[f"span:{key}"]), f"span:{key}"
        return float(thresholds["span:*"]), "span:*"

    def sparse_gate(
        self, probabilities: np.ndarray, offsets: np.ndarray, labels: list[str], text: str, threshold: float, rule: str,
        units: Callable[[], np.ndarray] | None = None,
    ) -> tuple[float, str]:  # fmt: skip
        """A document with at most K spans at the probe threshold decodes at ``t_sparse`` instead (``units``: as
        ``decode_spans`` takes them)."""
        gate = self.raw.get("pii_sparse_gate")
        if not gate or gate.get("K", -1) < 0 or threshold >= gate["t_sparse"] or not len(offsets):
            return threshold, rule
        probe = float(gate.get("probe_threshold", 0.5))
        if len(decode_spans(probabilities, offsets, labels, text, probe, units, limit=gate["K"] + 1)) <= gate["K"]:
            return float(gate["t_sparse"]), rule + "+sparse"
        return threshold, rule

    def noul(self, probability: float, enabled: bool) -> float:
        """``sigmoid(logit(p) / T + b)`` in double precision when enabled and present; else ``p``."""
        block = self.raw.get("noul_calibration")
        if not enabled or not block:
            return probability
        p = min(max(probability, 1e-12), 1.0 - 1e-12)
        logit = math.log(p) - math.log1p(-p)
        return 1.0 / (1.0 + math.exp(-(logit / float(block["T"]) + float(block["b"]))))

    def noul_default(self) -> bool:
        return bool((self.raw.get("noul_calibration") or {}).get("default", False))
