"""The consent gate of a reduced copy (vela2.md §9.3): ``s1omni validate COPY --exact ENG``.

The copy and the exact engine answer every calibration case; each answer type's decisions are counted
unchanged or not (``decisions``: a choice's key, a score's most probable level, a noul's side of 0.5, a
set's selection, a span question's set of (label, start, end); an answer that errors is its error), and
the two are timed in the same run: one untimed pass each (warm-up, and the answers), then ``rounds``
passes with the cases alternating between them, each engine's figure the sum over the cases of its
median ``execute`` time. The copy is granted its consent only where every answer type has decisions
and keeps at least ``least_kept`` of them, the copy is faster, and the member's registry entry
consents to the copy on that device; else it is refused, with every reason and the same figures.
Either way the verdict goes into the copy's manifest (``consent``), and only a granted one is served
(``s1omni.runtime.reduced_copy``).

The exact engine need not be validated yet (the gate compares the copy with it, not with the
reference); serving it still needs its own validation.

No tie allowance here, unlike the validation gates (``compare_answers``): a decision the copy flips
at a boundary is still served differently, and the consent counts what a client would see change.

The gate runs here, not when a server starts: it takes every case on both engines several times
(minutes on a large member), its speed figure moves from run to run, and a server's profiles should
not depend on start-up noise; the verdict is recorded once with its figures, as validation verdicts
are, and the server only reads it.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from s1omni.calib import CALIB
from s1omni.runtime import progress
from s1omni.runtime.engine import load_engine_model, read_manifest, record_consent
from s1omni.runtime.errors import UsageError
from s1omni.runtime.reduced_copy import CONSENT_GATE, REDUCED_PRECISIONS, engine_pins
from s1omni.runtime.registry import Registry

from .compare_answers import most_probable
from .reference import load_cases

ROUNDS = 3


def decisions(response: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """A Vela 2.0 response's decisions by answer type, then by key."""
    out: dict[str, dict[str, Any]] = {kind: {} for kind in CONSENT_GATE["answer_types"]}
    for key, answer in response.get("answers", {}).items():
        if "error" in answer:
            kind = answer.get("type", "choice")
            out[kind if kind in out else "choice"][key] = ("error", answer["error"])
        elif answer["type"] == "choice":
            out["choice"][key] = answer["choice"]
        elif answer["type"] == "score":
            out["score"][key] = most_probable(answer["probabilities"])
        else:
            out["noul"][key] = answer["noul"] > 0.5
    for key, answer in response.get("sets", {}).items():
        out["set"][key] = ("error", answer["error"]) if "error" in answer else tuple(sorted(answer["selected"]))
    for key, spans in response.get("spans", {}).items():
        out["span"][key] = ("error", spans["error"]) if isinstance(spans, dict) else frozenset((s["label"], s["start"], s["end"]) for s in spans)
    return out


def count(names: Sequence[str], exact: Sequence[dict[str, Any]], copy: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per answer type: decisions compared, kept, and the changed ones (``case: key``)."""
    figures = {kind: {"kept": 0, "compared": 0, "changed": []} for kind in CONSENT_GATE["answer_types"]}
    for name, want, got in zip(names, exact, copy, strict=True):
        theirs = decisions(got)
        for kind, expected in decisions(want).items():
            for key, decision in expected.items():
                figure = figures[kind]
                figure["compared"] += 1
                if theirs[kind].get(key, ("missing",)) == decision:
                    figure["kept"] += 1
                else:
                    figure["changed"].append(f"{name}: {key}")
    return figures


def verdict(figures: dict[str, dict[str, Any]], speed: dict[str, float], registry_consents: bool, copy: str, device: str) -> dict[str, Any]:
    """The consent record: ``granted`` and every reason it is refused, with the figures it was judged on."""
    least = CONSENT_GATE["least_kept"]
    refusals = []
    if not registry_consents:
        refusals.append(f"the member's registry entry does not consent to a {copy} copy on {device}")
    for kind, figure in figures.items():
        if not figure["compared"]:
            refusals.append(f"no {kind} decisions in the cases: the gate cannot judge them")
        elif figure["kept"] < least * figure["compared"]:
            refusals.append(f"{kind} {figure['kept']}/{figure['compared']} ({figure['kept'] / figure['compared']:.1%}) kept, below {least:.0%}")
    if not speed["copy_s"] < speed["exact_s"]:
        refusals.append(f"not faster: {speed['copy_s'] * 1e3:.1f} ms against the exact engine's {speed['exact_s'] * 1e3:.1f} ms")
    return {
        "granted": not refusals,
        "refusals": refusals,
        "gate": dict(CONSENT_GATE),
        "registry_consents": registry_consents,
        "figures": figures,
        "speed": speed,
    }


def _timed(model: Any, plans: Sequence[Any]) -> tuple[list[dict[str, Any]], list[float]]:
    """Each plan's response and its ``execute`` time."""
    responses, seconds = [], []
    for plan in plans:
        started = time.perf_counter()
        outputs = model.execute([plan])[0]
        seconds.append(time.perf_counter() - started)
        responses.append(model.finish(plan, outputs))
    return responses, seconds


def measure(exact: Any, copy: Any, cases: Sequence[dict[str, Any]], rounds: int = ROUNDS) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, float]]:
    """Both engines' responses to ``cases`` and the speed figures (see the module docstring)."""
    plans = [exact.plan(case["request"]) for case in cases]
    exact_answers, _ = _timed(exact, progress.track(plans, "consent: exact engine", unit="case"))
    copy_answers, _ = _timed(copy, progress.track(plans, "consent: reduced copy", unit="case"))
    times: dict[str, list[list[float]]] = {"exact": [[] for _ in plans], "copy": [[] for _ in plans]}
    for _ in progress.track(range(rounds), "consent: timed rounds", unit="round"):
        for index, plan in enumerate(plans):
            for side, model in (("exact", exact), ("copy", copy)):
                times[side][index] += _timed(model, [plan])[1]
    exact_s, copy_s = (sum(statistics.median(case) for case in times[side]) for side in ("exact", "copy"))
    return exact_answers, copy_answers, {"exact_s": exact_s, "copy_s": copy_s, "speedup": exact_s / copy_s if copy_s else 0.0, "rounds": rounds}


