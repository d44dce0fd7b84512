"""Raw head outputs to the Vela 2.0 answers: ``answers`` plus ``spans``, ``span_heads``, ``sets``, ``thresholds``.

Choice: softmax over the real options (float64, max-subtracted) at the choice temperature; the
choice is the first maximum logit; confidence the top-two margin clipped to [0, 1]; the abstain
probability the last entry of the softmax over options plus abstain. Noul: P(yes) over (no, yes),
optionally recalibrated. Score: expectation and variance confidence (exact sums). Set: one
sigmoid per label against the threshold, plus a Noul per label. Span: decoded spans and a Noul that
is the highest word probability inside the field read
(vllm-project/semantic-router:src/model-runtime/vllm_srun/families/vela2/answers.py; vela2-decoder.md §3.4–§3.7).

Score levels are read by position (their texts may repeat). A question that required its full input
answers with ``input_coverage: "complete"`` (a set in ``sets.<id>`` and every label answer too;
wire-contract.md §3.3). An ``invalid_model_output`` message names the question and what was wrong.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cache, partial
from typing import Any

import numpy as np

from ..digest import canonical_json
from ..errors import INVALID_MODEL_OUTPUT, item_error
from .calibration import Calibration, sigmoid, softmax
from .request import Question, State
from .words import decode_spans, trim, word_units

NOUL_YES = 1  # Noul's options are (no, yes)
COMPLETE = "complete"  # ``input_coverage`` of a question that required its full input


@dataclass
class RawSpan:
    labels: list[str]  # as rendered (a hallucination alias reads as ``unsupported``)
    offsets: np.ndarray  # int32 [W, 2] code points of the words read
    logits: np.ndarray  # float64 [W, L]
    head: str
    alias: dict[str, str] | None = None


@dataclass
class RawRow:
    """One row's head outputs: logits per question id, the span's words, token counts."""

    tokens: dict[str, int]  # whole-part token counts by role (the PII length rule reads them)
    input_tokens: int
    logits: dict[str, np.ndarray] = field(default_factory=dict)
    span: RawSpan | None = None


@dataclass(frozen=True)
class Answerer:
    calibration: Calibration
    noul_calibration: bool = False
    report_heads: bool = False

    def answer(self, question: Question, raw: RawRow, state: State, response: dict[str, Any]) -> None:
        """Write one question's answer (and its span or set entries) into ``response``; a question
        that asked for its full input says it was read whole (``input_coverage``)."""
        missing = raw.span is None if question.type == "span" else question.id not in raw.logits
        if missing:
            message = f"question {question.id!r}: the model returned no {question.type} output for it"
            response["answers"][question.id] = item_error(question.kind, INVALID_MODEL_OUTPUT, message)
            return
        try:
            if question.type == "span":
                self._span(question, raw, state, response)
            elif question.type == "set":
                self._set(question, raw.logits[question.id], response)
            else:
                response["answers"][question.id] = self._single(question, raw.logits[question.id])
        except (KeyError, ValueError, FloatingPointError) as exc:
            reason = f"answering it needs {exc.args[0]!r}, which the package calibration lacks" if isinstance(exc, KeyError) else exc
            message = f"question {question.id!r}: {reason}"
            response["answers"][question.id] = item_error(question.kind, INVALID_MODEL_OUTPUT, message)
            return
        if question.require_full_input:
            for entry in self._written(question, response):
                entry["input_coverage"] = COMPLETE

    @staticmethod
    def _written(question: Question, response: dict[str, Any]) -> list[dict[str, Any]]:
        """The objects one answered question wrote: its answer, or a set's entry and label answers."""
        if question.type != "set":
            return [response["answers"][question.id]]
        labels = [response["answers"][f"{question.id}.{name}"] for name in question.names]
        return [response["sets"][question.id], *labels]

    def _single(self, question: Question, values: np.ndarray) -> dict[str, Any]:
        logits = np.asarray(values, np.float64)
        names = question.names
        count = len(names)
        if not np.all(np.isfinite(logits[:count])):
            raise ValueError(f"its {count} {question.kind} option logits are not all finite")
        temperature = self.calibration.temperature(question.type)
        # Read by position: score level texts may repeat, so names would merge levels.
        levels = [float(p) for p in softmax(logits[:count] / temperature)]
        if question.kind == "noul":
            return {"type": "noul", "noul": self.calibration.noul(levels[NOUL_YES], self.noul_calibration)}
        if question.kind == "choice":
            probabilities = dict(zip(names, levels, strict=True))
            ranked = sorted(levels, reverse=True)
            margin = 1.0 if count == 1 else min(1.0, max(0.0, ranked[0] - ranked[1]))
            return {
                "type": "choice",
                "choice": names[int(np.argmax(logits[:count]))],
                "confidence": margin,
                "probabilities": probabilities,
                "abstain_probability": float(softmax(logits / temperature)[-1]),
            }
        mean = math.fsum(index * p for index, p in enumerate(levels))
        variance = math.fsum(p * (index - mean) ** 2 for index, p in enumerate(levels))
        return {
            "type": "score",
            "score": mean,
            "confidence": min(1.0, max(0.0, 1.0 - variance / ((count * count - 1) / 12))),
            "legend": {
                str(index): level if isinstance(level, str) else canonical_json(level)
                for index, level in enumerate(question.levels)
            },
            "probabilities": {str(index): p for index, p in enumerate(levels)},
        }

    def _set(self, question: Question, values: np.ndarray, response: dict[str, Any]) -> None:
        names = question.names
        logits = np.asarray(values, np.float64)[: len(names)]
        if not np.all(np.isfinite(logits)):
            raise ValueError(f"its {len(names)} set label logits are not all finite")
        threshold = question.threshold if question.threshold is not None else self.calibration.set_threshold(question.key)
        probabilities = dict(zip(names, (float(p) for p in sigmoid(logits / self.calibration.temperature("set"))), strict=True))
        response.setdefault("sets", {})[question.id] = {
            "selected": [name for name, p in probabilities.items() if p > threshold],
            "probabilities": probabilities,
        }
        response.setdefault("thresholds", {})[question.id] = float(threshold)
        for name, p in probabilities.items():
            response["answers"][f"{question.id}.{name}"] = {"type": "noul", "noul": p}

    def _span(self, question: Question, raw: RawRow, state: State, response: dict[str, Any]) -> None:
        span = raw.span
        assert span is not None  # ``answer`` checked
        role: str = question.over  # type: ignore[assignment]
        text = state.text(role)
        if question.threshold is not None:
            threshold, rule = question.threshold, "given"
        else:
            threshold, rule = self.calibration.span_threshold(question.key, span.labels, raw.tokens[role], span.head)
        probabilities = sigmoid(span.logits / self.calibration.span_temperature(span.head))
        if not np.all(np.isfinite(probabilities)):
            raise ValueError("its span word probabilities are not all finite")
        has_words = len(span.offsets) > 0
        # Computed once for the sparse gate's decode and the answer's, and only if one of them labels a word.
        units = cache(partial(word_units, text, span.offsets))
        if rule.startswith("pii:"):
            threshold, rule = self.calibration.sparse_gate(probabilities, span.offsets, span.labels, text, threshold, rule, units)
        decoded = decode_spans(probabilities, span.offsets, span.labels, text, threshold, units) if has_words else []
        alias = span.alias or {}
        low, high = question.span_range or (0, len(text))
        spans = []
        for entry in decoded:
            start, end = entry["start"], entry["end"]
            if question.span_range is not None:
                start, end = trim(text, max(start, low), min(end, high))
                if end <= start:
                    continue
            spans.append(
                {
                    "label": alias.get(entry["label"], entry["label"]),
                    "start": start - low,
                    "end": end - low,
                    "text": text[start:end],
                    "probability": float(entry["probability"]),
                }
            )
        best = probabilities.max(1) if has_words else np.zeros(0)
        if question.span_range is not None and len(best):
            best = best[(span.offsets[:, 0] >= low) & (span.offsets[:, 1] <= high)]
        response.setdefault("spans", {})[question.id] = spans
        response.setdefault("thresholds", {})[question.id] = float(threshold)
        if self.report_heads:
            response.setdefault("span_heads", {})[question.id] = span.head
        response["answers"][question.id] = {"type": "noul", "noul": float(np.max(best)) if len(best) else 0.0}
