"""The Prometheus text the server writes by hand: types, escaping, cumulative histogram buckets."""

from __future__ import annotations

from s1omni.server.metrics import Metrics


def test_the_exposition_is_well_formed() -> None:
    metrics = Metrics()
    metrics.requests.inc("/v1/systemone", "400", 'say "no"\\\n')
    metrics.stage_seconds.observe(0.001, "parse")
    metrics.stage_seconds.observe(0.003, "parse")
    metrics.stage_seconds.observe(100.0, "parse")
    metrics.gauge("s1omni_test_depth", "A gauge.", lambda: 3)
    text = metrics.render()
    lines = text.splitlines()
    assert text.endswith("\n")
    assert 's1omni_requests_total{route="/v1/systemone",status="400",code="say \\"no\\"\\\\\\n"} 1' in lines
    assert 's1omni_request_stage_seconds_bucket{stage="parse",le="0.001"} 1' in lines  # le is inclusive
    assert 's1omni_request_stage_seconds_bucket{stage="parse",le="0.0025"} 1' in lines
    assert 's1omni_request_stage_seconds_bucket{stage="parse",le="0.005"} 2' in lines
    assert 's1omni_request_stage_seconds_bucket{stage="parse",le="+Inf"} 3' in lines
    assert 's1omni_request_stage_seconds_count{stage="parse"} 3' in lines
    assert "s1omni_input_tokens_total 0" in lines and "s1omni_test_depth 3" in lines
    for name, kind in [("s1omni_requests_total", "counter"), ("s1omni_request_stage_seconds", "histogram"), ("s1omni_test_depth", "gauge")]:
        assert f"# TYPE {name} {kind}" in lines
    samples = [line for line in lines if not line.startswith("#")]
    assert all(len(line.rsplit(" ", 1)) == 2 for line in samples)
