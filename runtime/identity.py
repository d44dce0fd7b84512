"""What every family reports about a member: its identity (the card's and the manifests' ``member``)
and its parameter count, read from the safetensors headers."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from safetensors import safe_open

from .package import VerifiedPackage


@dataclass(frozen=True)
class Identity:
    """What the card and ``meta`` report about the member and its engine."""

    name: str
    repo: str
    revision: str
    model_sha256: str
    manifest_sha256: str
    licence: str
    parameters: int
    synthetic: bool


def identity_of(package: VerifiedPackage) -> Identity:
    member = package.member
    return Identity(
        name=member.name,
        repo=member.repo,
        revision=member.revision,
        model_sha256=package.model_sha256,
        manifest_sha256=package.details["manifest_sha256"],
        licence=member.licence,
        parameters=package.details["parameters"],
        synthetic=member.synthetic,
    )


def count_parameters(paths: list[Path]) -> int:
    """Elements of every tensor in the safetensors files, read from their headers only."""
    total = 0
    for path in paths:
        with safe_open(str(path), framework="numpy") as handle:
            for name in handle.keys():  # noqa: SIM118 - safe_open is not iterable
                count = 1
                for size in handle.get_slice(name).get_shape():
                    count *= size
                total += count
    return total
