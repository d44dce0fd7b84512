"""Engines arm against arm in one process: each workload on every arm, round by round in rotating order.

    python3 benchmarks/h100-rotary-selection/ab.py --arm before=ENGINE --arm after=ENGINE --unvalidated before \
        --out ab.json [--workloads router,backbone-128] [--late-candidates NAME] [--graph-tokens NAME=N]

Each arm is an engine directory, each directory loaded once (``load_engine_model``; arms of one directory share
its model; an engine of an arm named by ``--unvalidated`` may lack a gate's verdict: the record then says whether
its answers equal a validated arm's); an arm named by ``--late-candidates`` runs its candidate heads after the
forward (``Vela2Model.early_candidates`` off, as before they began during it); an arm named by ``--graph-tokens``
captures CUDA graphs of calls up to N tokens (``cuda_graphs.MAX_GRAPH_TOKENS``, 4,096 unless told: a merged
forward's prefill and longest blocks are past it). Per workload
(``s1omni.bench.workloads``) every arm is warmed up (three calls, the first one's answers hashed: SHA-256 of their
JSON), then timed one call an arm a round, ``--rounds`` rounds, the order rotating; the record keeps every sample
(ms), p50 and p95 (nearest rank) and, for the first workload (or ``--profiled``), ``s1omni.bench.profiler``'s capture of each arm
(kernels, launches, the device's idle time by the host's CUDA call meanwhile).
"""

from __future__ import annotations

import argparse
import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from s1omni.bench.profiler import capture
from s1omni.bench.stats import nearest_rank, now, time_calls
from s1omni.bench.workloads import named
from s1omni.runtime.engine import load_engine_model
from s1omni.runtime.runners import cuda_graphs


def _digest(result: Any) -> str:
    return hashlib.sha256(json.dumps(result, sort_keys=True, default=lambda array: array.tolist()).encode()).hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arm", action="append", required=True, help="NAME=ENGINE, twice or more")
    parser.add_argument("--unvalidated", action="append", default=[], help="an arm whose engine may lack a gate's verdict")
    parser.add_argument("--late-candidates", action="append", default=[], help="an arm whose candidate heads run after the forward")
    parser.add_argument("--graph-tokens", action="append", default=[], help="NAME=N: that arm captures calls of up to N tokens")
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--workloads", default="router,backbone-128")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--profile-iterations", type=int, default=5)
    parser.add_argument("--profiled", help="the workloads whose arms are profiled (default: the first)")
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    engines = dict(arm.split("=", 1) for arm in args.arm)
    loaded = {path: load_engine_model(path, device=args.device, allow_unvalidated=any(engines.get(name) == path for name in args.unvalidated))
              for path in dict.fromkeys(engines.values())}  # fmt: skip
    record: dict[str, Any] = {"format": "s1omni-engine-ab/1", "arms": engines, "unvalidated": args.unvalidated,
                              "late_candidates": args.late_candidates, "started": now(), "rounds": args.rounds, "workloads": {}}  # fmt: skip

    graph_tokens = {name: int(tokens) for name, tokens in (arm.split("=", 1) for arm in args.graph_tokens)}
    record["graph_tokens"] = graph_tokens

    def arm_call(name: str, workload: str) -> Callable[[], Any]:
        model, early = loaded[engines[name]], name not in args.late_candidates
        tokens = graph_tokens.get(name, cuda_graphs.MAX_GRAPH_TOKENS)
        call = named(workload, model.family).call(model)

        def run() -> Any:
            model.early_candidates = early
            cuda_graphs.MAX_GRAPH_TOKENS = tokens
            return call()

        return run

    workloads = args.workloads.split(",")
    profiled = set(args.profiled.split(",")) if args.profiled else {workloads[0]}
    for workload in workloads:
        calls = {name: arm_call(name, workload) for name in engines}
        arms: dict[str, dict[str, Any]] = {}
        for name, call in calls.items():
            first = call()
            call(), call()
            arms[name] = {"sha256": _digest(first), "ms": []}
        order = list(calls)
        for round_number in range(args.rounds):
            shift = round_number % len(order)
            for name in order[shift:] + order[:shift]:
                seconds, _ = time_calls(calls[name], 1, 0)
                arms[name]["ms"].append(round(seconds[0] * 1e3, 4))
        for name, arm in arms.items():
            arm["p50"], arm["p95"] = nearest_rank(arm["ms"], 50), nearest_rank(arm["ms"], 95)
            if workload in profiled:
                arm["profile"] = capture(calls[name], args.profile_iterations)
            profile = arm.get("profile", {})
            print(f"{workload} {name}: p50 {arm['p50']:.2f} p95 {arm['p95']:.2f} ms, answers {arm['sha256'][:12]}, kernels "
                  f"{profile.get('kernel_ms_per_iteration')} ms, idle {profile.get('idle', {}).get('by_host_call_ms_per_iteration')}",
                  flush=True)  # fmt: skip
        record["workloads"][workload] = {"same_answers": len({arm["sha256"] for arm in arms.values()}) == 1, "arms": arms}
    record["finished"] = now()
    args.out.write_text(json.dumps(record, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
