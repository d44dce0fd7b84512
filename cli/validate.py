from __future__ import annotations

import argparse

from . import add_json, add_quiet, add_registry, emit

HELP = ("validate an engine against the torch reference at its gate (cpu-fp32, gpu or gpu-reduced), or a reduced copy "
        "(--precision fp8) against its exact engine at the consent gate (--exact); non-zero on a miss or a refusal")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("engine", metavar="ENG", help="engine directory written by s1omni build")
    parser.add_argument("--cases", metavar="DIR", help="calibration cases (default calib/<family>)")
    parser.add_argument("--report", metavar="FILE", help="write the full report (every case; with --exact, the consent) as JSON")
    parser.add_argument("--package", metavar="PKG", help="the member package, to make the reference record when none is saved")
    parser.add_argument("--reference", metavar="DIR", help="where reference records are read and written (default "
                        "$S1OMNI_HOME/references/<family>/<member>, then the records shipped in calib/<family>/reference/<member>)")  # fmt: skip
    parser.add_argument("--reference-device", choices=["cpu", "cuda"],
                        help="where the float32 torch reference runs when it has to be made (default the engine's device; cuda: TF32 off); "
                        "a GPU engine also gets the BF16 reference (BF16 autocast) on cuda")  # fmt: skip
    parser.add_argument("--exact", metavar="EXACT", help="the engine served as exact: judge ENG, a reduced copy (s1omni build "
                        "--precision fp8), at the consent gate against it, in the same run (every answer type's decisions >= 99%% "
                        "unchanged and faster), and record the verdict in its manifest; only a granted copy serves max_speed")  # fmt: skip
    parser.add_argument("--rounds", type=int, default=None, metavar="N", help="with --exact: timed passes over the cases (default 3)")
    parser.add_argument("--merged", type=int, default=None, metavar="N", help="instead of validating: run every case alone, then "
                        "N cases to a forward (as batching merges requests), and judge merged against alone (cpu-fp32 or gpu for a float32 "
                        "engine; gpu-reduced-alone for a reduced one, with its BF16 and float32 reference records); the verdict goes "
                        "to the engine's manifest (Vela 2.0)")  # fmt: skip
    parser.add_argument("--shared-context", action="store_true", help="instead of validating: run every case alone, then "
                        "alone through the packed graph (the shared_context profile), and judge packed against alone at the "
                        "gate --merged uses; the verdict goes to the engine's manifest, and serving shared_context needs it passed. "
                        "With --merged N: N cases to a packed forward (batching on packed rows: a server packs batching's "
                        "forwards on an engine whose verdict passed)")  # fmt: skip
    add_registry(parser)
    add_json(parser)
    add_quiet(parser)


def run(args: argparse.Namespace) -> int:
    import contextlib
    import os
    import sys

    from s1omni.export.validate import validate
    from s1omni.runtime.engine import read_manifest
    from s1omni.runtime.errors import GateMissed, UsageError
    from s1omni.runtime.reduced_copy import REDUCED_PRECISIONS

    if args.registry:
        os.environ["S1OMNI_REGISTRY"] = args.registry
    if args.merged is not None or args.shared_context:
        return _against_alone(args)
    if args.exact or read_manifest(args.engine).get("precision") in REDUCED_PRECISIONS:
        return _consent(args)
    if args.rounds is not None:
        raise UsageError("--rounds is for the consent gate of a reduced copy (--exact)")
    # Under --json stdout carries the result alone: the table goes to stderr with the verdict.
    with contextlib.redirect_stdout(sys.stderr) if args.json else contextlib.nullcontext():
        passed = validate(args.engine, args.cases, args.package, args.report, args.reference, args.reference_device)
    # The report as the engine's manifest records it (without the per-case table: --report has that).
    report = read_manifest(args.engine)["validation"]
    emit(args, {"engine": args.engine, **report}, None)  # validate printed its table and verdict
    if not passed:
        raise GateMissed(f"{args.engine} missed the {report['gate']['name']} gate; it will not be served")
    return 0


def _consent(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    from s1omni.export.consent import ROUNDS, run_consent
    from s1omni.runtime.errors import GateMissed, UsageError

    if not args.exact:
        raise UsageError(f"{args.engine} is a reduced copy: it is judged by the consent gate against its exact engine (--exact ENG)")
    if args.package or args.reference or args.reference_device:
        raise UsageError("--package, --reference and --reference-device are for validation; the consent gate takes --exact, --cases and --rounds")
    if args.rounds is not None and args.rounds < 1:
        raise UsageError("--rounds takes a count >= 1")
    consent = run_consent(args.engine, args.exact, args.cases, args.rounds or ROUNDS)
    if args.report:
        Path(args.report).write_text(json.dumps(consent, indent=1) + "\n", encoding="utf-8")
    emit(args, {"engine": args.engine, "consent": consent}, None)  # the verdict was printed
    if not consent["granted"]:
        raise GateMissed(f"{args.engine} was refused its consent; max_speed will not serve it")
    return 0


def _against_alone(args: argparse.Namespace) -> int:
    from s1omni.export.merged_check import check_label, run_merged, run_shared_context
    from s1omni.runtime.errors import GateMissed, UsageError

    flag = "--merged" if args.merged is not None else "--shared-context"
    if args.exact or args.rounds is not None or args.reference_device:
        raise UsageError(f"{flag} judges the engine against itself: it takes --cases, --report, and --package and --reference "
                         "for a reduced engine's reference records")  # fmt: skip
    if args.merged is None:
        report = run_shared_context(args.engine, args.cases, args.report, args.package, args.reference)
    else:
        report = run_merged(args.engine, args.merged, args.cases, args.report, args.package, args.reference, packed=args.shared_context)
    emit(args, {"engine": args.engine, report["check"]: report}, None)  # the verdict was printed
    if not report["passed"]:
        raise GateMissed(f"{args.engine}: its answers {check_label(report)} missed the {report['gate']['name']} gate of its answers alone")
    return 0
