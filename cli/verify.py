from __future__ import annotations

import argparse

from . import add_json, add_registry, emit

HELP = "verify a member package against its pins (every file's SHA-256, identity, parameter count)"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("package", metavar="PKG", help="package directory")
    add_registry(parser)
    add_json(parser)


def run(args: argparse.Namespace) -> int:
    from s1omni.runtime.package import verify
    from s1omni.runtime.registry import Registry

    package = verify(args.package, Registry.load(args.registry))
    member = package.member
    result = {
        "package": str(package.root),
        "member": member.name,
        "revision": member.revision,
        "family": member.family,
        "identity": package.model_sha256,
        "files": package.files,
    }
    text = f"ok {member.name}@{member.revision} ({member.family}, {len(package.files)} files, identity {package.model_sha256})"
    emit(args, result, text)
    return 0
