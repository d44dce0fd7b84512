"""The server's Prometheus metrics, through ``prometheus_client``.

Each ``Metrics`` has its own registry: the server's series, the process collector (CPU, memory,
open files), the platform and the garbage collector. ``render`` writes the text format, or
OpenMetrics when the scraper asks for it. No request content goes into a label: requests are
counted by route, status and error code, stage latencies by stage name, forwards' requests by
profile; gauges are read when
scraped (vllm-project/semantic-router:src/model-runtime/vllm_srun/supervision/metrics.py).

``s1omni_thread_cpu_seconds{pool}`` is where the process's CPU goes: the CPU time of its live Python
threads, read from each thread's own clock at the scrape and summed by pool (a thread's name less its
``-N``/``_N`` index: the event loop's ``MainThread``, ``s1omni-worker`` running the forwards,
``AnyIO worker thread`` running planning of large bodies, heads left to the request and finishing,
``s1omni-head-readout`` and ``s1omni-span-head`` running the heads begun during a forward).
``process_cpu_seconds_total`` less their sum is the threads Python did not start (ONNX Runtime's,
CUDA's). A gauge, not a counter: a thread that ends takes its time with it. Two scrapes around a
load give its CPU per request and pool (``s1omni bench --http`` records them).

``s1omni_head_pool_*_total{pool}`` splits the heads' time in the two head pools the same way: tasks, the
seconds they waited for a thread of the pool, the seconds they ran; a heads stage that grows with load is
either waiting for the pool (more threads would help) or running longer (the GIL, the cores: they would not).
"""

from __future__ import annotations

import re
import threading
import time
from collections import Counter as Tally
from collections.abc import Callable, Iterator

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    disable_created_metrics,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector

from s1omni.runtime.cpu_heads import HEADS_POOLS
from s1omni.runtime.runners.capture_lock import CAPTURES

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12)
PLAN_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
TOKEN_BUCKETS = (64, 256, 1024, 4096, 16384, 65536, 262144)

# A ``*_created`` series per counter and histogram tells a scraper nothing a restart does not.
disable_created_metrics()
# A pool's threads are named PREFIX-N (threading.Thread) or PREFIX_N (ThreadPoolExecutor).
_THREAD_INDEX = re.compile(r"[-_]\d+$")


def thread_pool(name: str) -> str:
    """The pool a thread's name places it in: the name less a trailing ``-N`` or ``_N`` index."""
    return _THREAD_INDEX.sub("", name)


class ThreadCpu(Collector):
    """``s1omni_thread_cpu_seconds{pool}``: CPU seconds of the live Python threads, by pool (module docstring)."""

    def collect(self) -> Iterator[GaugeMetricFamily]:
        seconds: Tally[str] = Tally()
        for thread in threading.enumerate():
            if thread.ident is None:
                continue
            try:
                seconds[thread_pool(thread.name)] += time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
            except OSError:  # ended since the enumeration
                continue
        family = GaugeMetricFamily(
            "s1omni_thread_cpu_seconds", "CPU seconds of the process's live Python threads, by pool (thread name less its index).",
            labels=("pool",),
        )  # fmt: skip
        for pool, total in sorted(seconds.items()):
            family.add_metric((pool,), total)
        yield family


class HeadPools(Collector):
    """``s1omni_head_pool_{tasks,wait_seconds,run_seconds}_total{pool}``: per head pool (``cpu_heads.HEADS_POOLS``),
    the tasks finished, the seconds they waited for one of its threads and the seconds they ran."""

    def collect(self) -> Iterator[CounterMetricFamily]:
        families = [
            CounterMetricFamily("s1omni_head_pool_tasks", "Head tasks a head pool finished.", labels=("pool",)),
            CounterMetricFamily("s1omni_head_pool_wait_seconds", "Seconds head tasks waited for a thread of their pool.", labels=("pool",)),
            CounterMetricFamily("s1omni_head_pool_run_seconds", "Seconds head tasks ran on their pool's threads.", labels=("pool",)),
        ]  # fmt: skip
        for pool in sorted(HEADS_POOLS, key=lambda pool: pool.name):
            for family, value in zip(families, pool.totals(), strict=True):
                family.add_metric((pool.name,), value)
        yield from families


class CudaGraphs(Collector):
    """``s1omni_cuda_graph_{captures,capture_seconds,deferred_runs}_total``: the CUDA graphs the process captured, the
    seconds their capturing runs took, and the runs of graphs not yet captured that found another forward on the
    device, so ran outside any graph, their worker's next forward then waiting for the device alone
    (``capture_lock.CAPTURES``)."""

    def collect(self) -> Iterator[CounterMetricFamily]:
        captured, seconds, deferred = CAPTURES.totals()
        yield CounterMetricFamily("s1omni_cuda_graph_captures", "CUDA graphs captured.", value=captured)
        yield CounterMetricFamily("s1omni_cuda_graph_capture_seconds", "Seconds the capturing runs took (warm-up runs and capture).", value=seconds)
        yield CounterMetricFamily("s1omni_cuda_graph_deferred_runs", "Runs of a graph not yet captured that found another forward on the device.", value=deferred)


class Metrics:
    def __init__(self) -> None:
        self.registry = registry = CollectorRegistry(auto_describe=True)
        ProcessCollector(registry=registry)
        PlatformCollector(registry=registry)
        GCCollector(registry=registry)
        registry.register(ThreadCpu())
        registry.register(HeadPools())
        registry.register(CudaGraphs())
        self.requests = Counter(
            "s1omni_requests_total", "HTTP requests by route, status and error code (ok when none).",
            ("route", "status", "code"), registry=registry,
        )  # fmt: skip
        self.stage_seconds = Histogram(
            "s1omni_request_stage_seconds", "Decision request time per Server-Timing stage.", ("stage",),
            buckets=LATENCY_BUCKETS, registry=registry,
        )  # fmt: skip
        self.input_tokens = Counter(
            "s1omni_input_tokens_total", "Tokens the model processed for answered requests.", registry=registry
        )
        self.forward_seconds = Histogram(
            "s1omni_forward_seconds", "model.forward time per batch (the backbone; heads not included).", buckets=LATENCY_BUCKETS, registry=registry
        )
        self.batch_plans = Histogram("s1omni_batch_plans", "Plans per model.forward batch.", buckets=PLAN_BUCKETS, registry=registry)
        self.batch_tokens = Histogram(
            "s1omni_batch_tokens", "Tokens per model.forward batch.", buckets=TOKEN_BUCKETS, registry=registry
        )
        self.batch_requests = Histogram(
            "s1omni_batch_requests", "Requests (each with its states) per model.forward batch, by profile: 1 for exact.",
            ("profile",), buckets=PLAN_BUCKETS, registry=registry,
        )  # fmt: skip
        self.expired = Counter(
            "s1omni_deadline_expired_total", "Jobs not run because their deadline passed in the queue.", registry=registry
        )

    def gauge(self, name: str, help: str, read: Callable[[], float]) -> None:
        """A gauge whose value is ``read()`` at each scrape."""
        Gauge(name, help, registry=self.registry).set_function(read)

    def forward(self, seconds: float, plans: int, tokens: int, requests: int, profile: str) -> None:
        self.forward_seconds.observe(seconds)
        self.batch_plans.observe(plans)
        self.batch_tokens.observe(tokens)
        self.batch_requests.labels(profile).observe(requests)

    def render(self, accept: str | None = None) -> tuple[bytes, str]:
        """The exposition and its content type: OpenMetrics when ``accept`` (the scraper's Accept header) asks for it."""
        encode, content_type = choose_encoder(accept or "")
        return encode(self.registry), content_type
