"""Closed-loop HTTP load against real ``s1omni serve`` processes.

Each server is a subprocess on a free port, measured once ``/health`` answers 200 (the server has
loaded and warmed its model). At each concurrency a fixed set of clients each sends its next
request as soon as the previous one is answered (no arrival-rate model), on a connection of its
own, every request asking for the one profile the run times (``options.profile``: exact, or
batching, which the server merges across clients). The figures are steady state: each client
first sends ``warmup`` requests of its own, untimed, and the timed window opens only once every
client has, so that no sample is taken while some clients are still warming up; it closes once
every client has had ``requests`` answers in it, the clients done first sending on meanwhile, so
that the load stays at its concurrency to the end.
On a CUDA-graph engine, two warm-ups a client do not reach every merged size (``h100-forward-alone``: the
16-client level's window opened with graphs still to capture, 27.8 req/s over it, 37.6 after the last capture).
So before each level, where the server has captured any graph, the level's clients send untimed rounds of
``warmup`` requests each (``settle``) until a round captures nothing new, at most ``settle_rounds`` of them; the
record keeps the rounds, the graphs they captured and their seconds: the cold start, beside the steady state.
Before its first level, a server with several model instances (``s1omni serve --instances N``) gets
``warmup`` bursts of N requests at once, untimed: a worker takes one request of a burst each, so that
every instance has run the request (and on a GPU captured its CUDA graphs for the request's shapes)
before a sample is taken; one client's warm-ups alone need not reach every instance.
A level thus gives at least ``concurrency x requests`` samples; a request sent before the window
opened or answered after it closed is not one. Requests per second are the samples over the
window. A sample runs on the client clock from the send to the fully parsed body; the request body
is serialized once, before any clock starts. Each response's ``Server-Timing`` header splits the
server's share into its stages (wall time). ``/metrics``, scraped before and after each level, gives
the server's CPU time per answered request (``server_cpu``): its process's, each thread pool's
(``s1omni_thread_cpu_seconds``, ``s1omni.server.metrics``) and the rest, outside Python's threads;
and its forwards' count and mean size. A level whose scrapes did not see every request it answered
(a Ray Serve replica's own metrics, with several replicas) records none.

The clients are aiohttp's (its HTTP parser is C): what a client costs a request is in every sample, and
httpx's asyncio client cost 2 ms more a request than aiohttp's against the same uvicorn app (h11, as
``s1omni serve`` parses) on a 2-core host: p50 2.72-2.92 ms against 0.77-0.92 ms for a 12 KB request
and its answer (``benchmarks/cpu-http-client/``), most of the 5 ms by which one client's p50 may
exceed the in-process p50 (issue 17). The untimed control calls (``/health``, ``/v1/models``) use the
standard library.
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from .stats import DIGITS, median_by_key, now, summarize, to_ms
from .workloads import answer_errors

HOST = "127.0.0.1"
PATH = "/v1/systemone"
JSON = {"content-type": "application/json"}
SETTLE_ROUNDS = 10  # untimed rounds at most before a level while the server captures CUDA graphs (``settle``)
REQUEST_TIMEOUT_S = 600.0  # a CPU reference of a real-size member takes seconds per request
STOP_TIMEOUT_S = 60.0
TIMING_ENTRY = re.compile(r"([A-Za-z_][\w-]*);dur=([0-9.]+)")
EXACT = "exact"  # the profile every server runs, the default of a request that names none
SHARED_CONTEXT = "shared_context"  # an engine's packed graph: the torch reference's server cannot run it


class BenchFailed(RuntimeError):
    """The run cannot stand as a measurement (a server that never got ready, a failed request)."""


def server_timing(header: str) -> dict[str, float]:
    """``{stage: ms}`` from a ``Server-Timing`` value (``parse;dur=0.120, ..., total;dur=3.456``)."""
    return {name: float(value) for name, value in TIMING_ENTRY.findall(header)}


def request_body(body: dict[str, Any], profile: str, family: str) -> dict[str, Any]:
    """``body`` as sent: a Vela 2.0 request names ``profile`` in its options; an OmniJev request has no
    options (its contract refuses the field) and runs exact."""
    if family != "vela2":
        return body
    return {**body, "options": {**(body.get("options") or {}), "profile": profile}}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        return probe.getsockname()[1]


@dataclass(frozen=True)
class Server:
    name: str
    url: str
    command: list[str]
    log: Path
    pid: int | None = None  # the server process's, where this process started it


def _log_tail(path: Path, lines: int = 30) -> str:
    return "\n".join(path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])


# No proxy from the environment: the servers measured are on this host.
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _get(url: str, timeout_s: float) -> tuple[int, bytes]:
    """``(status, body)`` of a GET, whatever the status; ``OSError`` when nothing answers."""
    try:
        with _DIRECT.open(url, timeout=timeout_s) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as refused:
        with refused:
            return refused.code, refused.read()


def _wait_ready(url: str, process: subprocess.Popen[bytes], timeout_s: float, log: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise BenchFailed(f"the server exited with {process.returncode} before it was ready:\n{_log_tail(log)}")
        try:
            status, body = _get(f"{url}/health", 5)
        except OSError:  # not listening yet
            status, body = None, b""
        if status == 200:
            return
        # Only the server's own 503 is JSON (Ray Serve's proxy answers 404 text until the app is deployed).
        health = json.loads(body) if status == 503 else {}
        if health.get("status") == "failed":
            raise BenchFailed(f"the server failed its warm-up: {health.get('reason')}\n{_log_tail(log)}")
        time.sleep(0.2)
    raise BenchFailed(f"/health was not 200 within {timeout_s:.0f} s:\n{_log_tail(log)}")


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)  # the server drains, then exits
        try:
            process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@contextmanager
def serving(name: str, serve_args: Sequence[str], log: Path, start_timeout_s: float) -> Iterator[Server]:
    """``s1omni serve SERVE_ARGS`` on a free port, ready; stopped on exit."""
    port = free_port()
    # The interpreter running the bench, so the server runs the same code and packages.
    command = [sys.executable, "-m", "s1omni", "serve", *serve_args, "--host", HOST, "--port", str(port)]
    with log.open("wb") as handle:
        process = subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT)
    try:
        url = f"http://{HOST}:{port}"
        _wait_ready(url, process, start_timeout_s, log)
        yield Server(name, url, command, log, process.pid)
    finally:
        _stop(process)


def card(server: Server) -> dict[str, Any]:
    """What the server says it runs: its model card from ``/v1/models``."""
    status, body = _get(f"{server.url}/v1/models", 30)
    if status != 200:
        raise BenchFailed(f"/v1/models answered {status}: {body[:200]!r}")
    return json.loads(body)["data"][0]


@dataclass
class Load:
    """What one closed-loop level saw inside its timed window, and the untimed requests around it."""

    samples_s: list[float] = field(default_factory=list)
    timings: list[dict[str, float]] = field(default_factory=list)  # Server-Timing of each successful response
    failures: Counter[str] = field(default_factory=Counter)
    answer_errors: int = 0
    per_client: list[int] = field(default_factory=list)  # requests each client had answered in the window
    answered: int = 0  # 200 responses, timed or not
    untimed: int = 0  # warm-up, and requests the window's ends cut
    wall_s: float = 0.0


async def _closed_loop(client: aiohttp.ClientSession, body: bytes, concurrency: int, requests: int, warmup: int) -> Load:
    """``concurrency`` clients in a closed loop: each warms up with ``warmup`` requests, then the
    window runs until each has had ``requests`` answered (or failed) in it."""
    load = Load(per_client=[0] * concurrency)
    warming, short = concurrency if warmup else 0, concurrency  # clients still warming up, still short of their count
    opened = asyncio.Event()
    closed = asyncio.Event()
    window = [0.0, 0.0]  # when it opened and closed
    if not warming:
        window[0] = time.perf_counter()
        opened.set()

    async def one(index: int) -> None:
        nonlocal warming, short
        sent = 0
        while not closed.is_set():
            begin = time.perf_counter()
            sent += 1
            header, parsed, failure = "", None, None
            try:
                async with client.post(PATH, data=body, headers=JSON) as response:
                    content = await response.read()
                if response.status == 200:
                    header, parsed = response.headers.get("server-timing", ""), json.loads(content)
                else:
                    failure = f"http_{response.status}"
            except (aiohttp.ClientError, TimeoutError) as exc:
                failure = type(exc).__name__
            ended = time.perf_counter()
            load.answered += failure is None
            if failure is not None:
                load.failures[failure] += 1  # in the window or not: the run cannot stand
            if not opened.is_set() or begin < window[0] or closed.is_set():
                load.untimed += 1
                if sent == warmup:  # this client's last warm-up; it sends on, untimed, until every client is warm
                    warming -= 1
                    if not warming:
                        window[0] = ended
                        opened.set()
                continue
            if failure is None:
                load.samples_s.append(ended - begin)
                load.timings.append(server_timing(header))
                load.answer_errors += answer_errors(parsed)
            load.per_client[index] += 1
            if load.per_client[index] == requests:
                short -= 1
                if not short:
                    window[1] = ended
                    closed.set()

    await asyncio.gather(*(one(index) for index in range(concurrency)))
    load.wall_s = window[1] - window[0]
    return load


def _session(url: str, connections: int) -> aiohttp.ClientSession:
    """At most ``connections`` kept-alive connections to ``url`` (one a client)."""
    return aiohttp.ClientSession(
        base_url=url, connector=aiohttp.TCPConnector(limit=connections), timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    )


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]
DECISION_PATHS = frozenset({PATH, "/v1/decisions"})


def scrape(url: str) -> Samples | None:
    """Every sample of the server's ``/metrics`` by name and labels; ``None`` where it has none."""
    try:
        status, body = _get(f"{url}/metrics", 30)
    except OSError:
        return None
    if status != 200:
        return None
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(body.decode("utf-8"))
        for sample in family.samples
    }


