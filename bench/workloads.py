"""In-process workloads: what each one runs, and its timing on every subject in one process.

``backbone-N`` is one tree, the way the engine path runs a request: a prefix of N tokens, then one
block of ``BLOCK_TOKENS`` tokens continuing from its state (``runner.run`` = prefill + continue,
hidden states read back at the block's last token). Every other workload is a calibration case
answered through ``model.answer`` (planning, runner, heads, finishing): ``router`` is the
router-signal request (six questions, all five kinds, about 600 tokens of text), ``long-span`` the
windowed long span request, and any case name of ``calib/<family>/cases.json`` works too.
``NAME@N`` (``router@16``) is N copies of that request planned, run in one ``model.execute`` and
finished: the forward the server runs for N requests that arrive together, without HTTP.
``NAME:shared_context`` (``router:shared_context``) runs a request's forward through an engine's packed
graph (``model.forward_packed``), as the ``shared_context`` profile does; the torch reference, which has
none, runs it as ``exact``, and the record says so. For
OmniJev, ``screenshot-N`` is one choice question with N options about a 1600x900 screenshot
(``screenshot`` expands to 1, 12 and 255 options, the reference's own speed cases).
"""

from __future__ import annotations

import base64
import io
import json
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from PIL import Image, ImageDraw

from s1omni.runtime.errors import UsageError
from s1omni.runtime.families import family as family_of
from s1omni.runtime.runners.base import Block, Prefix, Tree

from .references import REFERENCE, ratio_note, release_cached_memory, workload_ratios
from .stats import now, summarize, time_calls, to_ms

from s1omni.calib import CALIB
BACKBONE = re.compile(r"backbone-(\d+)")
SCREENSHOT = re.compile(r"screenshot-(\d+)")
MERGED = re.compile(r"(.+)@([1-9]\d*)")
PACKED = re.compile(r"(.+):shared_context")
SCREENSHOT_SIZE = (1600, 900)
SCREENSHOT_OPTIONS = (1, 12, 255)
ALIASES = {"router": "router-signals-600", "long-span": "span-windowed-long"}
BLOCK_TOKENS = 8
# Token ids drawn below this: every member's vocabulary has them (the tiny synthetic one has 2,048).
ID_CEILING = 1000


@dataclass(frozen=True)
class Workload:
    name: str
    facts: dict[str, Any]  # what the record says was run
    tree: Tree | None = None  # backbone workloads
    body: dict[str, Any] | None = None  # request workloads
    copies: int = 1  # requests merged into one forward
    packed: bool = False  # forwards through the engine's packed graph (shared_context)

    def forward(self, model: Any) -> Callable[[Sequence[Any]], Any]:
        """``model``'s forward for this workload: its packed one where the workload and the model have one."""
        if self.packed and getattr(model.runner, "can_pack", False):
            model.open_shared_context()
            return model.forward_packed
        return model.forward

    def call(self, model: Any) -> Callable[[], Any]:
        """One call of this workload on ``model``, as a zero-argument call: a runner call, or the responses
        to ``copies`` requests (one plan each, one forward for all, then each read out and finished)."""
        if self.tree is not None:
            runner, trees = model.runner, [self.tree]
            return lambda: runner.run(trees)
        body, copies, forward = self.body, self.copies, self.forward(model)

        def answers() -> list[dict[str, Any]]:
            plans = [model.plan(body) for _ in range(copies)]
            return [model.finish(plan, model.readout(plan, hidden)) for plan, hidden in zip(plans, forward(plans), strict=True)]

        return answers

    def stages(self, model: Any) -> Callable[[], dict[str, float]]:
        """One request of this workload on ``model`` step by step, as a zero-argument call giving each
        step's seconds: plan, forward (the backbone runner, what the server's worker thread runs),
        readout (the CPU heads) and finish (decisions, span decoding). Request workloads only."""
        if self.body is None:
            raise UsageError(f"{self.name!r} is not a request: only requests run in steps")
        body, copies, forward = self.body, self.copies, self.forward(model)

        def steps() -> dict[str, float]:
            started = time.perf_counter()
            plans = [model.plan(body) for _ in range(copies)]
            planned = time.perf_counter()
            hidden = forward(plans)
            forwarded = time.perf_counter()
            outputs = [model.readout(plan, each) for plan, each in zip(plans, hidden, strict=True)]
            read = time.perf_counter()
            for plan, output in zip(plans, outputs, strict=True):
                model.finish(plan, output)
            ended = time.perf_counter()
            return {"plan": planned - started, "forward": forwarded - planned, "readout": read - forwarded, "finish": ended - read}

        return steps


def backbone(tokens: int) -> Workload:
    # Random ids, never zeros: a constant input can hide wrong indexing and time faster than text.
    rng = np.random.default_rng(tokens)
    prefix = Prefix(rng.integers(1, ID_CEILING, tokens, dtype=np.int64))
    block = Block(rng.integers(1, ID_CEILING, BLOCK_TOKENS, dtype=np.int64), np.array([BLOCK_TOKENS - 1], np.int64))
    facts = {
        "kind": "backbone",
        "call": "runner.run: prefill(prefix) + continue_blocks(1 block)",
        "prefix_tokens": tokens,
        "block_tokens": BLOCK_TOKENS,
        "input_tokens": tokens + BLOCK_TOKENS,
    }
    return Workload(f"backbone-{tokens}", facts, tree=Tree(prefix, (block,)))


