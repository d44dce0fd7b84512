"""Download a member's pinned files from the Hugging Face Hub, verify them, then move them into place."""

from __future__ import annotations

import os
from pathlib import Path

from .errors import PackageError
from .package import VerifiedPackage, verify
from .registry import Registry
from .staging import staged_directory


def fetch(registry: Registry, name: str, out: str | os.PathLike[str]) -> VerifiedPackage:
    member = registry.get(name)
    if member is None:
        raise PackageError(f"{name!r} is not in the registry (s1omni members lists it)")
    if member.synthetic or not member.files:
        raise PackageError(f"{name} has no pinned files on the Hub to fetch")
    from huggingface_hub import snapshot_download

    with staged_directory(out, "package") as stage:
        try:
            snapshot_download(
                repo_id=member.repo,
                revision=member.revision,
                allow_patterns=sorted(member.files),
                local_dir=stage,
            )
        except Exception as exc:  # noqa: BLE001 - hub, HTTP and socket errors differ by version; all mean the same here
            raise PackageError(
                f"cannot download {member.repo}@{member.revision} from the Hub ({type(exc).__name__}: {exc}); "
                "check the network or HF_ENDPOINT, or copy the files in and run s1omni verify"
            ) from exc
        cache = stage / ".cache"
        if cache.exists():  # huggingface_hub's download bookkeeping is not part of the package
            import shutil

            shutil.rmtree(cache)
        package = verify(stage, registry)
    return VerifiedPackage(Path(out), package.member, package.files, package.model_sha256, package.details)
