"""The OmniJev package gate on the tiny synthetic export: each load-time check of omnijev.md §11.4.

Two ways in. Tampering with a registered package trips the generic pins first (a changed,
missing or extra file). The export's own rules matter for an export whose pins are its
manifest: those cases re-register the edited package (every file pinned as it now is, with the
original member's pinned manifest fields), so only the OmniJev checks stand between it and loading.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from s1omni.runtime.digest import sha256_file, sha256_json
from s1omni.runtime.errors import PackageError
from s1omni.runtime.package import present_files, verify
from s1omni.runtime.registry import Member, Registry

MANIFEST = "omnijev_export.json"
SHARD = "model-00001-of-00001.safetensors"


@pytest.fixture
def package(omnijev_package: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "pkg"
    shutil.copytree(omnijev_package, copy)
    return copy


def read(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def write(path: Path, value: Any) -> None:
    path.write_text(json.dumps(value))


def rehash(root: Path, *names: str) -> None:
    """Update the manifest's digests of ``names`` (an export that vouches for its edited files)."""
    manifest = read(root / MANIFEST)
    for name in names:
        manifest["outputs"][name] = sha256_file(root / name)
    write(root / MANIFEST, manifest)


def edit_manifest(root: Path, change: Callable[[dict[str, Any]], None]) -> None:
    manifest = read(root / MANIFEST)
    change(manifest)
    write(root / MANIFEST, manifest)


def registered(root: Path, base: Member, **changes: Any) -> Registry:
    """A registry in which the package at ``root`` is pinned exactly as it now is."""
    files = {name: sha256_file(root / name) for name in present_files(root)}
    identity = sha256_json(read(root / MANIFEST)["outputs"])
    member = dataclasses.replace(base, files=files, model_sha256=identity, manifest_sha256=files[MANIFEST], **changes)
    return Registry({member.name: member})


def refusal(root: Path, registry: Registry | None = None) -> str:
    with pytest.raises(PackageError) as error:
        verify(root, registry)
    return str(error.value)


# ----------------------------------------------------------------------------- accepted


def test_the_synthetic_export_verifies(omnijev_member) -> None:
    root, member = omnijev_member
    verified = verify(root)
    assert verified.member.name == member.name == "omnijev-synth-tiny-s0"
    assert verified.family == "omnijev"
    assert verified.model_sha256 == member.model_sha256 == sha256_json(read(root / MANIFEST)["outputs"])
    assert verified.details["parameters"] == member.loaded_parameters
    assert verified.details["shards"] == [SHARD]
    assert verified.details["calibration"].temperatures == {"noul": 1.1991, "choice": 1.1199, "score": 1.1909}
    assert set(verified.files) == set(read(root / MANIFEST)["outputs"]) | {MANIFEST}


def test_the_released_member_pins_the_documented_manifest() -> None:
    member = Registry.load().get("OmniJev-4B-v1.1")
    assert member is not None and member.family == "omnijev"
    assert member.extra["manifest"] == {
        "format": "omnijev-merged/1",
        "model_id": "tinnel123/OmniJev",
        "checkpoint_revision": "ffe5f436eaf22e20e2f041f8e74e121fd057a6cb",
        "base_revision": "851bf6e806efd8d0a36b00ddf55e13ccb7b8cd0a",
        "vocabulary": 248079,
        "option_tokens": {"<|opt|>": 248077, "<|/opt|>": 248078},
        "max_pixels": 602112,
        "heads": {"norm": "softmax", "lm_features": True, "ordinal": True},
    }
    assert member.extra["image_token_id"] == 248056


# ----------------------------------------------------------------------------- the generic pins


def test_a_changed_file_is_refused(package: Path) -> None:
    with (package / "vision.safetensors").open("ab") as handle:
        handle.write(b"\0")
    assert "vision.safetensors differs" in refusal(package)


def test_a_missing_file_is_refused(package: Path) -> None:
    (package / "heads.safetensors").unlink()
    assert refusal(package) == "heads.safetensors is missing"


def test_an_unpinned_extra_file_is_refused(package: Path) -> None:
    (package / "__pycache__").mkdir()
    (package / "__pycache__" / "x.pyc").write_bytes(b"")
    assert "__pycache__/x.pyc is not pinned" in refusal(package)


def test_a_symbolic_link_is_refused(package: Path) -> None:
    (package / "vision.safetensors").unlink()
    os.symlink(package / "heads.safetensors", package / "vision.safetensors")
    assert "symbolic link" in refusal(package)


def test_an_export_of_no_registered_member_is_refused(package: Path) -> None:
    edit_manifest(package, lambda m: m["outputs"].update({"config.json": "0" * 64}))
    assert "match no registry entry" in refusal(package)


