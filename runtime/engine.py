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
manifest does not record a passed validation is refused unless explicitly allowed (the validator
itself loads it that way), and so is one validated under another gate than its precision and device
call for (``engine_gate``), another version or rule of that gate (``calib/<family>/gates.json``), or
another validator version (``VALIDATOR_VERSION``): each asks for validation again.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from s1omni.calib import CALIB

from .digest import pinned_sha256, sha256_files
from .errors import PackageError
from .families import family
from .host_memory import keep_freed_memory
from .package import inside, present_files
from .registry import Registry

FORMAT = "s1omni-engine/1"
MANIFEST = "manifest.json"
# The validator's checks: raised whenever what they hold an engine to changes (2: failures fail every
# gate, tensors per case, the tie rule, gpu-reduced against the BF16 reference).
VALIDATOR_VERSION = 2
# What a manifest says of how its engine was built: reported by ``s1omni build --json``, carried by benchmark
# records and by validation reports, so that each names the build it describes.
BUILD_KEYS = (
    "backend", "target", "device", "precision", "recurrence", "gated_delta_kernel", "gated_delta_inputs", "op_fusion",
    "merged_projections", "fused_mixers", "bf16_convolutions", "fused_silu", "fused_residual_norms", "fused_short_convolutions", "fused_convolution_heads", "fused_delta_gates", "fused_output_norms", "fused_head_rotary", "fused_attention", "attention_inputs", "cuda_graphs", "vision_cuda_graphs",
    "gated_delta_library", "library", "library_version", "provider_options",
)  # fmt: skip


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
    """Write ``manifest.json`` with every other file of ``path`` pinned (atomically replaced); a file this
    process wrote and hashed as it wrote it is pinned with that digest (``runtime.digest.pinned_sha256``)."""
    names = [name for name in present_files(path) if name != MANIFEST]
    pins = dict(zip(names, pinned_sha256([path / name for name in names]), strict=True))
    _replace_manifest(path, {**manifest, "files": pins})


def build_facts(manifest: dict[str, Any]) -> dict[str, Any]:
    """The manifest's ``BUILD_KEYS`` (None where an older build did not record one)."""
    return {key: manifest.get(key) for key in BUILD_KEYS}


def files_digest(manifest: dict[str, Any]) -> str:
    """One SHA-256 over the pinned files' names and digests: two engines share it only if every file is the same."""
    pinned = json.dumps(sorted((manifest.get("files") or {}).items()), separators=(",", ":"))
    return hashlib.sha256(pinned.encode("utf-8")).hexdigest()


def engine_identity(manifest: dict[str, Any]) -> dict[str, Any]:
    """What a check's report names as the engine it judged: the member, one digest of the pinned files, the build."""
    return {"member": manifest["member"]["name"], "files_sha256": files_digest(manifest), **build_facts(manifest)}


def record_validation(path: Path, validation: dict[str, Any]) -> None:
    """Store a validation report in a manifest whose files were just verified (their pins stand)."""
    _replace_manifest(path, {**read_manifest(path), "validation": validation})


def record_consent(path: Path, consent: dict[str, Any]) -> None:
    """Store a reduced copy's consent (``s1omni.runtime.reduced_copy``) in a manifest whose files were just verified."""
    _replace_manifest(path, {**read_manifest(path), "consent": consent})


def record_check(path: Path, check: str, verdict: dict[str, Any]) -> None:
    """Store the verdict on the engine's merged, merged packed or packed forwards (``check``: merged, merged_packed,
    shared_context) against its forwards alone (``s1omni.export.merged_check``)."""
    _replace_manifest(path, {**read_manifest(path), check: verdict})


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
    names = sorted(pinned)
    for name in names:
        if name not in present:
            raise PackageError(f"{name} is missing from the engine {path}")
    for name, actual in zip(names, sha256_files([path / name for name in names]), strict=True):
        if actual != pinned[name]:
            raise PackageError(f"{name} differs from {path / MANIFEST}; rebuild the engine")


def engine_gate(manifest: dict[str, Any]) -> str:
    """The gate an engine is held to: ``cpu-fp32`` (float32 on the CPU), ``gpu`` (float32 on CUDA) or
    ``gpu-reduced`` (any other precision: bf16, tf32, fp16, fp8, mixed)."""
    precision = manifest.get("precision", "fp32")
    if precision != "fp32":
        return "gpu-reduced"
    return "cpu-fp32" if manifest.get("device", "cpu") == "cpu" else "gpu"


def current_gate(manifest: dict[str, Any]) -> dict[str, Any]:
    """The gate an engine is held to now, as the validator records it: its name and its entry in the family's gates."""
    name = engine_gate(manifest)
    gates = json.loads((CALIB / str(manifest.get("family")) / "gates.json").read_text(encoding="utf-8"))
    return {"name": name, **gates[name]}


def validation_problem(manifest: dict[str, Any]) -> str | None:
    """Why the manifest's validation does not stand (None when it does)."""
    report = manifest.get("validation") or {}
    if not report.get("passed"):
        return "has not passed validation"
    if report.get("validator_version") != VALIDATOR_VERSION:
        return f"was validated by validator version {report.get('validator_version')}, not the current {VALIDATOR_VERSION}"
    recorded, current = report.get("gate") or {}, current_gate(manifest)
    if recorded.get("name") != current["name"]:
        return f"passed the {recorded.get('name')} gate, but its precision and device call for {current['name']}"
    if recorded != current:
        return (f"was validated against version {recorded.get('version')} of the {current['name']} gate, which has changed "
                f"since (its bounds or rule; now version {current['version']})")  # fmt: skip
    return None


def validated(manifest: dict[str, Any]) -> bool:
    return validation_problem(manifest) is None


def served_validation(manifest: dict[str, Any]) -> dict[str, Any]:
    """What a served engine's card says of its numerics: the gate it met, and ``approximate`` for reduced precision."""
    report = manifest["validation"]
    gate = report["gate"]
    return {
        "numerics": "approximate" if gate["name"] == "gpu-reduced" else "exact",
        "gate": gate["name"],
        "gate_version": gate["version"],
        "rule": gate["rule"],
        "validator_version": report["validator_version"],
    }


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
    """The member's model over the engine's runner; refuses unvalidated or altered engines. The process keeps
    freed host memory from here on (``host_memory.keep_freed_memory``)."""
    keep_freed_memory()
    path = Path(path)
    manifest = read_stage(path, "engine")
    face = family(manifest.get("family"))  # an unknown family before its gates are looked for
    problem = None if allow_unvalidated else validation_problem(manifest)
    if problem:
        raise PackageError(f"the engine {path} {problem}; run `s1omni validate {path} --package PKG` first")
    member = manifest["member"]
    registry = registry or Registry.load()
    known = registry.get(member["name"])
    if known is not None and known.revision != member["revision"]:
        raise PackageError(
            f"the engine {path} was built from {member['name']}@{member['revision']}, but the registry pins "
            f"{known.revision}; rebuild it with `s1omni export` and `s1omni build`"
        )
    model = face.from_engine(path, manifest, device)
    if "shared_context" in manifest:  # the verdict Vela 2.0's shared_context is served on
        model.packed_check = manifest["shared_context"]
    if "merged_packed" in manifest:  # the verdict batching packs its forwards on
        model.merged_packed_check = manifest["merged_packed"]
    if not allow_unvalidated:
        model.validation = served_validation(manifest)  # for its card
    return model
