"""The single server's contract through Ray Serve: a local Ray cluster, the tiny member deployed by
``s1omni serve --ray --ray-address`` with two replicas, real HTTP through Ray Serve's proxy.

The contract tests of ``test_server_http`` are imported and run here against the deployment, except
those that read one process's log, compare two ``/metrics`` scrapes (each scrape is one replica's)
or expect the default queue limits (each replica here admits 4); the Ray variants of those are
below, and the burst helpers are ``test_server_overload``'s. One deployment serves the module; the
tests that redeploy it run last.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from serving import S1OMNI, error, metric, stages

ray = pytest.importorskip("ray", reason="Ray Serve is not installed (pip install 's1omni[ray]')")
serve = pytest.importorskip("ray.serve", reason="Ray Serve is not installed (pip install 's1omni[ray]')")

from test_server_http import (  # noqa: E402  (run here against the deployment)
    test_a_declared_length_over_the_limit_is_413_before_the_body_is_read,
    test_a_failed_question_keeps_its_place,
    test_a_named_model_must_be_the_served_one,
    test_a_request_is_refused_only_when_no_question_in_any_state_is_valid,
    test_a_streamed_body_is_413_once_it_passes_the_limit,
    test_bodies_that_are_not_strict_json_are_400,
    test_escaped_pairs_and_large_bodies_are_fine,
    test_every_reason_is_in_the_message_when_no_question_is_valid,
    test_five_kinds_answer_in_the_documented_key_order,
    test_malformed_requests_are_400,
    test_max_tokens_reaches_the_model_as_the_scan_budget,
    test_other_families_surfaces_are_unsupported,
    test_states_are_answered_under_their_names,
    test_systemone_and_decisions_are_one_handler,
    test_unknown_routes_and_methods_are_invalid_request,
)
from test_server_overload import SMALL, burst, check_burst  # noqa: E402

from s1omni.bench.http_load import free_port  # noqa: E402
from s1omni.runtime.registry import user_registry  # noqa: E402
from s1omni.server.config import ServeConfig  # noqa: E402
from s1omni.server.ray_serve import APP, STATE_PERIOD_S, Cluster, Replica, options  # noqa: E402
from s1omni.server.scheduler import Limits  # noqa: E402

REPLICAS, MAX_QUEUE = 2, 4
DEPLOY_TIMEOUT_S = 300
BACK_WITHIN_S = 60
# What Ray Serve's proxy answers for a request whose replica died while it held it.
REPLICA_DIED = 500
LONG = {"state": "Please refund the duplicate charge of forty euros. " * 40, "questions": SMALL["questions"]}


@dataclass
class Deployment:
    """The surface of ``serving.Server`` that the shared tests use, over Ray Serve's proxy."""

    url: str
    client: httpx.Client
    address: str  # the Ray cluster's
    home: Path

    def post(self, body: object, path: str = "/v1/systemone") -> httpx.Response:
        return self.client.post(path, json=body)

    def deploy(self, package: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """``s1omni serve --ray`` against the cluster: it deploys (or redeploys), waits for it, and exits."""
        port = self.url.rsplit(":", 1)[1]
        command = [str(S1OMNI), "serve", str(package), "--ray", "--ray-address", self.address, "--port", port]
        command += ["--replicas", str(REPLICAS), "--max-queue", str(MAX_QUEUE), "--registry", str(user_registry()), *args]
        env = {**os.environ, "S1OMNI_HOME": str(self.home)}
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=DEPLOY_TIMEOUT_S)
        assert done.returncode == 0 or not check, done.stdout + done.stderr
        return done


@pytest.fixture(scope="module")
def server(tiny_vela: Path, s1omni_home: Path) -> Iterator[Deployment]:
    # Three logical CPUs: two CPU replicas, and room for a replacement while one stops.
    context = ray.init(address="local", num_cpus=REPLICAS + 1, include_dashboard=False, log_to_driver=False)
    url = f"http://127.0.0.1:{free_port()}"
    deployment = Deployment(url, httpx.Client(base_url=url, timeout=120), context.address_info["gcs_address"], s1omni_home)
    try:
        deployment.deploy(tiny_vela)
        yield deployment
    finally:
        deployment.client.close()
        serve.shutdown()
        ray.shutdown()


def replicas_seen(server: Deployment, waves: int = 4) -> Counter[str]:
    """``X-Replica`` of at least ``waves`` bursts of one queue's worth of small requests, until every
    replica has answered (or 20 bursts); every request answered 200."""
    seen: Counter[str] = Counter()
    for wave in range(20):
        responses = burst(server, MAX_QUEUE, SMALL)
        assert {response.status_code for response in responses} == {200}, [r.text for r in responses]
        seen.update(response.headers["x-replica"] for response in responses)
        if wave + 1 >= waves and len(seen) == REPLICAS:
            break
    return seen


