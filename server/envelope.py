"""The decisions request envelope (fields, options, images, ``states``) and the response's key order.

The envelope is checked before anything is planned: unknown top-level fields, a ``model`` that is
not a string (400) or not served (404, ``model_not_found``), malformed ``options`` (a ``profile``
the server did not enable among them: ``s1omni.server.profiles``), images sent to a model without
the image modality and malformed ``states`` all fail the whole request with 400
``invalid_request`` (vllm-project/semantic-router:src/model-runtime/vllm_srun/runtime.py
``prepare`` and ``_options``; api/openapi.yaml ``DecisionRequest``). What the state and the
questions say is the model's to judge (``model.plan``).

``states`` are further states answered in the same call: each entry is planned exactly as a request
with its own state, questions and images and this request's model and options would be, and its
answer comes back under the same name in ``states`` (vllm-project/semantic-router:
src/model-runtime/vllm_srun/plugins/decisions.py ``split_states``/``join_states``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from s1omni.runtime.errors import RequestError

from . import profiles

FIELDS = ("model", "state", "questions", "images", "states", "options")
STATE_FIELDS = ("state", "questions", "images")
OPTIONS = ("deadline_ms", "profile", "return_meta", "max_tokens")


@dataclass(frozen=True)
class Served:
    """What the envelope needs to know of the served model."""

    id: str
    names: frozenset[str]  # every name a request's ``model`` may use: the id, the repo
    reads_images: bool
    profiles: tuple[str, ...]  # those ``options.profile`` may name: exact first, its default


@dataclass(frozen=True)
class Envelope:
    """A checked request: one plan body per state (its own first) and the request's options."""

    bodies: tuple[dict[str, Any], ...]
    state_names: tuple[str, ...]  # the names of ``states``, in order: bodies[1:]
    deadline_ms: float | None
    profile: str
    return_meta: bool


def _invalid(message: str) -> RequestError:
    return RequestError("invalid_request", message)


def _deadline_ms(value: Any) -> float:
    refused = _invalid("options.deadline_ms must be a finite number > 0")
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise refused
    try:
        ms = float(value)
    except OverflowError as exc:  # an integer beyond any float
        raise refused from exc
    if not (math.isfinite(ms) and ms > 0):
        raise refused
    return ms


def _profile(value: Any, enabled: tuple[str, ...]) -> str:
    """The profile ``options.profile`` names: one the server enabled, else 400 with the enabled ones."""
    if value in enabled:
        return value
    if not profiles.well_formed(value):
        raise _invalid(f"options.profile must be a profile name ({profiles.NAME_PATTERN}): one of {list(enabled)}")
    hint = f" (`s1omni serve {profiles.enabling(value)}` enables it)" if value in profiles.KNOWN else ""
    raise _invalid(f"options.profile {value!r} is not enabled on this server, which runs {list(enabled)}{hint}")


def _options(value: Any, enabled: tuple[str, ...]) -> tuple[float | None, str, bool, int | None]:
    """(deadline_ms, profile, return_meta, max_tokens) of ``options``."""
    if value is None:
        value = {}
    if not isinstance(value, dict):
        raise _invalid("options must be an object")
    unknown = sorted(set(value) - set(OPTIONS))
    if unknown:
        raise _invalid(f"options takes only {list(OPTIONS)}, not {unknown}")
    deadline = value.get("deadline_ms")
    profile = _profile(value.get("profile", enabled[0]), enabled)
    return_meta = value.get("return_meta", False)
    if not isinstance(return_meta, bool):
        raise _invalid("options.return_meta must be a boolean")
    max_tokens = value.get("max_tokens")
    if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1):
        raise _invalid("options.max_tokens must be an integer >= 1")
    return (None if deadline is None else _deadline_ms(deadline)), profile, return_meta, max_tokens


def _plan_body(entry: dict[str, Any], where: str, reads_images: bool, max_tokens: int | None) -> dict[str, Any]:
    """What ``model.plan`` reads for one state: state, questions, images and the scan budget."""
    for required in ("state", "questions"):
        if required not in entry:
            raise _invalid(f"{where}{required} is required")
    body = {"state": entry["state"], "questions": entry["questions"]}
    images = entry.get("images")
    if images is not None:
        if not isinstance(images, list):
            raise _invalid(f"{where}images must be an array of data URLs")
        if images and not reads_images:
            raise _invalid(f"{where}images must be empty: this model does not read images")
        if images:
            body["images"] = images
    if max_tokens is not None:
        body["options"] = {"max_tokens": max_tokens}
    return body


def read(body: Any, served: Served) -> Envelope:
    """Check a decoded request against the envelope."""
    if not isinstance(body, dict):
        raise _invalid("the request body must be a JSON object")
    unknown = sorted(set(body) - set(FIELDS))
    if unknown:
        raise _invalid(f"unknown request fields: {unknown}")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise _invalid("model must be a string")
    if model is not None and model not in served.names:
        raise RequestError("model_not_found", f"this server serves {served.id}, not {model}")
    deadline_ms, profile, return_meta, max_tokens = _options(body.get("options"), served.profiles)
    bodies = [_plan_body(body, "", served.reads_images, max_tokens)]
    states = body.get("states")
    if states is not None and not isinstance(states, dict):
        raise _invalid("states must be an object of named states")
    for name, entry in (states or {}).items():
        if not name.strip():
            raise _invalid("every entry of states needs a non-blank name")
        if not isinstance(entry, dict) or set(entry) - set(STATE_FIELDS):
            raise _invalid(f"states[{name!r}] is an object of {list(STATE_FIELDS)}")
        bodies.append(_plan_body(entry, f"states[{name!r}].", served.reads_images, max_tokens))
    return Envelope(tuple(bodies), tuple(states or ()), deadline_ms, profile, return_meta)


def response(model_id: str, answered: list[dict[str, Any]], names: tuple[str, ...], meta: dict[str, Any] | None) -> dict[str, Any]:
    """The response body: ``model`` first, the request's own answers (``model.finish``'s order), then
    ``states`` (each entry ``model`` first too) and, only when asked for, ``meta`` last."""
    own, *parts = answered
    content: dict[str, Any] = {"model": model_id, **own}
    if names:
        content["states"] = {name: {"model": model_id, **part} for name, part in zip(names, parts, strict=True)}
    if meta is not None:
        content["meta"] = meta
    return content
