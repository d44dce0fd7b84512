"""The server's Prometheus metrics, through ``prometheus_client``.

Each ``Metrics`` has its own registry: the server's series, the process collector (CPU, memory,
open files), the platform and the garbage collector. ``render`` writes the text format, or
OpenMetrics when the scraper asks for it. No request content goes into a label: requests are
counted by route, status and error code, stage latencies by stage name, forwards' requests by
profile; gauges are read when
scraped (vllm-project/semantic-router:src/model-runtime/vllm_srun/supervision/metrics.py).
"""

from __future__ import annotations

from collections.abc import Callable

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
from prometheus_client.exposition import choose_encoder

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12)
PLAN_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
TOKEN_BUCKETS = (64, 256, 1024, 4096, 16384, 65536, 262144)

# A ``*_created`` series per counter and histogram tells a scraper nothing a restart does not.
disable_created_metrics()


class Metrics:
    def __init__(self) -> None:
        self.registry = registry = CollectorRegistry(auto_describe=True)
        ProcessCollector(registry=registry)
        PlatformCollector(registry=registry)
        GCCollector(registry=registry)
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