def replica_pid(replica: str) -> int:
    """The process of a replica, through its actor (Ray Serve names it after the replica's full id)."""
    actor = ray.get_actor(f"SERVE_REPLICA::{APP}#{APP}#{replica}", namespace="serve")
    return ray.get(actor.__ray_call__.remote(lambda _: os.getpid()))


def health_until_back(server: Deployment, said: list[httpx.Response]) -> None:
    """Poll ``/health`` into ``said`` until it has said 503 and then 200 again, or ``BACK_WITHIN_S`` passed."""
    deadline = time.monotonic() + BACK_WITHIN_S
    with httpx.Client(base_url=server.url, timeout=30) as client:
        while time.monotonic() < deadline:
            said.append(client.get("/health"))
            if said[-1].status_code == 200 and any(response.status_code == 503 for response in said):
                return
            time.sleep(0.2)


def assert_every_replica_running(server: Deployment) -> None:
    state = serve.status().applications[APP].deployments[APP]
    assert state.status == "HEALTHY" and state.replica_states == {"RUNNING": REPLICAS}, state
    deadline = time.monotonic() + 2 * STATE_PERIOD_S + 1  # each replica reads that state once a second
    while (health := server.client.get("/health")).status_code != 200:
        assert time.monotonic() < deadline, health.text
        time.sleep(0.1)


def test_both_replicas_answer(server: Deployment) -> None:
    seen = replicas_seen(server)
    assert len(seen) == REPLICAS, seen


def test_health_models_and_liveness_speak_for_the_deployment(server: Deployment) -> None:
    models = server.client.get("/v1/models").json()
    assert models["limits"]["max_queue"] == MAX_QUEUE
    card = models["data"][0]
    assert card["ready"] is True and card["family"] == "vela2"
    health = server.client.get("/health")
    assert health.status_code == 200, health.text
    assert health.json() == {"api_version": models["api_version"], "status": "ready", "reason": None, "model": card["id"]}
    stages(health)
    assert health.headers["x-replica"]
    assert server.client.get("/health/live").json() == {"api_version": models["api_version"], "status": "alive"}


def test_request_ids_are_the_proxys(server: Deployment) -> None:
    """Ray Serve's proxy echoes the client's ``X-Request-Id`` (or makes one): one header, never two."""
    response = server.client.post("/v1/systemone", json=SMALL, headers={"x-request-id": "abc-123"})
    assert response.headers.get_list("x-request-id") == ["abc-123"]
    assert len(server.post(SMALL).headers.get_list("x-request-id")) == 1


def scrape_every_replica(server: Deployment) -> dict[str, str]:
    """One ``/metrics`` text per replica, scraping until each has answered."""
    texts: dict[str, str] = {}
    deadline = time.monotonic() + 30
    while len(texts) < REPLICAS:
        assert time.monotonic() < deadline, f"only {sorted(texts)} answered /metrics"
        response = server.client.get("/metrics")
        texts[response.headers["x-replica"]] = response.text
    return texts


def test_metrics_are_each_replicas_own(server: Deployment) -> None:
    ok = {"route": "/v1/systemone", "status": "200", "code": "ok"}
    before = scrape_every_replica(server)
    seen = replicas_seen(server)
    after = scrape_every_replica(server)
    assert set(after) == set(before) == set(seen)
    for replica, count in seen.items():
        answered = metric(after[replica], "s1omni_requests_total", **ok) - metric(before[replica], "s1omni_requests_total", **ok)
        assert answered == count, (replica, answered, count)
        assert metric(after[replica], "s1omni_ready") == 1 and metric(after[replica], "s1omni_pending_jobs") == 0


def test_a_burst_of_four_times_the_combined_queue_is_answered_200_or_429(server: Deployment) -> None:
    responses = burst(server, 4 * REPLICAS * MAX_QUEUE, SMALL)
    check_burst(responses)  # the 429s are the contract's: the replicas refused them, not the proxy
    # The burst overflows one replica's queue, so both answer some; asked of the burst itself, since the
    # proxy's cached queue lengths may keep a just-full replica out of the next few small bursts.
    assert len({response.headers["x-replica"] for response in responses if response.status_code == 200}) == REPLICAS
    assert server.client.get("/health").status_code == 200


