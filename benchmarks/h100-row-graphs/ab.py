"""The state-row gather captured as CUDA graphs, against plain runs of it, arm against arm in one process.

    python3 benchmarks/h100-row-graphs/ab.py --engine ENGINE --out ab.json [--workloads router,router@8]

Before a CUDA-graph continue (or packed) call, the runner gathers each block's prefix-state rows into the
graph's buffers. ``plain`` runs that gather as an ordinary ONNX Runtime run, one Gather kernel per state
tensor launched by the executor (48 on the 0.8B member, 64 on the 4B), as every runner did before;
``captured`` replays it as one CUDA graph per pair of graphs (``OnnxRuntimeRunner._gather_rows``). The arm
is the runner's table of row graphs: ``plain`` swaps in one that never holds a graph. Both arms run the same
requests (``s1omni.bench.workloads``), warmed up first, then in rotating order round by round; the record
keeps every sample (ms), p50 and p95 (nearest rank), the SHA-256 of each arm's answers (a gather copies,
so they must be equal) and, per arm, ``s1omni.bench.profiler``'s capture of the first workload: kernels,
launches and the device's idle time by what the host was doing meanwhile (the committed run's captures have the
host's CUDA calls only: the profiler then recorded kernels only where torch had initialised CUDA, which it now does).
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path
from typing import Any

from s1omni.bench.profiler import capture
from s1omni.bench.stats import nearest_rank, now, time_calls
from s1omni.bench.workloads import named
from s1omni.runtime.engine import load_engine_model


class NoGraphs(dict):
    """A row-graph table that is always full, so every gather runs plain."""

    def __len__(self) -> int:
        return 1 << 30


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", required=True)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--workloads", default="router,router@8")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--profile-iterations", type=int, default=5)
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    model = load_engine_model(args.engine, device=args.device)
    runner = model.runner
    tables = {"plain": NoGraphs(), "captured": runner._row_graphs}
    record: dict[str, Any] = {"format": "s1omni-row-graphs/1", "engine": args.engine, "started": now(), "rounds": args.rounds, "workloads": {}}
    for position, name in enumerate(args.workloads.split(",")):
        call = named(name, "vela2").call(model)
        arms: dict[str, dict[str, Any]] = {}
        for arm, table in tables.items():  # warm-up: every shape captured before any arm is timed
            runner._row_graphs = table
            answers = [call() for _ in range(3)][0]
            arms[arm] = {"sha256": hashlib.sha256(json.dumps(answers, sort_keys=True).encode()).hexdigest(), "ms": []}
        for round_number in range(args.rounds):
            for arm in list(tables)[round_number % 2 :] + list(tables)[: round_number % 2]:
                runner._row_graphs = tables[arm]
                seconds, _ = time_calls(call, 1, 0)
                arms[arm]["ms"].append(round(seconds[0] * 1e3, 4))
        for arm, table in tables.items():
            arms[arm]["p50"], arms[arm]["p95"] = nearest_rank(arms[arm]["ms"], 50), nearest_rank(arms[arm]["ms"], 95)
            if position == 0:
                runner._row_graphs = table
                arms[arm]["profile"] = capture(call, args.profile_iterations)
            idle = arms[arm].get("profile", {}).get("idle", {})
            print(f"{name} {arm}: p50 {arms[arm]['p50']:.2f} p95 {arms[arm]['p95']:.2f} ms, answers {arms[arm]['sha256'][:12]}, "
                  f"idle {idle.get('idle_ms_per_iteration')} ms {idle.get('by_host_call_ms_per_iteration')}", flush=True)  # fmt: skip
        record["workloads"][name] = arms
    runner._row_graphs = tables["captured"]
    record["finished"] = now()
    args.out.write_text(json.dumps(record, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
