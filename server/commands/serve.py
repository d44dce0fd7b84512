from __future__ import annotations

import argparse

from . import add_registry

HELP = "serve /v1/systemone over HTTP from a member package, an engine, or the embedded demo member"


def configure(parser: argparse.ArgumentParser) -> None:
    from ..config import DEFAULT_PORT, ServeConfig
    from ..scheduler import Limits

    defaults, limits = ServeConfig(), Limits()
    source = parser.add_mutually_exclusive_group()
    source.add_argument("package", metavar="PKG", nargs="?", help="member package directory (verified before it loads)")
    source.add_argument("--engine", metavar="DIR", help="validated engine directory (with manifest.json)")
    parser.add_argument("--host", default=defaults.host)
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    add_registry(parser)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--max-queue", type=int, default=limits.max_queue, metavar="N", help="admitted jobs not yet answered")
    parser.add_argument("--max-queued-tokens", type=int, default=limits.max_queued_tokens, metavar="N")
    parser.add_argument("--max-request-bytes", type=int, default=defaults.max_request_bytes, metavar="N")
    parser.add_argument("--batch-window-ms", type=float, default=limits.batch_window_s * 1e3, metavar="MS")
    parser.add_argument("--max-batch-tokens", type=int, default=limits.max_batch_tokens, metavar="N")
    parser.add_argument("--max-batch-plans", type=int, default=limits.max_batch_plans, metavar="N")
    parser.add_argument("--drain-timeout", type=float, default=defaults.drain_timeout_s, metavar="S", help="on SIGTERM, the longest wait for requests in flight")
    parser.add_argument("--log-level", choices=("debug", "info", "warning", "error"), default="info")


def run(args: argparse.Namespace) -> int:
    import logging
    from functools import partial
    from pathlib import Path

    from runtime.api import load_model
    from runtime.registry import Registry

    from .. import demo
    from ..config import ServeConfig
    from ..process import serve
    from ..scheduler import Limits
    from ..service import ModelSource, Service

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    path = args.package or args.engine
    if path is not None and not Path(path).is_dir():
        raise SystemExit(f"s1omni serve: {path} is not a directory")
    if args.engine and not (Path(args.engine) / "manifest.json").is_file():
        raise SystemExit(f"s1omni serve: {args.engine} is not an engine directory (it has no manifest.json)")
    if path is None:
        source = ModelSource("demo", partial(demo.load, args.device), demo.NOTICE)
    else:
        source = ModelSource(Path(path).name, lambda: load_model(path, Registry.load(args.registry), args.device))
    limits = Limits(
        max_queue=args.max_queue,
        max_queued_tokens=args.max_queued_tokens,
        batch_window_s=args.batch_window_ms / 1e3,
        max_batch_tokens=args.max_batch_tokens,
        max_batch_plans=args.max_batch_plans,
    )
    config = ServeConfig(args.host, args.port, args.max_request_bytes, limits, args.drain_timeout)
    serve(Service(config, source), args.log_level)
    return 0
