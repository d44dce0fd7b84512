"""The host path of one Vela 2.0 request after its forward: ``Vela2Model.read`` (heads) and ``finish``.

    .venv/bin/python benchmarks/cpu-host-path/host_bench.py --label after --out benchmarks/cpu-host-path/after.json

``--label before`` times main's runtime: the same command with main's ``s1omni`` first on the path,
which the editable install's finder only serves when no ``s1omni`` is found there first::

    mkdir -p /tmp/main/s1omni && git archive main runtime calib | tar -x -C /tmp/main/s1omni
    cp s1omni/__init__.py /tmp/main/s1omni/
    PYTHONPATH=/tmp/main .venv/bin/python benchmarks/cpu-host-path/host_bench.py --label before --out ...

The record names the runtime it timed (``runtime``) and the SHA-256 of the request's JSON answer
(``answer_sha256``): before and after must answer the same bytes.

The request is ``calib/vela2`` case router-signals-600, planned for real on a synthetic member of
``--size`` (0.8B unless told): its config, calibration and tokenizer (``runtime.synth.vela2``) and random
head tensors of its shapes (0.8B: hidden 1,024, d 256; 9B: hidden 4,096). No backbone is built: the runner here only stands for one in the
model's constructor, and the hidden states ``forward`` would return are random, one
``[len(block.readouts), hidden]`` float32 array per block of the plan's trees. That is a benchmark
input, never a test of a user path.

``single`` times one request at a time (p50/p95 of wall milliseconds per stage, and CPU
milliseconds per request: the request thread's own from ``time.thread_time``, whose work holds the
GIL but for numpy's and torch's loops, and the process's from ``getrusage``, the span head's chunk
threads included); ``threads-N`` runs requests back to back on ``--threads`` threads, 8 unless told
(requests per second, and the process's CPU milliseconds per request from ``getrusage``).
``--profile`` prints cProfile's top functions of ``read`` and of ``finish`` instead. The load
average before and after is recorded: this machine may be shared.
"""

from __future__ import annotations

import argparse
import cProfile
import hashlib
import json
import os
import platform
import pstats
import resource
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from s1omni import runtime
from s1omni.calib import CALIB
from s1omni.runtime.identity import Identity
from s1omni.runtime.synth import vela2 as synth
from s1omni.runtime.synth.tokenizer import train_tokenizer
from s1omni.runtime.vela2.model import Vela2Model, Vela2Plan

CASE = "router-signals-600"


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


def model(rng: np.random.Generator, directory: Path, size: str) -> Vela2Model:
    shapes = synth.tensor_shapes(size)
    heads = _weights(shapes["model"] + shapes["broad"], ("head.", "set_bias", "span2.", "span_broad."), rng)
    tokenizer = directory / "tokenizer.json"
    tokenizer.write_text(train_tokenizer(synth.TOKENIZER_VOCAB), encoding="utf-8")
    name = synth.member_name(size, 0)
    identity = Identity(name, f"synthetic/{name}", "0" * 40, "0" * 64, "0" * 64, "apache-2.0", 0, True)
    hidden = synth.SIZES[size].backbone.hidden
    return Vela2Model(identity, synth.config(size, 0), synth.calibration(), tokenizer, heads, StatesOnly(hidden))  # type: ignore[arg-type]


def case_request() -> dict[str, Any]:
    """The request body of calibration case ``CASE``."""
    cases = json.loads((CALIB / "vela2" / "cases.json").read_text(encoding="utf-8"))["cases"]
    return next(case["request"] for case in cases if case["name"] == CASE)


def states(plan: Vela2Plan, hidden: int, rng: np.random.Generator) -> list[list[np.ndarray]]:
    """Random final-norm states where ``forward`` would return them: per tree, per block."""
    return [[rng.standard_normal((len(b.readouts()), hidden)).astype(np.float32) for b in blocks] for _, blocks in plan.trees]


