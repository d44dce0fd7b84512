"""Shared fixtures: a private s1omni home and registry, and synthetic members (and the tiny one's export) made once per session."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from tests.cli import s1omni
from tests.members import make_vela_member

# Tests never touch the user's ~/.cache/s1omni: every registry write goes to a session home.
_HOME = Path(tempfile.mkdtemp(prefix="s1omni-tests-"))
os.environ["S1OMNI_HOME"] = str(_HOME)
os.environ.pop("S1OMNI_REGISTRY", None)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    shutil.rmtree(_HOME, ignore_errors=True)


@pytest.fixture(scope="session")
def s1omni_home() -> Path:
    return _HOME


@pytest.fixture(scope="session")
def tiny_vela(s1omni_home: Path) -> Path:
    """The tiny synthetic Vela 2.0 member (seed 0), verified by the gate whenever it is loaded."""
    return make_vela_member(s1omni_home / "vela2-tiny")


@pytest.fixture(scope="session")
def tiny_model(tiny_vela: Path):
    """The tiny member on the torch reference runner."""
    from s1omni.runtime.api import load_model

    return load_model(tiny_vela)


@pytest.fixture(scope="session")
def exported(tiny_vela: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny member exported as a user does (``s1omni export``: both recurrences, weights inside the graphs);
    what it printed is kept beside it, in ``export.stderr``."""
    out = tmp_path_factory.mktemp("export") / "tiny"
    result = s1omni("export", str(tiny_vela), "--out", str(out))
    (out.parent / "export.stderr").write_text(result.stderr, encoding="utf-8")
    return out
