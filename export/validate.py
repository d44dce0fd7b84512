"""``s1omni validate ENG``: an engine against the torch reference, at the tensor and the answer level.

The engine's precision and device pick its gate (``s1omni.runtime.engine.engine_gate``: ``cpu-fp32``,
``gpu`` or ``gpu-reduced``), judged by ``s1omni.export.gate`` with the family's bounds
(``calib/<family>/gates.json``). The engine answers the calibration cases through Polygraphy's
runner protocol (its ``TreeRunner``); its hidden states at every readout and its answers are held
against the float32 reference's record and, on a GPU, beside the BF16 reference's (the same torch
runner under BF16 autocast, on the same cases), both made once from ``--package`` and then reused
(``s1omni.export.reference``: where records are kept and when one is reused). The validator prints
a table per case, records the verdict in the engine's manifest (the gate, its version and rule, the
validator's version, the BF16 reference's figures) and fails on any miss; an engine without a
standing passed verdict is never served. How a family's cases are fed, run and compared is
``s1omni.export.case_io``'s (OmniJev: from pixels, with the image features as a second tensor, unrounded).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from polygraphy.comparator import Comparator, RunResults

from s1omni.runtime import progress
from s1omni.runtime.engine import (
    VALIDATOR_VERSION, current_gate, engine_identity, load_engine_model, read_manifest, record_validation,
)
from s1omni.runtime.errors import InputError, UsageError

from .families import export_family
from .gate import CaseRecord, judge
from .reference import (
    REFERENCE_RUNNER, answers_from, case_feeds, cases_digest, compared, find_record, layout_digest, load_cases,
    load_reference, make_reference, record_dir, reference_roots,
)  # fmt: skip

from s1omni.calib import CALIB


def recorded_cases(record: dict[str, Any], results: RunResults) -> list[CaseRecord]:
    """A saved reference record's cases, as the gate compares them."""
    return [
        CaseRecord(case["name"], case["layout"], compared(case), dict(outputs), case["usage"]["input_tokens"])
        for case, outputs in zip(record["cases"], results[REFERENCE_RUNNER], strict=True)
    ]


def saved_reference(engine_dir: Path, manifest: dict[str, Any], cases: list[dict[str, Any]], package: str | None,
               roots: list[Path], device: str, precision: str) -> tuple[dict[str, Any], list[CaseRecord]]:  # fmt: skip
    """The saved record of this member and these cases on ``device`` at ``precision``, made from
    ``package`` into the first root when none matches."""
    identity, digest = manifest["member"], cases_digest(cases)
    where = find_record(roots, identity["model_sha256"], digest, device, precision)
    if where is None:
        if package is None:
            raise UsageError(f"no {device}-{precision} reference record of these cases in "
                             f"{' or '.join(map(str, roots))}; pass --package PKG to make one")  # fmt: skip
        from s1omni.runtime.api import load_model
        from s1omni.runtime.runners.torch_runner import release_gpu_memory

        model = load_model(package, device=device, precision=precision)
        if model.identity.model_sha256 != identity["model_sha256"]:
            raise InputError(f"{package} is not the package {engine_dir} was built from")
        if (model.device, model.runner.precision) != (device, precision):  # a record must be what its name says
            raise InputError(f"the {manifest['family']} reference runs at {model.runner.precision} on "
                             f"{model.device}, not {precision} on {device}")  # fmt: skip
        where = record_dir(roots[0], device, precision)
        make_reference(model, cases, where)
        del model
        release_gpu_memory()  # before the engine runs beside it
    record, results = load_reference(where)
    return record, recorded_cases(record, results)


