from __future__ import annotations

import argparse

from . import add_quiet, add_registry, comma_list

HELP = "time the torch reference and engines in one run (in process, and over HTTP with --http); a JSON record and a plot"


def _ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from exc
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--package", required=True, metavar="PKG", help="member package: the torch reference")
    parser.add_argument("--engine", action="append", default=[], metavar="ENG", help="engine directory to compare (repeatable)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument(
        "--reference-precision",
        choices=("bf16", "fp32"),
        help="the in-process reference's precision (default: bf16 autocast on cuda, fp32 on cpu)",
    )
    parser.add_argument(
        "--workloads",
        type=comma_list,
        default=("backbone", "router", "long-span"),
        metavar="LIST",
        help="in-process workloads: backbone, router, long-span, calibration case names, or NAME@N "
        "(N copies of a request run as one merged forward); '' for none",
    )
    parser.add_argument("--tokens", type=_ints, default=(128, 600, 2048), metavar="LIST", help="backbone prefix lengths")
    parser.add_argument(
        "--requests",
        type=int,
        default=30,
        metavar="N",
        help="timed requests per workload in process, and per client at each HTTP level (default 30: steady-state "
        "HTTP figures want at least 20 a client)",
    )
    parser.add_argument(
        "--warmup", type=int, default=5, metavar="N", help="untimed requests first (per workload; over HTTP per client, every client's before any is timed)"
    )
    parser.add_argument("--http", action="store_true", help="also serve each subject with `s1omni serve` and load it over HTTP")
    parser.add_argument("--http-workload", default="router", metavar="NAME", help="the request sent over HTTP")
    parser.add_argument(
        "--http-profile",
        default="exact",
        metavar="NAME",
        help="options.profile of every HTTP request (Vela 2.0; default exact); each server is started with it enabled",
    )
    parser.add_argument(
        "--concurrency", type=_ints, default=(1, 8, 16), metavar="LIST", help="closed-loop clients per HTTP level"
    )
    parser.add_argument(
        "--settle-rounds",
        type=int,
        default=10,
        metavar="N",
        help="before each HTTP level, at most N untimed rounds of --warmup requests a client while the server still "
        "captures CUDA graphs (default 10; 0: none)",
    )
    parser.add_argument(
        "--no-http-reference",
        dest="http_reference",
        action="store_false",
        help="serve only the engines over HTTP (the reference's server takes minutes; compare with a run on the same machine that served it)",
    )
    parser.add_argument(
        "--serve-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="extra `s1omni serve` argument for every server, e.g. --serve-arg=--batch-window-ms=2 (repeatable)",
    )
    parser.add_argument(
        "--profile", metavar="WORKLOAD", help="torch profiler capture of this workload (e.g. backbone-600) on the first engine"
    )
    parser.add_argument(
        "--allow-unvalidated", action="store_true", help="time engines that have not passed validation, in process only (--http leaves them out: s1omni serve refuses them)"
    )
    parser.add_argument("--start-timeout", type=float, default=900.0, metavar="S", help="longest wait for a server's /health 200")
    parser.add_argument("--out", metavar="DIR", help="record directory (default bench-records/<package>-<device>-<UTC time>)")
    add_quiet(parser)
    add_registry(parser)


def served_instances(serve_args: list[str]) -> int:
    """The model instances ``s1omni serve`` runs with ``serve_args`` among its arguments (its ``--instances``)."""
    from s1omni.server.config import ServeConfig

    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--instances", type=int, default=ServeConfig().instances)
    return parser.parse_known_args(serve_args)[0].instances


def run(args: argparse.Namespace) -> int:
    import sys
    from datetime import UTC, datetime
    from pathlib import Path

    from s1omni.bench.http_load import BenchFailed
    from s1omni.bench.run import Settings, bench
    from s1omni.runtime.errors import GateMissed

    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    out = Path(args.out) if args.out else Path("bench-records") / f"{Path(args.package).name}-{args.device}-{stamp}"
    settings = Settings(
        package=Path(args.package),
        out=out,
        engines=tuple(Path(path) for path in args.engine),
        device=args.device,
        reference_precision=args.reference_precision,
        workloads=args.workloads,
        tokens=args.tokens,
        requests=args.requests,
        warmup=args.warmup,
        http=args.http,
        http_workload=args.http_workload,
        http_profile=args.http_profile,
        concurrency=args.concurrency,
        serve_args=tuple(args.serve_arg),
        http_reference=args.http_reference,
        instances=served_instances(args.serve_arg),
        settle_rounds=args.settle_rounds,
        profile=args.profile,
        allow_unvalidated=args.allow_unvalidated,
        registry=args.registry,
        start_timeout_s=args.start_timeout,
        command=tuple(sys.argv),
    )
    try:
        bench(settings)
    except BenchFailed as exc:
        raise GateMissed(f"FAILED: {exc}") from exc
    return 0
