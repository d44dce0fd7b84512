"""``s1omni serve --instances N`` over HTTP: two copies of the tiny member, each with its own worker.

That the workers' forwards run at the same time is the scheduler's to show
(``test_server_scheduler``); here, that the option reaches the server and that requests sent together,
whichever copy answers them, answer byte for byte as each sent alone.
"""

from __future__ import annotations

import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from serving import S1OMNI

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
