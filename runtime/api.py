"""The Python API the server, the validator and the benchmarks share.

``load_model(path)`` gives a ``DecisionModel`` for a verified package (the torch reference runner)
or for a validated engine directory (its engine runner). A request is answered in four steps so
that a scheduler can admit, queue, batch and time it, and keep the forward, the one step that needs
the model's device, apart from the per-request work around it:

    plan = model.plan(body)                # validation + tokenization + trees; RequestError on a bad request
    hidden = model.forward([plan])[0]      # the backbone runner (batches several plans into one forward)
    result = model.readout(plan, hidden)   # the CPU heads of one plan
    response = model.finish(plan, result)  # answers in request order, keys in the reference's order

``model.execute(plans)`` is ``forward`` then each plan's ``readout``; ``model.answer(body)`` does
every step. ``model.expired(plan)`` is the response of a plan whose deadline passed before it ran.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from .families import family
from .host_memory import keep_freed_memory
from .registry import Registry


class Plan(Protocol):
    input_tokens: int  # tokens the plan will run (usage.input_tokens of the response)
    question_count: int
    valid_count: int  # questions that passed validation

    def reasons(self) -> str: ...


class DecisionModel(Protocol):
    id: str  # the served model id
    family: str  # vela2 | omnijev
    engine: str  # torch | onnxruntime | tensorrt
    device: str  # cpu | cuda

    def card(self) -> dict[str, Any]: ...

    def golden_request(self) -> dict[str, Any]: ...

    def plan(self, body: dict[str, Any], require_valid: bool = True) -> Plan: ...

    def forward(self, plans: Sequence[Plan]) -> list[Any]: ...

    def readout(self, plan: Plan, hidden: Any) -> Any: ...

    def execute(self, plans: Sequence[Plan]) -> list[Any]: ...

    def finish(self, plan: Plan, result: Any) -> dict[str, Any]: ...

    def expired(self, plan: Plan) -> dict[str, Any]: ...

    def answer(self, body: dict[str, Any]) -> dict[str, Any]: ...


def load_model(
    path: str | os.PathLike[str],
    registry: Registry | None = None,
    device: str = "cpu",
    precision: str | None = None,
) -> DecisionModel:
    """A servable model from a package directory or an engine directory (``manifest.json`` present).
    The process keeps freed host memory from here on (``host_memory.keep_freed_memory``)."""
    keep_freed_memory()
    path = Path(path)
    registry = registry or Registry.load()
    if (path / "manifest.json").is_file():
        from .engine import load_engine_model

        return load_engine_model(path, registry, device)
    from .package import verify

    package = verify(path, registry)
    return family(package.family).from_package(package, device=device, precision=precision)
