"""What an HTTP client costs one request: httpx's asyncio client against aiohttp's, on one uvicorn app.

The app answers the router request's body (about 12 KB of JSON) with an answer-sized JSON body and a
``Server-Timing`` header, doing nothing else, so that a sample is the client, the loopback and
uvicorn's own HTTP handling. Both clients run one connection, one request at a time, as one
closed-loop client of ``s1omni bench --http`` does, alternating runs against the same server; uvicorn
parses with h11 as ``s1omni serve`` does (``--http h11``), or with httptools for comparison.

    python benchmarks/cpu-http-client/client_cost.py --out benchmarks/cpu-http-client/client_cost.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import aiohttp
import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from s1omni.bench.http_load import free_port

PATH = "/v1/systemone"
HEADERS = {"content-type": "application/json"}
BODY = json.dumps(
    {"text": "word " * 2400, "questions": [{"id": f"q{i}", "kind": "choice", "options": ["a", "b"]} for i in range(6)]}
).encode()
ANSWER = json.dumps(
    {"answers": [{"id": f"q{i}", "kind": "choice", "label": "x" * 20, "probs": {f"o{j}": 0.125 for j in range(8)}} for i in range(6)]}
).encode()


async def answer(request: Request) -> Response:
    json.loads(await request.body())
    return Response(ANSWER, media_type="application/json", headers={"server-timing": "total;dur=0.000"})


app = Starlette(routes=[Route(PATH, answer, methods=["POST"])])


async def with_httpx(url: str, count: int) -> list[float]:
    samples = []
    async with httpx.AsyncClient(base_url=url, trust_env=False) as client:
        for _ in range(count):
            begin = time.perf_counter()
            response = await client.post(PATH, content=BODY, headers=HEADERS)
            json.loads(response.content), response.headers.get("server-timing")
            samples.append(time.perf_counter() - begin)
    return samples


async def with_aiohttp(url: str, count: int) -> list[float]:
    samples = []
    async with aiohttp.ClientSession(base_url=url, connector=aiohttp.TCPConnector(limit=1)) as client:
        for _ in range(count):
            begin = time.perf_counter()
            async with client.post(PATH, data=BODY, headers=HEADERS) as response:
                json.loads(await response.read()), response.headers.get("server-timing")
            samples.append(time.perf_counter() - begin)
    return samples


CLIENTS = {"httpx": with_httpx, "aiohttp": with_aiohttp}


def summary(samples: list[float]) -> dict[str, float]:
    ms = sorted(sample * 1e3 for sample in samples)
    return {"p50_ms": round(statistics.median(ms), 3), "p95_ms": round(ms[int(0.95 * (len(ms) - 1))], 3), "count": len(ms)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=400, help="timed requests a run (default 400)")
    parser.add_argument("--warmup", type=int, default=50, help="untimed requests before each run (default 50)")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each client, alternating (default 3)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    record = {"command": " ".join(sys.argv), "host": platform.processor() or platform.machine(), "body_bytes": len(BODY),
              "answer_bytes": len(ANSWER), "servers": {}}  # fmt: skip
    here = Path(__file__).resolve().parent
    for http in ("h11", "httptools"):
        port = free_port()
        server = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "client_cost:app", "--port", str(port), "--http", http, "--log-level", "warning"],
            cwd=here,
        )
        try:
            url = f"http://127.0.0.1:{port}"
            for _ in range(100):
                try:
                    urllib.request.urlopen(f"{url}/", timeout=1)
                except urllib.error.HTTPError:
                    break  # listening (404 for /)
                except OSError:
                    time.sleep(0.1)
            runs: dict[str, list[dict[str, float]]] = {name: [] for name in CLIENTS}
            for _ in range(args.rounds):
                for name, client in CLIENTS.items():
                    samples = asyncio.run(client(url, args.warmup + args.requests))[args.warmup :]
                    runs[name].append(summary(samples))
                    print(f"uvicorn --http {http}, {name}: {runs[name][-1]}", flush=True)
            record["servers"][http] = runs
        finally:
            server.terminate()
            server.wait()
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    plot(record, args.out.with_suffix(".png"))


def plot(record: dict, path: Path) -> None:
    """p50 of each run, by server parser and client."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(6, 3.5))
    labels, values = [], []
    for http, runs in record["servers"].items():
        for name, summaries in runs.items():
            labels.append(f"{name}\nuvicorn {http}")
            values.append([run["p50_ms"] for run in summaries])
    for index, run_values in enumerate(values):
        axis.scatter([index] * len(run_values), run_values, color="tab:blue")
    axis.set_xticks(range(len(labels)), labels, fontsize=8)
    axis.set_ylabel("p50 ms a request (each run)")
    axis.set_ylim(bottom=0)
    axis.set_title(f"One closed-loop client, {record['body_bytes']:,} B request", fontsize=10)
    figure.tight_layout()
    figure.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
