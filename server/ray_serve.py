"""The same app on Ray Serve: one deployment whose replicas each serve the model as one process does.

Each replica runs the single server's app and service (``create_app``, ``Service``, its scheduler)
under the one ``ServeConfig`` the deployment was given (its limits and enabled profiles), so a
request is read, admitted, batched and answered inside the replica Ray Serve's proxy routed it to,
with the same contract, refusals, ``Server-Timing`` and ``/metrics`` (that replica's own);
``X-Replica`` says which replica answered. ``X-Request-Id`` is the proxy's: it echoes the client's
value as sent, or makes one, and hands it to the replica, whose access log carries it.

Routing is Ray Serve's power-of-two-choices over the replicas below ``max_ongoing_requests``, which
is twice the family's admission limit (``max_queue``): a request that finds its replica's queue full
still reaches it and is refused there with the contract's 429 and ``Retry-After`` instead of waiting
in the proxy. With two replicas the router compares both, so a 429 means both were full; with more,
it means the two it sampled were.

A replica counts as started only once warm: Ray Serve awaits its first health check before routing
to it, and that check waits for the golden request. A redeploy (new engine, new options) therefore
replaces replicas one at a time, each old one draining its requests while its replacement warms
up, and never routes to a replica still loading. A replica whose model cannot be served (an
engine built for another compute capability) fails its start with the node it ran on in the
message, and Ray Serve puts that message in the deployment's status and in ``serve.run``'s error.

``/health`` is 200 only while Ray Serve reports the deployment HEALTHY with every replica RUNNING;
each replica reads that state once a second (``serve.status()``) and answers 503 ``degraded``,
with the replica states as its reason, otherwise.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
from dataclasses import dataclass
from typing import Any

import ray
from ray import serve
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .app import create_app
from .config import ServeConfig
from .families import family_for
from .metrics import Metrics
from .service import ModelSource, Service

log = logging.getLogger("s1omni.server")

APP = "s1omni"  # the Ray Serve application, and its one deployment
REPLICA_HEADER = b"x-replica"
STATE_PERIOD_S = 1.0  # how often each replica reads the deployment's state for /health
WARM_POLL_S = 0.05


class DeploymentFailed(RuntimeError):
    """Ray Serve could not start the deployment; the message is Ray Serve's, with each replica's reason."""


@dataclass(frozen=True)
class Cluster:
    """The ``--ray`` options of ``s1omni serve``."""

    address: str | None = None  # None: start a local cluster that lives as long as this process
    replicas: int = 1  # the autoscaler's initial count when bounds are given
    gpus_per_replica: float = 1.0  # when the model runs on CUDA; a CPU replica takes one CPU
    min_replicas: int | None = None
    max_replicas: int | None = None


def _stamped(app: ASGIApp, replica: str) -> ASGIApp:
    """``app`` with ``X-Replica`` on every response and without its own ``X-Request-Id`` (the proxy adds one)."""
    stamp = (REPLICA_HEADER, replica.encode())

    async def stamped_app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return

        async def stamped(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [(name, value) for name, value in message.get("headers", []) if name != b"x-request-id"]
                message = {**message, "headers": [*headers, stamp]}
            await send(message)

        await app(scope, receive, stamped)

    return stamped_app


def _waiting(app: str, deployment: str) -> str | None:
    """Why the deployment is not all warm by Ray Serve's account, None when it is."""
    try:
        state = serve.status().applications[app].deployments[deployment]
    except Exception as exc:  # the controller restarting, the app being deleted: not healthy, with why
        return f"the Ray Serve deployment's state cannot be read: {type(exc).__name__}: {exc}"
    if state.status == "HEALTHY" and set(state.replica_states) == {"RUNNING"}:
        return None
    replicas = ", ".join(f"{count} {name.lower()}" for name, count in sorted(state.replica_states.items()))
    return f"the Ray Serve deployment is {state.status.lower()} (replicas: {replicas or 'none'})"


