"""The server's Prometheus exposition: its series by name, escaping, cumulative buckets, process
metrics, the threads' CPU by pool, and OpenMetrics when the scraper asks for it."""

from __future__ import annotations

import threading
import time

from serving import metric

from s1omni.server.metrics import Metrics, thread_pool

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
    "s1omni_thread_cpu_seconds": "gauge",
    "s1omni_head_pool_tasks_total": "counter",
    "s1omni_head_pool_wait_seconds_total": "counter",
    "s1omni_head_pool_run_seconds_total": "counter",
    "s1omni_cuda_graph_captures_total": "counter",
    "s1omni_cuda_graph_capture_seconds_total": "counter",
    "s1omni_cuda_graph_deferred_runs_total": "counter",
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


def test_a_thread_is_counted_in_its_pool() -> None:
    assert thread_pool("s1omni-worker-0") == "s1omni-worker" and thread_pool("s1omni-head-readout_3") == "s1omni-head-readout"
    assert thread_pool("MainThread") == "MainThread" and thread_pool("AnyIO worker thread") == "AnyIO worker thread"
    assert thread_pool("s1omni-v2") == "s1omni-v2"  # only a separated index is one

    def burn(seconds: float) -> None:
        end = time.thread_time() + seconds
        while time.thread_time() < end:
            pass

    metrics, release = Metrics(), threading.Event()
    # Two threads of one pool, each holding 0.05 s of CPU while the scrape runs.
    pool = [threading.Thread(target=lambda: (burn(0.05), release.wait()), name=f"s1omni-test-pool_{n}") for n in range(2)]
    for thread in pool:
        thread.start()
    try:
        deadline = time.monotonic() + 30
        while metric(metrics.render()[0].decode(), "s1omni_thread_cpu_seconds", pool="s1omni-test-pool") < 0.1:
            assert time.monotonic() < deadline, "the pool's two threads never summed to 0.1 s"
            time.sleep(0.01)
        text = metrics.render()[0].decode()
        assert metric(text, "s1omni_thread_cpu_seconds", pool="s1omni-test-pool") < 0.1 + 0.05  # both threads, once each
        assert metric(text, "s1omni_thread_cpu_seconds", pool="s1omni-test-pool_0") == 0  # no pool of one thread
        assert 0 < metric(text, "s1omni_thread_cpu_seconds", pool="MainThread") <= metric(text, "process_cpu_seconds_total") + 0.01
    finally:
        release.set()
        for thread in pool:
            thread.join()
