from __future__ import annotations

import argparse

HELP = "build an engine from an export directory: ONNX Runtime (cpu, cuda) or a TensorRT plan (sm_XX)"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("export_dir", metavar="DIR", help="directory written by s1omni export")
    parser.add_argument("--backend", required=True, choices=["onnxruntime", "tensorrt"])
    parser.add_argument("--target", required=True, help="cpu or cuda (onnxruntime); sm_XX, a compute capability (tensorrt)")
    parser.add_argument("--out", metavar="ENG", help="engine directory (default engines/<member>/<backend>/<target>)")
    parser.add_argument(
        "--precision",
        choices=["fp32", "tf32", "bf16"],
        help="onnxruntime/cuda only: bf16 (default, the fastest: weight GEMMs in bfloat16 with float32 accumulation; everything "
        "else, the state included, float32; the gpu-reduced gate), fp32 (TF32 off, for parity work; the gpu gate) "
        "or tf32 (TF32 tensor-core matmuls; float32 weights and state; the gpu-reduced gate)",
    )
    parser.add_argument(
        "--gated-delta-kernel",
        choices=["GatedDeltaNet", "LinearAttention"],
        help="onnxruntime/cuda only: the contrib op running the fused Gated DeltaNet rule (default GatedDeltaNet, "
        "a warp per state column for float32 inputs; LinearAttention, slower, also runs on the CPU)",
    )
    parser.add_argument(
        "--no-op-fusion",
        dest="op_fusion",
        action="store_false",
        help="onnxruntime/cuda only: keep the exported graphs' norms and sigmoids op by op "
        "(by default each becomes one SimplifiedLayerNormalization or Sigmoid, fewer kernel launches)",
    )
    parser.add_argument(
        "--cuda-graphs",
        action=argparse.BooleanOptionalAction,
        help="onnxruntime/cuda only, on by default there: replay each shape of the smaller calls (up to "
        "s1omni.runtime.runners.cuda_graphs.MAX_GRAPH_TOKENS tokens) as a CUDA graph, one launch a run instead of thousands "
        "(widths rounded up to buckets of at most 12.5%% padding; the first run of each shape captures it)",
    )


def run(args: argparse.Namespace) -> int:
    from s1omni.export.build import build

    out = build(args.export_dir, args.backend, args.target, args.out, args.precision, args.gated_delta_kernel, args.op_fusion, args.cuda_graphs)
    print(f"built {args.backend}/{args.target} engine in {out}; validate it with `s1omni validate {out} --package PKG`")
    return 0
