from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from . import add_registry

if TYPE_CHECKING:
    from s1omni.server.config import ServeConfig
    from s1omni.server.service import ModelSource

HELP = "serve /v1/systemone over HTTP from a member package, an engine, or the embedded demo member"
RAY_ONLY = ("replicas", "ray_address", "gpus_per_replica", "min_replicas", "max_replicas")
VELA_ONLY = ("max_queue", "max_queued_tokens", "max_request_bytes", "batch_window_ms", "max_batch_tokens", "max_batch_plans")


def configure(parser: argparse.ArgumentParser) -> None:
    from s1omni.server.config import DEFAULT_PORT, ServeConfig
    from s1omni.server.scheduler import Limits

    defaults, limits = ServeConfig(), Limits()
    source = parser.add_mutually_exclusive_group()
    source.add_argument("package", metavar="PKG", nargs="?", help="member package directory (verified before it loads)")
    source.add_argument("--engine", metavar="DIR", help="validated engine directory (with manifest.json)")
    parser.add_argument("--host", default=defaults.host)
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    add_registry(parser)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--drain-timeout", type=float, default=defaults.drain_timeout_s, metavar="S", help="on SIGTERM, the longest wait for requests in flight")
    parser.add_argument("--body-timeout", type=float, default=defaults.body_timeout_s, metavar="S", help="the longest a request's body may take to arrive (then 400)")
    parser.add_argument("--log-level", choices=("debug", "info", "warning", "error"), default="info")
    # No argparse defaults here: an option given for an OmniJev package is refused, not ignored.
    vela = parser.add_argument_group("Vela 2.0 only", "OmniJev keeps its contract's: 12 MiB bodies, 16 admitted, 2 preparing")
    vela.add_argument("--max-queue", type=int, metavar="N", help=f"admitted jobs not yet answered (default {limits.max_queue})")
    vela.add_argument("--max-queued-tokens", type=int, metavar="N", help=f"their tokens (default {limits.max_queued_tokens})")
    vela.add_argument("--max-request-bytes", type=int, metavar="N", help=f"body limit (default {defaults.max_request_bytes})")
    vela.add_argument("--batch-window-ms", type=float, metavar="MS", help=f"default {limits.batch_window_s * 1e3:g}")
    vela.add_argument("--max-batch-tokens", type=int, metavar="N", help=f"default {limits.max_batch_tokens}")
    vela.add_argument("--max-batch-plans", type=int, metavar="N", help=f"default {limits.max_batch_plans}")
    ray = parser.add_argument_group("Ray Serve", "one deployment, each replica loads the model once (pip install 's1omni[ray]')")
    ray.add_argument("--ray", action="store_true", help="serve on Ray Serve, behind its HTTP proxy on --host/--port")
    ray.add_argument("--replicas", type=int, metavar="N", help="replicas (default 1; the initial count with autoscaling bounds)")
    ray.add_argument("--ray-address", metavar="ADDR", help="join this cluster (deploy or redeploy, then exit) instead of starting one")
    ray.add_argument("--gpus-per-replica", type=float, metavar="N", help="GPUs per replica with --device cuda (default 1)")
    ray.add_argument("--min-replicas", type=int, metavar="N", help="autoscaling lower bound (Ray Serve's autoscaler on queue length)")
    ray.add_argument("--max-replicas", type=int, metavar="N", help="autoscaling upper bound")


def _given_vela_only(args: argparse.Namespace) -> list[str]:
    return [f"--{name.replace('_', '-')}" for name in VELA_ONLY if getattr(args, name) is not None]