def _summary(values: list[float]) -> dict[str, float]:
    return {"p50": round(float(np.percentile(values, 50)), 3), "p95": round(float(np.percentile(values, 95)), 3)}


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def single(vela: Vela2Model, plan: Vela2Plan, hidden: list[list[np.ndarray]], repeats: int) -> dict[str, Any]:
    stages: dict[str, list[float]] = {name: [] for name in ("read_ms", "finish_ms", "request_ms", "thread_cpu_ms", "process_cpu_ms")}
    for index in range(repeats + 3):
        cpu, usage, start = time.thread_time(), _cpu_seconds(), time.perf_counter()
        outputs = vela.read([plan], hidden)[0]
        middle = time.perf_counter()
        vela.finish(plan, outputs)
        end = time.perf_counter()
        if index >= 3:  # warm-up
            stages["read_ms"].append((middle - start) * 1e3)
            stages["finish_ms"].append((end - middle) * 1e3)
            stages["request_ms"].append((end - start) * 1e3)
            stages["thread_cpu_ms"].append((time.thread_time() - cpu) * 1e3)
            stages["process_cpu_ms"].append((_cpu_seconds() - usage) * 1e3)
    return {name: _summary(values) for name, values in stages.items()} | {"n": repeats}


def threads(vela: Vela2Model, plan: Vela2Plan, hidden: list[list[np.ndarray]], count: int, per_thread: int) -> dict[str, Any]:
    def request() -> float:
        start = time.perf_counter()
        vela.finish(plan, vela.read([plan], hidden)[0])
        return (time.perf_counter() - start) * 1e3

    def client(_: int) -> list[float]:
        request()  # warm-up
        return [request() for _ in range(per_thread)]

    cpu, start = _cpu_seconds(), time.perf_counter()
    with ThreadPoolExecutor(count) as pool:
        ms = [m for result in pool.map(client, range(count)) for m in result]
    wall, cpu = time.perf_counter() - start, _cpu_seconds() - cpu
    requests = count * (per_thread + 1)
    return {"request_ms": _summary(ms), "requests_per_s": round(requests / wall, 2), "cpu_ms_per_request": round(cpu / requests * 1e3, 3), "n": requests}


def profile(vela: Vela2Model, plan: Vela2Plan, hidden: list[list[np.ndarray]], repeats: int) -> None:
    outputs = vela.read([plan], hidden)[0]
    for name, call in (("read", lambda: vela.read([plan], hidden)), ("finish", lambda: vela.finish(plan, outputs))):
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(repeats):
            call()
        profiler.disable()
        print(f"== {name}, {repeats} requests")
        pstats.Stats(profiler).sort_stats("tottime").print_stats(25)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--label", required=True, help="before (main's runtime) or after")
    parser.add_argument("--size", default="0.8B", choices=[s for s in synth.SIZES if s != "tiny"], help="the member whose head shapes are timed")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--repeats", type=int, default=30, help="requests timed one at a time")
    parser.add_argument("--threads", type=int, default=8, help="threads running requests at once")
    parser.add_argument("--per-thread", type=int, default=8, help="requests timed on each thread")
    parser.add_argument("--profile", action="store_true", help="print cProfile's view of read and finish")
    parser.add_argument("--answers", type=Path, help="also write the request's JSON answer here (to compare runs)")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as directory:
        vela = model(rng, Path(directory), args.size)
    plan = vela.plan(case_request())
    hidden = states(plan, vela.runner.hidden_size, rng)
    answer = vela.finish(plan, vela.read([plan], hidden)[0])
    answer_bytes = json.dumps(answer).encode("utf-8")
    if args.answers:
        args.answers.write_bytes(answer_bytes)
    if args.profile:
        profile(vela, plan, hidden, args.repeats)
        return
    load = [os.getloadavg()[0]]
    blocks = [b for _, bs in plan.trees for b in bs if b.read]
    results = {"single": single(vela, plan, hidden, args.repeats), f"threads-{args.threads}": threads(vela, plan, hidden, args.threads, args.per_thread)}
    load.append(os.getloadavg()[0])
    path = [f"PYTHONPATH={os.environ['PYTHONPATH']}"] if "PYTHONPATH" in os.environ else []
    record = {
        "label": args.label,
        "command": " ".join([*path, os.path.relpath(sys.executable), *sys.argv]),
        "runtime": str(Path(runtime.__file__).parent),
        "answer_sha256": hashlib.sha256(answer_bytes).hexdigest(),
        "request": {
            "case": CASE,
            "member_shapes": args.size,
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

