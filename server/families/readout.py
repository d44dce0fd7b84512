"""A request's steps after its forward, off the model worker thread: heads, then finish (both families)."""

from __future__ import annotations

import time
from typing import Any

from s1omni.runtime.api import DecisionModel, Plan

from ..timing import Timing


def read_and_finish(model: DecisionModel, plan: Plan, forwarded: Any, timing: Timing) -> dict[str, Any]:
    """The response of a plan from its share of a forward: ``model.readout`` (adds to ``timing.heads``),
    then ``model.finish`` (to ``timing.post``). Off the worker thread, so the next forward runs meanwhile."""
    mark = time.perf_counter()
    result = model.readout(plan, forwarded)
    read = time.perf_counter()
    content = model.finish(plan, result)
    timing.heads += read - mark
    timing.post += time.perf_counter() - read
    return content
