from __future__ import annotations

import argparse

from . import add_force, add_json, add_quiet, emit, make_room

HELP = "build an engine from an export directory: ONNX Runtime (cpu, cuda) or a TensorRT plan (sm_XX)"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("export_dir", metavar="DIR", help="directory written by s1omni export")
    parser.add_argument("--backend", required=True, choices=["onnxruntime", "tensorrt"])
    parser.add_argument("--target", required=True, help="cpu or cuda (onnxruntime); sm_XX, a compute capability (tensorrt)")
    parser.add_argument(
        "--out", metavar="ENG", help="engine directory (default engines/<member>/<backend>/<target>; replaced atomically)"
    )
    add_force(parser)
    parser.add_argument(
        "--precision",
        choices=["fp32", "tf32", "bf16", "fp8"],
        help="onnxruntime/cuda only: bf16 (default, the fastest: weight GEMMs in bfloat16 with float32 accumulation; everything "
        "else, the state included, float32; the gpu-reduced gate), fp32 (TF32 off, for parity work; the gpu gate) "
        "or tf32 (TF32 tensor-core matmuls; float32 weights and state; the gpu-reduced gate); fp8 builds the reduced copy "
        "max_speed serves (weight GEMMs in float8 e4m3 with per-channel and per-row scales, no CUDA graphs; held to the "
        "consent gate: s1omni validate COPY --exact ENG)",
    )
    parser.add_argument(
        "--gated-delta-kernel",
        choices=["GatedDeltaNet", "LinearAttention", "ChunkedGatedDeltaRule"],
        help="onnxruntime/cuda only: the op running the fused Gated DeltaNet rule (default GatedDeltaNet, "
        "a warp per state column for float32 inputs; LinearAttention, slower, also runs on the CPU; ChunkedGatedDeltaRule, "
        "at --precision bf16 only and opt-in, flash-linear-attention's chunked kernels compiled ahead of time for --cuda-arch "
        "into a custom op library the engine carries: needs triton, fla-core, g++ and ONNX Runtime's C API headers, which "
        "`make setup` installs)",
    )
    parser.add_argument(
        "--cuda-arch",
        type=int,
        metavar="SM",
        help="with --gated-delta-kernel ChunkedGatedDeltaRule: the compute capability to compile its kernels for, as one "
        "number (90: sm_90, the H100 and H200; default the visible GPU's; a build machine needs no GPU)",
    )
    parser.add_argument(
        "--gated-delta-inputs",
        choices=["fp16", "fp32"],
        help="onnxruntime/cuda with the GatedDeltaNet kernel only: the type of its q, k and v (default fp32, which runs its "
        "sequential engine at every length; fp16, at --precision bf16 only and opt-in (validated on the H200 at every "
        "member size, not on the tiny member), is what its chunked tensor-core prefill engine needs for head size 128); the "
        "state, decay and beta stay float32",
    )
    parser.add_argument(
        "--no-op-fusion",
        dest="op_fusion",
        action="store_false",
        help="onnxruntime/cuda only: keep the exported graphs' norms, sigmoids and rotary section interleaving op by op "
        "(by default each norm becomes one SimplifiedLayerNormalization, each sigmoid one Sigmoid and each interleaving "
        "two Where with the same values: fewer kernel launches)",
    )
    parser.add_argument(
        "--merged-projections",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="onnxruntime/cuda at --precision bf16 only, opt-in until validated on an H200: the projections reading one "
        "activation (q|k|v, the Gated DeltaNet's inputs, gate|up) as one GEMM over their weights side by side",
    )
    parser.add_argument(
        "--fused-mixers",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="onnxruntime/cuda only, opt-in (validated on the H200 at every member size): each Gated DeltaNet short convolution (with its "
        "SiLU) as one CausalConvWithState and each gated output norm as one GatedRMSNorm, ONNX Runtime contrib ops",
    )
    parser.add_argument(
        "--bf16-convolutions",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="with --fused-mixers at --precision bf16, opt-in: each Gated DeltaNet short convolution reads its projection's "
        "bfloat16 product sequence-major (CausalConvWithState channels_last) and writes bfloat16, as the reference's BF16 "
        "autocast runs it, instead of a float32 copy transposed there and back",
    )
    parser.add_argument(
        "--fused-silu",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="with --gated-delta-kernel ChunkedGatedDeltaRule, opt-in: each MLP's silu(gate) * up, its "
        "casts and (with --merged-projections) its split as one SiluProduct of the engine's op library, reading the bfloat16 "
        "products and writing bfloat16",
    )
    parser.add_argument(
        "--fused-residual-norms",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="with --gated-delta-kernel ChunkedGatedDeltaRule, opt-in, validated on the 0.8B and 4B on an H100: each residual add and the "
        "RMSNorm read by the next GEMMs as one ResidualRmsNorm of the engine's op library, reading the bfloat16 product and "
        "writing the float32 sum and the bfloat16 normalized rows",
    )
    parser.add_argument(
        "--fused-short-convolutions",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="with --gated-delta-kernel ChunkedGatedDeltaRule and --bf16-convolutions, opt-in, its op tested on an H100 (engines "
        "validated with --fused-convolution-heads, which takes every layer of the members): each "
        "Gated DeltaNet short convolution (CausalConvWithState channels_last, with its SiLU) as one ShortConvolution of the "
        "engine's op library, the same inputs and outputs",
    )
    parser.add_argument(
        "--fused-convolution-heads",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="with --fused-short-convolutions, opt-in, validated on the 0.8B and 4B on an H100: each short convolution whose output "
        "only becomes the ChunkedGatedDeltaRule's q, k and v (cast, mask, split, head repeat, l2 norms, float16 casts) as one "
        "ShortConvolutionHeads of the engine's op library writing them",
    )
    parser.add_argument(
        "--fused-delta-gates",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="with --gated-delta-kernel ChunkedGatedDeltaRule, opt-in (validated on the 0.8B and 4B on an H100): each Gated DeltaNet layer's decay "
        "and beta (the casts of the a and b products, dt_bias, the thresholded softplus, the -exp(A_log) scale, the prefill "
        "mask, the sigmoid) as one GatedDeltaGates of the engine's op library",
    )
    parser.add_argument(
        "--fused-output-norms",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="with --gated-delta-kernel ChunkedGatedDeltaRule and --fused-mixers, opt-in (validated on the 0.8B and 4B on an H100): each Gated "
        "DeltaNet layer's output norm (GatedRMSNorm) with the casts around it as one GatedOutputNorm of the engine's op "
        "library, reading the rule's float16 output and the z product, writing the out projection's bfloat16 input",
    )
    parser.add_argument(
        "--fused-head-rotary",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="with --gated-delta-kernel ChunkedGatedDeltaRule, opt-in (validated on the 0.8B and 4B on an H100): each full-attention layer's q and k "
        "head norm, transpose and partial rotary embedding (a dozen nodes each) as one HeadNormRotary of the engine's op library",
    )
    parser.add_argument(
        "--fused-attention",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="onnxruntime/cuda only, opt-in: each full-attention layer's scores, mask, softmax and weighted sum as one "
        "MultiHeadAttention (ONNX Runtime contrib op; the graph's own mask as its attention_bias, keys padded to a multiple "
        "of 8), no [rows, heads, S, T] float32 score tensors where a fused kernel runs",
    )
    parser.add_argument(
        "--attention-inputs",
        choices=["fp16", "fp32"],
        help="with --fused-attention: the type of its q, k, v and mask (default fp32; fp16, at --precision bf16 only, "
        "runs the op on tensor cores between casts, its output cast back to float32)",
    )
    parser.add_argument(
        "--cuda-graphs",
        action=argparse.BooleanOptionalAction,
        help="onnxruntime/cuda only, on by default there: replay each shape of the smaller calls (up to "
        "s1omni.runtime.runners.cuda_graphs.MAX_GRAPH_TOKENS tokens) as a CUDA graph, one launch a run instead of thousands "
        "(widths rounded up to buckets of at most 12.5%% padding; the first run of each shape captures it where no "
        "other forward runs on the GPU, a later run where one does)",
    )
    parser.add_argument(
        "--vision-cuda-graphs",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="onnxruntime/cuda, vision members (OmniJev) only, opt-in (validated on the H200): replay the vision tower "
        "as a CUDA graph per patch count, which images of one size share (the first image of each runs it three times "
        "to capture it, or once, capturing on a later image, where another forward runs on the GPU; at most s1omni.runtime.runners.cuda_graphs.MAX_GRAPHS of them, the others run eagerly)",
    )
    add_json(parser)
    add_quiet(parser)


