"""Every documented exit code of ``s1omni``, each from a run a user could make, with its one-line message;
``--version`` everywhere and ``--json`` results on stdout alone."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from s1omni import __version__
from s1omni.cli.main import COMMANDS, main
from tests.cli import run_s1omni, s1omni


def last_line(result) -> str:
    return result.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize("command", ["", *COMMANDS])
def test_version_answers_on_every_command(command: str) -> None:
    result = s1omni(*filter(None, [command, "--version"]))
    assert result.stdout.strip() == f"s1omni {__version__}"


def test_members_json_is_the_registry_and_stdout_holds_nothing_else(tiny_vela: Path) -> None:
    data = json.loads(s1omni("members", "--json").stdout)
    names = {member["name"]: member for member in data["members"]}
    assert "Vela-2.0-0.8B" in names and names["vela2-synth-tiny-s0"]["family"] == "vela2"
    assert names["vela2-synth-tiny-s0"]["files"]["config.json"]  # every pin, by name
    text = s1omni("members").stdout
    assert text.startswith("NAME") and "vela2-synth-tiny-s0" in text


def test_verify_json(tiny_vela: Path) -> None:
    data = json.loads(s1omni("verify", str(tiny_vela), "--json").stdout)
    assert data["member"] == "vela2-synth-tiny-s0" and data["family"] == "vela2" and "tokenizer.json" in data["files"]


def test_0_and_json_on_build_then_3_for_a_path_that_is_no_export(exported: Path, tmp_path: Path) -> None:
    result = s1omni("build", str(exported), "--backend", "onnxruntime", "--target", "cpu", "--out", str(tmp_path / "e"), "--json")
    data = json.loads(result.stdout)  # progress lines went to stderr
    assert data["engine"] == str(tmp_path / "e") and (data["backend"], data["target"], data["precision"]) == ("onnxruntime", "cpu", "fp32")
    assert data["member"]["name"] == "vela2-synth-tiny-s0"
    refused = run_s1omni("build", str(tmp_path), "--backend", "onnxruntime", "--target", "cpu", "--out", str(tmp_path / "f"))
    assert refused.returncode == 3 and last_line(refused).startswith("s1omni build: ") and "manifest.json" in refused.stderr
    assert "Traceback" not in refused.stderr


def test_2_for_usage(tmp_path: Path) -> None:
    wrong_size = run_s1omni("synth", "vela2", "--size", "77B", "--out", str(tmp_path / "m"))
    assert wrong_size.returncode == 2 and last_line(wrong_size) == "s1omni synth: vela2 sizes are tiny, 0.8B, 4B, 9B"
    assert not (tmp_path / "m").exists()
    assert run_s1omni("members", "--no-such-flag").returncode == 2  # argparse's own refusals are usage too


def test_3_for_a_registry_file_that_is_not_there(tiny_vela: Path, tmp_path: Path) -> None:
    missing = tmp_path / "nope.json"
    for args in (["members"], ["verify", str(tiny_vela)]):
        result = run_s1omni(*args, "--registry", str(missing))
        assert result.returncode == 3 and last_line(result).endswith(f"the registry file {missing} (--registry) does not exist")
    result = run_s1omni("members", env={"S1OMNI_REGISTRY": str(missing)})
    assert result.returncode == 3 and "($S1OMNI_REGISTRY) does not exist" in result.stderr


def test_3_for_a_package_the_gate_refuses(tiny_vela: Path, tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    shutil.copytree(tiny_vela, package)
    (package / "notes.txt").write_text("mine", encoding="utf-8")
    result = run_s1omni("verify", str(package))
    assert result.returncode == 3 and last_line(result) == "s1omni verify: notes.txt is not pinned for vela2-synth-tiny-s0; packages hold only pinned files"


def test_4_when_the_machine_lacks_a_gpu(tiny_vela: Path, tmp_path: Path) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is visible: nothing is missing")
    result = run_s1omni("bench", "--package", str(tiny_vela), "--device", "cuda", "--workloads", "backbone", "--tokens", "8",
                        "--requests", "1", "--warmup", "0", "--out", str(tmp_path / "record"))  # fmt: skip
    assert result.returncode == 4, result.stderr
    assert last_line(result).startswith("s1omni bench: device cuda: torch") and "sees no CUDA GPU" in result.stderr


def test_4_names_the_extra_a_missing_module_comes_with(
    tiny_vela: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """In process, with aiohttp made unimportable (as in a serve-only install) and the bench modules unloaded."""
    import s1omni.bench

    monkeypatch.setitem(sys.modules, "aiohttp", None)
    for name in [name for name in sys.modules if name.startswith("s1omni.bench")]:
        monkeypatch.delitem(sys.modules, name)
    # main's import binds a new s1omni.bench to the package: the old one goes back with its modules, or a later
    # test reaching s1omni.bench.stats through the package finds the new one, which never got that far.
    monkeypatch.setattr(s1omni, "bench", s1omni.bench)
    assert main(["bench", "--package", str(tiny_vela), "--out", str(tmp_path / "record")]) == 4
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("s1omni bench: ") and "aiohttp" in last and last.endswith("(pip install 's1omni[bench]')")


def test_1_when_an_engine_misses_its_gate(cpu_engine: Path, tiny_vela: Path, tmp_path: Path) -> None:
    """One calibration case against a reference record made now, then against the same record with one
    probability moved: the engine (a copy of the session's, whose manifest validation changes) meets the
    cpu-fp32 gate, then misses it."""
    engine, reference, cases = tmp_path / "engine", tmp_path / "reference", tmp_path / "cases.json"
    all_cases = json.loads((Path(__file__).parent.parent / "calib" / "vela2" / "cases.json").read_text(encoding="utf-8"))
    cases.write_text(json.dumps({**all_cases, "cases": [all_cases["cases"][0]]}), encoding="utf-8")
    shutil.copytree(cpu_engine, engine)
    args = ("validate", str(engine), "--cases", str(cases), "--reference", str(reference), "--json")
    passed = s1omni(*args, "--package", str(tiny_vela))
    report = json.loads(passed.stdout)
    assert report["passed"] and report["gate"]["name"] == "cpu-fp32" and report["cases"] == 1
    saved = reference / "cpu-fp32" / "answers.json"  # the float32 CPU record under --reference
    record = json.loads(saved.read_text(encoding="utf-8"))
    answers = record["cases"][0]["response"]["answers"]
    noul = next(name for name, answer in answers.items() if answer["type"] == "noul")
    answers[noul]["noul"] = 1.0 - answers[noul]["noul"]
    saved.write_text(json.dumps(record), encoding="utf-8")
    missed = run_s1omni(*args)
    assert missed.returncode == 1, missed.stderr
    assert json.loads(missed.stdout)["passed"] is False  # the result on stdout, the table moved to stderr
    assert last_line(missed) == f"s1omni validate: {engine} missed the cpu-fp32 gate; it will not be served"
