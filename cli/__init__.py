"""One module per ``s1omni`` subcommand."""

from __future__ import annotations

import argparse


def add_registry(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--registry",
        metavar="FILE",
        help="extra registry file merged over the built-in members (default: $S1OMNI_REGISTRY)",
    )
