"""``s1omni validate ENG``: an engine against the torch reference, at the tensor and the answer level.

Tensor level: Polygraphy's comparator over the hidden states at every readout, the engine's
``TreeRunner`` against the reference's saved ``RunResults``. Answer level: the engine's JSON answers
against the reference's, with the member's gates for the engine's precision (``calib/<family>/gates.json``):
same token ids and readouts everywhere, same usage, decisions identical (all of them on the CPU in
float32; on a GPU where the reference's top-two margin is at least the gate's margin), probabilities within
the gate, score expectations within the gate, and enough identical span sets. The validator prints
a table per case, records the report in the engine's manifest and fails on any miss; an engine
without a passing report is never served. How a family's cases are fed, run and compared is
``s1omni.export.case_io``'s (OmniJev: from pixels, with the image features as a second tensor, unrounded).
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from polygraphy.comparator import Comparator, CompareFunc, RunResults

from s1omni.runtime.engine import load_engine_model, read_manifest, record_validation

from .compare_answers import CaseStats
from .families import export_family
from .reference import REFERENCE_RUNNER, answers_from, case_feeds, compared, layout_digest, load_cases, load_reference, make_reference

from s1omni.calib import CALIB


def reference_dir(family: str, member: str) -> Path:
    return CALIB / family / "reference" / member


def _reference(engine_dir: Path, manifest: dict[str, Any], cases: list[dict[str, Any]], package: str | None,
               where: Path, device: str) -> tuple[dict[str, Any], RunResults]:  # fmt: skip
    """The saved record for this member and these cases, made from ``package`` when absent or stale."""
    identity = manifest["member"]
    if (where / "answers.json").is_file():
        record, results = load_reference(where)
        if record["member"]["model_sha256"] == identity["model_sha256"] and [c["name"] for c in record["cases"]] == [
            c["name"] for c in cases
        ]:
            return record, results
    if package is None:
        raise SystemExit(f"s1omni validate: no reference record in {where}; pass --package PKG to make one")
    from s1omni.runtime.api import load_model
    from s1omni.runtime.runners.torch_runner import release_gpu_memory

    model = load_model(package, device=device, precision="fp32")
    if model.identity.model_sha256 != identity["model_sha256"]:
        raise SystemExit(f"s1omni validate: {package} is not the package {engine_dir} was built from")
    make_reference(model, cases, where)
    del model
    release_gpu_memory()  # before the engine runs beside it
    return load_reference(where)


def _gate(manifest: dict[str, Any], family: str) -> tuple[str, dict[str, Any]]:
    gates = json.loads((CALIB / family / "gates.json").read_text(encoding="utf-8"))
    # The design's two gates: float32 on the CPU, and every GPU engine (its kernels reorder float32
    # sums, and BF16 engines round further).
    name = "cpu-fp32" if manifest.get("device", "cpu") == "cpu" and manifest["precision"] == "fp32" else "gpu"
    return name, gates[name]


def validate(
    engine_dir: str | Path,
    cases_path: str | Path | None = None,
    package: str | None = None,
    report_path: str | Path | None = None,
    reference: str | Path | None = None,
    reference_device: str = "cpu",
) -> bool:
    engine_dir = Path(engine_dir)
    engine = load_engine_model(engine_dir, allow_unvalidated=True)  # checks every pinned file once
    manifest = read_manifest(engine_dir)
    family, member = manifest["family"], manifest["member"]["name"]
    cases = load_cases(cases_path or CALIB / family)
    record, reference_results = _reference(
        engine_dir, manifest, cases, package, Path(reference) if reference else reference_dir(family, member), reference_device
    )
    gate_name, gate = _gate(manifest, family)
    print(f"validate {member}: {manifest['backend']}/{manifest['target']} ({manifest['precision']}) against "
          f"{record['runner']['name']}/{record['runner']['device']}, gate {gate_name}, {len(cases)} cases", file=sys.stderr, flush=True)  # fmt: skip
    io = export_family(family).cases
    plans, feeds = case_feeds(engine, cases)
    runner = io.runner(engine)
    results = Comparator.run([runner], data_loader=feeds)
    combined = RunResults()
    combined.append((REFERENCE_RUNNER, reference_results[REFERENCE_RUNNER]))
    combined.append((runner.name, results[runner.name]))
    accuracy = Comparator.compare_accuracy(combined, compare_func=CompareFunc.simple(**gate["tensor"]))
    tensor = next(iter(accuracy[0].values()))  # one compare function, one runner pair: per-iteration results
    answers = answers_from(engine, plans, results[runner.name])
    rows, passed = [], bool(accuracy)
    totals = CaseStats()
    for case, plan, (response, values), expected, outputs in zip(cases, plans, answers, record["cases"], tensor, strict=True):
        stats = io.compare(compared(expected), values, gate["decision_margin"])
        same_layout = layout_digest(plan) == expected["layout"]
        hidden = outputs["hidden"]
        ok = (
            same_layout and stats.usage_equal and all(bool(result) for result in outputs.values())
            and stats.max_probability <= gate["max_probability"] and stats.max_score <= gate["max_score"]
            and stats.same_margin_decisions == stats.margin_decisions
        )  # fmt: skip
        passed &= ok
        _accumulate(totals, stats)
        rows.append(
            {"case": case["name"], "tokens": response["usage"]["input_tokens"], "same_layout": same_layout,
             "hidden_max_abs": float(hidden.max_absdiff), "hidden_max_rel": float(hidden.max_reldiff),
             **({"image_max_abs": float(outputs["image_embeds"].max_absdiff)} if "image_embeds" in outputs else {}),
             "max_probability": stats.max_probability, "max_score": stats.max_score,
             "decisions": f"{stats.same_decisions}/{stats.decisions}", "span_sets": f"{stats.same_span_sets}/{stats.span_sets}",
             "passed": ok, "problems": stats.problems[:5]}  # fmt: skip
        )
    span_share = totals.same_span_sets / totals.span_sets if totals.span_sets else 1.0
    passed &= span_share >= gate["span_sets"]
    _print_table(rows)
    report = {
        "passed": passed,
        "gate": {"name": gate_name, **gate},
        "reference": {"runner": record["runner"], "member": record["member"]["name"]},
        "cases": len(cases),
        "summary": {
            "max_probability": totals.max_probability,
            "max_score": totals.max_score,
            "hidden_max_abs": max(row["hidden_max_abs"] for row in rows),
            **({"image_max_abs": max(row["image_max_abs"] for row in rows)} if "image_max_abs" in rows[0] else {}),
            "decisions": f"{totals.same_decisions}/{totals.decisions}",
            "margin_decisions": f"{totals.same_margin_decisions}/{totals.margin_decisions}",
            "span_sets": f"{totals.same_span_sets}/{totals.span_sets}",
            "layouts_identical": all(row["same_layout"] for row in rows),
            "usage_identical": totals.usage_equal,
        },
        "table": rows,
    }
    print(f"{'PASSED' if passed else 'FAILED'}: {json.dumps(report['summary'])}", file=sys.stderr)
    if report_path:
        Path(report_path).write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    record_validation(engine_dir, {k: v for k, v in report.items() if k != "table"})
    return passed


def _accumulate(totals: CaseStats, stats: CaseStats) -> None:
    for name, value in asdict(stats).items():
        if name == "problems":
            continue
        if name.startswith("max_"):
            setattr(totals, name, max(getattr(totals, name), value))
        elif name == "usage_equal":
            totals.usage_equal &= value
        else:
            setattr(totals, name, getattr(totals, name) + value)


def _print_table(rows: list[dict[str, Any]]) -> None:
    header = f"{'case':28} {'tokens':>7} {'layout':>6} {'hidden |d|':>11} {'max |dp|':>10} {'decisions':>9} {'spans':>6}  result"
    print(header)
    print("-" * len(header))
    for row in rows:
        print(
            f"{row['case']:28} {row['tokens']:7d} {'same' if row['same_layout'] else 'DIFF':>6} {row['hidden_max_abs']:11.3e} "
            f"{row['max_probability']:10.3e} {row['decisions']:>9} {row['span_sets']:>6}  {'ok' if row['passed'] else 'MISS'}"
        )
        for problem in row["problems"]:  # a passed case's too: a span set or a decision under the margin that differs
            print(f"{'':30}{problem}")
