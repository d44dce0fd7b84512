"""The speed profiles a Vela 2.0 request chooses with ``options.profile`` (vela2.md §8), and which of
them a server runs.

``exact`` is always enabled and is the default: the scheduler gives a forward the plans of one
admitted group only (a request and its ``states``), with the shapes and batching that request has
alone, so that its answers never depend on what else the server is running. ``batching`` is opt-in
and approximate: the scheduler merges the plans of concurrent ``batching`` requests into one
forward within its batching window (``Limits``), so a request's prefix may be left-padded to a
wider one of another request; its answers stay within the engine's gate of ``exact`` (the same
decisions; on the CPU float32 engine, probabilities within 1e-5), not byte for byte. As the reference's
(vela2.md §8: "as shared_context, and also merges concurrent requests") its forwards run packed, each
tree's blocks in one row behind its prefix, on an engine whose merged packed forwards passed
``s1omni validate ENG --merged N --shared-context`` (``packed_batching_check``); on any other engine they
merge in exact's layout, one row a block, which ``s1omni validate ENG --merged N`` holds to alone
(``s1omni.export.merged_check``). The card's entry says which. A server runs
``exact`` and the profiles it was started with (``s1omni serve --profiles batching``); the card of
``GET /v1/models`` lists them, and a request for any other is 400 ``invalid_request``.

``max_speed`` is ``batching`` on a reduced copy of the engine's linear layers (``s1omni build --precision
fp8``): its forwards run on the copy, merged like ``batching``'s (never with ``batching``'s: another
model), and everything else of the request (plan, heads, finish) on the engine. A server offers it only
with a copy whose consent stands (``s1omni serve --profiles max_speed --reduced-copy COPY``;
``s1omni.runtime.reduced_copy``): otherwise it does not start. Its card entry is ``approximate`` and
names the copy and its consent figures.

``shared_context`` packs each tree's blocks into one row behind its prefix (the engine's packed graph,
``s1omni.export.patches.PackedForward``) and, like ``exact``, never merges requests. It is ``exact`` up to
float32 rounding (the same keys and weights, summed in another order), not byte for byte; a server offers it
only with an engine whose packed forwards passed ``s1omni validate ENG --shared-context`` (the device's
fixed gate against exact, ``s1omni.export.merged_check``), and its card entry carries that verdict's
figures.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from s1omni.runtime.errors import UsageError

if TYPE_CHECKING:
    from .scheduler import Limits

# What a profile's name may look like on the wire (wire-contract.md §2).
NAME_PATTERN = "[a-z][a-z0-9_]*"
_NAME = re.compile(NAME_PATTERN)


@dataclass(frozen=True)
class Profile:
    name: str
    merges_requests: bool  # whether a forward takes the plans of concurrent requests


EXACT = Profile("exact", merges_requests=False)
SHARED_CONTEXT = Profile("shared_context", merges_requests=False)  # on the engine's packed graph
BATCHING = Profile("batching", merges_requests=True)
MAX_SPEED = Profile("max_speed", merges_requests=True)  # on a reduced copy
KNOWN = {profile.name: profile for profile in (EXACT, SHARED_CONTEXT, BATCHING, MAX_SPEED)}


def well_formed(name: Any) -> bool:
    return isinstance(name, str) and _NAME.fullmatch(name) is not None


def enabled(names: Iterable[str]) -> tuple[str, ...]:
    """``exact``, then each other profile of ``names`` once, in their order; ``UsageError`` naming the
    known profiles for any other name."""
    chosen = [EXACT.name]
    for name in names:
        if name not in KNOWN:
            raise UsageError(f"unknown profile {name!r}: the known profiles are {', '.join(KNOWN)}")
        if name not in chosen:
            chosen.append(name)
    return tuple(chosen)


def enabling(name: str) -> str:
    """The ``s1omni serve`` options that enable the known profile ``name``."""
    return f"--profiles {name}" + (" --reduced-copy COPY" if name == MAX_SPEED.name else "")


def _merging(limits: Limits, profile: Profile) -> str:
    return (f"merged with concurrent {profile.name} requests into one forward within a {limits.batch_window_s * 1e3:g} ms window "
            f"(at most {limits.max_batch_tokens} tokens and {limits.max_batch_plans} plans a forward)")  # fmt: skip


def packed_batching_check(model: Any) -> dict[str, Any] | None:
    """The passed verdict on ``model``'s merged packed forwards (``s1omni validate ENG --merged N --shared-context``),
    on which ``batching`` packs its forwards; None where it has none or missed (it merges in exact's layout then)."""
    check = getattr(model, "merged_packed_check", None)
    return check if check and check.get("passed") else None


def _check_figures(check: dict[str, Any]) -> dict[str, Any]:
    summary = check["summary"]
    return {"gate": check["gate"]["name"], "decisions": summary["decisions"], "span_sets": summary["span_sets"],
            "max_probability": summary["max_probability"]}  # fmt: skip


def batching_entry(limits: Limits, packed: dict[str, Any] | None = None) -> dict[str, Any]:
    """The card's entry for ``batching`` under the scheduler's ``limits``, its forwards packed where ``packed``
    (the engine's passed merged packed check, ``packed_batching_check``) is given."""
    if packed is None:
        return {
            "name": BATCHING.name,
            "numerics": "approximate",
            "description": (
                f"{_merging(limits, BATCHING)}, in exact's layout: a prefix may be left-padded to another request's, so answers "
                "are within the engine's gate of exact (the same decisions), not byte for byte"
            ),
        }
    figures = _check_figures(packed)
    return {
        "name": BATCHING.name,
        "numerics": "approximate",
        "check": figures,
        "description": (
            f"{_merging(limits, BATCHING)}, each tree's blocks packed into one row behind its prefix (as shared_context): a "
            "prefix may be left-padded to another request's, so answers are within the engine's gate of exact, not byte for "
            f"byte; held to the {figures['gate']} gate of each request alone (decisions {figures['decisions']}, max |dp| "
            f"{figures['max_probability']:.2g} with {packed['group']} calibration cases to a forward)"
        ),
    }


def shared_context_entry(check: dict[str, Any]) -> dict[str, Any]:
    """The card's entry for ``shared_context``, from the engine's passed packed check (``s1omni validate --shared-context``)."""
    summary = check["summary"]
    return {
        "name": SHARED_CONTEXT.name,
        "numerics": "approximate",
        "check": _check_figures(check),
        "description": (
            "each tree's blocks packed into one row behind its prefix, each request alone: exact's answers up to the "
            f"engine's rounding, held to the {check['gate']['name']} gate of exact (decisions {summary['decisions']}, max |dp| "
            f"{summary['max_probability']:.2g} on the calibration cases)"
        ),
    }


def max_speed_entry(limits: Limits, copy: dict[str, Any]) -> dict[str, Any]:
    """The card's entry for ``max_speed`` on the reduced copy described by ``copy`` (``ReducedCopy.card``)."""
    return {
        "name": MAX_SPEED.name,
        "numerics": "approximate",
        "copy": copy,
        "description": (
            f"{_merging(limits, MAX_SPEED)}, on the reduced copy {copy['name']} ({copy['precision']} linear layers): its consent "
            f"keeps at least {copy['consent']['least_kept']:.0%} of every answer type's decisions of exact on the calibration "
            "cases, not all of them"
        ),
    }
