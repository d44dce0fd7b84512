"""``Vela2Model.plan`` of the router request with its option blocks rendered afresh against cached, in one process.

    .venv/bin/python benchmarks/cpu-host-path/plan_bench.py --out benchmarks/cpu-host-path/plan/option-blocks.json

The request is ``calib/vela2`` case router-signals-600 on a 0.8B-shaped synthetic member (``host_bench.model``:
its config, calibration and tokenizer; no backbone). The arms alternate round by round: ``fresh`` plans with
``layout.option_block``'s cache bypassed (the function it wraps), ``cached`` as served. Each round plans the
request ``--plans`` times after 10 untimed plans, and the record keeps each round's p50 and p95 (ms). Both arms
must render the same trees, token for token: the record says whether they did. A plot of the rounds goes beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from s1omni.runtime.vela2 import layout

sys.path.insert(0, str(Path(__file__).resolve().parent))
from host_bench import CASE, case_request, model  # noqa: E402


def trees(plan) -> list[list[list[int]]]:
    """Each tree's prefix ids, then each block's ids and readouts."""
    return [
        [tree.prefix.ids.tolist(), *([*block.ids.tolist(), -1, *block.readouts.tolist()] for block in tree.blocks)]
        for tree, _ in plan.trees
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6, help="rounds of each arm, alternating (default 6)")
    parser.add_argument("--plans", type=int, default=200, help="plans timed a round (default 200)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        vela = model(np.random.default_rng(0), Path(directory), "0.8B")
    body = case_request()
    cached = layout.option_block
    arms = {"fresh": cached.__wrapped__, "cached": cached}
    rendered, rounds = {}, {name: [] for name in arms}
    load = [os.getloadavg()[0]]
    try:
        for _ in range(args.rounds):
            for name, render in arms.items():
                layout.option_block = render
                for _ in range(10):
                    rendered[name] = trees(vela.plan(body))
                ms = []
                for _ in range(args.plans):
                    start = time.perf_counter()
                    vela.plan(body)
                    ms.append((time.perf_counter() - start) * 1e3)
                rounds[name].append({"p50": round(float(np.percentile(ms, 50)), 3), "p95": round(float(np.percentile(ms, 95)), 3)})
                print(name, rounds[name][-1], flush=True)
    finally:
        layout.option_block = cached
    load.append(os.getloadavg()[0])
    record = {
        "command": " ".join([os.path.relpath(sys.executable), *sys.argv]),
        "case": CASE,
        "same_trees": rendered["fresh"] == rendered["cached"],
        "machine": {"cpus": len(os.sched_getaffinity(0)), "processor": platform.processor(), "load_average_1min": load},
        "rounds": rounds,
        "p50_of_rounds": {name: round(float(np.median([r["p50"] for r in values])), 3) for name, values in rounds.items()},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    plot(record, args.out.with_suffix(".png"))
    print(json.dumps({k: record[k] for k in ("same_trees", "p50_of_rounds")}))


def plot(record: dict, path: Path) -> None:
    """Each round's p50 by arm, in the order the rounds ran."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(6, 3.5))
    for name, rounds in record["rounds"].items():
        axis.plot(range(1, len(rounds) + 1), [r["p50"] for r in rounds], marker="o", label=name)
    axis.set_xlabel("round")
    axis.set_ylabel("plan p50 ms")
    axis.set_ylim(bottom=0)
    axis.legend()
    axis.set_title(f"Vela2Model.plan, {record['case']}", fontsize=10)
    figure.tight_layout()
    figure.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
