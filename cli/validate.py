from __future__ import annotations

import argparse

from . import add_registry

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


def run(args: argparse.Namespace) -> int:
    import os

    from s1omni.export.validate import validate

    if args.registry:
        os.environ["S1OMNI_REGISTRY"] = args.registry
    passed = validate(args.engine, args.cases, args.package, args.report, args.reference, args.reference_device)
    return 0 if passed else 1
