from __future__ import annotations

import argparse

from . import add_force, add_quiet, add_registry, make_room

HELP = "verify a member package and export its backbone to ONNX, its heads to float32 safetensors"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("package", metavar="PKG", help="package directory")
    parser.add_argument("--out", required=True, metavar="DIR", help="export directory (replaced atomically)")
    parser.add_argument(
        "--recurrence",
        choices=["both", "scan", "fused"],
        default="both",
        help="Gated DeltaNet graphs to write: scan (portable ONNX Scan, for TensorRT), fused (ONNX Runtime's "
        "LinearAttention kernels, what ONNX Runtime engines run), or both (default)",
    )
    add_force(parser)
    add_quiet(parser)
    add_registry(parser)


def run(args: argparse.Namespace) -> int:
    from s1omni.export.package_export import export_package
    from s1omni.runtime.registry import Registry

    recurrences = ("scan", "fused") if args.recurrence == "both" else (args.recurrence,)
    make_room(args.out, "export", args.force)
    manifest = export_package(args.package, args.out, Registry.load(args.registry), recurrences)
    graphs = sorted(name for name in manifest["files"] if name.endswith(".onnx"))
    print(f"exported {manifest['member']['name']}@{manifest['member']['revision']} to {args.out}: {', '.join(graphs)}")
    return 0
