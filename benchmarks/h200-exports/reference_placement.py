"""`s1omni export` with the check's torch reference moved, for `benchmarks/README.md` ("Export times
on the H200"): EXP=after runs it once the graphs are traced, EXP=threads:N beside the tracing on N
torch threads (the export itself runs it beside them on all cores the tracing workers leave).

    EXP=after python3 benchmarks/h200-exports/reference_placement.py export PKG --out OUT --recurrence fused
"""

from __future__ import annotations

import os
import runpy
import sys
from collections.abc import Callable
from typing import Any

import torch

from s1omni.export import onnx_export
from s1omni.export.workers import workers


def placed(jobs: list[onnx_export.GraphJob], meanwhile: Callable[[], Any]) -> tuple[list[Any], Any]:
    mode = os.environ["EXP"]
    with workers(len(jobs)) as pool:
        traced = [pool.submit(onnx_export.build_graph, job) for job in jobs]
        if mode == "after":
            done = [future.result() for future in traced]
            return done, meanwhile()
        threads = torch.get_num_threads()
        torch.set_num_threads(int(mode.removeprefix("threads:")))
        try:
            result = meanwhile()
        finally:
            torch.set_num_threads(threads)
        return [future.result() for future in traced], result


if __name__ == "__main__":  # the spawned tracing workers import this file as __mp_main__
    onnx_export.build_graphs_beside = placed
    sys.argv = ["s1omni", *sys.argv[1:]]
    runpy.run_module("s1omni", run_name="__main__")