def _config(args: argparse.Namespace) -> ServeConfig:
    from s1omni.server.config import ServeConfig
    from s1omni.server.scheduler import Limits

    window = None if args.batch_window_ms is None else args.batch_window_ms / 1e3
    limits = {
        "max_queue": args.max_queue,
        "max_queued_tokens": args.max_queued_tokens,
        "batch_window_s": window,
        "max_batch_tokens": args.max_batch_tokens,
        "max_batch_plans": args.max_batch_plans,
    }
    body = {} if args.max_request_bytes is None else {"max_request_bytes": args.max_request_bytes}
    given = Limits(**{name: value for name, value in limits.items() if value is not None})
    return ServeConfig(args.host, args.port, limits=given, body_timeout_s=args.body_timeout, drain_timeout_s=args.drain_timeout, **body)


def run(args: argparse.Namespace) -> int:
    import logging
    from functools import partial
    from pathlib import Path

    from s1omni.runtime.api import load_model
    from s1omni.runtime.engine import read_manifest
    from s1omni.runtime.package import detect_family
    from s1omni.runtime.registry import Registry

    from s1omni.server import demo
    from s1omni.server.process import serve
    from s1omni.server.service import ModelSource, Service

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not args.body_timeout > 0:
        raise SystemExit(f"s1omni serve: --body-timeout must be > 0 seconds, not {args.body_timeout:g}")
    path = args.package or args.engine
    if path is not None and args.ray:
        path = str(Path(path).absolute())  # each replica loads it in its own process, on its own node
    if path is not None and not Path(path).is_dir():
        raise SystemExit(f"s1omni serve: {path} is not a directory")
    if args.engine and not (Path(args.engine) / "manifest.json").is_file():
        raise SystemExit(f"s1omni serve: {args.engine} is not an engine directory (it has no manifest.json)")
    if path is None:
        source = ModelSource("demo", partial(demo.load, args.device), demo.NOTICE)
    else:
        # Known before the load, so that even a request refused while it loads gets the family's form.
        family = detect_family(Path(path)) if args.package else read_manifest(path)["family"]
        source = ModelSource(Path(path).name, lambda: load_model(path, Registry.load(args.registry), args.device), family=family)
    given = _given_vela_only(args)
    if source.family != "vela2" and given:
        raise SystemExit(f"s1omni serve: {', '.join(given)} apply to Vela 2.0 members only, not to {source.family}")
    if args.ray:
        return _deploy_on_ray(args, _config(args), source)
    given = [f"--{name.replace('_', '-')}" for name in RAY_ONLY if getattr(args, name) is not None]
    if given:
        raise SystemExit(f"s1omni serve: {', '.join(given)} apply with --ray only")
    serve(Service(_config(args), source), args.log_level)
    return 0


def _deploy_on_ray(args: argparse.Namespace, config: ServeConfig, source: ModelSource) -> int:
    try:
        from s1omni.server.ray_serve import Cluster, DeploymentFailed, deploy
    except ModuleNotFoundError as exc:
        if not (exc.name or "").startswith("ray"):
            raise
        raise SystemExit(f"s1omni serve --ray needs Ray Serve: pip install 's1omni[ray]' ({exc})") from None
    counts = (args.replicas, args.min_replicas, args.max_replicas)
    if any(count is not None and count < 1 for count in counts) or (args.gpus_per_replica is not None and args.gpus_per_replica <= 0):
        raise SystemExit("s1omni serve: --replicas, --min-replicas and --max-replicas take a count >= 1, --gpus-per-replica > 0")
    if args.min_replicas is not None and args.max_replicas is not None and args.min_replicas > args.max_replicas:
        raise SystemExit("s1omni serve: --min-replicas is above --max-replicas")
    defaults = Cluster()
    cluster = Cluster(
        args.ray_address,
        defaults.replicas if args.replicas is None else args.replicas,
        defaults.gpus_per_replica if args.gpus_per_replica is None else args.gpus_per_replica,
        args.min_replicas,
        args.max_replicas,
    )
    try:
        return deploy(config, source, cluster, args.device, args.log_level)
    except DeploymentFailed as exc:
        raise SystemExit(f"s1omni serve: {exc}") from None
