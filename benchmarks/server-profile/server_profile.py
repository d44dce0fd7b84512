"""Where a loaded server's time goes: ``s1omni serve`` under closed-loop clients, sampled by py-spy.

    .venv/bin/pip install --target /tmp/pyspy py-spy      # a tool of this benchmark only, not a dependency
    PYSPY=/tmp/pyspy/bin/py-spy .venv/bin/python benchmarks/server-profile/server_profile.py --engine ENGINE \\
        --device cuda --serve-arg=--instances=2 --profile batching --concurrency 16 --out DIR

The server starts as ``s1omni bench --http`` starts it (``bench.http_load.serving``) and gets one level as the bench
runs it (``measure``: settled while it captures CUDA graphs, then ``--requests`` timed a client; ``run.json`` keeps
the level, its Server-Timing stages and its CPU by thread pool). Then the same clients go on sending, untimed, while
py-spy samples the server for ``--seconds`` twice, without pausing it: the thread that holds the GIL (``--gil``),
then every thread running Python on a CPU (idle threads left out). Each sample set gives, in ms a request (samples
over the rate, over the requests the server answered meanwhile, from ``/metrics``): each thread pool's share
(``server.metrics.thread_pool`` names them as ``/metrics`` does), and the functions with the most samples, on the
stack (``total``) and at its top (``self``). ``mean_threads`` is the threads sampled at once, on average; for the
GIL, the share of the sampled time some thread held it: near 1, Python's one lock is what bounds the throughput,
whatever the GPU and the pools' sizes. py-spy's samples are statistical and a sampler beside the server takes some
of its CPU: compare arms of one machine.
The raw stacks stay beside the record (``gil.txt``, ``cpu.txt``: py-spy's collapsed format) for a flame graph.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from s1omni.bench import http_load
from s1omni.bench.workloads import named
from s1omni.cli.bench import served_instances
from s1omni.server.metrics import thread_pool

DIGITS = 3
ROUND = 5  # requests a client between the load's pauses for its slowest client


def answered(url: str) -> float:
    """Decision requests the server has answered 200 so far."""
    return http_load.counter_total(http_load.scrape(url) or {}, "s1omni_requests_total", http_load.answered_decision)


def load_until(url: str, body: bytes, concurrency: int, stop: threading.Event) -> None:
    """``concurrency`` closed-loop clients, untimed, in rounds of ``ROUND`` requests each, until ``stop``."""
    while not stop.is_set():
        asyncio.run(http_load.run_level(url, body, concurrency, ROUND, 0))


def sample(pyspy: str, pid: int, seconds: int, rate: int, gil: bool, out: Path) -> None:
    """py-spy's collapsed stacks of ``pid`` (thread names first) over ``seconds``, into ``out``."""
    command = [pyspy, "record", "--threads", "--nonblocking", "-r", str(rate), "-d", str(seconds), "-f", "raw", "-o", str(out),
               "--pid", str(pid), *(["--gil"] if gil else [])]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:  # e.g. ptrace refused: py-spy says why
        raise SystemExit(f"py-spy exited {done.returncode}: {done.stderr.strip()[-2000:]}")


def summary(raw: Path, rate: int, seconds: float, requests: float, top: int = 30) -> dict[str, Any]:
    """ms a request by thread pool, and the ``top`` functions by samples on the stack and at its top."""
    pools: collections.Counter[str] = collections.Counter()
    total: collections.Counter[str] = collections.Counter()
    own: collections.Counter[str] = collections.Counter()
    for line in raw.read_text(encoding="utf-8").splitlines():
        stack, _, count = line.rpartition(" ")
        thread, *frames = stack.split(";")
        samples = int(count)
        pools[thread_pool(thread.partition(": ")[2])] += samples
        for frame in set(frames):
            total[frame] += samples
        if frames:
            own[frames[-1]] += samples
    per_request = lambda count: round(count / rate * 1e3 / requests, DIGITS) if requests else None  # noqa: E731
    return {
        "samples": sum(pools.values()),
        # Threads sampled at once, on average: with --gil the share of the time the GIL was held.
        "mean_threads": round(sum(pools.values()) / (rate * seconds), DIGITS),
        "ms_per_request_by_pool": {pool: per_request(count) for pool, count in pools.most_common()},
        "top_total_ms_per_request": {frame: per_request(count) for frame, count in total.most_common(top)},
        "top_self_ms_per_request": {frame: per_request(count) for frame, count in own.most_common(top)},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--engine", type=Path, help="a validated engine to serve")
    source.add_argument("--package", type=Path, help="a member package: its torch reference")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--serve-arg", action="append", default=[], metavar="ARG", help="extra `s1omni serve` argument (repeatable)")
    parser.add_argument("--workload", default="router", help="the request sent (a bench workload name)")
    parser.add_argument("--profile", default="batching", help="options.profile of every request; the server enables it")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--requests", type=int, default=20, help="timed requests a client in the level before sampling")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--seconds", type=int, default=15, help="sampled seconds, each of the two samplings")
    parser.add_argument("--rate", type=int, default=250, help="py-spy samples a second")
    parser.add_argument("--start-timeout", type=float, default=900.0)
    parser.add_argument("--out", type=Path, required=True, help="a directory for the record and the raw stacks")
    args = parser.parse_args()
    pyspy = os.environ.get("PYSPY", "py-spy")
    args.out.mkdir(parents=True, exist_ok=True)
    source = ["--engine", str(args.engine)] if args.engine else [str(args.package)]
    serve = [*source, "--device", args.device, *args.serve_arg, *(["--profiles", args.profile] if args.profile != http_load.EXACT else [])]
    workload = named(args.workload, "vela2")
    body = http_load.request_body(workload.body, args.profile, "vela2")
    payload = json.dumps(body).encode("utf-8")
    instances = served_instances(args.serve_arg)
    progress = lambda message: print(message, file=sys.stderr, flush=True)  # noqa: E731
    with http_load.serving("server", serve, args.out / "serve.log", args.start_timeout) as server:
        (run,) = http_load.measure(server, body, args.profile, [args.concurrency], args.requests, args.warmup, progress, instances,
                                 http_load.SETTLE_ROUNDS)  # fmt: skip
        record: dict[str, Any] = {"command": " ".join([os.path.relpath(sys.executable), *sys.argv]), "run": run, "rate": args.rate}
        stop = threading.Event()
        clients = threading.Thread(target=load_until, args=(server.url, payload, args.concurrency, stop))
        clients.start()
        try:
            time.sleep(2.0)  # the clients at full concurrency before the sampler attaches
            for name, gil in (("gil", True), ("cpu", False)):
                before, started = answered(server.url), time.perf_counter()
                sample(pyspy, server.pid, args.seconds, args.rate, gil, args.out / f"{name}.txt")
                seconds, requests = time.perf_counter() - started, answered(server.url) - before
                record[name] = {"seconds": round(seconds, DIGITS), "requests": requests, "requests_per_s": round(requests / seconds, 2),
                                **summary(args.out / f"{name}.txt", args.rate, seconds, requests)}  # fmt: skip
                progress(f"{name}: {requests:.0f} requests in {seconds:.1f} s, mean threads {record[name]['mean_threads']}, by pool {record[name]['ms_per_request_by_pool']}")
        finally:
            stop.set()
            clients.join()
    (args.out / "run.json").write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
