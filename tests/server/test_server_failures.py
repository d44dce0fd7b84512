"""500 when a model answers a non-finite number; a model that cannot load or never passes its warm-up
stops the server (``/health/live`` 503 in the meantime)."""

from __future__ import annotations

import asyncio
import time

import httpx
from serving import error, metric

from s1omni.runtime.errors import PackageError
from s1omni.runtime.registry import user_registry
from s1omni.server.app import create_app
from s1omni.server.config import ServeConfig
from s1omni.server.service import ModelSource, Service
from tests.cli import run_s1omni

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


def test_a_model_that_fails_its_warm_up_stops_the_server(broken_member) -> None:
    result = run_s1omni("serve", str(broken_member), "--port", "0", "--registry", str(user_registry()), timeout=120)
    assert result.returncode == 1, result.stderr  # its golden request is a gate it missed
    last = result.stderr.strip().splitlines()[-1]
    assert last == "s1omni serve: the golden request failed: the model produced a non-finite number"
    assert "Uvicorn running on" in result.stderr and "Traceback" not in result.stderr


def test_liveness_turns_503_once_the_load_failed() -> None:
    def refuse():
        raise PackageError("model.safetensors differs from its pin")

    async def probe() -> tuple[httpx.Response, httpx.Response, Service]:
        service = Service(ServeConfig(), ModelSource("broken", refuse))
        app = create_app(service)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as client:
            before = await client.get("/health/live")  # alive while it starts
            service.start(asyncio.get_running_loop())  # what the app's lifespan does
            deadline = time.monotonic() + 30
            while service.alive:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.01)
            return before, await client.get("/health/live"), service

    before, after, service = asyncio.run(probe())
    assert before.status_code == 200 and before.json()["status"] == "alive"
    assert after.status_code == 503 and after.json()["status"] == "failed"
    assert after.json()["reason"] == "PackageError: model.safetensors differs from its pin"
    assert isinstance(service.failure, PackageError)
