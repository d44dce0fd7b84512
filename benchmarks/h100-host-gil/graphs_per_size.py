"""How many new CUDA graphs a merged router forward of N requests brings, per N (benchmarks/README.md, h100-host-gil).

Runs the router request's trees N at a time through ``run_packed`` (``batching``'s forward on an engine whose merged
packed check passed) of a CUDA-graph build on the CPU, which takes the same bucketed fixed-buffer path with nothing to
capture, and counts the graphs each N's first forward makes (on the GPU each is warmed up and captured there). The
tiny member's tokenizer gives the router request the 0.8B's 2,977 tokens, so the trees and their shapes are the 0.8B's.

    s1omni synth vela2 --size tiny --out PKG && s1omni export PKG --out EXPORT
    s1omni build EXPORT --backend onnxruntime --target cuda --gated-delta-kernel LinearAttention --cuda-graphs --out ENGINE
    python benchmarks/h100-host-gil/graphs_per_size.py PKG ENGINE   (S1OMNI_HOME as for synth: its registry)
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from s1omni.bench.workloads import named
from s1omni.runtime.api import load_model
from s1omni.runtime.runners import cuda_graphs
from s1omni.runtime.runners.onnxruntime_runner import OnnxRuntimeRunner

SIZES = (1, 2, 3, 4, 5, 6, 7, 8, 2, 3)  # then two sizes again: no new graph


def main(package: str, engine: str) -> None:
    made: list[tuple] = []
    first_run = cuda_graphs.Graph.run

    def counting(graph: cuda_graphs.Graph, feeds: dict) -> None:
        if graph.runs == 0:
            made.append(tuple(sorted((name, tuple(value.shape())) for name, value in graph.inputs.items()))[:2])
        first_run(graph, feeds)

    cuda_graphs.Graph.run = counting
    trees = [tree for tree, _ in load_model(package).plan(named("router", "vela2").body).trees]
    print("router trees (prefix tokens, block tokens):", [(len(tree.prefix.ids), [len(b.ids) for b in tree.blocks]) for tree in trees])
    runner = OnnxRuntimeRunner(Path(engine), device="cpu", cuda_graphs=True)
    runner.open_packed()
    for size in SIZES:
        before, started = len(made), time.perf_counter()
        runner.run_packed(trees * size)
        print(f"N={size}: {len(made) - before} new graphs ({len(made)} in all), {time.perf_counter() - started:.2f} s on this CPU")
        for shapes in made[before:]:
            print("    ", ", ".join(f"{name} {list(shape)}" for name, shape in shapes))


if __name__ == "__main__":
    main(*sys.argv[1:3])
