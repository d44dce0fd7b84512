"""The host path of one Vela 2.0 request after its forward: ``Vela2Model.read`` (heads) and ``finish``.

    .venv/bin/python benchmarks/cpu-host-path/host_bench.py --label after --out benchmarks/cpu-host-path/after.json

``--label before`` times main's runtime: the same command with main's runtime first on the path
(``git archive main runtime calib | tar -x -C /tmp/main/s1omni``, ``cp s1omni/__init__.py
/tmp/main/s1omni/``, then ``PYTHONPATH=/tmp/main``).

The request is ``calib/vela2`` case router-signals-600, planned for real on a 0.8B-shaped synthetic
member: its config, calibration and tokenizer (``runtime.synth.vela2``) and random head tensors of
its shapes (hidden 1,024, d 256). No backbone is built: the runner here only stands for one in the
model's constructor, and the hidden states ``forward`` would return are random, one
``[len(block.readouts), hidden]`` float32 array per block of the plan's trees. That is a benchmark
input, never a test of a user path.

``single`` times one request at a time (p50/p95 of wall milliseconds per stage, and the thread's
CPU milliseconds per request from ``time.thread_time``); ``threads-8`` runs requests back to back
on 8 threads (requests per second, and process CPU seconds per request from ``getrusage``).
``--profile`` prints cProfile's top functions of ``read`` and of ``finish`` instead. The load
average before and after is recorded: this machine may be shared.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import platform
import pstats
import resource
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from s1omni.calib import CALIB
from s1omni.runtime.identity import Identity
from s1omni.runtime.synth import vela2 as synth
from s1omni.runtime.synth.tokenizer import train_tokenizer
from s1omni.runtime.vela2.model import Vela2Model, Vela2Plan

SIZE, CASE, THREADS = "0.8B", "router-signals-600", 8


class StatesOnly:
    """What the model's constructor reads of a runner; ``forward`` is never called here."""

    name, device, precision = "none", "cuda", "bf16"

    def __init__(self, hidden: int):
        self.hidden_size = hidden


