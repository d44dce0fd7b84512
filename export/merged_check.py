"""``s1omni validate ENG --merged N`` and ``--shared-context``: an engine's answers for requests merged into
one forward, or with each tree's blocks packed (``shared_context``), held to its own answers for each
request alone as ``exact`` runs it.

This is what the ``batching`` profile does to a request (``s1omni.server.profiles``): the scheduler hands
``model.forward`` the plans of concurrent requests together, so a prefix is left-padded to the widest of the
forward and the blocks of several requests share continue calls. Each calibration case is planned once, run
alone (``forward([plan])``, as ``exact`` runs it) and then in forwards of ``N`` consecutive cases, cases of
different widths side by side; heads and finish are the engine's own either way. The gate judging merged
against alone follows the engine's own (``calib/<family>/gates.json``): a float32 engine is held to its
device's fixed gate, ``cpu-fp32`` on the CPU (every decision, probabilities within 1e-5, hidden states within
5e-5 relative L2) and ``gpu`` on CUDA (clear decisions identical, probabilities within 0.02, hidden states
within 1e-3); a reduced-precision engine (validated at ``gpu-reduced``) is held to ``gpu-reduced-alone``:
every choice, score, noul and set decision identical, and the figures within 1.5 x what the BF16 reference
does to the float32 reference on the same cases (their saved records, which validation made). A bf16
engine's merged or packed forward reorders its bf16 rounding, which moves probabilities by the BF16
reference's order of magnitude, not a float32 engine's: on the H200 the 0.8B bf16 engine kept 340/340
decisions and 26/26 span sets packed while its max |dp| was 0.0255 (``benchmarks/h200-0.8B-shared-context``).
Ties are the gate's (``s1omni.export.compare_answers``). The verdict goes to the engine's manifest
(``merged``); it does not gate serving, which stands on the engine's validation.

``--merged N --shared-context`` runs ``N`` cases to a packed forward (``model.forward_packed``), what ``batching``
does where it packs: each tree's blocks in one row behind its prefix, as ``shared_context`` lays them out, the
rows of ``N`` requests in one forward. Its verdict (``merged_packed`` in the manifest) decides that layout: a
server packs ``batching``'s forwards only on an engine whose verdict passed, and merges them in exact's layout
otherwise (``s1omni.server.profiles.packed_batching_check``).

``--shared-context`` runs every case alone through the packed graph (``model.forward_packed``) against
``forward`` at the same gate: the reference's bar for ``shared_context`` (vela2.md §9.2: no choice,
score, noul or set decision changed; |dp| within 0.02 on a GPU, for its float32 forwards). Its verdict (``shared_context`` in the
manifest) does gate serving: ``s1omni serve --profiles shared_context`` refuses an engine without a
passed one, the packed graph being another graph than the one validation ran.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from s1omni.calib import CALIB
from s1omni.runtime import progress
from s1omni.runtime.engine import engine_gate, engine_identity, load_engine_model, read_manifest, record_check
from s1omni.runtime.errors import UsageError

from .families import export_family
from .gate import REDUCED, CaseRecord, judge, load_gates
from .reference import layout_digest, load_cases, reference_roots
from .tree_runner import flat_hidden
from .validate import saved_reference

# The gate judging an engine's merged or packed forwards against alone, by the gate the engine was validated at.
ALONE_GATE = {"cpu-fp32": "cpu-fp32", "gpu": "gpu", REDUCED: "gpu-reduced-alone"}
MERGING_FAMILIES = ("vela2",)  # the families whose requests merge (``batching``) and pack (``shared_context``)


def _records(model: Any, cases: Sequence[dict[str, Any]], plans: Sequence[Any], hidden: Sequence[Any]) -> list[CaseRecord]:
    """The gate's view of each case from the hidden states ``model.forward`` gave its plan."""
    records = []
    for case, plan, states in zip(cases, plans, hidden, strict=True):
        tensors = {"hidden": flat_hidden(states, model.runner.hidden_size)}
        response = model.finish(plan, model.readout(plan, states))
        records.append(CaseRecord(case["name"], layout_digest(plan), response, tensors, response["usage"]["input_tokens"]))
    return records


def judge_merged(family: str, gate_name: str, alone: list[CaseRecord], merged: list[CaseRecord],
                 bf16: list[CaseRecord] | None = None, fp32: list[CaseRecord] | None = None) -> dict[str, Any]:  # fmt: skip
    """The verdict on ``merged`` against ``alone`` (the same cases, in order) at ``gate_name`` (``ALONE_GATE``);
    a reduced gate's bounds are what the ``bf16`` reference's records do against the ``fp32`` reference's."""
    gate = load_gates(family)[gate_name]
    verdict = judge(gate_name, gate, export_family(family).cases.compare, alone, merged, bf16, fp32)
    return {**verdict, "gate": {"name": gate_name, "version": gate["version"], "rule": gate["rule"]}}


