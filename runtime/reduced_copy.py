"""A reduced copy of an engine's linear layers (``s1omni build --precision fp8``) and when it may be served.

A copy is never served alone, and never under ``exact`` or ``batching``: ``s1omni serve --engine ENG
--profiles max_speed --reduced-copy COPY`` runs ``max_speed`` requests' forwards on it and everything
else on ``ENG``. It is served only where both of these stand (``consent_problem``):

- the member's registry entry consents to that copy on that device: ``"reduced_copies": {"fp8":
  ["cuda"]}`` (``Member.consents_to``; ``s1omni synth`` writes it for synthetic members; the built-in
  entries name none, as the reference's name none on a GPU, vela2.md §8);
- the copy's manifest records a granted consent of the current ``CONSENT_GATE`` (vela2.md §9.3),
  measured against this very engine (its pinned files, and the heads, tokenizer, config and
  calibration the copy shares with it), on this device (``s1omni.export.consent`` runs it).

A refused consent keeps its figures in the manifest; a copy with one is refused like one with none.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .digest import sha256_json
from .engine import load_engine_model, read_manifest
from .errors import GateMissed
from .registry import Registry

REDUCED_PRECISIONS = ("fp8",)
# What the copy must share with the engine it answers for: the plans and heads are the engine's.
SHARED = ("heads.safetensors", "tokenizer.json", "config.json", "calibration.json")
CONSENT_GATE: dict[str, Any] = {
    "name": "reduced-copy",
    "version": 1,
    "least_kept": 0.99,
    "answer_types": ["choice", "noul", "score", "set", "span"],
    "rule": "every answer type's decisions (choice key, score level, noul side, set selection, span set) on the "
    "calibration cases unchanged against the exact engine in at least 99% of them, each type present; the copy's "
    "summed median time per case below the exact engine's, measured in the same run, cases alternating; the "
    "member's registry entry consenting to the copy on the device",
}


def engine_pins(manifest: dict[str, Any]) -> str:
    """One digest of every file an engine's manifest pins: which engine a consent was measured against."""
    return sha256_json(manifest.get("files") or {})


def consent_problem(copy: dict[str, Any], engine: dict[str, Any], registry: Registry, device: str) -> str | None:
    """Why the copy with manifest ``copy`` may not serve ``max_speed`` beside the engine with manifest
    ``engine`` on ``device`` (None when it may)."""
    precision = copy.get("precision")
    if precision not in REDUCED_PRECISIONS:
        return f"is a {precision} engine, not a reduced copy ({', '.join(REDUCED_PRECISIONS)})"
    if copy["member"] != engine["member"]:
        return f"is a copy of {copy['member']['name']}@{copy['member']['revision']}, not of the engine's member"
    if any(copy["files"].get(name) != engine["files"].get(name) for name in SHARED):
        return f"does not share the engine's {', '.join(SHARED)}: build both from one export"
    if copy.get("device") != device:
        return f"runs on {copy.get('device')}, not {device}"
    member = registry.get(copy["member"]["name"])
    if member is None or not member.consents_to(precision, device):
        return f"has no consent of its member's registry entry to a {precision} copy on {device} (\"reduced_copies\")"
    consent = copy.get("consent")
    if not consent:
        return f"has no consent recorded; run `s1omni validate COPY --exact ENG` (the {CONSENT_GATE['name']} gate)"
    gate = consent.get("gate") or {}
    if (gate.get("name"), gate.get("version")) != (CONSENT_GATE["name"], CONSENT_GATE["version"]):
        return f"was judged by {gate.get('name')} version {gate.get('version')}, not the current {CONSENT_GATE['name']} version {CONSENT_GATE['version']}"
    if consent.get("exact", {}).get("pins") != engine_pins(engine):
        return "was measured against another engine (or this one before it changed); run the consent gate against this one"
    if not consent.get("granted"):
        return "was refused its consent: " + "; ".join(consent.get("refusals") or ["no reason recorded"])
    return None


@dataclass(frozen=True)
class ReducedCopy:
    """A consented copy, loaded: its directory, its manifest and its model (whose ``forward`` runs ``max_speed``)."""

    path: Path
    manifest: dict[str, Any]
    model: Any

    @property
    def consent(self) -> dict[str, Any]:
        return self.manifest["consent"]

    def card(self) -> dict[str, Any]:
        """What ``GET /v1/models`` says of it under ``max_speed``."""
        manifest = self.manifest
        figures = self.consent["figures"]
        return {
            "name": self.path.name,
            "precision": manifest["precision"],
            "engine": f"{manifest['backend']}/{manifest['target']}",
            "consent": {
                "gate": self.consent["gate"]["name"],
                "gate_version": self.consent["gate"]["version"],
                "least_kept": self.consent["gate"]["least_kept"],
                "kept": {kind: f"{figure['kept']}/{figure['compared']}" for kind, figure in figures.items()},
                "speedup": self.consent["speed"]["speedup"],
            },
        }


def load_reduced_copy(path: str | Path, engine_dir: str | Path, registry: Registry, device: str) -> ReducedCopy:
    """The copy at ``path`` for the engine at ``engine_dir``; ``GateMissed`` naming why where it may not be served."""
    path = Path(path)
    copy, engine = read_manifest(path), read_manifest(engine_dir)
    problem = consent_problem(copy, engine, registry, device)
    if problem:
        raise GateMissed(f"the reduced copy {path} {problem}; it will not be served (max_speed is refused)")
    model = load_engine_model(path, registry, device, allow_unvalidated=True)  # its files checked; its standing is the consent
    return ReducedCopy(path, copy, model)
