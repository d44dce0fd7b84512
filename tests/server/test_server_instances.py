"""``s1omni serve --instances N`` over HTTP: two copies of the tiny member, each with its own worker.

That the workers' forwards run at the same time is the scheduler's to show
(``test_server_scheduler``); here, that the option reaches the server and that requests sent together,
whichever copy answers them, answer byte for byte as each sent alone; and that two instances of a CUDA-graph
engine capture new shapes while the other runs without failing a request (``s1omni.runtime.runners.capture_lock``):
on the GPU, and through the same locks on the CPU.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from serving import S1OMNI

from s1omni.bench import http_load

from tests.cli import s1omni
from tests.cuda_builds import needs_cuda, validate_on_the_cpu

REQUESTS = [
    {"state": text, "questions": {
        "refund": {"type": "noul", "instructions": "Does the customer ask for a refund?"},
        "urgency": {"type": "score", "instructions": "How urgent is it?", "criteria": ["Routine", "Soon", "Today"]},
        "money": {"type": "span", "instructions": "Which spans name money?", "criteria": {"money": "an amount"}},
    }}
    for text in (
        "Please refund the duplicate charge of 40 euros.",
        "Where is my parcel? It was due on Monday.",
        "Cancel the order and send back the 12.50 I paid, today.",
        "Thanks, all good.",
    )
]  # fmt: skip


def test_two_instances_load_and_answer_together_as_alone(start, tiny_vela: Path) -> None:
    server = start(str(tiny_vela), "--instances", "2")  # stopped with the session's servers
    server.wait_status("ready")
    assert "2 instances" in server.log()
    alone = [server.post(request) for request in REQUESTS]
    assert all(response.status_code == 200 for response in alone), [response.text for response in alone]
    with ThreadPoolExecutor(2 * len(REQUESTS)) as pool:
        together = list(pool.map(server.post, 2 * REQUESTS))
    assert [response.content for response in together] == 2 * [response.content for response in alone]


@pytest.mark.parametrize("count", ["0", "-1"])
def test_instances_must_be_at_least_one(tiny_vela: Path, count: str) -> None:
    done = subprocess.run([str(S1OMNI), "serve", str(tiny_vela), "--instances", count], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and f"--instances takes a count >= 1, not {count}" in done.stderr


def _merged_batches_from_16_clients(server, repeats: int, rounds: int) -> dict[str, float]:
    """``rounds`` x each of ``REQUESTS`` with its state 1 to ``repeats`` times over (``batching``), from 16 clients at
    once to a ready ``server``: every answer 200 (asserted); the server's ``s1omni_cuda_graph_*`` counters after."""
    server.wait_status("ready")
    bodies = [{**request, "state": request["state"] * repeat, "options": {"profile": "batching"}}
              for repeat in range(1, repeats + 1) for request in REQUESTS]  # fmt: skip
    with ThreadPoolExecutor(16) as pool:
        answered = list(pool.map(server.post, rounds * bodies))
    assert [response.status_code for response in answered] == [200] * len(answered), {r.text for r in answered if r.status_code != 200}
    return {family.name: family.samples[0].value for family in text_string_to_metric_families(server.metrics())
            if family.name.startswith("s1omni_cuda_graph_")}  # fmt: skip


def test_two_instances_of_a_graphed_engine_serve_merged_batches_on_the_cpu(start, cuda_engine: Callable[..., tuple[Path, str]], tiny_vela: Path, tmp_path: Path) -> None:
    """The capture lock's path under ``batching`` without a GPU: a CUDA-graph build run on the CPU EP takes the same
    locks (a forward that meets a graph while the other instance runs defers it, and its next forward waits for the
    device alone), so two instances answering 16 clients at once must neither deadlock nor fail a request."""
    engine = tmp_path / "engine"
    shutil.copytree(cuda_engine("--gated-delta-kernel", "LinearAttention", "--cuda-graphs")[0], engine)
    validate_on_the_cpu(engine, tiny_vela, tmp_path / "report.json")
    server = start("--engine", str(engine), "--instances", "2", "--profiles", "batching")
    counters = _merged_batches_from_16_clients(server, repeats=2, rounds=2)
    # Both paths ran: graphs captured, and runs deferred while the other instance ran (each followed by a forward alone).
    assert counters["s1omni_cuda_graph_captures"] > 0 and counters["s1omni_cuda_graph_deferred_runs"] > 0, counters
    # s1omni bench's settling against this server: it has captured graphs, so a level first gets untimed rounds,
    # each of a request a client, until one captures nothing new (here within the limit: these sizes are few). Whether
    # the instance warm-up or a round captures the new width depends on which instance takes what: a round after the
    # first means the one before it captured.
    body = {**REQUESTS[2], "state": REQUESTS[2]["state"] * 3, "options": {"profile": "batching"}}  # a width not seen yet
    server_of_bench = http_load.Server("engine", server.url, [], tmp_path / "unused.log")
    (run,) = http_load.measure(server_of_bench, body, "batching", [4], requests=2, warmup=1, progress=lambda _: None,
                               instances=2, settle_rounds=6)  # fmt: skip
    assert run["failures"] == {} and run["count"] >= 8, run
    settled = run["settle"]
    assert 1 <= settled["rounds"] <= 6 and settled["settled"] is True and settled["captures"] >= settled["rounds"] - 1, settled


@pytest.mark.gpu
@needs_cuda
def test_two_instances_of_a_cuda_graph_engine_capture_while_the_other_runs(start, exported: Path, tiny_vela: Path, tmp_path: Path) -> None:
    """``batching`` merges whatever arrives together, so nearly every forward has shapes no graph has yet:
    one instance captures while the other runs. Before the capture lock 97 of 587 such requests failed
    (CUDA error 900, "operation not permitted when stream is capturing") on the H200."""
    engine = tmp_path / "engine"  # float32, held to the gpu gate: the tiny member's bf16 build can miss gpu-reduced on a span set
    s1omni("build", str(exported), "--backend", "onnxruntime", "--target", "cuda", "--precision", "fp32", "--cuda-graphs", "--out", str(engine))
    s1omni("validate", str(engine), "--package", str(tiny_vela), "--reference", str(tmp_path / "reference"))
    server = start("--engine", str(engine), "--device", "cuda", "--instances", "2", "--profiles", "batching")
    counters = _merged_batches_from_16_clients(server, repeats=8, rounds=3)
    assert "stream is capturing" not in server.log()
    assert counters["s1omni_cuda_graph_captures"] > 0 and counters["s1omni_cuda_graph_capture_seconds"] > 0, counters
