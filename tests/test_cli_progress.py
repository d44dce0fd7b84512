"""The shared progress helper: lines under the command's prefix, bars only on a terminal, nothing under --quiet."""

from __future__ import annotations

import io
import re
from collections.abc import Iterator

import pytest

from s1omni.runtime import progress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture(autouse=True)
def restore() -> Iterator[None]:
    yield
    progress.configure("s1omni", quiet=False)


def shown(stream: io.StringIO, monkeypatch: pytest.MonkeyPatch, quiet: bool) -> str:
    monkeypatch.setattr("sys.stderr", stream)
    progress.configure("s1omni build", quiet=quiet)
    progress.note("linking prefill.onnx")
    assert list(progress.track(["a", "b", "c"], "files", unit="file")) == ["a", "b", "c"]
    counted = progress.Counted([1, 2], "cases", "case")
    assert len(counted) == 2 and counted[1] == 2 and list(counted) == [1, 2]  # indexable, as Polygraphy reads it
    return stream.getvalue()


def test_a_terminal_gets_lines_and_bars(monkeypatch: pytest.MonkeyPatch) -> None:
    text = shown(Terminal(), monkeypatch, quiet=False)
    assert "s1omni build: linking prefill.onnx\n" in text
    assert "s1omni build: files:   0%|" in text and "0/3" in text and "s1omni build: cases" in text


def test_a_log_gets_the_lines_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    assert shown(io.StringIO(), monkeypatch, quiet=False) == "s1omni build: linking prefill.onnx\n"


def test_quiet_silences_both(monkeypatch: pytest.MonkeyPatch) -> None:
    assert shown(Terminal(), monkeypatch, quiet=True) == ""


def test_a_phase_closes_with_its_seconds_and_not_on_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    stream = io.StringIO()
    monkeypatch.setattr("sys.stderr", stream)
    progress.configure("s1omni export", quiet=False)
    with progress.timed("verified pkg") as phase:
        phase.detail = " (7 files hashed)"
    with pytest.raises(RuntimeError), progress.timed("checked the graphs"):
        raise RuntimeError("differ")
    line = stream.getvalue()
    assert re.fullmatch(r"s1omni export: verified pkg \(7 files hashed\) in \d+\.\d s\n", line), line
    assert phase.seconds == phase.seconds >= 0  # frozen once the phase ended