def validate(
    engine_dir: str | Path,
    cases_path: str | Path | None = None,
    package: str | None = None,
    report_path: str | Path | None = None,
    reference: str | Path | None = None,
    reference_device: str | None = None,
) -> bool:
    """Validate the engine and record the verdict; ``reference_device`` (default the engine's) runs the float32 reference."""
    engine_dir = Path(engine_dir)
    engine = load_engine_model(engine_dir, allow_unvalidated=True)  # checks every pinned file once
    manifest = read_manifest(engine_dir)
    family, member = manifest["family"], manifest["member"]["name"]
    cases = load_cases(cases_path or CALIB / family)
    gate = current_gate(manifest)
    device = manifest.get("device", "cpu")
    roots = reference_roots(family, member, reference)
    record, expected = saved_reference(engine_dir, manifest, cases, package, roots, reference_device or device, "fp32")
    # The BF16 reference: the reference's own GPU mode, beside the float32 one wherever the engine runs on a GPU.
    bf16 = saved_reference(engine_dir, manifest, cases, package, roots, "cuda", "bf16") if device == "cuda" else None
    progress.note(f"{member}: {manifest['backend']}/{manifest['target']} ({manifest['precision']}) against "
                  f"{record['runner']['name']}/{record['runner']['device']}, gate {gate['name']}, {len(cases)} cases")  # fmt: skip
    io = export_family(family).cases
    plans, feeds = case_feeds(engine, cases)
    runner = io.runner(engine)
    results = Comparator.run([runner], data_loader=progress.Counted(feeds, f"cases on {runner.name}", "case"))
    answers = answers_from(engine, plans, results[runner.name])
    ran = [
        CaseRecord(case["name"], layout_digest(plan), values, dict(outputs), response["usage"]["input_tokens"])
        for case, plan, (response, values), outputs in zip(cases, plans, answers, results[runner.name], strict=True)
    ]
    verdict = judge(gate["name"], gate, io.compare, expected, ran, bf16[1] if bf16 else None)
    print_table(verdict["table"], bf16 is not None)
    print_summary(verdict, gate["name"])
    passed = verdict["passed"]
    report = {
        "passed": passed,
        "gate": gate,
        "validator_version": VALIDATOR_VERSION,
        "engine": engine_identity(manifest),
        "reference": {"runner": record["runner"], "member": record["member"]["name"], "cases_sha256": record["cases_sha256"]},
        "bf16_reference": {"runner": bf16[0]["runner"], "figures": _bf16_figures(verdict["figures"])} if bf16 else None,
        "cases": len(cases),
        "failures": verdict["failures"],
        "summary": verdict["summary"],
        "figures": verdict["figures"],
        "table": verdict["table"],
    }
    if report_path:
        Path(report_path).write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    record_validation(engine_dir, {k: v for k, v in report.items() if k != "table"})
    return passed


def _bf16_figures(figures: dict[str, Any]) -> dict[str, Any]:
    return {name: figure["bf16"] for name, figure in figures.items() if "bf16" in figure}


def _cell(value: float | None) -> str:
    return f"{'-':>9}" if value is None else f"{value:9.2e}"


def print_table(rows: list[dict[str, Any]], bf16: bool) -> None:
    """One line per case: the hidden states' relative L2 and the max |dp| (engine, BF16 reference where
    there is one, bound), decisions, span sets; under it what failed, what differs and the ties."""
    columns = ("engine", "bf16", "bound") if bf16 else ("engine", "bound")
    figures = " ".join(f"{name:>9}" for name in columns)
    print(f"{'':36} {'':>7} {'hidden relative L2':^{10 * len(columns) - 1}} {'max |dp|':^{10 * len(columns) - 1}}")
    header = f"{'case':36} {'tokens':>7} {figures} {figures} {'decisions':>9} {'spans':>6}  result"
    print(header)
    print("-" * len(header))
    for index, row in enumerate(rows, 1):
        hidden = row["tensors"].get("hidden", {}).get("rel_l2")
        cells = [_cell(hidden)] + ([_cell(row["bf16"]["tensors"].get("hidden", {}).get("rel_l2"))] if bf16 else [])
        cells.append(_cell(row["tensor_bounds"].get("hidden", {}).get("rel_l2")))
        cells += [_cell(row["max_probability"])] + ([_cell(row["bf16"]["max_probability"])] if bf16 else [])
        cells.append(_cell(row.get("probability_bound")))
        name = f"{index}/{len(rows)} {row['case']}"
        print(f"{name:36} {row['tokens']:7d} {' '.join(cells)} {row['decisions']:>9} {row['span_sets']:>6}  {'ok' if row['passed'] else 'MISS'}")
        for line in row["failures"] + row["problems"] + row["ties"]:  # a passed case's too: what differs, and why it passed
            print(f"{'':38}{line}")


def print_summary(verdict: dict[str, Any], gate: str) -> None:
    """The run's figures, engine against its bound (and the BF16 reference's), then PASSED or FAILED with every failure."""
    for name, figure in verdict["figures"].items():
        compared = f"/{figure['compared']}" if "compared" in figure else ""
        bf16 = f"  BF16 reference {_number(figure['bf16'])}{compared}" if "bf16" in figure else ""
        bound = "" if figure["bound"] is None else f"  bound {'>=' if compared else '<='} {_number(figure['bound'])}"
        print(f"{name.replace('_', ' '):18} engine {_number(figure['engine'])}{compared}{bf16}{bound}", file=sys.stderr)
    verdict_line = f"{'PASSED' if verdict['passed'] else 'FAILED'} gate {gate}"
    print(verdict_line + "".join(f"\n  {failure}" for failure in verdict["failures"]), file=sys.stderr)


def _number(value: float) -> str:
    return f"{value:d}" if isinstance(value, int) else f"{value:.3g}"