def run_merged(engine_dir: str | Path, group: int, cases_path: str | Path | None = None, report_path: str | Path | None = None,
               package: str | None = None, reference: str | Path | None = None, packed: bool = False) -> dict[str, Any]:  # fmt: skip
    """Run every case alone and then ``group`` to a forward (``packed``: to a packed forward), judge, print and
    record the verdict; the verdict. ``package`` and ``reference``: a reduced engine's reference records, as
    ``s1omni.export.validate`` takes them."""
    if group < 2:
        raise UsageError("--merged takes the number of cases merged into one forward, at least 2")

    def merged(model: Any, plans: list[Any]) -> list[Any]:
        if packed:
            model.open_shared_context()
        forward = model.forward_packed if packed else model.forward
        hidden: list[Any] = []
        for start in progress.Counted(range(0, len(plans), group), f"{'packed ' if packed else ''}forwards of {group} cases", "forward"):
            hidden += forward(plans[start : start + group])
        return hidden

    check = "merged_packed" if packed else "merged"
    return _against_alone(engine_dir, check, {"group": group}, merged, cases_path, report_path, package, reference)


def run_shared_context(engine_dir: str | Path, cases_path: str | Path | None = None, report_path: str | Path | None = None,
                       package: str | None = None, reference: str | Path | None = None) -> dict[str, Any]:  # fmt: skip
    """Run every case alone, then alone through the packed graph; judge, print and record the verdict."""

    def packed(model: Any, plans: list[Any]) -> list[Any]:
        model.open_shared_context()
        return [model.forward_packed([plan])[0] for plan in progress.Counted(plans, "cases packed", "case")]

    return _against_alone(engine_dir, "shared_context", {}, packed, cases_path, report_path, package, reference)


def _against_alone(
    engine_dir: str | Path, check: str, settings: dict[str, Any], variant: Callable[[Any, list[Any]], list[Any]],
    cases_path: str | Path | None, report_path: str | Path | None, package: str | None, reference: str | Path | None,
) -> dict[str, Any]:
    """The verdict on ``variant(model, plans)``'s hidden states against each plan's forward alone, printed and
    recorded in the manifest under ``check``."""
    engine_dir = Path(engine_dir)
    manifest = read_manifest(engine_dir)
    family = manifest["family"]
    if family not in MERGING_FAMILIES:
        raise UsageError(f"{family} serves exact alone (merged and packed forwards are Vela 2.0's profiles): there is nothing to check")
    cases = load_cases(cases_path or CALIB / family)
    validated_at = engine_gate(manifest)
    baseline: dict[str, list[CaseRecord]] = {}  # a reduced gate's: the BF16 and float32 references' records, before the engine loads
    if validated_at == REDUCED:
        roots = reference_roots(family, manifest["member"]["name"], reference)
        baseline = {precision: saved_reference(engine_dir, manifest, cases, package, roots, "cuda", precision)[1] for precision in ("fp32", "bf16")}
    model = load_engine_model(engine_dir, allow_unvalidated=True)
    plans = [model.plan(case["request"]) for case in cases]
    alone = [model.forward([plan])[0] for plan in progress.Counted(plans, "cases alone", "case")]
    verdict = judge_merged(family, ALONE_GATE[validated_at], _records(model, cases, plans, alone), _records(model, cases, plans, variant(model, plans)),
                           baseline.get("bf16"), baseline.get("fp32"))  # fmt: skip
    report = {"check": check, "passed": verdict["passed"], "gate": verdict["gate"], "engine": engine_identity(manifest), **settings, "cases": len(cases),
              "failures": verdict["failures"], "summary": verdict["summary"], "figures": verdict["figures"]}  # fmt: skip
    print_merged(report)
    if report_path:
        Path(report_path).write_text(json.dumps({**report, "table": verdict["table"]}, indent=1) + "\n", encoding="utf-8")
    record_check(engine_dir, check, report)
    return report


def check_label(report: dict[str, Any]) -> str:
    """What a report's check ran against alone, in words: ``merged N to a forward``, ``merged N to a packed
    forward`` or ``packed (shared_context)``."""
    labels = {"merged": "merged {group} to a forward", "merged_packed": "merged {group} to a packed forward", "shared_context": "packed (shared_context)"}
    return labels[report["check"]].format(group=report.get("group"))


def print_merged(report: dict[str, Any]) -> None:
    summary = report["summary"]
    what = check_label(report)
    progress.note(
        f"{what} against alone, {report['cases']} cases: decisions {summary['decisions']}, "
        f"span sets {summary['span_sets']}, max |dp| {summary['max_probability']:.3g}, hidden relative L2 {summary['hidden_rel_l2']:.3g}, "
        f"{summary['ties']} ties"
    )
    verdict = f"{'PASSED' if report['passed'] else 'FAILED'} gate {report['gate']['name']} ({what} against alone)"
    progress.note(verdict + "".join(f"\n  {failure}" for failure in report["failures"]))
