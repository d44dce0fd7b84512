"""Which span head reads a span question, in packages that ship a broad head.

First match wins: the question's ``head``; the key ``pii``, ``halu`` or ``toxic``; a label set equal
to one the router head was trained on; a non-empty subset of the PII types; a single hallucination
alias label (asked as the trained ``unsupported`` label, answered with the caller's name); else the
broad head. Without a broad head every span goes to the router head
(vllm-project/semantic-router:src/model-runtime/vllm_srun/families/vela2/dispatch.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .calibration import BROAD, ROUTER, Calibration
from .request import Question, rendered_as

ROUTER_KEYS = ("pii", "halu", "toxic")
HALU_LABEL = "unsupported"
HALU_ALIASES = frozenset(
    {"unsupported", "unsupportedclaim", "hallucinated", "hallucination", "hallucinatedspan",
     "notsupported", "unsupportedspan", "fabricated", "fabrication"}
)  # fmt: skip
HALU_DESCRIPTION = "a claim not supported by the context"


@dataclass(frozen=True)
class Route:
    """The head a span question goes to, the question as rendered, and labels to map back."""

    head: str
    question: Question
    alias: dict[str, str] | None = None


def halu_alias(question: Question) -> str | None:
    names = question.names
    if len(names) == 1 and re.sub(r"[\s_\-]+", "", names[0]).lower() in HALU_ALIASES:
        return names[0]
    return None


class Dispatcher:
    def __init__(self, calibration: Calibration, broad_loaded: bool):
        block = calibration.broad or {}
        self.enabled = bool(block) and broad_loaded
        halu = (calibration.schema("halu") or {}).get("labels", {})
        trained = [frozenset(labels) for labels in block.get("router_label_sets", ())]
        self.router_sets = trained or [calibration.pii_types, frozenset(halu)]
        self.pii_types = calibration.pii_types
        self.halu_description = halu.get(HALU_LABEL, HALU_DESCRIPTION)

    def route(self, question: Question) -> Route:
        if not self.enabled:
            return Route(ROUTER, question)
        head = self._choose(question)
        alias = halu_alias(question)
        if head == ROUTER and alias is not None and alias != HALU_LABEL:
            shown = rendered_as(question, ((HALU_LABEL, self.halu_description),))
            return Route(head, shown, {HALU_LABEL: alias})
        return Route(head, question)

    def _choose(self, question: Question) -> str:
        if question.head is not None:
            return question.head
        names = frozenset(question.names)
        if (
            question.key in ROUTER_KEYS
            or any(names == labels for labels in self.router_sets)
            or (names and names <= self.pii_types)
            or halu_alias(question) is not None
        ):
            return ROUTER
        return BROAD