def screenshot_url(width: int, height: int) -> str:
    """A PNG data URL of a desktop-like screen: title bar, sidebar, text lines, buttons (fixed, no randomness)."""
    image = Image.new("RGB", (width, height), (236, 239, 244))
    draw = ImageDraw.Draw(image)
    draw.rectangle((0, 0, width, 36), fill=(45, 52, 64))
    draw.rectangle((0, 36, width // 5, height), fill=(216, 222, 233))
    for row in range(60, height - 80, 28):  # "text": dark bars of varying length
        draw.rectangle((width // 5 + 40, row, width // 5 + 40 + (row * 37) % (width // 2) + 120, row + 12), fill=(59, 66, 82))
    for index, colour in enumerate([(191, 97, 106), (163, 190, 140), (94, 129, 172)]):
        left = width - 360 + 115 * index
        draw.rectangle((left, height - 64, left + 100, height - 24), fill=colour)
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def screenshot(options: int) -> Workload:
    """One OmniJev choice question with ``options`` options about a 1600x900 screenshot."""
    question = {
        "type": "choice",
        "instructions": "Which element of the screen should be clicked next?",
        "options": [{"key": f"element {index:03d}", "text": f"the control labelled {index}"} for index in range(options)],
    }
    body = {"state": {"images": [screenshot_url(*SCREENSHOT_SIZE)]}, "questions": {"next": question}}
    facts = {"kind": "request", "call": "model.answer", "image": "x".join(map(str, SCREENSHOT_SIZE)), "options": options}
    return Workload(f"screenshot-{options}", facts, body=body)


def cases(family: str) -> dict[str, dict[str, Any]]:
    data = json.loads((CALIB / family / "cases.json").read_text(encoding="utf-8"))
    return {case["name"]: case["request"] for case in data["cases"]}


def named(name: str, family: str) -> Workload:
    """``backbone-N``, ``screenshot-N`` (OmniJev), a calibration case by its name or alias (``router``,
    ``long-span``), or one of those requests ``@N`` or ``:shared_context``."""
    found = PACKED.fullmatch(name)
    if found:
        single = named(found.group(1), family)
        if single.body is None or family != "vela2":
            raise UsageError(f"{name!r}: only Vela 2.0 requests run shared_context")
        facts = {**single.facts, "profile": "shared_context", "reference_profile": "exact (the torch reference has no packed forward)"}
        return Workload(name, facts, body=single.body, copies=single.copies, packed=True)
    found = MERGED.fullmatch(name)
    if found:
        single = named(found.group(1), family)
        if single.body is None:
            raise UsageError(f"{name!r}: only requests merge (@N), not backbone-N")
        copies = int(found.group(2))
        facts = {**single.facts, "call": "model.execute of N plans, then model.finish each", "merged_requests": copies}
        return Workload(name, facts, body=single.body, copies=copies)
    found = BACKBONE.fullmatch(name)
    if found:
        return backbone(int(found.group(1)))
    found = SCREENSHOT.fullmatch(name)
    if found and family_of(family).images:
        return screenshot(int(found.group(1)))
    case = ALIASES.get(name, name)
    known = cases(family)
    if case not in known:
        raise UsageError(
            f"no workload {name!r}; use backbone-N, {', '.join(ALIASES)}, screenshot-N (OmniJev) or a case of {CALIB / family}"
        )
    return Workload(name, {"kind": "request", "call": "model.answer", "case": case}, body=known[case])


def resolve(names: Sequence[str], tokens: Sequence[int], family: str) -> list[Workload]:
    """``backbone`` expands to one workload per token count, ``screenshot`` to ``SCREENSHOT_OPTIONS``;
    other names go through ``named``."""
    expand = {"backbone": [f"backbone-{count}" for count in tokens], "screenshot": [f"screenshot-{n}" for n in SCREENSHOT_OPTIONS]}
    return [named(each, family) for name in names for each in expand.get(name, [name])]


def answer_errors(response: dict[str, Any]) -> int:
    """Questions answered with an error (a 200 response can still carry them, e.g. non-finite logits)."""
    return sum(1 for answer in response.get("answers", {}).values() if isinstance(answer, dict) and "error" in answer)


def measure(
    workload: Workload,
    subjects: Mapping[str, Any],
    requests: int,
    warmup: int,
    progress: Callable[[str], None],
) -> dict[str, Any]:
    """Each subject in turn, same inputs: one checked feasibility call and ``warmup`` calls, excluded, then
    ``requests`` timed calls; ratios against the faster reference from these very samples."""
    entry: dict[str, Any] = {"name": workload.name, **workload.facts, "started": now(), "results": {}}
    reference = subjects[REFERENCE]
    if workload.body is not None:
        entry["input_tokens"] = reference.plan(workload.body).input_tokens
    for name, model in subjects.items():
        call = workload.call(model)
        first = call()  # the feasibility call: excluded from the samples, its answers checked
        errors = sum(map(answer_errors, first)) if workload.body is not None else None
        samples, wall = time_calls(call, requests, warmup)
        release_cached_memory(name)
        summary = summarize(to_ms(samples), wall)
        entry["results"][name] = {**summary, "feasibility": 1, "warmup": warmup, "answer_errors": errors}
        progress(f"{workload.name} {name}: p50 {summary['p50_ms']:.3f} ms, p95 {summary['p95_ms']:.3f} ms ({requests} samples)")
    entry |= workload_ratios(entry["results"])
    progress(ratio_note(entry))
    entry["finished"] = now()
    return entry