def run(args: argparse.Namespace) -> int:
    from s1omni.export.build import build, default_engine_dir
    from s1omni.runtime.engine import build_facts, read_manifest

    out = args.out or default_engine_dir(read_manifest(args.export_dir), args.backend, args.target)
    make_room(out, "engine", args.force)
    out = build(
        args.export_dir, args.backend, args.target, out, args.precision, args.gated_delta_kernel, args.op_fusion, args.cuda_graphs,
        gated_delta_inputs=args.gated_delta_inputs, merged_projections=args.merged_projections, fused_mixers=args.fused_mixers,
        bf16_convolutions=args.bf16_convolutions,
        fused_attention=args.fused_attention, attention_inputs=args.attention_inputs, vision_cuda_graphs=args.vision_cuda_graphs,
        cuda_arch=args.cuda_arch, fused_silu=args.fused_silu, fused_residual_norms=args.fused_residual_norms,
        fused_short_convolutions=args.fused_short_convolutions, fused_convolution_heads=args.fused_convolution_heads,
        fused_delta_gates=args.fused_delta_gates, fused_output_norms=args.fused_output_norms, fused_head_rotary=args.fused_head_rotary,
    )  # fmt: skip
    manifest = read_manifest(out)
    result = {"engine": str(out), **build_facts(manifest), "member": manifest["member"]}
    emit(args, result, f"built {args.backend}/{args.target} engine in {out}; validate it with `s1omni validate {out} --package PKG`")
    return 0
