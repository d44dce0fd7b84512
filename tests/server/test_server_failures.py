"""500 when a model answers a non-finite number, 503 when a model never passes its warm-up."""

from __future__ import annotations

from serving import error, metric

STATE = "Please refund the duplicate charge."


def set_question(labels: dict[str, str]) -> dict:
    return {"type": "set", "instructions": "Which topics?", "criteria": labels}


def test_a_non_finite_number_in_a_response_is_500(start, nan_member) -> None:
    server = start(str(nan_member))
    server.wait_status("ready")
    fine = server.post({"state": STATE, "questions": {"topics": set_question({"billing": "payments"})}})
    assert fine.status_code == 200, fine.text
    broken = server.post({"state": STATE, "questions": {"nanset": set_question({"billing": "payments"})}})
    assert error(broken, 500, "internal_error") == "the model produced a non-finite number"
    assert metric(server.metrics(), "s1omni_requests_total", route="/v1/systemone", status="500", code="internal_error") == 1
    assert server.client.get("/health").status_code == 200  # one bad answer does not unready the server
    server.stop()


def test_a_model_that_fails_its_warm_up_is_never_ready(start, broken_member) -> None:
    server = start(str(broken_member))
    health = server.wait_status("failed")
    assert "non-finite" in health["reason"] and health["model"] is not None
    response = server.client.get("/health")
    assert response.status_code == 503 and response.json() == health
    message = error(server.post({"state": STATE, "questions": {"q": {"type": "noul", "instructions": "x"}}}), 503, "not_ready")
    assert message.startswith("the model is failed")
    card = server.client.get("/v1/models").json()["data"][0]
    assert card["ready"] is False and card["status"] == "failed"
    assert server.client.get("/health/live").status_code == 200
    assert metric(server.metrics(), "s1omni_ready") == 0
    server.stop()
