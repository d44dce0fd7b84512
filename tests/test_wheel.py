"""The built wheel, installed into a fresh venv, runs the whole pipeline outside the source tree.

The wheel is built from a copy of the sources (``pip wheel --no-deps --no-build-isolation``: no
download; the setuptools it builds with comes with torch) and installed with ``--no-deps`` into a venv that sees this environment's
dependencies through a path file, not its editable ``s1omni``. Every command then runs in a scratch
directory with ``PYTHONPATH`` unset, so a module left out of the wheel, or ``calib/`` missing from its
package data, fails here: validate reads the cases, gates and (where this host synthesizes the tiny
member as the record's host did) its reference record from the installed package.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
from importlib.metadata import version
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("pyproject.toml", "README.md", "LICENSE", "s1omni", "runtime", "export", "server", "bench", "cli", "calib")
# The model digest of the tiny member's reference record in the installed package's calib/.
SHIPPED_RECORD = """
import json, s1omni.calib as calib, pathlib
root = pathlib.Path(calib.__file__).parent / "vela2" / "reference" / "vela2-synth-tiny-s0" / "cpu-fp32" / "answers.json"
print(json.dumps(json.loads(root.read_text())["member"]["model_sha256"]))
"""
LISTENING = re.compile(r"Uvicorn running on http://127\.0\.0\.1:(\d+)")

pytestmark = pytest.mark.slow


def run(command: list[str], cwd: Path, env: dict[str, str], timeout: float = 900) -> str:
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{' '.join(command)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str], Path]:
    """(the fresh venv's bin directory, the environment to run it in, a scratch directory)."""
    scratch = tmp_path_factory.mktemp("wheel")
    source = scratch / "source"
    source.mkdir()
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(ROOT / name, source / name)
    build = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q", "-w", str(scratch)]
    run([*build, str(source)], scratch, os.environ.copy())
    (wheel,) = scratch.glob("s1omni-*.whl")

    venv = scratch / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = Path(run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], scratch, {}).strip())
    # This environment's dependencies as plain paths: their .pth files (the editable s1omni) are not run.
    (site / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n", encoding="utf-8")
    pip = [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index", "-q"]
    run([*pip, str(wheel)], scratch, os.environ.copy())

    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "S1OMNI_REGISTRY", "VIRTUAL_ENV")}
    env.update(S1OMNI_HOME=str(scratch / "home"), PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}")
    work = scratch / "work"
    work.mkdir()
    return venv / "bin", env, work


def test_the_wheel_holds_every_tracked_module_and_data_file(installed: tuple[Path, dict[str, str], Path]) -> None:
    bin_dir, env, work = installed
    package = Path(run([str(bin_dir / "python"), "-c", "import s1omni; print(s1omni.__file__)"], work, env).strip()).parent
    shipped = {
        str(path.relative_to(package)) for path in package.rglob("*") if path.is_file() and "__pycache__" not in path.parts
    }
    tracked = run(["git", "ls-files", *SOURCES[3:]], ROOT, os.environ.copy()).split()
    # s1omni/ is the package itself; every other folder is mapped under it (pyproject.toml).
    expected = {name.removeprefix("s1omni/") for name in tracked}
    assert sorted(expected - shipped) == [], "missing from the wheel"
    assert sorted(shipped - expected) == [], "in the wheel but not tracked"


def test_the_wheel_runs_the_pipeline_outside_the_source_tree(installed: tuple[Path, dict[str, str], Path]) -> None:
    bin_dir, env, work = installed
    where = run([str(bin_dir / "python"), "-c", "import s1omni.calib, s1omni.server.openapi as m; print(m.__file__)"], work, env)
    assert where.startswith(str(bin_dir.parent)), f"s1omni was imported from {where}, not the wheel"
    s1omni = str(bin_dir / "s1omni")
    assert run([s1omni, "--version"], work, env).strip().endswith(version("s1omni"))  # the wheel's entry point
    members = json.loads(run([str(bin_dir / "python"), "-m", "s1omni", "members", "--json"], work, env))
    assert "Vela-2.0-4B" in json.dumps(members)

    run([s1omni, "synth", "vela2", "--size", "tiny", "--out", "pkg"], work, env)
    run([s1omni, "export", "pkg", "--out", "export", "--recurrence", "scan"], work, env)  # the graphs a CPU engine runs
    run([s1omni, "build", "export", "--backend", "onnxruntime", "--target", "cpu", "--out", "engine"], work, env)
    # The cases and gates of the wheel's calib/, and its reference record of the tiny member where this host
    # synthesizes the member as the record's host did (torch's CPU normal draws differ between CPUs: the shipped
    # record's host made 126f465f, others 8045b87); elsewhere validate makes the record from pkg.
    validated = subprocess.run([s1omni, "validate", "engine", "--package", "pkg"], cwd=work, env=env, capture_output=True, text=True, timeout=900)
    assert validated.returncode == 0, validated.stderr
    shipped = json.loads(run([str(bin_dir / "python"), "-c", SHIPPED_RECORD], work, env))
    made_here = json.loads(run([s1omni, "verify", "pkg", "--json"], work, env))["identity"]
    assert ("cases on torch" in validated.stderr) == (made_here != shipped), validated.stderr

    log = work / "serve.log"
    with log.open("wb") as out:
        server = subprocess.Popen(
            [s1omni, "serve", "--engine", "engine", "--port", "0"], cwd=work, env=env, stdout=out, stderr=subprocess.STDOUT
        )
    try:
        deadline = time.monotonic() + 300
        while not (listening := LISTENING.search(log.read_text(errors="replace"))):
            assert server.poll() is None and time.monotonic() < deadline, log.read_text(errors="replace")
            time.sleep(0.1)
        with httpx.Client(base_url=f"http://127.0.0.1:{listening.group(1)}", timeout=60) as client:
            while client.get("/health").status_code != 200:
                assert server.poll() is None and time.monotonic() < deadline, log.read_text(errors="replace")
                time.sleep(0.2)
            question = {"type": "noul", "instructions": "Does the customer ask for a refund?"}
            answered = client.post("/v1/systemone", json={"state": "Please refund me.", "questions": {"refund": question}})
            assert answered.status_code == 200, answered.text
            assert 0.0 <= answered.json()["answers"]["refund"]["noul"] <= 1.0
            assert client.get("/openapi.json").json()["openapi"] == "3.1.0"
    finally:
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=60) == 0, log.read_text(errors="replace")
