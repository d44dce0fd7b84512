"""What a Vela 2.0 decoder package holds and how its bytes are accounted for.

``config.json`` must say ``format_version`` 1 and ``model_type`` ``vela2-decoder``. The loaded files
are the config, calibration and tokenizer, the index and the sorted unique shards of its
``weight_map``, plus ``broad_head.safetensors`` and ``MODEL_MANIFEST.json`` when present. The identity
is the SHA-256 of the canonical JSON of {shard: digest} (and the broad head's)
(vllm-project/semantic-router:src/model-runtime/vllm_srun/families/vela2/package.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..digest import sha256_json
from ..errors import PackageError
from ..identity import count_parameters
from ..package import inside, read_json
from ..registry import Member, Registry

MODEL_TYPE = "vela2-decoder"
FORMAT_VERSION = 1
INDEX_FILE = "model.safetensors.index.json"
BROAD_HEAD_FILE = "broad_head.safetensors"
MANIFEST_FILE = "MODEL_MANIFEST.json"
COMMON_FILES = ("config.json", "calibration.json", "tokenizer.json")


def shard_names(root: Path) -> list[str]:
    """The weight shards: the sorted unique values of the index's ``weight_map``."""
    weight_map = read_json(root / INDEX_FILE).get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise PackageError(f"{INDEX_FILE} has no weight_map")
    shards = sorted(set(weight_map.values()))
    for shard in shards:
        if not isinstance(shard, str) or not inside(root, shard):
            raise PackageError(f"{INDEX_FILE} names {shard!r}, a path outside the package")
    return shards


class Vela2Gate:
    def detect(self, root: Path) -> bool:
        try:
            config = read_json(root / "config.json")
        except PackageError:
            return False
        return config.get("model_type") == MODEL_TYPE

    def claimed_name(self, root: Path) -> str | None:
        name = read_json(root / "config.json").get("model_name")
        return name if isinstance(name, str) and name else None

    def loaded_files(self, root: Path) -> list[str]:
        names = [*COMMON_FILES, INDEX_FILE, *shard_names(root)]
        names += [name for name in (BROAD_HEAD_FILE, MANIFEST_FILE) if (root / name).is_file()]
        return names

    def identity(self, root: Path, files: dict[str, str]) -> str:
        weights = shard_names(root) + ([BROAD_HEAD_FILE] if BROAD_HEAD_FILE in files else [])
        return sha256_json({name: files[name] for name in weights})

    def match(self, root: Path, registry: Registry) -> Member | None:
        return None  # a Vela package claims its member by config.json's model_name

    def pins(self, root: Path, member: Member, files: dict[str, str]) -> dict[str, str]:
        return member.files

    def check(self, root: Path, files: dict[str, str], member: Member) -> dict[str, Any]:
        config = read_json(root / "config.json")
        if config.get("format_version") != FORMAT_VERSION:
            raise PackageError(f"config.json format_version is {config.get('format_version')!r}, expected 1")
        layout = config.get("span_layout") or {}
        if int(layout.get("window_above", layout.get("hybrid_rmax", 2048))) != int(layout.get("hybrid_rmax", 2048)):
            raise PackageError("config.json span_layout must window exactly the targets it does not repeat")
        if not isinstance(config.get("backbone_config"), dict) or "head_dim" not in config:
            raise PackageError("config.json lacks backbone_config or head_dim")
        shards = shard_names(root)
        if MANIFEST_FILE in files:
            listed = read_json(root / MANIFEST_FILE).get("files_sha256") or {}
            stale = [name for name in shards if listed.get(name) not in (None, files[name])]
            if stale:
                raise PackageError(f"{stale[0]} differs from {MANIFEST_FILE}")
        weights = [root / name for name in shards]
        if BROAD_HEAD_FILE in files:
            weights.append(root / BROAD_HEAD_FILE)
        parameters = count_parameters(weights)
        if member.loaded_parameters is not None and parameters != member.loaded_parameters:
            raise PackageError(f"the package holds {parameters:,} parameters; {member.name} pins {member.loaded_parameters:,}")
        return {
            "config": config,
            "calibration": read_json(root / "calibration.json"),
            "shards": shards,
            "broad_head": BROAD_HEAD_FILE in files,
            "parameters": parameters,
            "manifest_sha256": files.get(MANIFEST_FILE, ""),
        }


GATE = Vela2Gate()
