"""Fixtures for the HTTP tests: real ``s1omni serve`` processes over tiny synthetic members.

Each server is a subprocess on a free port (``--port 0``; the port is read from uvicorn's log line),
with ``S1OMNI_HOME`` the session's home and ``--registry`` the session registry, talked to over HTTP with
httpx. Nothing stands in for the model: members are written by ``s1omni.runtime.synth.vela2`` and
``s1omni.runtime.synth.omnijev`` and loaded by ``s1omni.runtime.api.load_model`` in the server.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from serving import Server

from s1omni.runtime.registry import user_registry
from tests.cli import s1omni


def _changed_member(home: Path, seed: int, change: Callable[[dict], None]) -> Path:
    """A tiny member whose calibration ``change`` edits, pinned as changed in the session registry."""
    from s1omni.runtime.digest import sha256_file
    from s1omni.runtime.registry import write_entry
    from s1omni.runtime.synth import vela2

    root = home / f"vela2-tiny-s{seed}-changed"
    member = vela2.write(root, "tiny", seed)
    path = root / "calibration.json"
    values = json.loads(path.read_text(encoding="utf-8"))
    change(values)
    path.write_text(json.dumps(values, indent=2), encoding="utf-8")  # NaN stays NaN: Python's json allows it
    files = {**member.files, "calibration.json": sha256_file(path)}
    (root / "SHA256SUMS").write_text("".join(f"{digest}  {name}\n" for name, digest in sorted(files.items())), encoding="utf-8")
    write_entry(user_registry(), dataclasses.replace(member, files=files))
    return root


@pytest.fixture(scope="session")
def nan_member(s1omni_home: Path) -> Path:
    """Answers normally, except that a set question named ``nanset`` gets a NaN threshold."""
    return _changed_member(s1omni_home, 1, lambda values: values["thresholds"].update({"set:nanset": math.nan}))


@pytest.fixture(scope="session")
def broken_member(s1omni_home: Path) -> Path:
    """Every choice-type answer is NaN (a NaN temperature), so its warm-up can never pass."""
    return _changed_member(s1omni_home, 2, lambda values: values["temperature"].update({"choice": math.nan}))


@pytest.fixture(scope="session")
def omnijev_package(s1omni_home: Path) -> Path:
    """The tiny synthetic OmniJev member (seed 0), pinned in the session registry."""
    from s1omni.runtime.registry import write_entry
    from s1omni.runtime.synth import omnijev

    root = s1omni_home / "omnijev-tiny-served"
    write_entry(user_registry(), omnijev.write(root, "tiny", 0))
    return root


@pytest.fixture(scope="session")
def engine_model(exported: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The tiny member's ONNX Runtime CPU engine, loaded as ``s1omni serve --engine`` loads it (not
    validated here: what is tested is the server around it); served in process (``inprocess``)."""
    from s1omni.runtime.engine import load_engine_model

    out = tmp_path_factory.mktemp("served-engine") / "ort-cpu"
    s1omni("build", str(exported), "--backend", "onnxruntime", "--target", "cpu", "--out", str(out))
    return load_engine_model(out, allow_unvalidated=True)


@pytest.fixture(scope="session")
def start(s1omni_home: Path) -> Iterator[Callable[..., Server]]:
    """Start a server with these ``s1omni serve`` arguments; any still running is stopped at the end."""
    servers: list[Server] = []

    def launch(*args: str) -> Server:
        # The session registry, where the members' pins are (tests/conftest.py's home).
        server = Server(s1omni_home, *args, "--registry", str(user_registry()))
        servers.append(server)
        return server

    yield launch
    for server in servers:
        server.stop()