def run_consent(copy_dir: str | Path, exact_dir: str | Path, cases_path: str | Path | None = None, rounds: int = ROUNDS,
                registry: Registry | None = None) -> dict[str, Any]:  # fmt: skip
    """Judge the copy at ``copy_dir`` against the exact engine at ``exact_dir``, record the verdict in the copy's
    manifest, print it, and return it."""
    copy_dir, exact_dir = Path(copy_dir), Path(exact_dir)
    copy_manifest, exact_manifest = read_manifest(copy_dir), read_manifest(exact_dir)
    precision = copy_manifest.get("precision")
    if precision not in REDUCED_PRECISIONS:
        raise UsageError(f"{copy_dir} is a {precision} engine, not a reduced copy: --exact is for {', '.join(REDUCED_PRECISIONS)} builds")
    if exact_manifest.get("precision") in REDUCED_PRECISIONS:
        raise UsageError(f"--exact {exact_dir} is itself a reduced copy; name the engine served as exact")
    if exact_manifest["member"] != copy_manifest["member"] or exact_manifest.get("device") != copy_manifest.get("device"):
        raise UsageError(f"{copy_dir} and {exact_dir} are not of one member on one device")
    registry = registry or Registry.load()
    device = copy_manifest.get("device", "cpu")
    member = registry.get(copy_manifest["member"]["name"])
    exact = load_engine_model(exact_dir, registry, device, allow_unvalidated=True)
    copy = load_engine_model(copy_dir, registry, device, allow_unvalidated=True)  # its standing is what is judged here
    cases = load_cases(cases_path or CALIB / copy_manifest["family"])
    progress.note(f"consent: {copy_dir} against {exact_dir}, {len(cases)} cases, {rounds} timed rounds")
    exact_answers, copy_answers, speed = measure(exact, copy, cases, rounds)
    figures = count([case["name"] for case in cases], exact_answers, copy_answers)
    consent = verdict(figures, speed, member is not None and member.consents_to(precision, device), precision, device)
    consent["exact"] = {"path": str(exact_dir.resolve()), "pins": engine_pins(exact_manifest), "precision": exact_manifest.get("precision")}
    consent["cases"] = len(cases)
    record_consent(copy_dir, consent)
    print_verdict(consent)
    return consent


def print_verdict(consent: dict[str, Any]) -> None:
    for kind, figure in consent["figures"].items():
        share = f"{figure['kept'] / figure['compared']:.1%}" if figure["compared"] else "-"
        changed = f"  changed: {', '.join(figure['changed'][:5])}" + (" ..." if len(figure["changed"]) > 5 else "") if figure["changed"] else ""
        print(f"{kind:7} {figure['kept']:5d}/{figure['compared']:<5d} {share:>7}{changed}", file=sys.stderr)
    speed = consent["speed"]
    print(f"speed   exact {speed['exact_s'] * 1e3:.1f} ms, copy {speed['copy_s'] * 1e3:.1f} ms ({speed['speedup']:.2f}x)", file=sys.stderr)
    print(("GRANTED" if consent["granted"] else "REFUSED") + f" consent ({consent['gate']['name']} v{consent['gate']['version']})"
          + "".join(f"\n  {reason}" for reason in consent["refusals"]), file=sys.stderr)  # fmt: skip