def counter_total(samples: Samples, name: str, keep: Callable[[dict[str, str]], bool] = lambda _: True) -> float:
    """The counter ``name`` summed over its label sets that ``keep`` takes, in one scrape."""
    return sum(value for key, value in samples.items() if key[0] == name and keep(dict(key[1])))


def answered_decision(labels: dict[str, str]) -> bool:
    """Whether a label set of ``s1omni_requests_total`` counts decision requests answered 200."""
    return labels.get("route") in DECISION_PATHS and labels.get("status") == "200"


def server_cpu(before: Samples | None, after: Samples | None, answered: int) -> dict[str, Any] | None:
    """The server's CPU per answered decision request between two scrapes, in ms: ``process``, each thread
    pool's and ``outside_python`` (the process's less its Python threads'); the forwards run meanwhile and
    their mean requests; per head pool, its tasks a request and the mean ms a task waited for a thread and
    ran; the CUDA graphs captured meanwhile, the ms their capturing runs took, and the runs deferred (``cuda_graphs``).
    ``None`` unless both scrapes count exactly the ``answered`` requests between them."""
    if before is None or after is None:
        return None

    def change(name: str, keep: Callable[[dict[str, str]], bool] = lambda _: True) -> float:
        return counter_total(after, name, keep) - counter_total(before, name, keep)

    counted = change("s1omni_requests_total", answered_decision)
    if not answered or round(counted) != answered:
        return None
    pools = {
        dict(key[1])["pool"]: (value - before.get(key, 0.0)) * 1e3 / answered
        for key, value in after.items() if key[0] == "s1omni_thread_cpu_seconds"
    }  # fmt: skip
    process = change("process_cpu_seconds_total") * 1e3 / answered
    forwards = change("s1omni_batch_requests_count")

    def head_pool(pool: str) -> dict[str, float | None]:
        tasks, wait, run = (
            change(f"s1omni_head_pool_{series}_total", lambda labels: labels["pool"] == pool)
            for series in ("tasks", "wait_seconds", "run_seconds")
        )
        return {
            "tasks_per_request": round(tasks / answered, DIGITS),
            "wait_ms_per_task": round(wait * 1e3 / tasks, DIGITS) if tasks else None,
            "run_ms_per_task": round(run * 1e3 / tasks, DIGITS) if tasks else None,
        }

    head_pools = sorted(dict(key[1])["pool"] for key in after if key[0] == "s1omni_head_pool_tasks_total")
    return {
        "answered": answered,
        "process_ms_per_request": round(process, DIGITS),
        "pools_ms_per_request": {pool: round(ms, DIGITS) for pool, ms in sorted(pools.items())},
        "outside_python_ms_per_request": round(process - sum(pools.values()), DIGITS),
        "forwards": round(forwards),
        "mean_requests_per_forward": round(change("s1omni_batch_requests_sum") / forwards, DIGITS) if forwards else None,
        "head_pools": {pool: head_pool(pool) for pool in head_pools},
        "cuda_graphs": {
            "captures": round(change("s1omni_cuda_graph_captures_total")),
            "capture_ms": round(change("s1omni_cuda_graph_capture_seconds_total") * 1e3, DIGITS),
            "deferred_runs": round(change("s1omni_cuda_graph_deferred_runs_total")),
        },
    }


