"""The CPU heads' work of one request, timed alone and from 8 threads at once (the server's situation).

    .venv/bin/python benchmarks/cpu-heads/heads_bench.py --label after --out benchmarks/cpu-heads/after.json

``--label before`` times main's heads: the same command with main's runtime first on the path
(``git archive main runtime calib | tar -x -C /tmp/main/s1omni``, ``cp s1omni/__init__.py
/tmp/main/s1omni/``, then ``PYTHONPATH=/tmp/main``). Workloads, on random head tensors of the
members' shapes and random states:

- ``vela2-router-0.8B``: ``Vela2Model.readout``'s head calls for ``calib/vela2`` case
  router-signals-600 on the 0.8B member (hidden 1,024, d 256; shapes from ``runtime/synth``): one
  span head call over 450 words x 17 labels and 15 candidate head calls of 15 options.
- ``omnijev-4B-K``: OmniJev-4B's ``option_scorer`` (Choice) over K options (2,560-wide states).

``single`` runs one request at a time (p50/p95 per request, and per head call for Vela 2.0);
``threads-8`` starts 8 threads that each run requests back to back (p50/p95 per request, requests per
second over the run). The load average before and after is recorded: this machine may be shared.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from s1omni.runtime.omnijev.heads import Heads
from s1omni.runtime.synth import omnijev as omnijev_synth
from s1omni.runtime.synth import vela2 as vela2_synth
from s1omni.runtime.vela2.heads import CandidateHead, SpanHead

WORDS, LABELS, CANDIDATE_CALLS, OPTIONS = 450, 17, 15, 15  # router-signals-600's blocks on the 0.8B member
THREADS = 8


def _weights(shapes: list[tuple[str, tuple[int, ...]]], prefix: str, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """The tensors under ``prefix`` (the prefix dropped): vectors near 1 (norm scales; biases are the
    same work), matrices scaled by their fan-in, so activations are of order one."""
    out = {}
    for name, shape in shapes:
        if name.startswith(prefix):
            value = 1.0 + 0.1 * rng.standard_normal(shape) if len(shape) < 2 else rng.standard_normal(shape) / np.sqrt(shape[-1])
            out[name[len(prefix) :]] = np.asarray(value, np.float32)
    return out


def vela2_request(rng: np.random.Generator) -> tuple[Callable[[], None], dict[str, Callable[[], None]]]:
    shapes = vela2_synth.tensor_shapes("0.8B")["model"]
    candidate = CandidateHead(_weights(shapes, "head.", rng))
    span = SpanHead(_weights(shapes, "span2.", rng), "span2.")
    hidden = vela2_synth.SIZES["0.8B"].backbone.hidden
    words = rng.standard_normal((WORDS, hidden)).astype(np.float32)
    labels = rng.standard_normal((LABELS, hidden)).astype(np.float32)
    blocks = [rng.standard_normal((OPTIONS + 1, hidden)).astype(np.float32) for _ in range(CANDIDATE_CALLS)]

    def request() -> None:
        span(words, labels)
        for rows in blocks:
            candidate(rows[:-1], rows[-1])

    calls = {"span": lambda: span(words, labels), "candidate": lambda: candidate(blocks[0][:-1], blocks[0][-1])}
    return request, calls


def omnijev_request(rng: np.random.Generator, options: int) -> Callable[[], None]:
    heads = Heads(_weights(omnijev_synth.tensor_shapes("4B")["heads"], "", rng))
    u = rng.standard_normal((options, heads.hidden_size)).astype(np.float32)
    zq = rng.standard_normal(heads.hidden_size).astype(np.float32)
    features = rng.standard_normal((options, 6)).astype(np.float32)
    return lambda: heads.option_scorer(u, zq, 1, features)


def _timed(call: Callable[[], None]) -> float:
    start = time.perf_counter()
    call()
    return (time.perf_counter() - start) * 1e3


def _summary(ms: list[float]) -> dict[str, float]:
    return {"p50_ms": round(float(np.percentile(ms, 50)), 2), "p95_ms": round(float(np.percentile(ms, 95)), 2), "n": len(ms)}


def single(call: Callable[[], None], repeats: int) -> dict[str, float]:
    for _ in range(3):
        call()
    return _summary([_timed(call) for _ in range(repeats)])


def threads(call: Callable[[], None], per_thread: int) -> dict[str, float]:
    def client(_: int) -> list[float]:
        call()  # warm-up
        return [_timed(call) for _ in range(per_thread)]

    start = time.perf_counter()
    with ThreadPoolExecutor(THREADS) as pool:
        ms = [m for result in pool.map(client, range(THREADS)) for m in result]
    wall = time.perf_counter() - start
    return {**_summary(ms), "requests_per_s": round(THREADS * (per_thread + 1) / wall, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--label", required=True, help="before (main's heads) or after")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--repeats", type=int, default=30, help="requests timed one at a time")
    parser.add_argument("--per-thread", type=int, default=10, help="requests timed on each of the 8 threads")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    load = [os.getloadavg()[0]]
    request, calls = vela2_request(rng)
    results = {
        "vela2-router-0.8B": {
            "single": single(request, args.repeats),
            **{f"single-{name}-call": single(call, args.repeats) for name, call in calls.items()},
            f"threads-{THREADS}": threads(request, args.per_thread),
        }
    }
    for options in (12, 255):
        call = omnijev_request(rng, options)
        results[f"omnijev-4B-{options}"] = {"single": single(call, args.repeats), f"threads-{THREADS}": threads(call, args.per_thread)}
    load.append(os.getloadavg()[0])
    record = {
        "label": args.label,
        "machine": {"cpus": len(os.sched_getaffinity(0)), "processor": platform.processor(), "load_average_1min": load},
        "results": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
