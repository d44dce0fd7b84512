"""``s1omni serve``. Every option can also come from the environment: ``--max-queue`` from
``S1OMNI_MAX_QUEUE``, the package argument from ``S1OMNI_PACKAGE`` (``S1OMNI_`` and the option's
name, upper case, dashes as underscores); an option on the command line wins over its variable."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING

from s1omni.runtime.errors import EnvironmentMissing, GateMissed, InputError, UsageError

from . import add_registry, comma_list

if TYPE_CHECKING:
    from collections.abc import Callable

    from s1omni.runtime.reduced_copy import ReducedCopy
    from s1omni.server.config import ServeConfig
    from s1omni.server.service import ModelSource

HELP = "serve /v1/systemone over HTTP from a member package, an engine, or the embedded demo member"
ENV_PREFIX = "S1OMNI_"
TRUE, FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")
RAY_ONLY = ("replicas", "ray_address", "gpus_per_replica", "min_replicas", "max_replicas")
VELA_ONLY = ("profiles", "reduced_copy", "max_queue", "max_queued_tokens", "max_request_bytes", "batch_window_ms", "max_batch_tokens", "max_batch_plans")


def configure(parser: argparse.ArgumentParser) -> None:
    from s1omni.server.config import DEFAULT_PORT, ServeConfig
    from s1omni.server.profiles import EXACT, KNOWN
    from s1omni.server.scheduler import Limits

    defaults, limits = ServeConfig(), Limits()
    source = parser.add_mutually_exclusive_group()
    source.add_argument("package", metavar="PKG", nargs="?", help="member package directory (verified before it loads)")
    source.add_argument("--engine", metavar="DIR", help="validated engine directory (with manifest.json)")
    parser.add_argument("--host", default=defaults.host, help=f"address to bind (default {defaults.host}; 0.0.0.0: every interface)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"default {DEFAULT_PORT}; 0 picks a free port (the log names it)")
    add_registry(parser)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where the model runs (default cpu)")
    parser.add_argument("--instances", type=int, default=defaults.instances, metavar="N",
                        help="copies of the model loaded side by side, each with its own worker, so that N forwards run at once "
                        "(on a GPU, each holds its own copy of the engine; default 1)")  # fmt: skip
    parser.add_argument("--drain-timeout", type=float, default=defaults.drain_timeout_s, metavar="S", help="on SIGTERM, the longest wait for requests in flight")
    parser.add_argument("--body-timeout", type=float, default=defaults.body_timeout_s, metavar="S", help="the longest a request's body may take to arrive (then 400)")
    parser.add_argument("--log-level", choices=("debug", "info", "warning", "error"), default="info", help="default info")
    parser.add_argument(
        "--log-format", choices=("text", "json"), default="text", help="text (default) or json: one JSON object per line, uvicorn's too"
    )
    # No argparse defaults here: an option given for an OmniJev package is refused, not ignored.
    vela = parser.add_argument_group(
        "Vela 2.0 only", "OmniJev keeps its contract's: 12 MiB bodies, 16 admitted, 2 preparing, one request a forward (exact)"
    )
    vela.add_argument(
        "--profiles",
        type=comma_list,
        metavar="LIST",
        help=f"profiles to enable besides exact (always on, the default), comma-separated: {', '.join(sorted(set(KNOWN) - {EXACT.name}))}; "
        "shared_context packs each tree's blocks behind its prefix (an --engine whose `s1omni validate --shared-context` passed); "
        "batching merges concurrent requests into one forward within --batch-window-ms (in packed rows on an engine whose "
        "`s1omni validate ENG --merged N --shared-context` passed); max_speed does too, on --reduced-copy",
    )
    vela.add_argument(
        "--reduced-copy",
        metavar="DIR",
        help="with --engine and --profiles max_speed: the reduced copy max_speed runs on (s1omni build --precision fp8), "
        "served only where its member's registry entry consents to it on --device and its consent gate, run against "
        "this very engine (s1omni validate DIR --exact ENG), granted it; otherwise the server does not start",
    )
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
    env_defaults(parser)


def env_name(action: argparse.Action) -> str:
    """``S1OMNI_`` and the option's long name (or a positional's name), upper case, ``-`` as ``_``."""
    long = next((flag[2:] for flag in action.option_strings if flag.startswith("--")), action.dest)
    return ENV_PREFIX + long.upper().replace("-", "_")


def env_defaults(parser: argparse.ArgumentParser) -> None:
    """Take each option's default from its environment variable when that is set; a value argparse
    does not check in a default (a choice, an on/off word) is checked here and refused when ``run`` starts."""
    defaults: dict[str, object] = {}
    wrong: list[str] = []
    for action in parser._actions:  # argparse lists its actions nowhere public
        if action.dest in ("help", "version"):
            continue
        name = env_name(action)
        if name not in (action.help or ""):
            action.help = f"{action.help or ''} [${name}]".lstrip()
        value = os.environ.get(name)
        if value is None:
            continue
        if action.nargs == 0:  # an on/off flag (--ray): its constant when the variable says yes
            if value.lower() not in TRUE + FALSE:
                wrong.append(f"${name}={value!r} is none of {', '.join(TRUE + FALSE)}")
            defaults[action.dest] = action.const if value.lower() in TRUE else action.default
        elif action.choices is not None and value not in action.choices:
            wrong.append(f"${name}={value!r} is none of {', '.join(map(str, action.choices))}")
        else:
            defaults[action.dest] = value  # argparse converts a string default with the option's type
    parser.set_defaults(**defaults, environment_errors=wrong)


def _given_vela_only(args: argparse.Namespace) -> list[str]:
    return [f"--{name.replace('_', '-')}" for name in VELA_ONLY if getattr(args, name) is not None]


def _config(args: argparse.Namespace) -> ServeConfig:
    from s1omni.server.config import ServeConfig
    from s1omni.server.profiles import enabled
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
    return ServeConfig(
        args.host,
        args.port,
        limits=given,
        body_timeout_s=args.body_timeout,
        drain_timeout_s=args.drain_timeout,
        profiles=enabled(args.profiles or ()),
        instances=args.instances,
        **body,
    )


def run(args: argparse.Namespace) -> int:
    from functools import partial

    from s1omni.runtime.api import load_model
    from s1omni.runtime.engine import read_manifest
    from s1omni.runtime.package import detect_family
    from s1omni.runtime.registry import Registry

    from s1omni.server import demo
    from s1omni.server.process import configure_logging, serve
    from s1omni.server.profiles import MAX_SPEED, SHARED_CONTEXT
    from s1omni.server.service import ModelSource, Service

    if args.environment_errors:
        raise UsageError("; ".join(args.environment_errors))
    if args.package and args.engine:
        raise UsageError("serve a package or an --engine, not both ($S1OMNI_PACKAGE and $S1OMNI_ENGINE count too)")
    if not args.body_timeout > 0:
        raise UsageError(f"--body-timeout must be > 0 seconds, not {args.body_timeout:g}")
    if args.instances < 1:
        raise UsageError(f"--instances takes a count >= 1, not {args.instances}")
    config = _config(args)  # refuses an unknown profile before anything loads
    configure_logging(args.log_level, args.log_format)
    path = args.package or args.engine
    if path is not None and args.ray:
        path = str(Path(path).absolute())  # each replica loads it in its own process, on its own node
    if path is not None and not Path(path).is_dir():
        raise InputError(f"{path} is not a directory")
    if args.engine and not (Path(args.engine) / "manifest.json").is_file():
        raise InputError(f"{args.engine} is not an engine directory (it has no manifest.json)")
    if path is None:
        source = ModelSource("demo", partial(demo.load, args.device), demo.NOTICE)
    else:
        # Known before the load, so that even a request refused while it loads gets the family's form.
        family = detect_family(Path(path)) if args.package else read_manifest(path)["family"]
        # Only plain values in the loader: a Ray replica gets it pickled, and args holds more than these.
        registry, device = args.registry, args.device
        copy = _reduced_copy(args, config, path) if family == "vela2" else None  # other families refuse the option below
        source = ModelSource(Path(path).name, lambda: load_model(path, Registry.load(registry), device), family=family, reduced_copy=copy)
    given = _given_vela_only(args)
    if source.family != "vela2" and given:
        raise UsageError(f"{', '.join(given)} apply to Vela 2.0 members only, not to {source.family}")
    if path is None and MAX_SPEED.name in config.profiles:
        raise UsageError("max_speed runs on a reduced copy of an engine: serve --engine ENG with --reduced-copy COPY")
    if not args.engine and SHARED_CONTEXT.name in config.profiles:
        raise UsageError("shared_context runs an engine's packed graph: serve --engine ENG, one whose `s1omni validate ENG --shared-context` passed")
    if args.ray:
        return _deploy_on_ray(args, config, source)
    given = [f"--{name.replace('_', '-')}" for name in RAY_ONLY if getattr(args, name) is not None]
    if given:
        raise UsageError(f"{', '.join(given)} apply with --ray only")
    serve(Service(config, source), args.log_level)
    return 0


def _reduced_copy(args: argparse.Namespace, config: ServeConfig, engine: str) -> Callable[[], ReducedCopy] | None:
    """The loader of ``--reduced-copy`` (with ``--profiles max_speed`` and ``--engine`` only), its consent checked
    now, before anything loads (``GateMissed`` naming why it may not be served), and again as it loads."""
    from s1omni.runtime.engine import read_manifest
    from s1omni.runtime.reduced_copy import consent_problem, load_reduced_copy
    from s1omni.runtime.registry import Registry
    from s1omni.server.profiles import MAX_SPEED

    wanted = MAX_SPEED.name in config.profiles
    if not wanted and args.reduced_copy is None:
        return None
    if not wanted or args.reduced_copy is None or not args.engine:
        raise UsageError("--profiles max_speed and --reduced-copy COPY go together, with --engine ENG (the engine served as exact)")
    # Absolute: a Ray replica loads it in its own process, on its own node.
    copy, registry, device = str(Path(args.reduced_copy).absolute()), args.registry, args.device
    if not (Path(copy) / "manifest.json").is_file():
        raise InputError(f"{copy} is not an engine directory (it has no manifest.json)")
    problem = consent_problem(read_manifest(copy), read_manifest(engine), Registry.load(registry), device)
    if problem:
        raise GateMissed(f"the reduced copy {copy} {problem}; max_speed is refused and the server does not start")
    return lambda: load_reduced_copy(copy, engine, Registry.load(registry), device)


def _deploy_on_ray(args: argparse.Namespace, config: ServeConfig, source: ModelSource) -> int:
    try:
        from s1omni.server.ray_serve import Cluster, DeploymentFailed, deploy
    except ModuleNotFoundError as exc:
        if not (exc.name or "").startswith("ray"):
            raise
        raise EnvironmentMissing(f"--ray needs Ray Serve: pip install 's1omni[ray]' ({exc})") from None
    counts = (args.replicas, args.min_replicas, args.max_replicas)
    if any(count is not None and count < 1 for count in counts) or (args.gpus_per_replica is not None and args.gpus_per_replica <= 0):
        raise UsageError("--replicas, --min-replicas and --max-replicas take a count >= 1, --gpus-per-replica > 0")
    if args.min_replicas is not None and args.max_replicas is not None and args.min_replicas > args.max_replicas:
        raise UsageError("--min-replicas is above --max-replicas")
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
    except DeploymentFailed as exc:  # its replicas never passed their load and warm-up
        raise GateMissed(str(exc)) from None
