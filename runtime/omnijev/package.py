"""What an OmniJev export holds and the load-time checks it must pass (omnijev.md §11.3-§11.4).

The export's own pins are its manifest, ``omnijev_export.json``: ``outputs`` maps every file
name to its SHA-256. The loaded files are therefore the manifest plus every plain name it lists;
the generic gate hashes them (streamed) and compares them with the registry member's pins.
``check`` then applies ``ThinkFlowLab/system1-omni:src/models/omnijev/native/src/export.rs``
``load`` and the worker's load checks, against the fields the registry member pins in its
``manifest`` (so a synthetic member with a small vocabulary is checked the same way):

1. every pinned manifest field is equal (format, model id, revisions, vocabulary, option tokens,
   max_pixels, heads), and the calibration has positive finite temperatures and a finite bias;
2. ``outputs`` lists config.json, heads.safetensors, model.safetensors.index.json,
   tokenizer.json and vision.safetensors;
3. every listed name is a plain file name (no ``/``, ``\\``, ``..``, not the manifest) whose
   streamed SHA-256 matches;
4. every shard of the index's ``weight_map`` is listed (an unlisted ``model.safetensors``, like any
   file the manifest does not list, is an unpinned file the generic gate refuses);
5. ``config.json``'s ``text_config.vocab_size`` (and the embedding's rows) equal the vocabulary;
6. the tokenizer maps ``<|image_pad|>``, ``<|opt|>`` and ``<|/opt|>`` to their ids, the config's
   ``image_token_id`` is the pinned one and its hidden size is the heads'.

The identity is the SHA-256 of the canonical JSON of the manifest's ``outputs`` map: what the
manifest vouches for, independent of its formatting, and (once ``check`` passed) equal to the
streamed digests. The export names no registry member, so packages are matched by identity.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from safetensors import safe_open
from tokenizers import Tokenizer

from ..digest import canonical_json, sha256_json
from ..errors import PackageError
from ..identity import count_parameters
from ..package import read_json
from ..registry import Member, Registry
from .finish import Calibration
from .layout import IMAGE_PAD, OPTION_CLOSE, OPTION_OPEN

MANIFEST = "omnijev_export.json"
INDEX = "model.safetensors.index.json"
REQUIRED_OUTPUTS = ("config.json", "heads.safetensors", INDEX, "tokenizer.json", "vision.safetensors")
LANGUAGE_PREFIX = "model.language_model."  # the base checkpoint's names, kept by the merge (inferred)
EMBEDDING = LANGUAGE_PREFIX + "embed_tokens.weight"
HEADS_INPUT = "head.opt.0.weight"


def plain_name(name: Any) -> bool:
    return isinstance(name, str) and bool(name) and not any(c in name for c in "/\\") and name not in ("..", MANIFEST)


def read_manifest(root: Path) -> dict[str, Any]:
    return read_json(root / MANIFEST)


def outputs_of(manifest: dict[str, Any]) -> dict[str, Any]:
    outputs = manifest.get("outputs")
    if not isinstance(outputs, dict):
        raise PackageError("export manifest lists no outputs")
    return outputs


def _pinned(member: Member) -> dict[str, Any]:
    pinned = member.extra.get("manifest")
    if not isinstance(pinned, dict):
        raise PackageError(f"registry entry {member.name} pins no export manifest fields")
    return pinned


def _check_pinned(manifest: dict[str, Any], member: Member) -> None:
    for key, expected in _pinned(member).items():
        # Canonical JSON, so 1 is not true and 248079.0 is not 248079.
        if canonical_json(manifest.get(key)) != canonical_json(expected):
            raise PackageError(
                f"export manifest {key} is {json.dumps(manifest.get(key))}, expected {json.dumps(expected)}"
            )


def _calibration(manifest: dict[str, Any]) -> Calibration:
    try:
        return Calibration.from_manifest(manifest.get("calibration"))
    except ValueError as exc:
        raise PackageError(str(exc)) from None


def _check_outputs(outputs: dict[str, Any], files: dict[str, str], member: Member) -> None:
    for name in member.extra.get("required_outputs", REQUIRED_OUTPUTS):
        if name not in outputs:
            raise PackageError(f"export manifest does not list {name}")
    for name, digest in outputs.items():
        if not plain_name(name):
            raise PackageError(f"export manifest lists an invalid file name {name!r}")
        if not isinstance(digest, str):
            raise PackageError("export manifest hashes must be strings")
        if files.get(name) != digest:
            raise PackageError(f"{name} does not match the export manifest")


def _shards(root: Path, outputs: dict[str, Any]) -> list[str]:
    weight_map = read_json(root / INDEX).get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise PackageError(f"{INDEX} has no weight_map")
    shards = sorted(set(weight_map.values()), key=str)
    for shard in shards:
        if not isinstance(shard, str):
            raise PackageError("weight_map values must be file names")
        if shard not in outputs:
            raise PackageError(f"export manifest does not list {shard}")
    return shards


def _shape(path: Path, name: str) -> list[int]:
    with safe_open(str(path), framework="numpy") as handle:
        if name not in handle.keys():  # noqa: SIM118 - safe_open is not iterable
            raise PackageError(f"{path.name} lacks {name}")
        return list(handle.get_slice(name).get_shape())


def _check_config(
    root: Path, config: dict[str, Any], manifest: dict[str, Any], shards: list[str], member: Member
) -> None:
    text = config.get("text_config")
    if not isinstance(text, dict) or not isinstance(config.get("vision_config"), dict):
        raise PackageError("config.json lacks text_config or vision_config")
    vocabulary = manifest["vocabulary"]
    if text.get("vocab_size") != vocabulary:
        raise PackageError(f"config.json vocabulary is {text.get('vocab_size')}, expected {vocabulary}")
    shard = read_json(root / INDEX)["weight_map"].get(EMBEDDING)
    if shard not in shards:
        raise PackageError(f"{INDEX} does not map {EMBEDDING}")
    rows = _shape(root / shard, EMBEDDING)[0]
    if rows != vocabulary:
        raise PackageError(f"the embedding has {rows} rows, expected the vocabulary's {vocabulary}")
    if config.get("image_token_id") != member.extra.get("image_token_id"):
        raise PackageError(
            f"config.json image_token_id is {config.get('image_token_id')}, expected {member.extra.get('image_token_id')}"
        )
    heads_hidden = _shape(root / "heads.safetensors", HEADS_INPUT)[1]
    if text.get("hidden_size") != heads_hidden:
        raise PackageError(
            f"config.json hidden size {text.get('hidden_size')} does not match the heads' {heads_hidden}"
        )


def _check_tokenizer(root: Path, config: dict[str, Any], manifest: dict[str, Any]) -> None:
    try:
        tokenizer = Tokenizer.from_file(str(root / "tokenizer.json"))
    except Exception as exc:  # noqa: BLE001 - tokenizers raises its own Exception type
        raise PackageError(f"tokenizer.json does not load: {exc}") from None
    expected = {IMAGE_PAD: config["image_token_id"], **manifest["option_tokens"]}
    for text in (IMAGE_PAD, OPTION_OPEN, OPTION_CLOSE):
        if tokenizer.token_to_id(text) != expected[text]:
            raise PackageError(f"tokenizer does not map {text} to {expected[text]}")


class OmniJevGate:
    def detect(self, root: Path) -> bool:
        return (root / MANIFEST).is_file()

    def claimed_name(self, root: Path) -> str | None:
        return None  # the manifest names the release, not a registry member: matched by identity

    def loaded_files(self, root: Path) -> list[str]:
        # Names that are not plain are left to ``check``, which refuses them by name.
        return [MANIFEST, *sorted(name for name in outputs_of(read_manifest(root)) if plain_name(name))]

    def identity(self, root: Path, files: dict[str, str]) -> str:
        return sha256_json(outputs_of(read_manifest(root)))

    def match(self, root: Path, registry: Registry) -> Member | None:
        """The release the manifest declares (``model_id`` at ``checkpoint_revision``), when it is registered."""
        manifest = read_manifest(root)
        declared = (manifest.get("model_id"), manifest.get("checkpoint_revision"))
        candidates = [m for m in registry if m.family == "omnijev" and not m.synthetic and (m.repo, m.revision) == declared]
        return candidates[0] if candidates else None

    def pins(self, root: Path, member: Member, files: dict[str, str]) -> dict[str, str]:
        """A member pinned file by file keeps its pins; a release pinned by its manifest fields is
        pinned by the export's own manifest (whose fields ``check`` then compares with the registry)."""
        if member.files:
            return member.files
        outputs = outputs_of(read_manifest(root))
        return {**{name: digest for name, digest in outputs.items() if plain_name(name)}, MANIFEST: files[MANIFEST]}

    def check(self, root: Path, files: dict[str, str], member: Member) -> dict[str, Any]:
        # In the reference's order: the manifest and files, then what the worker reads at load.
        manifest = read_manifest(root)
        _check_pinned(manifest, member)
        outputs = outputs_of(manifest)
        _check_outputs(outputs, files, member)
        shards = _shards(root, outputs)
        config = read_json(root / "config.json")
        _check_config(root, config, manifest, shards, member)
        calibration = _calibration(manifest)
        _check_tokenizer(root, config, manifest)
        parameters = count_parameters([root / name for name in (*shards, "vision.safetensors", "heads.safetensors")])
        if member.loaded_parameters is not None and parameters != member.loaded_parameters:
            raise PackageError(
                f"the package holds {parameters:,} parameters; {member.name} pins {member.loaded_parameters:,}"
            )
        return {
            "manifest": manifest,
            "config": config,
            "calibration": calibration,
            "shards": shards,
            "parameters": parameters,
            "manifest_sha256": files[MANIFEST],
        }


GATE = OmniJevGate()