@serve.deployment(name=APP)
@serve.ingress()
class Replica:
    """One replica: the model loaded once, behind the single server's app."""

    def __init__(self, config: ServeConfig, source: ModelSource, log_level: str = "info"):
        logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        context = serve.get_replica_context()
        self.name = context.replica_id.unique_id
        self.deployment = (context.app_name, context.deployment)
        self.service = Service(config, source)
        self.waiting: str | None = "the Ray Serve deployment's state has not been read yet"
        self.service.peers = lambda: self.waiting
        self._follow: asyncio.Task[None] | None = None

    def __serve_build_asgi_app__(self) -> ASGIApp:
        return _stamped(create_app(self.service), self.name)

    async def check_health(self) -> None:
        """Ray Serve's health check; the first one, which it awaits before routing here, waits for the warm-up."""
        service = self.service
        while service.status not in ("ready", "failed"):
            await asyncio.sleep(WARM_POLL_S)
        if service.status == "failed":
            node = f"{ray.util.get_node_ip_address()} (node {ray.get_runtime_context().get_node_id()})"
            raise RuntimeError(f"{service.source.label} cannot be served on {node}: {service.reason}")
        if self._follow is None:
            self._follow = asyncio.create_task(self._follow_deployment())

    async def _follow_deployment(self) -> None:
        while True:
            self.waiting = await asyncio.to_thread(_waiting, *self.deployment)
            await asyncio.sleep(STATE_PERIOD_S)


def options(cluster: Cluster, device: str, config: ServeConfig, family: str) -> dict[str, Any]:
    """The deployment's Ray Serve options: resources, routing bound, replica count or autoscaling bounds."""
    limits = family_for(family, config, Metrics()).limits
    resources: dict[str, Any] = {"num_gpus": cluster.gpus_per_replica} if device == "cuda" else {"num_cpus": 1}
    # The deploying process's s1omni settings (home, registry) hold in every replica, on any node.
    settings = {name: value for name, value in os.environ.items() if name.startswith("S1OMNI_")}
    chosen: dict[str, Any] = {
        "ray_actor_options": {**resources, "runtime_env": {"env_vars": settings}},
        "max_ongoing_requests": 2 * limits.max_queue,
        # Ray Serve waits this long for a stopping replica's requests before it kills it.
        "graceful_shutdown_timeout_s": config.drain_timeout_s,
    }
    if cluster.min_replicas is None and cluster.max_replicas is None:
        chosen["num_replicas"] = cluster.replicas
        return chosen
    low = 1 if cluster.min_replicas is None else cluster.min_replicas
    high = max(low, cluster.replicas) if cluster.max_replicas is None else cluster.max_replicas
    # Scale on queue length: past one full forward's plans waiting per replica, add replicas.
    chosen["autoscaling_config"] = {
        "min_replicas": low,
        "max_replicas": high,
        "initial_replicas": min(max(cluster.replicas, low), high),
        "target_ongoing_requests": limits.max_batch_plans,
    }
    return chosen


def deploy(config: ServeConfig, source: ModelSource, cluster: Cluster, device: str, log_level: str = "info") -> int:
    """Deploy (or redeploy, replica by replica) on Ray Serve; with a local cluster, serve until a signal."""
    # "local": a new cluster even where `ray start` left one on this machine (ray.init would join it).
    ray.init(address=cluster.address or "local", logging_level=log_level.upper())
    serve.start(http_options={"host": config.host, "port": config.port})
    application = Replica.options(**options(cluster, device, config, source.family)).bind(config, source, log_level)
    try:
        serve.run(application, name=APP, route_prefix="/")
    except RuntimeError as exc:  # serve.run's way of saying the application went DEPLOY_FAILED
        raise DeploymentFailed(str(exc)) from None
    url = f"http://{config.host}:{config.port}"
    if cluster.address is not None:
        log.info("Ray Serve serves %s at %s on the cluster at %s", source.label, url, cluster.address)
        return 0  # the deployment lives in the cluster, not in this process
    address = ray.get_runtime_context().gcs_address
    log.info("Ray Serve serves %s at %s; the local Ray cluster is at %s (--ray-address to redeploy)", source.label, url, address)
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    stop.wait()
    log.info("shutting down Ray Serve and the local cluster")
    serve.shutdown()
    ray.shutdown()
    return 0
