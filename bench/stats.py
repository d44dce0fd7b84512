"""Timing and statistics of the benchmarks: a synchronized clock, nearest-rank summaries, ratios.

Samples are kept in milliseconds rounded to 0.1 µs *before* any statistic is taken, so every figure
of a record can be recomputed from the samples it lists. Percentiles are nearest-rank
(``sorted[ceil(q/100 * n) - 1]``), as the reference projects report them (omnijev.md §13.5).
"""

from __future__ import annotations

import math
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

DIGITS = 4  # milliseconds to 0.1 µs: far below any timer's noise, short enough to keep every sample


def synchronize() -> None:
    """Wait for queued device work, so a host clock read after it covers that work.

    Only when torch already runs on CUDA in this process: importing torch or creating a CUDA context
    just to synchronize would cost seconds and memory on machines that never use it.
    """
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def now() -> str:
    """A UTC timestamp for the record."""
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def time_calls(call: Callable[[], Any], count: int, warmup: int) -> tuple[list[float], float]:
    """``warmup`` untimed calls, then ``count`` timed ones: their seconds each and the wall time of all."""
    for _ in range(warmup):
        call()
    synchronize()
    samples = []
    start = time.perf_counter()
    for _ in range(count):
        begin = time.perf_counter()
        call()
        synchronize()
        samples.append(time.perf_counter() - begin)
    return samples, time.perf_counter() - start


def nearest_rank(values: Sequence[float], q: float) -> float:
    """The nearest-rank ``q``-th percentile: the smallest value with at least q% of values at or below it."""
    if not values:
        raise ValueError("no samples")
    ordered = sorted(values)
    return ordered[max(math.ceil(q / 100 * len(ordered)), 1) - 1]


def to_ms(seconds: Sequence[float]) -> list[float]:
    return [round(value * 1e3, DIGITS) for value in seconds]


def quantiles_ms(call: Callable[[], Any], count: int, warmup: int = 1) -> dict[str, float]:
    """p50 and p95 (nearest rank) milliseconds of ``count`` calls after ``warmup``: the CPU records' figures."""
    samples = to_ms(time_calls(call, count, warmup)[0])
    return {"p50_ms": nearest_rank(samples, 50), "p95_ms": nearest_rank(samples, 95)}


def summarize(samples_ms: Sequence[float], wall_s: float) -> dict[str, Any]:
    """p50, p95 (nearest rank), mean, min, max and requests/s over ``wall_s``, with the samples themselves."""
    return {
        "count": len(samples_ms),
        "p50_ms": nearest_rank(samples_ms, 50),
        "p95_ms": nearest_rank(samples_ms, 95),
        "mean_ms": round(statistics.fmean(samples_ms), DIGITS),
        "min_ms": min(samples_ms),
        "max_ms": max(samples_ms),
        "wall_s": round(wall_s, 6),
        "requests_per_s": round(len(samples_ms) / wall_s, 4) if wall_s > 0 else None,
        "samples_ms": list(samples_ms),
    }


def ratios(
    subject: Mapping[str, Any], reference: Mapping[str, Any], keys: Sequence[str] = ("p50_ms", "p95_ms")
) -> dict[str, float | None]:
    """``subject / reference`` for each summary key (below 1 is faster for latencies, slower for rates)."""
    out: dict[str, float | None] = {}
    for key in keys:
        mine, theirs = subject.get(key), reference.get(key)
        out[key.removesuffix("_ms")] = round(mine / theirs, 4) if mine is not None and theirs else None
    return out


def median_by_key(rows: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Per key, the median over the rows that carry it (Server-Timing stages of many responses)."""
    keys = dict.fromkeys(key for row in rows for key in row)
    return {key: round(statistics.median(row[key] for row in rows if key in row), DIGITS) for key in keys}
