"""The server's Prometheus exposition: its series by name, escaping, cumulative buckets, process
metrics, and OpenMetrics when the scraper asks for it."""

from __future__ import annotations

from serving import metric

from s1omni.server.metrics import Metrics

SERIES = {
    "s1omni_requests_total": "counter",
    "s1omni_request_stage_seconds": "histogram",
    "s1omni_input_tokens_total": "counter",
    "s1omni_forward_seconds": "histogram",
    "s1omni_batch_plans": "histogram",
    "s1omni_batch_tokens": "histogram",
    "s1omni_batch_requests": "histogram",
    "s1omni_deadline_expired_total": "counter",
    "s1omni_test_depth": "gauge",
}


def _filled() -> Metrics:
    metrics = Metrics()
    metrics.requests.labels("/v1/systemone", "400", 'say "no"\\\n').inc()
    for seconds in (0.001, 0.003, 100.0):
        metrics.stage_seconds.labels("parse").observe(seconds)
    metrics.forward(0.002, 3, 100, 2, "batching")
    metrics.gauge("s1omni_test_depth", "A gauge.", lambda: 3)
    return metrics


def test_the_text_exposition_keeps_the_names_and_is_well_formed() -> None:
    body, content_type = _filled().render()
    assert content_type.startswith("text/plain; version=0.0.4")
    text = body.decode()
    lines = text.splitlines()
    assert text.endswith("\n")
    for name, kind in SERIES.items():
        assert f"# TYPE {name} {kind}" in lines
    assert 's1omni_requests_total{code="say \\"no\\"\\\\\\n",route="/v1/systemone",status="400"} 1.0' in lines
    assert metric(text, "s1omni_request_stage_seconds_bucket", stage="parse", le="0.001") == 1  # le is inclusive
    assert metric(text, "s1omni_request_stage_seconds_bucket", stage="parse", le="0.0025") == 1
    assert metric(text, "s1omni_request_stage_seconds_bucket", stage="parse", le="0.005") == 2
    assert metric(text, "s1omni_request_stage_seconds_bucket", stage="parse", le="+Inf") == 3
    assert metric(text, "s1omni_request_stage_seconds_count", stage="parse") == 3
    assert metric(text, "s1omni_batch_plans_bucket", le="4.0") == 1 and metric(text, "s1omni_batch_tokens_sum") == 100
    assert metric(text, "s1omni_batch_requests_bucket", profile="batching", le="2.0") == 1
    assert "s1omni_input_tokens_total 0.0" in lines and metric(text, "s1omni_test_depth") == 3
    assert metric(text, "process_resident_memory_bytes") > 0 and "# TYPE python_gc_objects_collected_total counter" in lines
    assert not any("_created" in line for line in lines)
    samples = [line for line in lines if not line.startswith("#")]
    assert all(len(line.rsplit(" ", 1)) == 2 for line in samples)


def test_openmetrics_is_negotiated() -> None:
    body, content_type = _filled().render("application/openmetrics-text; version=1.0.0,text/plain;q=0.5")
    assert content_type.startswith("application/openmetrics-text; version=1.0.0")
    text = body.decode()
    assert text.endswith("# EOF\n")
    assert "# TYPE s1omni_requests counter" in text and metric(text, "s1omni_deadline_expired_total") == 0
    assert _filled().render("text/plain")[1].startswith("text/plain; version=0.0.4")
