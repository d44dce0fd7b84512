"""Where a request's server time goes: the stages of its ``Server-Timing`` header.

``parse`` reads and decodes the body and checks its envelope, ``tokenize`` is ``model.plan``
(validation, rendering, tokenization, layout), ``queue`` the time its plans waited for the model
worker (before and between their forwards), ``forward`` ``model.forward`` (the backbone, on the
worker, for the whole batch the request's plans ran in), ``heads`` ``model.readout`` (the CPU heads
of the request's own plans, off the worker, while it runs the next forward), ``post``
``model.finish`` (answers in request order), ``serialize`` the JSON encoding. ``total`` runs
from the first byte the app saw to the response being ready, so ``total`` minus the stages is the
server's own overhead. Milliseconds with three decimals, every stage on every response, zero where
a request never reached it (vllm-project/semantic-router:src/model-runtime/vllm_srun/timing.py).
"""

from __future__ import annotations

import time

STAGES = ("parse", "tokenize", "queue", "forward", "heads", "post", "serialize")


class Timing:
    """One request's stages in seconds; ``started`` is its ``time.perf_counter()`` at arrival."""

    __slots__ = ("started", *STAGES)

    def __init__(self) -> None:
        self.started = time.perf_counter()
        self.parse = self.tokenize = self.queue = self.forward = self.heads = self.post = self.serialize = 0.0

    def stages(self) -> dict[str, float]:
        return {stage: getattr(self, stage) for stage in STAGES}

    def total(self) -> float:
        return time.perf_counter() - self.started

    def header(self, total: float) -> str:
        """The ``Server-Timing`` value: every stage, then ``total``."""
        parts = [f"{stage};dur={seconds * 1e3:.3f}" for stage, seconds in self.stages().items()]
        return ", ".join([*parts, f"total;dur={total * 1e3:.3f}"])