def test_killing_a_replica_mid_burst_answers_its_requests_and_it_comes_back(server: Deployment) -> None:
    victim = replicas_seen(server).most_common(1)[0][0]
    pid = replica_pid(victim)
    killed = threading.Event()
    said: list[httpx.Response] = []
    watcher = threading.Thread(target=health_until_back, args=(server, said))

    async def send() -> list[httpx.Response]:
        limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
        async with httpx.AsyncClient(base_url=server.url, limits=limits, timeout=60) as client:

            async def one() -> httpx.Response:
                response = await client.post("/v1/systemone", json=LONG)
                if response.headers.get("x-replica") == victim and not killed.is_set():
                    killed.set()  # the victim is answering: it holds admitted requests now
                    os.kill(pid, signal.SIGKILL)
                    watcher.start()
                return response

            return await asyncio.gather(*(one() for _ in range(4 * REPLICAS * MAX_QUEUE)))

    responses = asyncio.run(send())  # an httpx timeout (a hang) fails the test here
    assert killed.is_set()
    statuses = Counter(response.status_code for response in responses)
    assert set(statuses) <= {200, 429, REPLICA_DIED}, statuses
    assert statuses[REPLICA_DIED] >= 1, statuses  # the requests the victim held when it died
    for response in responses:
        if response.status_code == 429:
            error(response, 429, "overloaded")
            assert response.headers["retry-after"] == "1"
        if response.status_code == REPLICA_DIED:  # the proxy's answer: no replica stamped it
            assert response.text == "Internal Server Error" and "x-replica" not in response.headers
    watcher.join(BACK_WITHIN_S + 30)
    degraded = [response for response in said if response.status_code == 503]
    assert degraded and said[-1].status_code == 200, [response.text for response in said]
    body = degraded[0].json()
    assert body["status"] == "degraded" and body["reason"].startswith("the Ray Serve deployment is "), body
    assert_every_replica_running(server)
    assert victim not in replicas_seen(server)


def test_a_redeploy_under_load_drops_no_request(server: Deployment, tiny_vela: Path) -> None:
    before = set(replicas_seen(server))
    answered: list[httpx.Response] = []
    done = threading.Event()

    async def load() -> None:
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:

            async def client_loop() -> None:
                while not done.is_set():
                    answered.append(await client.post("/v1/systemone", json=SMALL))

            await asyncio.gather(client_loop(), client_loop())

    loader = threading.Thread(target=asyncio.run, args=(load(),))
    loader.start()
    try:
        server.deploy(tiny_vela, "--batch-window-ms", "3")  # new options: every replica is replaced
    finally:
        done.set()
        loader.join(60)
    statuses = Counter(response.status_code for response in answered)
    assert statuses == {200: len(answered)} and len(answered) > 0, statuses
    after = set(replicas_seen(server))
    assert len(after) == REPLICAS and not after & before, (before, after)
    assert_every_replica_running(server)


def test_a_model_that_cannot_load_says_which_node_and_the_old_replicas_serve_on(server: Deployment, broken_member: Path) -> None:
    """The path of an engine refused for another compute capability: the replica's load fails. Ray
    Serve gives up after 3 starts per replica (about a minute here) and keeps the old replicas."""
    done = server.deploy(broken_member, check=False)
    assert done.returncode == 1, done.stdout + done.stderr
    message = done.stderr.strip().splitlines()
    node = ray.util.get_node_ip_address()
    assert any(f"{broken_member.name} cannot be served on {node} (node " in line and "non-finite" in line for line in message), done.stderr
    response = server.post(SMALL)
    assert response.status_code == 200 and response.json()["model"] != broken_member.name, response.text


def test_autoscaling_bounds_and_the_routing_bound_go_to_ray_serve() -> None:
    config = ServeConfig(limits=Limits(max_queue=4, max_batch_plans=8))
    scaled = options(Cluster(replicas=3, min_replicas=2, max_replicas=5), "cuda", config, "vela2")
    assert scaled["autoscaling_config"] == {"min_replicas": 2, "max_replicas": 5, "initial_replicas": 3, "target_ongoing_requests": 8}
    assert "num_replicas" not in scaled and scaled["max_ongoing_requests"] == 8
    assert scaled["ray_actor_options"]["num_gpus"] == 1.0
    fixed = options(Cluster(replicas=2), "cpu", config, "vela2")
    assert fixed["num_replicas"] == 2 and fixed["ray_actor_options"]["num_cpus"] == 1 and "autoscaling_config" not in fixed
    for chosen in (scaled, fixed):
        Replica.options(**chosen)  # Ray Serve's own validation of the options
    with pytest.raises(ValueError, match="max_replicas"):
        Replica.options(**{**scaled, "autoscaling_config": {**scaled["autoscaling_config"], "max_replicas": 1}})


def test_ray_options_need_ray(tiny_vela: Path) -> None:
    done = subprocess.run([str(S1OMNI), "serve", str(tiny_vela), "--replicas", "2"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--replicas apply with --ray only" in done.stderr, done.stderr  # usage
