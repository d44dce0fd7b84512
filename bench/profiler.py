"""Where one workload's time goes: a torch profiler capture, reduced to kernel time against wall time.

On CUDA the profiler records every kernel of the process through CUPTI, those an ONNX Runtime
session launches too, so ``kernel_ms / wall_ms`` says how much of a request the device was busy;
the rest is host overhead (Python, launches, copies, synchronization). Two tables follow: the
kernels by device time, and the torch operators by their own CPU time (with the device time of the
kernels they launched). On the CPU kernel time is None, and an ONNX Runtime session shows no
operators: its work is not torch's. Wall time is taken under the profiler, which adds its own
overhead; the timed runs stay the figures.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from .stats import DIGITS, synchronize

TOP = 15
NAME_CHARS = 160  # templated kernel names run to thousands of characters


def _name(key: str) -> str:
    return key if len(key) <= NAME_CHARS else key[: NAME_CHARS - 1] + "…"


def _ms(microseconds: float) -> float:
    return round(microseconds / 1e3, DIGITS)


def capture(call: Callable[[], Any], iterations: int) -> dict[str, Any]:
    """Profile ``iterations`` calls (already warmed up) and summarize kernels against wall time."""
    on_cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if on_cuda else [])]
    synchronize()
    # One cycle only: acc_events just keeps the profiler from warning that cycles clear events.
    with profile(activities=activities, acc_events=True) as prof:
        start = time.perf_counter()
        for _ in range(iterations):
            call()
        synchronize()
        wall_ms = (time.perf_counter() - start) * 1e3
    rows = prof.key_averages()
    # Kernel (and copy) rows carry the device time once; operator rows repeat it for their kernels.
    kernels = sorted((row for row in rows if row.device_type == DeviceType.CUDA), key=lambda row: -row.self_device_time_total)
    operators = sorted((row for row in rows if row.device_type == DeviceType.CPU), key=lambda row: -row.self_cpu_time_total)
    kernel_ms = _ms(sum(row.self_device_time_total for row in kernels)) if on_cuda else None
    return {
        "activities": [activity.name.lower() for activity in activities],
        "iterations": iterations,
        "wall_ms": round(wall_ms, DIGITS),
        "wall_ms_per_iteration": round(wall_ms / iterations, DIGITS),
        "kernel_ms": kernel_ms,
        "kernel_ms_per_iteration": None if kernel_ms is None else round(kernel_ms / iterations, DIGITS),
        "kernel_fraction": None if kernel_ms is None else round(kernel_ms / wall_ms, 4),
        "kernel_launches": sum(row.count for row in kernels),
        "kernels": [
            {"name": _name(row.key), "calls": row.count, "device_ms": _ms(row.self_device_time_total)} for row in kernels[:TOP]
        ],
        "operators": [
            {
                "name": _name(row.key),
                "calls": row.count,
                "self_cpu_ms": _ms(row.self_cpu_time_total),
                "device_ms": _ms(row.self_device_time_total),
            }
            for row in operators[:TOP]
        ],
    }
