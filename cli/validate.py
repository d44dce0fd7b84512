from __future__ import annotations

import argparse

from . import add_json, add_quiet, add_registry, emit

HELP = "validate an engine against the torch reference at its gate (cpu-fp32, gpu or gpu-reduced); non-zero on a miss"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("engine", metavar="ENG", help="engine directory written by s1omni build")
    parser.add_argument("--cases", metavar="DIR", help="calibration cases (default calib/<family>)")
    parser.add_argument("--report", metavar="FILE", help="write the full report (every case) as JSON")
    parser.add_argument("--package", metavar="PKG", help="the member package, to make the reference record when none is saved")
    parser.add_argument("--reference", metavar="DIR", help="where reference records are read and written (default "
                        "$S1OMNI_HOME/references/<family>/<member>, then the records shipped in calib/<family>/reference/<member>)")  # fmt: skip
    parser.add_argument("--reference-device", choices=["cpu", "cuda"],
                        help="where the float32 torch reference runs when it has to be made (default the engine's device; cuda: TF32 off); "
                        "a GPU engine also gets the BF16 reference (BF16 autocast) on cuda")  # fmt: skip
    add_registry(parser)
    add_json(parser)
    add_quiet(parser)


def run(args: argparse.Namespace) -> int:
    import contextlib
    import os
    import sys

    from s1omni.export.validate import validate
    from s1omni.runtime.engine import read_manifest
    from s1omni.runtime.errors import GateMissed

    if args.registry:
        os.environ["S1OMNI_REGISTRY"] = args.registry
    # Under --json stdout carries the result alone: the table goes to stderr with the verdict.
    with contextlib.redirect_stdout(sys.stderr) if args.json else contextlib.nullcontext():
        passed = validate(args.engine, args.cases, args.package, args.report, args.reference, args.reference_device)
    # The report as the engine's manifest records it (without the per-case table: --report has that).
    report = read_manifest(args.engine)["validation"]
    emit(args, {"engine": args.engine, **report}, None)  # validate printed its table and verdict
    if not passed:
        raise GateMissed(f"{args.engine} missed the {report['gate']['name']} gate; it will not be served")
    return 0
