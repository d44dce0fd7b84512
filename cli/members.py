from __future__ import annotations

import argparse

from . import add_registry

HELP = "list the member registry: name, family, repo, revision, pinned file count"


def configure(parser: argparse.ArgumentParser) -> None:
    add_registry(parser)


def run(args: argparse.Namespace) -> int:
    from s1omni.runtime.registry import Registry

    rows = [("NAME", "FAMILY", "REPO", "REVISION", "FILES")]
    for member in Registry.load(args.registry):
        count = len(member.files) or len(member.extra.get("required_outputs", []))
        rows.append((member.name, member.family, member.repo, member.revision, str(count)))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
    return 0