# ----------------------------------------------------------------------------- the export's rules


PINNED_EDITS = [
    ("format", "omnijev-merged/2"),
    ("model_id", "tinnel123/OmniJev"),
    ("checkpoint_revision", "main"),
    ("base_revision", "851bf6e806efd8d0a36b00ddf55e13ccb7b8cd0a"),
    ("vocabulary", 248320),
    ("vocabulary", 2083.0),
    ("option_tokens", {"<|opt|>": 2082, "<|/opt|>": 2081}),
    ("max_pixels", 401408),
    ("heads", {"norm": "sigmoid", "lm_features": True, "ordinal": True}),
    ("heads", {"norm": "softmax", "lm_features": 1, "ordinal": True}),
]


@pytest.mark.parametrize(("key", "value"), PINNED_EDITS)
def test_every_pinned_manifest_field_must_be_equal(package: Path, omnijev_member, key: str, value: Any) -> None:
    edit_manifest(package, lambda m: m.update({key: value}))
    assert f"export manifest {key} is {json.dumps(value)}, expected" in refusal(
        package, registered(package, omnijev_member[1])
    )


def test_a_missing_pinned_field_is_refused(package: Path, omnijev_member) -> None:
    edit_manifest(package, lambda m: m.pop("max_pixels"))
    assert "export manifest max_pixels is null, expected 602112" in refusal(
        package, registered(package, omnijev_member[1])
    )


@pytest.mark.parametrize(
    ("calibration", "reason"),
    [
        ({"temperatures": {"noul": 0.0, "choice": 1.0, "score": 1.0}, "noul_bias": 0.0}, "temperatures"),
        ({"temperatures": {"noul": 1.0, "choice": -1.0, "score": 1.0}, "noul_bias": 0.0}, "temperatures"),
        ({"temperatures": {"noul": 1.0, "choice": 1.0, "score": 1.0, "set": 1.0}, "noul_bias": 0.0}, "temperatures"),
        ({"temperatures": {"noul": 1.0, "choice": 1.0, "score": 1.0}}, "noul_bias"),
        ({"temperatures": {"noul": 1.0, "choice": 1.0, "score": 1.0}, "noul_bias": float("nan")}, "noul_bias"),
        ({"temperatures": {"noul": 1.0, "choice": 1.0, "score": float("inf")}, "noul_bias": 0.0}, "temperatures"),
    ],
)
def test_calibration_must_be_positive_and_finite(package: Path, omnijev_member, calibration: dict, reason: str) -> None:
    edit_manifest(package, lambda m: m.update(calibration=calibration))
    assert reason in refusal(package, registered(package, omnijev_member[1]))


@pytest.mark.parametrize(
    "name", ["config.json", "heads.safetensors", "model.safetensors.index.json", "tokenizer.json", "vision.safetensors"]
)
def test_outputs_must_list_every_file_the_worker_reads(package: Path, omnijev_member, name: str) -> None:
    edit_manifest(package, lambda m: m["outputs"].pop(name))
    (package / name).unlink()  # a file the manifest does not list is never pinned
    assert f"export manifest does not list {name}" in refusal(package, registered(package, omnijev_member[1]))


@pytest.mark.parametrize("name", ["../config.json", "sub/config.json", "sub\\config.json", "..", MANIFEST, ""])
def test_outputs_must_be_plain_file_names(package: Path, omnijev_member, name: str) -> None:
    edit_manifest(package, lambda m: m["outputs"].update({name: "00"}))
    assert f"export manifest lists an invalid file name {name!r}" in refusal(
        package, registered(package, omnijev_member[1])
    )


def test_output_digests_must_be_strings(package: Path, omnijev_member) -> None:
    edit_manifest(package, lambda m: m["outputs"].update({"preprocessor_config.json": None}))
    assert "export manifest hashes must be strings" in refusal(package, registered(package, omnijev_member[1]))


def test_each_output_must_match_its_streamed_digest(package: Path, omnijev_member) -> None:
    with (package / "vision.safetensors").open("ab") as handle:
        handle.write(b"\0")  # the file changes; the manifest still holds the old digest
    assert "vision.safetensors does not match the export manifest" in refusal(
        package, registered(package, omnijev_member[1])
    )


def test_every_index_shard_must_be_listed(package: Path, omnijev_member) -> None:
    edit_manifest(package, lambda m: m["outputs"].pop(SHARD))
    (package / SHARD).unlink()
    assert f"export manifest does not list {SHARD}" in refusal(package, registered(package, omnijev_member[1]))


def test_an_unlisted_model_safetensors_is_refused(package: Path) -> None:
    shutil.copy(package / SHARD, package / "model.safetensors")
    assert "model.safetensors is not pinned" in refusal(package)


