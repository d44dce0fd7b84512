"""OmniJev rules no client can provoke on its own, in process: the tiny model with one method wrapped.

The app, service and scheduler are the ones ``s1omni serve`` runs; only the model is reached into,
to slow its preparation or make it fail.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from s1omni.runtime.omnijev.model import OmniJevModel
from s1omni.server.app import create_app
from s1omni.server.config import ServeConfig
from s1omni.server.service import ModelSource, Service

PATH = "/v1/systemone"


@pytest.fixture
def fresh(omnijev_package: Path) -> Callable[[], OmniJevModel]:
    from s1omni.runtime.api import load_model

    return lambda: load_model(omnijev_package)


@asynccontextmanager
async def serving(model: OmniJevModel) -> AsyncIterator[httpx.AsyncClient]:
    service = Service(ServeConfig(), ModelSource("tiny", lambda: model, family="omnijev"))
    app = create_app(service)
    service.start(asyncio.get_running_loop())  # what the app's lifespan does
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as client:
            deadline = time.monotonic() + 60
            while (await client.get("/health")).status_code != 200:
                assert time.monotonic() < deadline and service.status != "failed", service.reason
                await asyncio.sleep(0.02)
            yield client
    finally:
        service.stop(10)


def small(model: OmniJevModel, name: str = "blue") -> dict[str, Any]:
    body = model.golden_request()
    body["questions"] = {name: {"type": "noul", "instructions": "The image is mostly blue."}}
    return body


def test_at_most_two_requests_prepare_at_once(fresh: Callable[[], OmniJevModel]) -> None:
    model = fresh()
    plan, lock = model.plan, threading.Lock()
    active, peak = 0, []

    def slow(body: dict[str, Any]) -> Any:
        nonlocal active
        with lock:
            active += 1
            peak.append(active)
        try:
            time.sleep(0.1)
            return plan(body)
        finally:
            with lock:
                active -= 1

    async def burst() -> list[httpx.Response]:
        async with serving(model) as client:
            return await asyncio.gather(*(client.post(PATH, json=small(model)) for _ in range(6)))

    model.plan = slow  # type: ignore[method-assign]
    responses = asyncio.run(burst())
    assert [response.status_code for response in responses] == [200] * 6
    assert max(peak) == 2  # concurrent, so off the event loop, and never three


def _nan_answer(finish: Callable[..., dict[str, Any]]) -> Callable[..., dict[str, Any]]:
    def finished(plan: Any, result: Any) -> dict[str, Any]:
        content = finish(plan, result)
        if "boom" in content["answers"]:
            content["answers"]["boom"]["noul"] = math.nan
        return content

    return finished


def _raising(method: Callable[..., Any], where: Callable[..., bool]) -> Callable[..., Any]:
    def failing(argument: Any) -> Any:
        if where(argument):
            raise RuntimeError("the kernel exploded")
        return method(argument)

    return failing


def _raising_readout(method: Callable[..., Any]) -> Callable[..., Any]:
    def failing(plan: Any, forwarded: Any) -> Any:
        if any(question.id == "boom" for question in plan.questions):
            raise RuntimeError("the heads exploded")
        return method(plan, forwarded)

    return failing


BREAKS: dict[str, Callable[[OmniJevModel], None]] = {
    "preparation": lambda model: setattr(model, "plan", _raising(model.plan, lambda body: "boom" in body["questions"])),
    "execution": lambda model: setattr(
        model, "forward", _raising(model.forward, lambda plans: any(q.id == "boom" for p in plans for q in p.questions))
    ),
    "heads": lambda model: setattr(model, "readout", _raising_readout(model.readout)),
    "a non-finite answer": lambda model: setattr(model, "finish", _nan_answer(model.finish)),
}


@pytest.mark.parametrize("brk", BREAKS.values(), ids=BREAKS.keys())
def test_a_failure_is_500_inference_failed_and_only_the_log_says_why(
    fresh: Callable[[], OmniJevModel], brk: Callable[[OmniJevModel], None], caplog: pytest.LogCaptureFixture
) -> None:
    async def requests() -> list[httpx.Response]:
        async with serving(model) as client:
            failed = await client.post(PATH, json=small(model, "boom"))
            return [failed, await client.post(PATH, json=small(model)), await client.get("/health")]

    model = fresh()
    brk(model)
    failed, after, health = asyncio.run(requests())
    assert failed.status_code == 500 and failed.json() == {"detail": "inference failed"}
    assert "server-timing" in failed.headers
    assert after.status_code == 200 and health.status_code == 200  # one failure leaves the rest alone
    assert "answered 500 'inference failed' for:" in caplog.text
    assert "exploded" in caplog.text or "non-finite" in caplog.text
