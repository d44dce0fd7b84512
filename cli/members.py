from __future__ import annotations

import argparse

from . import add_json, add_registry, emit

HELP = "list the member registry: name, family, repo, revision, pinned file count"


def configure(parser: argparse.ArgumentParser) -> None:
    add_registry(parser)
    add_json(parser)


def run(args: argparse.Namespace) -> int:
    from s1omni.runtime.registry import Registry

    members = [member.to_dict() for member in Registry.load(args.registry)]
    rows = [("NAME", "FAMILY", "REPO", "REVISION", "FILES")]
    for member in members:
        count = len(member["files"]) or len(member.get("required_outputs", []))
        rows.append((member["name"], member["family"], member["repo"], member["revision"], str(count)))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    table = "\n".join("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows)
    emit(args, {"members": members}, table)
    return 0