async def _warm_instances(url: str, body: bytes, instances: int, rounds: int) -> None:
    """``rounds`` bursts of ``instances`` requests at once, untimed (see the module's docstring)."""

    async def one(client: aiohttp.ClientSession) -> None:
        async with client.post(PATH, data=body, headers=JSON) as response:
            await response.read()

    async with _session(url, instances) as client:
        for _ in range(rounds):
            await asyncio.gather(*(one(client) for _ in range(instances)))


def captured_graphs(samples: Samples | None) -> float | None:
    """The CUDA graphs a server has captured (``s1omni_cuda_graph_captures_total``); None without a scrape."""
    return None if samples is None else counter_total(samples, "s1omni_cuda_graph_captures_total")


def settle(captured: Callable[[], float | None], untimed_round: Callable[[], Load], limit: int) -> tuple[dict[str, Any], Counter[str]]:
    """Untimed rounds (``untimed_round``) while the server still captures CUDA graphs: none where it has captured
    none so far (no graphs, or not yet used) or its metrics do not answer, else until a round adds none to
    ``captured()``, at most ``limit`` rounds. The rounds, the graphs they captured, their seconds and whether the
    last round captured nothing (``settled``); and their failures."""
    started = time.perf_counter()
    first = count = captured()
    rounds, failures = 0, Counter[str]()
    settled = not count
    while count and not settled and rounds < limit:
        failures += untimed_round().failures
        rounds += 1
        latest = captured()
        if latest is None:  # the metrics stopped answering: not known to have settled
            break
        settled, count = latest == count, latest
    return {"rounds": rounds, "captures": round(count - first) if rounds else 0, "seconds": round(time.perf_counter() - started, DIGITS),
            "settled": settled}, failures  # fmt: skip


