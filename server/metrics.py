"""The server's Prometheus metrics, rendered in the text exposition format (version 0.0.4).

No request content goes into a label: requests are counted by route, status and error code,
stage latencies by stage name. Counters and histograms are written from the event loop and the
model worker, so each holds a lock; gauges are read when scraped
(vllm-project/semantic-router:src/model-runtime/vllm_srun/supervision/metrics.py).
"""

from __future__ import annotations

import bisect
import math
import threading
from collections.abc import Callable

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12)
PLAN_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
TOKEN_BUCKETS = (64, 256, 1024, 4096, 16384, 65536, 262144)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(names: tuple[str, ...], values: tuple[str, ...], extra: str = "") -> str:
    pairs = [f'{name}="{_escape(value)}"' for name, value in zip(names, values, strict=True)]
    if extra:
        pairs.append(extra)
    return "{" + ",".join(pairs) + "}" if pairs else ""


def _number(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value)) if not float(value).is_integer() else str(int(value))


class Counter:
    def __init__(self, name: str, help: str, labels: tuple[str, ...] = ()):
        self.name, self.help, self.label_names = name, help, labels
        self._values: dict[tuple[str, ...], float] = {}
        self._lock = threading.Lock()

    def inc(self, *labels: str, amount: float = 1.0) -> None:
        with self._lock:
            self._values[labels] = self._values.get(labels, 0.0) + amount

    def render(self) -> list[str]:
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} counter"]
        with self._lock:
            values = sorted(self._values.items())
        if not values and not self.label_names:
            values = [((), 0.0)]
        lines += [f"{self.name}{_labels(self.label_names, key)} {_number(v)}" for key, v in values]
        return lines


class Histogram:
    def __init__(self, name: str, help: str, buckets: tuple[float, ...], labels: tuple[str, ...] = ()):
        self.name, self.help, self.buckets, self.label_names = name, help, buckets, labels
        self._series: dict[tuple[str, ...], tuple[list[int], list[float]]] = {}
        self._lock = threading.Lock()

    def observe(self, value: float, *labels: str) -> None:
        with self._lock:
            counts, total = self._series.setdefault(labels, ([0] * (len(self.buckets) + 1), [0.0]))
            counts[bisect.bisect_left(self.buckets, value)] += 1
            total[0] += value

    def render(self) -> list[str]:
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} histogram"]
        with self._lock:
            series = sorted((key, (list(counts), total[0])) for key, (counts, total) in self._series.items())
        for key, (counts, total) in series:
            cumulative = 0
            for bound, count in zip((*self.buckets, math.inf), counts, strict=True):
                cumulative += count
                le = f'le="{_number(bound)}"'
                lines.append(f"{self.name}_bucket{_labels(self.label_names, key, le)} {cumulative}")
            lines.append(f"{self.name}_sum{_labels(self.label_names, key)} {_number(total)}")
            lines.append(f"{self.name}_count{_labels(self.label_names, key)} {cumulative}")
        return lines


class Gauge:
    def __init__(self, name: str, help: str, read: Callable[[], float]):
        self.name, self.help, self.read = name, help, read

    def render(self) -> list[str]:
        return [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} gauge", f"{self.name} {_number(self.read())}"]


class Metrics:
    def __init__(self) -> None:
        self.requests = Counter(
            "s1omni_requests_total", "HTTP requests by route, status and error code (ok when none).", ("route", "status", "code")
        )
        self.stage_seconds = Histogram(
            "s1omni_request_stage_seconds", "Decision request time per Server-Timing stage.", LATENCY_BUCKETS, ("stage",)
        )
        self.input_tokens = Counter("s1omni_input_tokens_total", "Tokens the model processed for answered requests.")
        self.forward_seconds = Histogram("s1omni_forward_seconds", "model.execute time per batch.", LATENCY_BUCKETS)
        self.batch_plans = Histogram("s1omni_batch_plans", "Plans per model.execute batch.", PLAN_BUCKETS)
        self.batch_tokens = Histogram("s1omni_batch_tokens", "Tokens per model.execute batch.", TOKEN_BUCKETS)
        self.expired = Counter("s1omni_deadline_expired_total", "Jobs not run because their deadline passed in the queue.")
        self.gauges: list[Gauge] = []

    def gauge(self, name: str, help: str, read: Callable[[], float]) -> None:
        self.gauges.append(Gauge(name, help, read))

    def forward(self, seconds: float, plans: int, tokens: int) -> None:
        self.forward_seconds.observe(seconds)
        self.batch_plans.observe(plans)
        self.batch_tokens.observe(tokens)

    def render(self) -> str:
        families = [
            self.requests,
            self.stage_seconds,
            self.input_tokens,
            self.forward_seconds,
            self.batch_plans,
            self.batch_tokens,
            self.expired,
            *self.gauges,
        ]
        return "\n".join(line for family in families for line in family.render()) + "\n"
