"""Requests timed with the runner's blocks grouped for fewer calls, arm against arm in one process.

    python3 benchmarks/h100-call-groups/ab.py --engine ENGINE --out ab.json [--workloads router,router@8] [--costs 0,512,1024]

Each arm sets the engine runner's ``call_cost_tokens`` (``s1omni.runtime.runners.onnxruntime_runner.length_groups``:
the padded tokens one call fewer is worth) and runs the same requests (``s1omni.bench.workloads``: ``router`` is
case router-signals-600, ``router@8`` eight copies planned and run as one merged forward). Every arm is warmed up
first (its new shapes captured as CUDA graphs), then the rounds run the arms one after another in a rotating order,
so that a drift of the machine falls on every arm alike. The record keeps every sample (ms), p50 and p95 (nearest
rank), the continue calls each arm makes, the SHA-256 of each arm's answers and the questions whose answers differ
from the first arm's (a block padded wider runs GEMMs of other shapes).
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path
from typing import Any

from s1omni.bench.stats import nearest_rank, now, time_calls
from s1omni.bench.workloads import named
from s1omni.runtime.engine import load_engine_model
from s1omni.runtime.runners.onnxruntime_runner import PADDING_SLACK, length_groups, tree_batches


def continue_calls(model: Any, body: dict[str, Any], copies: int, cost: int) -> int:
    """The continue calls ``run`` makes for ``copies`` of the request at this call cost."""
    trees = [tree for _ in range(copies) for tree, _ in model.plan(body).trees]
    busy = [tree for tree in trees if tree.blocks]
    calls = 0
    for batch in tree_batches([tree.tokens for tree in busy]):
        lengths = [len(block.ids) for index in batch for block in busy[index].blocks]
        calls += len(length_groups(lengths, PADDING_SLACK, cost))
    return calls


def digest(answers: Any) -> str:
    return hashlib.sha256(json.dumps(answers, sort_keys=True).encode()).hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", required=True)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--workloads", default="router,router@8")
    parser.add_argument("--costs", default="0,512,1024")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    costs = [int(cost) for cost in args.costs.split(",")]
    model = load_engine_model(args.engine, device=args.device)
    runner = model.runner
    record: dict[str, Any] = {"format": "s1omni-call-groups/1", "engine": args.engine, "started": now(), "costs": costs,
                              "rounds": args.rounds, "device_default": runner.call_cost_tokens, "workloads": {}}  # fmt: skip
    for name in args.workloads.split(","):
        workload = named(name, "vela2")
        call = workload.call(model)
        arms: dict[int, dict[str, Any]] = {}
        answers: dict[int, list[dict[str, Any]]] = {}
        for cost in costs:  # warm-up: each arm's shapes captured before any is timed
            runner.call_cost_tokens = cost
            answers[cost] = call()
            for _ in range(2):
                call()
            calls = continue_calls(model, workload.body, workload.copies, cost)
            arms[cost] = {"calls": calls, "sha256": digest(answers[cost]), "ms": []}
        for round_number in range(args.rounds):
            for cost in costs[round_number % len(costs):] + costs[: round_number % len(costs)]:
                runner.call_cost_tokens = cost
                seconds, _ = time_calls(call, 1, 0)
                arms[cost]["ms"].append(round(seconds[0] * 1e3, 4))
        for cost, arm in arms.items():
            pairs = zip(answers[cost], answers[costs[0]], strict=True)
            arm["differing"] = sorted({key for mine, first in pairs for key in mine["answers"] if mine["answers"][key] != first["answers"][key]})
            arm["p50"], arm["p95"] = nearest_rank(arm["ms"], 50), nearest_rank(arm["ms"], 95)
            print(f"{name} call cost {cost}: {arm['calls']} continue calls, p50 {arm['p50']:.2f} p95 {arm['p95']:.2f} ms, "
                  f"answers differing from cost {costs[0]}'s: {arm['differing'] or 'none'}", flush=True)  # fmt: skip
        record["workloads"][name] = {str(cost): arm for cost, arm in arms.items()}
    runner.call_cost_tokens = record["device_default"]
    record["finished"] = now()
    args.out.write_text(json.dumps(record, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
