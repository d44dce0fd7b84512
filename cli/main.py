"""``s1omni``: one entry point for every stage. Each subcommand parses arguments and calls one function.

Exit codes: 0 done; 1 a gate missed (validate; serve's warm-up; bench's HTTP requests); 2 usage (a
wrong option or combination); 3 an input refused (a path, registry, package, engine or --out
directory); 4 the environment lacks something (a GPU, a library or an extra, an execution provider);
70 an unexpected error (a bug: the traceback is printed); 130 interrupted; 141 stdout closed early.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import os
import sys
import traceback
from typing import NoReturn

from s1omni import __version__
from s1omni.runtime.errors import EnvironmentMissing, GateMissed, InputError, UsageError

from s1omni.runtime import progress

from . import check_registry

# Subcommand -> module under s1omni.cli exposing HELP, configure(parser) and run(args) -> int.
# Modules import their heavy dependencies inside run(), so --help stays fast.
COMMANDS = ("members", "verify", "synth", "fetch", "export", "build", "validate", "serve", "bench")
EXIT_GATE_MISSED, EXIT_USAGE, EXIT_INPUT, EXIT_ENVIRONMENT, EXIT_BUG = 1, 2, 3, 4, 70
EXIT_INTERRUPTED, EXIT_BROKEN_PIPE = 130, 141  # the shell's 128 + SIGINT, 128 + SIGPIPE
# Checked in order: the first class an error is an instance of gives its code.
EXIT_CODES = (
    (GateMissed, EXIT_GATE_MISSED),
    (UsageError, EXIT_USAGE),
    (InputError, EXIT_INPUT),
    (EnvironmentMissing, EXIT_ENVIRONMENT),
    # A path that is not there, not a directory or not permitted: the input the user gave.
    ((FileNotFoundError, NotADirectoryError, IsADirectoryError, PermissionError, FileExistsError), EXIT_INPUT),
    (OSError, EXIT_ENVIRONMENT),  # a full disk, a lost device
    (ModuleNotFoundError, EXIT_ENVIRONMENT),  # an extra not installed (INSTALL_HINTS)
)
# The extra that brings a module, named when the module is missing.
INSTALL_HINTS = {
    "onnxruntime": "pip install 's1omni[cpu]', or 's1omni[gpu]' on a CUDA machine",
    "aiohttp": "pip install 's1omni[bench]'",
    "matplotlib": "pip install 's1omni[bench]'",
}
VERSION = f"s1omni {__version__}"


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(prog="s1omni", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    root.add_argument("--version", action="version", version=VERSION)
    sub = root.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"s1omni.cli.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"s1omni.cli.{name}":
                raise
            continue
        command = sub.add_parser(name, help=module.HELP, description=module.HELP)
        command.add_argument("--version", action="version", version=VERSION)
        module.configure(command)
        command.set_defaults(run=module.run)
    return root


def exit_code(error: BaseException) -> int | None:
    """The documented exit code of an error a user can act on (None: a bug)."""
    return next((code for kinds, code in EXIT_CODES if isinstance(error, kinds)), None)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    progress.configure(f"s1omni {args.command}", getattr(args, "quiet", False))
    args.stdout = sys.stdout
    # Under --json stdout carries the result alone: whatever else a stage prints goes to stderr.
    quiet_stdout = contextlib.redirect_stdout(sys.stderr) if getattr(args, "json", False) else contextlib.nullcontext()
    try:
        check_registry(args)
        with quiet_stdout:
            return int(args.run(args) or 0)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # the reader left (`s1omni members | head`): nothing more to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    except Exception as exc:  # noqa: BLE001 - every failure leaves as one line and a documented code
        code = exit_code(exc)
        if code is None:
            traceback.print_exc()
            print(f"s1omni {args.command}: internal error: {type(exc).__name__}: {exc}", file=sys.stderr)
            return EXIT_BUG
        hint = INSTALL_HINTS.get(exc.name or "") if isinstance(exc, ModuleNotFoundError) else None
        print(f"s1omni {args.command}: {exc}" + (f" ({hint})" if hint else ""), file=sys.stderr)
        return code


def entry() -> NoReturn:
    """The ``s1omni`` command: ``main``, then the process ends. What the command built is left to the
    exit rather than to the collector's last passes over every object torch and transformers made
    (``gc.freeze``): 0.9 s of an export's exit here, nothing a command's result depends on.

    A command that imports flash-linear-attention (``build --gated-delta-kernel ChunkedGatedDeltaRule`` compiles
    its kernels; ``bench`` times ``reference+fla``) loads Triton, whose nanobind bindings list their objects as
    leaked at the interpreter's teardown, a report Triton itself silences in its own workers
    (``triton/_compile_warmup_pool.py``) and that says nothing about the command: once the command's output
    is flushed, a teardown after Triton was loaded writes its stderr to /dev/null. (fla's warning that it found
    no GPU is caught where the build imports it, ``s1omni.export.fla_kernels``.)"""
    code = main()
    gc.freeze()
    if "triton" in sys.modules:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stderr.fileno())
    sys.exit(code)


if __name__ == "__main__":
    entry()