def edit_config(root: Path, change: Callable[[dict[str, Any]], None]) -> None:
    config = read(root / "config.json")
    change(config)
    write(root / "config.json", config)
    rehash(root, "config.json")


def test_the_config_vocabulary_must_be_the_manifests(package: Path, omnijev_member) -> None:
    edit_config(package, lambda c: c["text_config"].update(vocab_size=248320))
    assert "config.json vocabulary is 248320, expected 2083" in refusal(package, registered(package, omnijev_member[1]))


def test_the_embedding_must_have_the_vocabularys_rows(package: Path, omnijev_member) -> None:
    edit_config(package, lambda c: c["text_config"].update(vocab_size=2084))
    edit_manifest(package, lambda m: m.update(vocabulary=2084))
    pins = {**omnijev_member[1].extra, "manifest": {**omnijev_member[1].extra["manifest"], "vocabulary": 2084}}
    assert "the embedding has 2083 rows, expected the vocabulary's 2084" in refusal(
        package, registered(package, omnijev_member[1], extra=pins)
    )


def test_the_config_image_token_must_be_pinned(package: Path, omnijev_member) -> None:
    edit_config(package, lambda c: c.update(image_token_id=248056))
    assert "config.json image_token_id is 248056, expected 2060" in refusal(
        package, registered(package, omnijev_member[1])
    )


def test_the_hidden_size_must_be_the_heads(package: Path, omnijev_member) -> None:
    edit_config(package, lambda c: c["text_config"].update(hidden_size=2560))
    assert "config.json hidden size 2560 does not match the heads' 64" in refusal(
        package, registered(package, omnijev_member[1])
    )


@pytest.mark.parametrize(
    ("token", "renamed"), [("<|image_pad|>", "<|image_pat|>"), ("<|opt|>", "<|option|>"), ("<|/opt|>", "<|/option|>")]
)
def test_the_tokenizer_must_map_the_special_tokens(package: Path, omnijev_member, token: str, renamed: str) -> None:
    path = package / "tokenizer.json"
    path.write_text(path.read_text().replace(json.dumps(token), json.dumps(renamed)))
    rehash(package, "tokenizer.json")
    ids = {"<|image_pad|>": 2060, "<|opt|>": 2081, "<|/opt|>": 2082}
    assert f"tokenizer does not map {token} to {ids[token]}" in refusal(package, registered(package, omnijev_member[1]))


def test_the_parameter_count_must_be_the_pinned_one(package: Path, omnijev_member) -> None:
    base = omnijev_member[1]
    message = refusal(package, registered(package, base, loaded_parameters=base.loaded_parameters + 1))
    assert f"the package holds {base.loaded_parameters:,} parameters" in message


def test_a_member_without_pinned_manifest_fields_is_refused(package: Path, omnijev_member) -> None:
    extra = {k: v for k, v in omnijev_member[1].extra.items() if k != "manifest"}
    assert "pins no export manifest fields" in refusal(package, registered(package, omnijev_member[1], extra=extra))


# ----------------------------------------------------------------------------- a release pinned by its manifest


def _release(root: Path, base: Member) -> Registry:
    """A registry whose non-synthetic release pins only manifest fields (no file digests), as the
    real OmniJev-4B-v1.1 entry does, and an export that declares that release."""
    edit_manifest(root, lambda m: m.update(model_id="example/OmniJev-private", checkpoint_revision="0" * 40))
    pinned = {**base.extra["manifest"], "model_id": "example/OmniJev-private", "checkpoint_revision": "0" * 40}
    release = dataclasses.replace(
        base, name="OmniJev-private", repo="example/OmniJev-private", revision="0" * 40, files={},
        model_sha256="", manifest_sha256="", synthetic=False, extra={**base.extra, "manifest": pinned},
    )  # fmt: skip
    return Registry({release.name: release})


def test_an_export_declaring_a_registered_release_is_matched_by_its_manifest(package: Path, omnijev_member) -> None:
    registry = _release(package, omnijev_member[1])
    verified = verify(package, registry)
    assert verified.member.name == "OmniJev-private"
    assert set(verified.files) == {MANIFEST, *read(package / MANIFEST)["outputs"]}


def test_a_release_pinned_by_its_manifest_still_refuses_a_changed_file(package: Path, omnijev_member) -> None:
    registry = _release(package, omnijev_member[1])
    (package / "tokenizer.json").write_text((package / "tokenizer.json").read_text() + " ")
    assert "tokenizer.json differs" in refusal(package, registry)
    (package / "stray.bin").write_bytes(b"x")
    assert "stray.bin is not pinned" in refusal(package, registry)
