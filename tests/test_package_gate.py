"""The package gate, the registry and synthetic members (issue: foundation)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from s1omni.runtime.errors import PackageError
from s1omni.runtime.package import verify
from s1omni.runtime.registry import Registry
from s1omni.runtime.synth import vela2
from tests.cli import run_s1omni

PINNED_PARAMETERS = {"0.8B": 755_685_699, "4B": 4_213_980_675, "9B": 7_949_850_627}


@pytest.fixture
def package(tiny_vela: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "pkg"
    shutil.copytree(tiny_vela, copy)
    return copy


def test_verify_accepts_a_synthetic_member(tiny_vela: Path) -> None:
    verified = verify(tiny_vela)
    assert verified.member.name == "vela2-synth-tiny-s0"
    assert verified.details["parameters"] == verified.member.loaded_parameters
    result = run_s1omni("verify", str(tiny_vela))
    assert result.returncode == 0, result.stderr
    assert "vela2-synth-tiny-s0@" in result.stdout


def test_flipped_byte_in_a_shard_is_refused(package: Path) -> None:
    shard = package / "model-00001-of-00001.safetensors"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01
    shard.write_bytes(bytes(data))
    with pytest.raises(PackageError, match="model-00001-of-00001.safetensors differs"):
        verify(package)
    result = run_s1omni("verify", str(package))
    assert result.returncode != 0 and "model-00001-of-00001.safetensors" in result.stderr


def test_added_bytecode_cache_is_refused(package: Path) -> None:
    (package / "__pycache__").mkdir()
    (package / "__pycache__" / "x.pyc").write_bytes(b"\x00")
    with pytest.raises(PackageError, match=r"__pycache__/x\.pyc is not pinned"):
        verify(package)


def test_file_replaced_by_a_symlink_is_refused(package: Path, tiny_vela: Path) -> None:
    (package / "tokenizer.json").unlink()
    (package / "tokenizer.json").symlink_to(tiny_vela / "tokenizer.json")
    with pytest.raises(PackageError, match="tokenizer.json is a symbolic link"):
        verify(package)


def test_missing_calibration_is_refused(package: Path) -> None:
    (package / "calibration.json").unlink()
    with pytest.raises(PackageError, match="calibration.json is missing"):
        verify(package)


def test_unknown_model_name_is_refused_by_name(package: Path) -> None:
    config = json.loads((package / "config.json").read_text())
    config["model_name"] = "Vela-2.0-Imaginary-3B"
    (package / "config.json").write_text(json.dumps(config))
    with pytest.raises(PackageError, match="Vela-2.0-Imaginary-3B"):
        verify(package)
    result = run_s1omni("verify", str(package))
    assert result.returncode != 0 and "Vela-2.0-Imaginary-3B" in result.stderr


def test_index_naming_a_path_outside_the_package_is_refused(package: Path) -> None:
    index = json.loads((package / "model.safetensors.index.json").read_text())
    first = next(iter(index["weight_map"]))
    index["weight_map"][first] = "../elsewhere.safetensors"
    (package / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(PackageError, match="outside the package"):
        verify(package)


def test_sha256sums_mismatch_is_refused(package: Path) -> None:
    sums = (package / "SHA256SUMS").read_text().splitlines()
    digest, name = sums[0].split("  ")
    sums[0] = f"{'0' * 64}  {name}"
    (package / "SHA256SUMS").write_text("\n".join(sums) + "\n")
    with pytest.raises(PackageError, match=f"{name} differs from SHA256SUMS"):
        verify(package)


def test_members_lists_the_released_members_with_their_revisions() -> None:
    result = run_s1omni("members")
    assert result.returncode == 0, result.stderr
    expected = {
        "Vela-2.0-0.8B": "a778eb2ae2304cfa72fca7e53a19136dea5be012",
        "Vela-2.0-4B": "c1e64d4f872cb38bc58502e6888340100bab9d55",
        "Vela-2.0-9B": "bc8761637d8788619dfbaf6d8890128efe85fd40",
        "OmniJev-4B-v1.1": "ffe5f436eaf22e20e2f041f8e74e121fd057a6cb",
    }
    rows = {line.split()[0]: line.split() for line in result.stdout.splitlines()[1:]}
    for name, revision in expected.items():
        assert revision in rows[name]
    assert rows["Vela-2.0-4B"][-1] == "9"  # nine pinned files


def test_registry_pins_match_the_reference_table() -> None:
    registry = Registry.load()
    member = registry.get("Vela-2.0-4B")
    assert member is not None
    assert member.model_sha256 == "c47ee0594199d66f924c81c1664cb97a9f2cfaeb12d484c232b3d6abe67ec07b"
    assert member.files["tokenizer.json"] == "06b9509352d2af50381ab2247e083b80d32d5c0aba91c272ca9ff729b6a0e523"
    assert member.loaded_parameters == PINNED_PARAMETERS["4B"]


@pytest.mark.parametrize("size", sorted(PINNED_PARAMETERS))
def test_real_size_tensor_shapes_add_up_to_the_pinned_parameter_count(size: str) -> None:
    assert vela2.parameter_count(size) == PINNED_PARAMETERS[size]
    shapes = vela2.tensor_shapes(size)
    names = {name for group in shapes.values() for name, _ in group}
    assert {"head.scalar.weight", "set_bias", "span2.o.bias", "span_broad.slot.weight"} <= names
    assert all(name.startswith(("backbone.", "head.", "set_bias", "span2.")) for name, _ in shapes["model"])


def test_synth_is_byte_identical_for_the_same_seed(tmp_path: Path) -> None:
    first = vela2.write(tmp_path / "a", "tiny", 7)
    second = vela2.write(tmp_path / "b", "tiny", 7)
    other = vela2.write(tmp_path / "c", "tiny", 8)
    assert first.files == second.files
    for name in first.files:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    assert other.model_sha256 != first.model_sha256 and other.name != first.name


def test_synth_cli_writes_the_registry_entry(tmp_path: Path) -> None:
    registry = tmp_path / "registry.json"
    result = run_s1omni("synth", "vela2", "--size", "tiny", "--out", str(tmp_path / "m"), "--seed", "3", "--registry", str(registry))
    assert result.returncode == 0, result.stderr
    entry = json.loads(registry.read_text())["members"][0]
    assert entry["name"] == "vela2-synth-tiny-s3" and entry["synthetic"] is True
    assert verify(tmp_path / "m", Registry.load(registry)).member.name == "vela2-synth-tiny-s3"


def test_fetch_without_a_network_fails_clearly_and_leaves_nothing(tmp_path: Path) -> None:
    env = dict(os.environ, HF_ENDPOINT="http://127.0.0.1:9", HF_HUB_ETAG_TIMEOUT="2", HF_HUB_DOWNLOAD_TIMEOUT="2")
    result = subprocess.run(
        [sys.executable, "-m", "s1omni", "fetch", "Vela-2.0-0.8B", "--out", str(tmp_path / "out")],
        capture_output=True, text=True, env=env, timeout=120,
    )
    assert result.returncode != 0
    assert "cannot download vllm-sr/Vela-2.0-0.8B@a778eb2ae2304cfa72fca7e53a19136dea5be012" in result.stderr
    assert not (tmp_path / "out").exists() and not list(tmp_path.iterdir())