def _weights(shapes: list[tuple[str, tuple[int, ...]]], prefixes: tuple[str, ...], rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Head tensors: vectors near 1, matrices scaled by their fan-in (activations of order one)."""
    out = {}
    for name, shape in shapes:
        if name.startswith(prefixes):
            value = 1.0 + 0.1 * rng.standard_normal(shape) if len(shape) < 2 else rng.standard_normal(shape) / np.sqrt(shape[-1])
            out[name] = np.asarray(-0.5 if name == "set_bias" else value, np.float32)
    return out


def model(rng: np.random.Generator, directory: Path) -> Vela2Model:
    shapes = synth.tensor_shapes(SIZE)
    heads = _weights(shapes["model"] + shapes["broad"], ("head.", "set_bias", "span2.", "span_broad."), rng)
    tokenizer = directory / "tokenizer.json"
    tokenizer.write_text(train_tokenizer(synth.TOKENIZER_VOCAB), encoding="utf-8")
    name = synth.member_name(SIZE, 0)
    identity = Identity(name, f"synthetic/{name}", "0" * 40, "0" * 64, "0" * 64, "apache-2.0", 0, True)
    hidden = synth.SIZES[SIZE].backbone.hidden
    return Vela2Model(identity, synth.config(SIZE, 0), synth.calibration(), tokenizer, heads, StatesOnly(hidden))  # type: ignore[arg-type]


def states(plan: Vela2Plan, hidden: int, rng: np.random.Generator) -> list[list[np.ndarray]]:
    """Random final-norm states where ``forward`` would return them: per tree, per block."""
    return [[rng.standard_normal((len(b.readouts()), hidden)).astype(np.float32) for b in blocks] for _, blocks in plan.trees]


def _summary(values: list[float]) -> dict[str, float]:
    return {"p50": round(float(np.percentile(values, 50)), 3), "p95": round(float(np.percentile(values, 95)), 3)}


def single(vela: Vela2Model, plan: Vela2Plan, hidden: list[list[np.ndarray]], repeats: int) -> dict[str, Any]:
    stages: dict[str, list[float]] = {"read_ms": [], "finish_ms": [], "request_ms": [], "request_cpu_ms": []}
    for index in range(repeats + 3):
        cpu, start = time.thread_time(), time.perf_counter()
        outputs = vela.read([plan], hidden)[0]
        middle = time.perf_counter()
        vela.finish(plan, outputs)
        end = time.perf_counter()
        if index >= 3:  # warm-up
            stages["read_ms"].append((middle - start) * 1e3)
            stages["finish_ms"].append((end - middle) * 1e3)
            stages["request_ms"].append((end - start) * 1e3)
            stages["request_cpu_ms"].append((time.thread_time() - cpu) * 1e3)
    return {name: _summary(values) for name, values in stages.items()} | {"n": repeats}


def threads(vela: Vela2Model, plan: Vela2Plan, hidden: list[list[np.ndarray]], per_thread: int) -> dict[str, Any]:
    def request() -> float:
        start = time.perf_counter()
        vela.finish(plan, vela.read([plan], hidden)[0])
        return (time.perf_counter() - start) * 1e3

    def client(_: int) -> list[float]:
        request()  # warm-up
        return [request() for _ in range(per_thread)]

    usage, start = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    with ThreadPoolExecutor(THREADS) as pool:
        ms = [m for result in pool.map(client, range(THREADS)) for m in result]
    wall, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_SELF)
    count = THREADS * (per_thread + 1)
    cpu = (after.ru_utime - usage.ru_utime) + (after.ru_stime - usage.ru_stime)
    return {"request_ms": _summary(ms), "requests_per_s": round(count / wall, 2), "cpu_ms_per_request": round(cpu / count * 1e3, 3), "n": count}


def profile(vela: Vela2Model, plan: Vela2Plan, hidden: list[list[np.ndarray]], repeats: int) -> None:
    outputs = vela.read([plan], hidden)[0]
    for name, call in (("read", lambda: vela.read([plan], hidden)), ("finish", lambda: vela.finish(plan, outputs))):
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(repeats):
            call()
        profiler.disable()
        print(f"== {name}, {repeats} requests: cumulative seconds")
        pstats.Stats(profiler).sort_stats("tottime").print_stats(25)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--label", required=True, help="before (main's runtime) or after")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--repeats", type=int, default=30, help="requests timed one at a time")
    parser.add_argument("--per-thread", type=int, default=8, help="requests timed on each of the 8 threads")
    parser.add_argument("--profile", action="store_true", help="print cProfile's view of read and finish")
    parser.add_argument("--answers", type=Path, help="also write the request's JSON answer here (to compare runs)")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as directory:
        vela = model(rng, Path(directory))
    case = next(c for c in json.loads((CALIB / "vela2" / "cases.json").read_text(encoding="utf-8"))["cases"] if c["name"] == CASE)
    plan = vela.plan(case["request"])
    hidden = states(plan, vela.runner.hidden_size, rng)
    answer = vela.finish(plan, vela.read([plan], hidden)[0])
    if args.answers:
        args.answers.write_text(json.dumps(answer, sort_keys=True) + "\n", encoding="utf-8")
    if args.profile:
        profile(vela, plan, hidden, args.repeats)
        return
    load = [os.getloadavg()[0]]
    blocks = [b for _, bs in plan.trees for b in bs if b.read]
    results = {"single": single(vela, plan, hidden, args.repeats), f"threads-{THREADS}": threads(vela, plan, hidden, args.per_thread)}
    load.append(os.getloadavg()[0])
    record = {
        "label": args.label,
        "command": f"benchmarks/cpu-host-path/host_bench.py --label {args.label}",
        "request": {
            "case": CASE,
            "member_shapes": SIZE,
            "input_tokens": plan.input_tokens,
            "span_blocks": sum(b.is_span for b in blocks),
            "candidate_blocks": sum(not b.is_span for b in blocks),
            "spans_decoded": sum(len(v) for v in answer.get("spans", {}).values()),
        },
        "machine": {"cpus": len(os.sched_getaffinity(0)), "processor": platform.processor(), "load_average_1min": load},
        "results": results,
    }
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()

