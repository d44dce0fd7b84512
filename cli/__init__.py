"""One module per ``s1omni`` subcommand, and the options several of them share."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from s1omni.runtime.errors import InputError


def add_registry(parser: argparse.ArgumentParser, written: bool = False) -> None:
    """``--registry FILE``; it must exist unless the command writes it (``written``)."""
    parser.add_argument(
        "--registry",
        metavar="FILE",
        help="extra registry file merged over the built-in members (default: $S1OMNI_REGISTRY)"
        + ("; created when absent" if written else ""),
    )
    parser.set_defaults(registry_written=written)


def check_registry(args: argparse.Namespace) -> None:
    """A registry file named by ``--registry`` or ``$S1OMNI_REGISTRY`` that is not there is an error, not an empty registry."""
    from s1omni.runtime.registry import ENVIRONMENT

    named = getattr(args, "registry", None) or os.environ.get(ENVIRONMENT)
    if named and not getattr(args, "registry_written", True) and not Path(named).is_file():
        source = "--registry" if getattr(args, "registry", None) else f"${ENVIRONMENT}"
        raise InputError(f"the registry file {named} ({source}) does not exist")


def comma_list(text: str) -> tuple[str, ...]:
    """The names of a comma-separated option value, blanks dropped."""
    return tuple(part.strip() for part in text.split(",") if part.strip())


def add_json(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the result as one JSON object on stdout (logs stay on stderr)")


def add_quiet(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress bars or progress lines on stderr")


def add_force(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--force",
        action="store_true",
        help="write --out even when it holds other files: they are kept, renamed to OUT.kept-<UTC time>",
    )


def make_room(out: str | os.PathLike[str], kind: str, force: bool) -> None:
    """Under ``--force``, move what ``out`` holds aside (never deleting it) unless it is a previous ``kind`` output."""
    if not force:
        return
    from s1omni.runtime.staging import set_aside

    kept = set_aside(out, kind)
    if kept is not None:
        print(f"kept the previous contents of {out} as {kept}", file=sys.stderr)


def emit(args: argparse.Namespace, result: dict[str, Any], text: str | None) -> None:
    """The command's result on stdout: ``text`` for a reader (None: the command has said it), or
    ``result`` as JSON under ``--json``."""
    if getattr(args, "json", False):
        print(json.dumps(result, ensure_ascii=False), file=args.stdout)
    elif text is not None:
        print(text, file=args.stdout)