async def run_level(url: str, body: bytes, concurrency: int, requests: int, warmup: int) -> Load:
    """One closed-loop level against ``url`` (``_closed_loop``), on connections of its own."""
    async with _session(url, concurrency) as client:
        return await _closed_loop(client, body, concurrency, requests, warmup)


def measure(
    server: Server,
    body: Any,
    profile: str,
    concurrency: Sequence[int],
    requests: int,
    warmup: int,
    progress: Callable[[str], None],
    instances: int = 1,
    settle_rounds: int = 0,
) -> list[dict[str, Any]]:
    """One run per concurrency level, each client sending ``requests`` timed requests (``body``, which
    asks for ``profile``) after its own ``warmup``: client latency summary, requests/s over the timed
    window, failures, answer errors, and per-stage medians of the server's own timing. A server of
    ``instances`` model instances first gets ``warmup`` bursts of that many requests at once; each level
    first gets up to ``settle_rounds`` untimed rounds while the server captures CUDA graphs (``settle``)."""
    payload = json.dumps(body).encode("utf-8")
    bursts = warmup if instances > 1 else 0
    if bursts:
        asyncio.run(_warm_instances(server.url, payload, instances, bursts))
        progress(f"http {server.name}: warmed its {instances} instances ({bursts} x {instances} requests at once)")
    runs = []
    for level in concurrency:
        started = now()
        settled, settle_failures = settle(
            lambda: captured_graphs(scrape(server.url)),
            lambda level=level: asyncio.run(run_level(server.url, payload, level, max(warmup, 1), 0)),
            settle_rounds,
        )
        if settled["rounds"]:
            progress(f"http {server.name} c={level}: {settled['rounds']} untimed rounds captured {settled['captures']} CUDA graphs "
                     f"in {settled['seconds']:.1f} s" + ("" if settled["settled"] else ", still capturing"))  # fmt: skip
        before = scrape(server.url)
        load = asyncio.run(run_level(server.url, payload, level, requests, warmup))
        cpu = server_cpu(before, scrape(server.url), load.answered)
        run: dict[str, Any] = {
            "subject": server.name, "profile": profile, "concurrency": level, "started": started, "finished": now(),
        }  # fmt: skip
        run["failures"] = dict(load.failures + settle_failures)
        run["requests_per_client"], run["warmup_per_client"] = requests, warmup
        run["instance_warmup"] = {"instances": instances, "bursts": bursts}
        run["settle"] = settled
        run["per_client"] = load.per_client  # each client's requests in the window, failed ones included
        run["untimed"] = load.untimed
        run["answer_errors"] = load.answer_errors
        run["server_cpu"] = cpu
        if load.samples_s:
            samples = to_ms(load.samples_s)
            run |= summarize(samples, load.wall_s)
            run["server_timing_median_ms"] = median_by_key(load.timings)
            outside = [
                sample - timing["total"] for sample, timing in zip(samples, load.timings, strict=True) if "total" in timing
            ]
            run["client_minus_server_median_ms"] = round(statistics.median(outside), DIGITS) if outside else None
            progress(
                f"http {server.name} {profile} c={level}: p50 {run['p50_ms']:.3f} ms, p95 {run['p95_ms']:.3f} ms, "
                f"{run['requests_per_s']:.2f} req/s over {run['count']} samples, {load.failures.total()} failed"
                + (f"; server CPU {cpu['process_ms_per_request']:.2f} ms a request" if cpu else "")
            )
        else:
            progress(f"http {server.name} {profile} c={level}: every request failed {dict(load.failures)}")
        runs.append(run)
    return runs
