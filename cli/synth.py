from __future__ import annotations

import argparse

from s1omni.runtime.families import FAMILIES, family

from . import add_registry

HELP = "write a synthetic member (real layout, random deterministic weights) and its registry entry"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("family", choices=sorted(FAMILIES))
    parser.add_argument("--size", default="tiny", help="tiny (tests), or a real config: 0.8B, 4B, 9B (vela2), 4B (omnijev)")
    parser.add_argument("--out", required=True, metavar="DIR", help="package directory to write (replaced atomically)")
    parser.add_argument("--seed", type=int, default=0)
    add_registry(parser)


def run(args: argparse.Namespace) -> int:
    from s1omni.runtime.registry import user_registry, write_entry

    writer = family(args.family).synth()
    if args.size not in writer.SIZES:
        raise SystemExit(f"s1omni synth: {args.family} sizes are {', '.join(writer.SIZES)}")
    member = writer.write(args.out, args.size, args.seed)
    registry = user_registry(args.registry)
    write_entry(registry, member)
    print(f"wrote {member.name} ({member.loaded_parameters:,} parameters, random weights) to {args.out}")
    print(f"registry entry in {registry}")
    return 0
