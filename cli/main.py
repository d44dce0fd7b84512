"""``s1omni``: one entry point for every stage. Each subcommand parses arguments and calls one function."""

from __future__ import annotations

import argparse
import importlib
import sys

from s1omni.runtime.errors import PackageError

# Subcommand -> module under s1omni.cli exposing HELP, configure(parser) and run(args) -> int.
# Modules import their heavy dependencies inside run(), so --help stays fast.
COMMANDS = ("members", "verify", "synth", "fetch", "export", "build", "validate", "serve", "bench")


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(prog="s1omni", description=__doc__)
    sub = root.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"s1omni.cli.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"s1omni.cli.{name}":
                raise
            continue
        command = sub.add_parser(name, help=module.HELP, description=module.HELP)
        module.configure(command)
        command.set_defaults(run=module.run)
    return root


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return int(args.run(args) or 0)
    except PackageError as exc:
        print(f"s1omni {args.command}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
