from __future__ import annotations

import argparse

from . import add_force, add_quiet, add_registry, make_room

HELP = "download a member's pinned revision from the Hugging Face Hub, then verify it"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("member", metavar="MEMBER", help="registry name, e.g. Vela-2.0-4B")
    parser.add_argument("--out", required=True, metavar="DIR", help="package directory to write (replaced atomically)")
    add_force(parser)
    add_quiet(parser)
    add_registry(parser)


def run(args: argparse.Namespace) -> int:
    from s1omni.runtime.fetch import fetch
    from s1omni.runtime.registry import Registry

    make_room(args.out, "package", args.force)
    package = fetch(Registry.load(args.registry), args.member, args.out)
    print(f"ok {package.member.name}@{package.member.revision} in {args.out}")
    return 0
