"""Each model family's rules over the one server: how its requests are read, answered and refused,
and how it describes itself.

The app, the scheduler, the access log and the metrics registry are the same for every family;
the family of the package being served picks one ``Family``: ``vela2`` (the contract of
vllm-project/semantic-router, ``{"error": {"code", "message"}}``) or ``omnijev``
(wire-contract.md §11, ``{"detail": ...}``).
"""

from __future__ import annotations

from typing import Any, Protocol

from s1omni.runtime.api import DecisionModel
from s1omni.runtime.errors import RequestError
from s1omni.runtime.families import family

from ..config import ServeConfig
from ..metrics import Metrics
from ..scheduler import Arrival, Limits, Scheduler
from ..timing import Timing


class Family(Protocol):
    name: str  # the ``family`` of the models it serves
    max_body: int  # request body bytes; past them 413
    limits: Limits  # the scheduler's

    def card(self, model: DecisionModel) -> dict[str, Any]:
        """The model's card as ``/v1/models`` shows it."""
        ...

    def bind(self, model: DecisionModel, card: dict[str, Any], scheduler: Scheduler) -> None:
        """The loaded model, its card and the scheduler that runs it: before any request."""
        ...

    def read(self, raw: bytes) -> Any:
        """The strict JSON value of a body; ``RequestError`` (400) when it is not one."""
        ...

    async def answer(self, body: Any, size: int, timing: Timing, arrival: Arrival | None) -> tuple[dict[str, Any], int]:
        """The response content of a read body and the tokens the model processed for it."""
        ...

    def refusal(self, error: RequestError, status: int | None) -> tuple[int, dict[str, Any], dict[str, str]]:
        """Status, body and headers of a refused request; ``status`` overrides the error's own."""
        ...

    def health(self, status: str, reason: str | None, model: str | None) -> dict[str, Any]: ...

    def live(self) -> dict[str, Any]: ...

    def models(self, card: dict[str, Any]) -> dict[str, Any]: ...


def _vela(config: ServeConfig, metrics: Metrics) -> Family:
    from .vela import Vela

    return Vela(config)


def _omnijev(config: ServeConfig, metrics: Metrics) -> Family:
    from .omnijev import OmniJev

    return OmniJev(metrics)


# Each family's rules under the names of ``s1omni.runtime.families``; each module is imported only
# when its family is served.
RULES = {"vela2": _vela, "omnijev": _omnijev}


def family_for(name: str, config: ServeConfig, metrics: Metrics) -> Family:
    """The rules of family ``name``; ``UnknownFamily`` (the runtime table's) when there are none."""
    return RULES[family(name).name](config, metrics)
