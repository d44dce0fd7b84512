"""``--out`` never costs a user a file: a directory holding anything but a previous output of the same
command is refused (and kept), ``--force`` keeps it under a new name, a previous output is replaced,
and the staging directories of a killed run are cleared by the next run (only those)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from s1omni.runtime.errors import InputError
from s1omni.runtime.staging import clear_stale_stages, is_output, staged_directory
from tests.cli import run_s1omni, s1omni


def build(exported: Path, out: Path, *extra: str):
    return run_s1omni("build", str(exported), "--backend", "onnxruntime", "--target", "cpu", "--out", str(out), *extra)


def dead_pid() -> int:
    """The id of a process that has ended (and been reaped)."""
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True)
    return int(done.stdout)


def test_a_directory_with_a_stray_file_is_refused_and_kept(exported: Path, tmp_path: Path) -> None:
    out = tmp_path / "engine"
    out.mkdir()
    (out / "notes.txt").write_text("my notes", encoding="utf-8")
    result = build(exported, out)
    assert result.returncode == 3
    assert "holds something other than a previous s1omni build output" in result.stderr and "--force" in result.stderr
    assert [path.name for path in out.iterdir()] == ["notes.txt"] and (out / "notes.txt").read_text() == "my notes"
    assert [path.name for path in tmp_path.iterdir()] == ["engine"]  # nothing staged beside it either


def test_the_other_commands_refuse_before_any_work(exported: Path, tiny_vela: Path, tmp_path: Path) -> None:
    out = tmp_path / "mine"
    out.mkdir()
    (out / "thesis.tex").write_text("years of work", encoding="utf-8")
    for args in (["synth", "vela2"], ["export", str(tiny_vela)], ["fetch", "Vela-2.0-0.8B"]):
        result = run_s1omni(*args, "--out", str(out))
        assert result.returncode == 3 and "holds something other than a previous" in result.stderr, result.stderr
    assert (out / "thesis.tex").read_text() == "years of work" and len(list(tmp_path.iterdir())) == 1


def test_force_keeps_the_old_contents_under_a_new_name(exported: Path, tmp_path: Path) -> None:
    out = tmp_path / "engine"
    out.mkdir()
    (out / "notes.txt").write_text("my notes", encoding="utf-8")
    result = build(exported, out, "--force")
    assert result.returncode == 0, result.stderr
    kept = [path for path in tmp_path.iterdir() if path.name.startswith("engine.kept-")]
    assert len(kept) == 1 and (kept[0] / "notes.txt").read_text() == "my notes"
    assert f"kept the previous contents of {out} as {kept[0]}" in result.stderr
    assert (out / "manifest.json").is_file() and not (out / "notes.txt").exists()


def test_a_previous_output_is_replaced_without_force(exported: Path, tmp_path: Path) -> None:
    out = tmp_path / "engine"
    assert build(exported, out).returncode == 0
    assert is_output(out, "engine") and not is_output(out, "export") and not is_output(out, "package")
    assert build(exported, out).returncode == 0  # ours: replaced
    assert sorted(path.name for path in tmp_path.iterdir()) == ["engine"]  # nothing kept, nothing staged
    (out / "manifest.json").write_text("{}", encoding="utf-8")  # no longer recognisably ours
    assert build(exported, out).returncode == 3


def test_outputs_are_recognised_by_their_contents(exported: Path, tiny_vela: Path, tmp_path: Path) -> None:
    assert is_output(exported, "export") and not is_output(exported, "engine")
    package = tmp_path / "package"
    shutil.copytree(tiny_vela, package)
    assert is_output(package, "package") and not is_output(package, "export")
    (package / "notes.txt").write_text("mine", encoding="utf-8")
    assert not is_output(package, "package")
    export = tmp_path / "export"
    shutil.copytree(exported, export)
    (export / "extra.onnx").write_bytes(b"")  # not pinned by its manifest
    assert not is_output(export, "export")
    with pytest.raises(InputError, match="previous s1omni export output"), staged_directory(export, "export"):
        pytest.fail("the block never runs for a refused target")
    assert (export / "extra.onnx").exists()


@pytest.mark.parametrize("weights", [["weights-00001-of-00002.data", "weights-00002-of-00002.data"], "weights.data"])
def test_a_backbone_export_is_its_graphs_and_the_weights_files_its_record_names(weights: list[str] | str, tmp_path: Path) -> None:
    """Several weights files (format 3) or one by its name (before it): what the record names is the export's."""
    (tmp_path / "prefill.onnx").write_bytes(b"")
    (tmp_path / "export.json").write_text(json.dumps({"weights": weights}), encoding="utf-8")
    for name in [weights] if isinstance(weights, str) else weights:
        (tmp_path / name).write_bytes(b"")
    assert is_output(tmp_path, "backbone")
    (tmp_path / "weights-00003-of-00002.data").write_bytes(b"")  # a file the record does not name
    assert not is_output(tmp_path, "backbone")


def test_stale_staging_directories_of_a_killed_run_are_cleared_and_nothing_else(tmp_path: Path) -> None:
    target = tmp_path / "engine"
    dead, alive = dead_pid(), subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        stale = tmp_path / f".engine.{dead}.abcd_123.partial"
        running = tmp_path / f".engine.{alive.pid}.efgh_456.partial"  # a run still going
        other = tmp_path / f".engine-2.{dead}.abcd_123.partial"  # another target's
        users = tmp_path / ".engine.notes.partial"  # not a name staging makes
        for path in (stale, running, other, users):
            path.mkdir()
            (path / "file").write_text("x", encoding="utf-8")
        assert clear_stale_stages(target) == [stale]
        assert not stale.exists() and running.exists() and other.exists() and users.exists()
    finally:
        alive.kill()
        alive.wait()


def test_the_next_run_clears_a_killed_runs_stage(exported: Path, tmp_path: Path) -> None:
    stale = tmp_path / f".engine.{dead_pid()}.zzzz9999.partial"
    stale.mkdir()
    (stale / "prefill.onnx").write_bytes(b"half")
    assert build(exported, tmp_path / "engine").returncode == 0
    assert sorted(path.name for path in tmp_path.iterdir()) == ["engine"]


def test_synth_writes_its_registry_file_when_absent(tmp_path: Path) -> None:
    """``--registry FILE`` that does not exist is refused everywhere but by synth, which creates it."""
    out, registry = tmp_path / "member", tmp_path / "new-registry.json"
    result = s1omni("synth", "vela2", "--out", str(out), "--registry", str(registry), "--quiet")
    assert registry.is_file() and f"registry entry in {registry}" in result.stdout
    assert result.stderr == ""  # --quiet: no progress
    assert is_output(out, "package")
