from __future__ import annotations

import argparse

HELP = "build an engine from an export directory: ONNX Runtime (cpu, cuda) or a TensorRT plan (sm_XX)"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("export_dir", metavar="DIR", help="directory written by s1omni export")
    parser.add_argument("--backend", required=True, choices=["onnxruntime", "tensorrt"])
    parser.add_argument("--target", required=True, help="cpu or cuda (onnxruntime); sm_XX, a compute capability (tensorrt)")
    parser.add_argument("--out", metavar="ENG", help="engine directory (default engines/<member>/<backend>/<target>)")


def run(args: argparse.Namespace) -> int:
    from export.build import build

    out = build(args.export_dir, args.backend, args.target, args.out)
    print(f"built {args.backend}/{args.target} engine in {out}; validate it with `s1omni validate {out} --package PKG`")
    return 0
