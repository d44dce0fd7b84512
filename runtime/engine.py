"""Engine directories: what a built engine holds, how it is checked, and how it becomes a servable model.

```
engines/<member>/<backend>/<target>/
    prefill.* continue.*   heads.safetensors   tokenizer.json   config.json   calibration.json
    manifest.json   # member identity, source and graph hashes, backend + version, target,
                    # precision, shape profiles, the validation report and the gates it met
    (OmniJev also: vision.onnx  embedding.safetensors  preprocessor_config.json  release.json)
```

Every file an engine loads is pinned by SHA-256 in its manifest, like a package. A runner refuses an
engine built for another compute capability, library version or member revision. An engine whose
manifest does not record passed validation gates is refused unless explicitly allowed (the
validator itself loads it that way).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from .digest import sha256_file
from .errors import PackageError
from .families import family
from .package import inside, present_files
from .registry import Registry

FORMAT = "s1omni-engine/1"
MANIFEST = "manifest.json"


def read_manifest(path: str | os.PathLike[str]) -> dict[str, Any]:
    path = Path(path)
    try:
        manifest = json.loads((path / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise PackageError(f"{path} holds no readable {MANIFEST}: {exc}") from exc
    if manifest.get("format") != FORMAT:
        raise PackageError(f"{path / MANIFEST} is not an {FORMAT} manifest")
    return manifest


def read_stage(path: str | os.PathLike[str], stage: str) -> dict[str, Any]:
    """The manifest of an export (``stage`` export) or engine (``stage`` engine) directory, files checked."""
    manifest = read_manifest(path)
    if manifest.get("stage") != stage:
        raise PackageError(f"{path} is an {manifest.get('stage')} directory, not an {stage} directory")
    verify_files(Path(path), manifest)
    return manifest


def write_manifest(path: Path, manifest: dict[str, Any]) -> None:
    """Write ``manifest.json`` with every other file of ``path`` pinned (atomically replaced)."""
    pins = {name: sha256_file(path / name) for name in present_files(path) if name != MANIFEST}
    _replace_manifest(path, {**manifest, "files": pins})


def record_validation(path: Path, validation: dict[str, Any]) -> None:
    """Store a validation report in a manifest whose files were just verified (their pins stand)."""
    _replace_manifest(path, {**read_manifest(path), "validation": validation})


def _replace_manifest(path: Path, manifest: dict[str, Any]) -> None:
    manifest = {**manifest, "format": FORMAT}
    temporary = path / f".{MANIFEST}.tmp"
    temporary.write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(temporary, path / MANIFEST)


def verify_files(path: Path, manifest: dict[str, Any]) -> None:
    """Every file present is pinned by the manifest and matches its digest."""
    pinned = manifest.get("files") or {}
    for name in pinned:
        if not inside(path, name):
            raise PackageError(f"{name!r} leaves the engine directory")
    present = [name for name in present_files(path) if name != MANIFEST]
    extra = sorted(set(present) - set(pinned))
    if extra:
        raise PackageError(f"{extra[0]} is not pinned by {path / MANIFEST}")
    for name, digest in sorted(pinned.items()):
        if name not in present:
            raise PackageError(f"{name} is missing from the engine {path}")
        if sha256_file(path / name) != digest:
            raise PackageError(f"{name} differs from {path / MANIFEST}; rebuild the engine")


def validated(manifest: dict[str, Any]) -> bool:
    report = manifest.get("validation") or {}
    return bool(report.get("passed"))


def engine_runner(path: Path, manifest: dict[str, Any], device: str, embedding: Any = None):
    """The engine's backbone runner; ``embedding``: the table of a prefill taking ``inputs_embeds`` (vision members)."""
    backend = manifest.get("backend")
    if backend == "onnxruntime":
        from .runners.onnxruntime_runner import OnnxRuntimeRunner

        return OnnxRuntimeRunner(
            path,
            device=manifest.get("device", device),
            embedding=embedding,
            precision=manifest.get("precision", "fp32"),
            provider_options=manifest.get("provider_options"),
            cuda_graphs=bool(manifest.get("cuda_graphs")),
        )
    if backend == "tensorrt":
        from .runners.tensorrt_runner import TensorRtRunner

        if embedding is not None:
            raise PackageError(f"{path}: TensorRT plans of vision members are not built yet; build for onnxruntime")
        return TensorRtRunner.load(path, manifest)
    raise PackageError(f"{path / MANIFEST} names an unknown backend {backend!r}")


def load_engine_model(
    path: str | os.PathLike[str],
    registry: Registry | None = None,
    device: str = "cpu",
    allow_unvalidated: bool = False,
):
    """The member's model over the engine's runner; refuses unvalidated or altered engines."""
    path = Path(path)
    manifest = read_stage(path, "engine")
    if not allow_unvalidated and not validated(manifest):
        raise PackageError(
            f"the engine {path} has not passed validation; run `s1omni validate {path} --package PKG` first"
        )
    member = manifest["member"]
    registry = registry or Registry.load()
    known = registry.get(member["name"])
    if known is not None and known.revision != member["revision"]:
        raise PackageError(
            f"the engine {path} was built from {member['name']}@{member['revision']}, but the registry pins "
            f"{known.revision}; rebuild it with `s1omni export` and `s1omni build`"
        )
    return family(manifest.get("family")).from_engine(path, manifest, device)
