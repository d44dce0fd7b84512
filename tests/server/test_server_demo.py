"""``s1omni serve`` with neither a package nor an engine serves the embedded demo member."""

from __future__ import annotations

import json
from pathlib import Path

from serving import Server


def test_the_demo_member_is_written_once_and_labelled_random(tmp_path: Path) -> None:
    server = Server(tmp_path)
    try:
        server.wait_status("ready")
        card = server.client.get("/v1/models").json()["data"][0]
        assert "random weights" in card["notice"] and card["id"] == "vela2-synth-tiny-s0"
        answer = server.post({"state": "Hello there.", "questions": {"q": {"type": "noul", "instructions": "A greeting?"}}})
        assert answer.status_code == 200, answer.text
        assert "random weights" in server.log()
    finally:
        assert server.stop() == 0
    registry = json.loads((tmp_path / "registry.json").read_text(encoding="utf-8"))
    assert [entry["name"] for entry in registry["members"]] == ["vela2-synth-tiny-s0"]
    written = (tmp_path / "demo" / "config.json").stat().st_mtime_ns
    again = Server(tmp_path)  # a second start reuses the member as it is
    try:
        again.wait_status("ready")
    finally:
        again.stop()
    assert (tmp_path / "demo" / "config.json").stat().st_mtime_ns == written
