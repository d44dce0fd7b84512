"""Where one workload's time goes: a torch profiler capture, reduced to kernel time against wall time.

On CUDA the profiler records every kernel of the process through CUPTI, those an ONNX Runtime
session launches too, so ``kernel_ms / wall_ms`` says how much of a request the device was busy;
the rest is host overhead (Python, launches, copies, synchronization). Two tables follow: the
kernels by device time, and the torch operators by their own CPU time (with the device time of the
kernels they launched). On the CPU kernel time is None, and an ONNX Runtime session shows no
operators: its work is not torch's. Wall time is taken under the profiler, which adds its own
overhead; the timed runs stay the figures.

``idle`` says where the device waited: the wall time outside every kernel and copy (their intervals
merged), split by the CUDA runtime call the host was in meanwhile (``cudaMemcpy``, ``cudaGraphLaunch``,
...), the rest ``host`` (Python, ONNX Runtime's executor between launches), with the widest gaps.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from .stats import DIGITS, synchronize

TOP = 30
NAME_CHARS = 160  # templated kernel names run to thousands of characters
WIDEST_GAPS = 10
HOST = "host"  # a gap's time outside every CUDA runtime call
SPAN = "s1omni.profiled"  # the profiled iterations' own range, which idle time is measured within


def _name(key: str) -> str:
    return key if len(key) <= NAME_CHARS else key[: NAME_CHARS - 1] + "…"


def _ms(microseconds: float) -> float:
    return round(microseconds / 1e3, DIGITS)


def _merged(intervals: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def idle(device: Sequence[tuple[float, float]], runtime: Sequence[tuple[str, float, float]], span: tuple[float, float],
         iterations: int) -> dict[str, Any]:  # fmt: skip
    """The time in ``span`` outside every ``device`` interval (kernels and copies, microseconds), per
    iteration: in all, by the ``runtime`` call (name, start, end) overlapping it (``HOST`` where none
    does), and the widest gaps with the calls that filled them."""
    busy = [(max(start, span[0]), min(end, span[1])) for start, end in _merged(device) if end > span[0] and start < span[1]]
    edges = [span[0], *[edge for interval in busy for edge in interval], span[1]]
    gaps = [(edges[i], edges[i + 1]) for i in range(0, len(edges), 2) if edges[i + 1] > edges[i]]
    calls = sorted(runtime, key=lambda call: call[1])
    by_call: dict[str, float] = {}
    widest = []
    for start, end in gaps:
        inside: dict[str, float] = {}
        for name, call_start, call_end in calls:  # runtime calls of one thread do not nest
            if call_start >= end:
                break
            overlap = min(end, call_end) - max(start, call_start)
            if overlap > 0:
                inside[name] = inside.get(name, 0.0) + overlap
        inside[HOST] = (end - start) - sum(inside.values())
        for name, microseconds in inside.items():
            by_call[name] = by_call.get(name, 0.0) + microseconds
        widest.append((end - start, start - span[0], inside))
    widest.sort(key=lambda gap: -gap[0])
    total = sum(end - start for start, end in gaps)
    return {
        "idle_ms_per_iteration": _ms(total / iterations),
        "gaps_per_iteration": round(len(gaps) / iterations, 1),
        "by_host_call_ms_per_iteration": {name: _ms(us / iterations) for name, us in sorted(by_call.items(), key=lambda item: -item[1])},
        "widest": [
            {"us": round(width, 1), "at_ms": _ms(at), "host": {name: round(us, 1) for name, us in inside.items() if us > 0}}
            for width, at, inside in widest[:WIDEST_GAPS]
        ],
    }


def capture(call: Callable[[], Any], iterations: int) -> dict[str, Any]:
    """Profile ``iterations`` calls (already warmed up) and summarize kernels against wall time."""
    on_cuda = torch.cuda.is_available()
    if on_cuda:
        torch.cuda.init()  # CUPTI records kernels of a process whose torch has a CUDA context (ONNX Runtime's included)
    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if on_cuda else [])]
    synchronize()
    # One cycle only: acc_events just keeps the profiler from warning that cycles clear events.
    with profile(activities=activities, acc_events=True) as prof:
        with torch.profiler.record_function(SPAN):
            start = time.perf_counter()
            for _ in range(iterations):
                call()
            synchronize()
            wall_ms = (time.perf_counter() - start) * 1e3
    rows = prof.key_averages()
    # Kernel (and copy) rows carry the device time once; operator rows repeat it for their kernels.
    rows = [row for row in rows if row.key != SPAN]  # the range (and its device-side twin, spanning every kernel)
    kernels = sorted((row for row in rows if row.device_type == DeviceType.CUDA), key=lambda row: -row.self_device_time_total)
    operators = sorted((row for row in rows if row.device_type == DeviceType.CPU), key=lambda row: -row.self_cpu_time_total)
    kernel_ms = _ms(sum(row.self_device_time_total for row in kernels)) if on_cuda else None
    record = {
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
    if on_cuda:
        events = prof.events()
        span = next(event.time_range for event in events if event.name == SPAN and event.device_type == DeviceType.CPU)
        device = [(event.time_range.start, event.time_range.end) for event in events if event.device_type == DeviceType.CUDA and event.name != SPAN]
        runtime = [(event.name, event.time_range.start, event.time_range.end) for event in events
                   if event.device_type == DeviceType.CPU and event.name.startswith("cuda")]  # fmt: skip
        record["idle"] = idle(device, runtime, (span.start, span.end), iterations)
    return record
