"""``s1omni build DIR --backend onnxruntime|tensorrt --target ... --out ENG``: an engine from an export.

A build reads only the export directory. ONNX Runtime engines carry the graphs themselves and the
execution provider options to run them with:

- ``cpu``: float32, the portable ``Scan`` graphs where exported. Their chunked rule rounds as the
  reference's does; the fused rule's token-by-token rounding, though nearer float64, drifts 1.09e-5
  from the reference on one calibration case of the tiny member, past the 1e-5 CPU gate. Every ``Exp``
  runs in float64, rounded once to float32 (``s1omni.export.cpu_exp``): ONNX Runtime's float32 ``Exp``
  alone put the tiny member 1.25e-5 from the reference on an AVX-512 host.
- ``cuda``: the ``fused`` graphs where exported, each Gated DeltaNet layer one contrib node that
  ``--gated-delta-kernel`` picks (``s1omni.export.cuda_kernels``), at ``--precision bf16`` (the default, the
  fastest: weight GEMMs in bfloat16, ``s1omni.export.bf16_gemms``, held to the gpu-reduced gate), ``fp32``
  (TF32 off; for parity work, the gpu gate), ``tf32`` or ``fp8``, the reduced copy ``max_speed`` serves
  (weight GEMMs in float8 e4m3, ``s1omni.export.fp8_gemms``; no CUDA graphs; held to the consent gate
  against the exact engine, ``s1omni.export.consent``, not to a validation gate). Four options are opt-in:
  ``--gated-delta-inputs fp16`` (bf16) feeds the GatedDeltaNet nodes float16 q/k/v, which their chunked prefill
  engine needs; ``--merged-projections`` (bf16) merges the projections that read one activation into one GEMM
  each (``s1omni.export.merged_projections``); ``--fused-mixers`` makes each Gated DeltaNet short convolution and
  gated output norm one contrib op (``s1omni.export.mixer_fusions``); ``--fused-attention`` makes each
  full-attention layer's scores, mask, softmax and weighted sum one ``MultiHeadAttention``
  (``s1omni.export.attention_fusions``; ``--attention-inputs fp16`` on bf16 builds). fp32 and tf32 builds keep the
  exported graph's inputs. The first, third and fourth together passed gpu-reduced on the H200 at every member
  size and are faster there (``benchmarks/h200-9B-attn16``), but the tiny member's bf16 engine with them missed
  it (docs/validation.md), so none is a default yet. TF32 matmuls are
  faster but flipped 2 of 24 span sets of the 0.8B synthetic member on the H200, a GPU-gate miss
  (``benchmarks/h200-0.8B-kernels``). Their norms and sigmoids become single ONNX Runtime ops
  (``s1omni.export.cuda_fusions``), and the rotary embedding's interleaving of its sections a selection
  (``s1omni.export.rotary_sections``: the same values), unless ``--no-op-fusion``. By default (``--no-cuda-graphs`` turns it off) the runner replays each
  shape bucket as a CUDA graph (``s1omni.runtime.runners.cuda_graphs``): the manifest says so, and validation
  runs the engine that way.

TensorRT engines carry one plan per portable graph for one compute capability and library version.
Every engine gets the heads, tokenizer, config, calibration and a manifest that pins them. Files are
hard-linked from the export where the file system allows (both directories are immutable once
written), so a large member's build copies nothing.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import onnx

from s1omni.runtime import progress
from s1omni.runtime.engine import read_stage, write_manifest
from s1omni.runtime.errors import InputError, UsageError
from s1omni.runtime.omnijev.engine import VISION_GRAPH
from s1omni.runtime.staging import staged_directory

from .attention_fusions import fuse_attention
from .bf16_convolutions import short_convolutions_in_bf16
from .residual_norms import NORM_OP, fuse_residual_norms, norm_widths
from .convolution_heads import HEADS_OP, head_kernels, use_convolution_heads
from .delta_gates import GATES_OP, use_delta_gates
from .head_rotary import HEAD_ROTARY_OP, head_rotary_widths, use_head_rotary
from .output_norms import OUTPUT_NORM_OP, output_norm_widths, use_output_norms
from .rotary_sections import select_rotary_sections
from .short_convolutions import CONVOLUTION_OP, kernel_sizes, use_convolution_op
from .silu_products import SILU_OP, fuse_silu_products
from .bf16_gemms import Bf16Weights, use_bf16_gemms
from .cpu_exp import exp_in_float64
from .cuda_fusions import fuse_norms, fuse_sigmoids
from .cuda_kernels import INPUT_TYPES, KERNELS, chunked_prefill, state_shapes, use_gated_delta_kernel
from .fp8_gemms import FP8_FILE, use_fp8_gemms
from .merged_projections import merge_projections
from .mixer_fusions import fuse_gated_norms, fuse_short_convolutions
from .naming import GRAPHS, OP_TYPE, RECURRENCES, graph_file

SHARED_FILES = ("heads.safetensors", "tokenizer.json", "config.json", "calibration.json")
ORT_TARGETS = ("cpu", "cuda")
# Precisions per ONNX Runtime target, the default first, with the CUDA EP options that give them.
# HEURISTIC conv algorithms: the CUDA EP's default (EXHAUSTIVE) benchmarks cuDNN algorithms again for
# every new sequence length, ~0.4 s a request on the H200.
ORT_PRECISIONS = {
    "cpu": {"fp32": {}},
    "cuda": {
        "bf16": {"use_tf32": 0, "cudnn_conv_algo_search": "HEURISTIC"},  # and the graphs' GEMMs in bfloat16
        "fp32": {"use_tf32": 0, "cudnn_conv_algo_search": "HEURISTIC"},
        "tf32": {"use_tf32": 1, "cudnn_conv_algo_search": "HEURISTIC"},
        "fp8": {"use_tf32": 0, "cudnn_conv_algo_search": "HEURISTIC"},  # a reduced copy for max_speed (fp8_gemms)
    },
}
BACKBONE = ("prefill", "continue")  # every export's; a Vela export's packed graph too (GRAPHS), which TensorRT builds leave out
BACKBONE_FILES = {graph_file(graph, "scan") for graph in GRAPHS}  # their names in every ONNX Runtime engine
# The Gated DeltaNet form each ONNX Runtime target runs when the export has both (see above).
PREFERRED = {"cpu": "scan", "cuda": "fused"}
# Served ranges of the dynamic dimensions: rows of a batch, and token lengths (the member's input limit).
BATCH_RANGE = (1, 8, 64)


def default_engine_dir(manifest: dict[str, Any], backend: str, target: str) -> Path:
    return Path("engines") / manifest["member"]["name"] / backend / target


def link_or_copy(source: Path, target: Path) -> None:
    """A hard link where source and target share a file system, else a copy."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)


def _graph_files(export_dir: Path) -> list[str]:
    """The graphs and everything they reference (external weights), i.e. all but the shared files."""
    return sorted(p.name for p in export_dir.iterdir() if p.name not in ("manifest.json", *SHARED_FILES))


def backbone_variants(export_dir: Path) -> dict[str, dict[str, str]]:
    """The backbone graph files of each recurrence the export holds (``{"fused": {"prefill": ...}}``): its
    prefill and continue graphs, and its packed graph where there is one."""
    present = set(_graph_files(export_dir))
    variants = {}
    for recurrence in RECURRENCES:
        files = {graph: graph_file(graph, recurrence) for graph in GRAPHS if graph_file(graph, recurrence) in present}
        if set(BACKBONE) <= set(files):
            variants[recurrence] = files
    return variants


def ort_files(export_dir: Path, target: str) -> tuple[str, dict[str, str]]:
    """The recurrence an ONNX Runtime engine for ``target`` runs (``PREFERRED``, else the one exported)
    and ``{engine file: export file}``."""
    variants = backbone_variants(export_dir)
    if not variants:
        raise InputError(f"{export_dir} holds no prefill/continue graphs")
    recurrence = PREFERRED[target] if PREFERRED[target] in variants else next(iter(variants))
    every_variant = {file for files in variants.values() for file in files.values()}
    files = {name: name for name in _graph_files(export_dir) if name not in every_variant}
    files.update({graph_file(graph, "scan"): file for graph, file in variants[recurrence].items()})
    return recurrence, files


def _graph_rewrites(
    target: str, kernel: str | None, inputs: str, precision: str, recurrence: str, op_fusion: bool, merged: bool,
    weights: Bf16Weights, fp8_weights: Bf16Weights, mixers: bool, attention: str | None, bf16_convolutions: bool = False,
    fused_silu: bool = False, fused_residual_norms: bool = False, fused_short_convolutions: bool = False,
    fused_convolution_heads: bool = False, fused_delta_gates: bool = False, fused_output_norms: bool = False,
    fused_head_rotary: bool = False,
) -> dict[str, Callable[[onnx.ModelProto], int]]:
    """What a build rewrites in each backbone graph, in order: on the CPU its exponentials in float64
    (``s1omni.export.cpu_exp``), else the Gated DeltaNet kernel (its q/k/v in
    ``inputs``), the fused mixers and attention (its q/k/v in ``attention``; they match the spelling the export wrote), the norms and sigmoids, the
    merged projections, then the GEMMs' precision (merged weights are rounded as they are concatenated, so
    only bf16 builds merge; fp8 builds run the GEMMs float8 cannot take in bfloat16), then the short convolutions
    on the GEMMs' bfloat16 products (``s1omni.export.bf16_convolutions``; then as the op library's, with
    ``s1omni.export.short_convolutions``, those that make the Gated DeltaNet rule's q, k and v writing them with
    ``s1omni.export.convolution_heads``), the rule's gates (``s1omni.export.delta_gates``) and output norms
    (``s1omni.export.output_norms``), the attention's head norms and rotary embeddings (``s1omni.export.head_rotary``),
    the MLPs' SiLU products (``s1omni.export.silu_products``) and the residual adds with their norms
    (``s1omni.export.residual_norms``)."""
    rewrites: dict[str, Callable[[onnx.ModelProto], int]] = {}
    if target == "cpu":
        rewrites["float64 Exp nodes"] = exp_in_float64
    if kernel in ("GatedDeltaNet", OP_TYPE):  # a fused graph (kernel implies fused)
        rewrites[f"{kernel} nodes"] = lambda graph: use_gated_delta_kernel(graph, kernel, inputs)
    if mixers:
        rewrites["CausalConvWithState nodes"] = fuse_short_convolutions
        rewrites["GatedRMSNorm nodes"] = fuse_gated_norms
    if attention:
        rewrites["MultiHeadAttention nodes"] = lambda graph: fuse_attention(graph, attention)
    if op_fusion:
        rewrites["fused norms"] = fuse_norms
        rewrites["sigmoids"] = fuse_sigmoids
        rewrites["rotary section selections"] = select_rotary_sections
    if precision in ("bf16", "fp8"):
        if recurrence != "fused":
            raise InputError(f"--precision {precision} rewrites the fused graphs; export again with --recurrence fused")
        if merged:
            rewrites["merged projections"] = lambda graph: merge_projections(graph, weights.concatenated)
        if precision == "fp8":
            rewrites["float8 GEMMs"] = lambda graph: use_fp8_gemms(graph, fp8_weights)
        rewrites["bfloat16 GEMMs"] = lambda graph: use_bf16_gemms(graph, weights)
    if bf16_convolutions:
        rewrites["bfloat16 short convolutions"] = lambda graph: short_convolutions_in_bf16(graph, weights)
    if fused_short_convolutions:
        rewrites[f"{CONVOLUTION_OP} nodes"] = use_convolution_op
    if fused_convolution_heads:
        rewrites[f"{HEADS_OP} nodes"] = use_convolution_heads
    if fused_delta_gates:
        rewrites[f"{GATES_OP} nodes"] = use_delta_gates
    if fused_output_norms:
        rewrites[f"{OUTPUT_NORM_OP} nodes"] = use_output_norms
    if fused_head_rotary:
        rewrites[f"{HEAD_ROTARY_OP} nodes"] = use_head_rotary
    if fused_silu:
        rewrites[f"{SILU_OP} nodes"] = fuse_silu_products
    if fused_residual_norms:
        rewrites[f"{NORM_OP} nodes"] = fuse_residual_norms
    return rewrites


def _gated_delta_inputs(requested: str | None, kernel: str | None, precision: str) -> str:
    """The type of the GatedDeltaNet nodes' q/k/v: float32 unless float16 is asked for (bf16 builds only);
    ChunkedGatedDeltaRule's are float16 (bf16 builds only)."""
    reduced = kernel == "GatedDeltaNet" and precision == "bf16"
    if requested not in (None, *INPUT_TYPES):
        raise UsageError(f"--gated-delta-inputs is one of {', '.join(INPUT_TYPES)}")
    if kernel == OP_TYPE:
        if precision != "bf16" or requested == "fp32":
            raise UsageError(f"--gated-delta-kernel {OP_TYPE} takes float16 q/k/v: it is for --precision bf16 builds")
        return "fp16"
    if requested == "fp16" and not reduced:
        raise UsageError("--gated-delta-inputs fp16 is for --precision bf16 builds with the GatedDeltaNet kernel")
    return requested or "fp32"


def _attention_inputs(requested: str | None, fused: bool, precision: str) -> str | None:
    """The type of the fused attention's q/k/v (None: not fused): float32 unless float16 is asked for (bf16 builds only)."""
    if requested not in (None, *INPUT_TYPES):
        raise UsageError(f"--attention-inputs is one of {', '.join(INPUT_TYPES)}")
    if requested and not fused:
        raise UsageError("--attention-inputs is the type of --fused-attention's q, k and v: add --fused-attention")
    if requested == "fp16" and precision != "bf16":
        raise UsageError("--attention-inputs fp16 is for --precision bf16 builds (fp32 and tf32 builds keep the graph's float32)")
    return (requested or "fp32") if fused else None


def tensorrt_profiles(export_dir: Path, max_tokens: int) -> dict[str, dict[str, tuple[int, int, int]]]:
    """A (min, opt, max) range for every named dynamic dimension of each graph's inputs."""
    profiles: dict[str, dict[str, tuple[int, int, int]]] = {}
    for graph in BACKBONE:
        model = onnx.load(str(export_dir / f"{graph}.onnx"), load_external_data=False)
        names = {d.dim_param for i in model.graph.input for d in i.type.tensor_type.shape.dim if d.dim_param}
        profiles[graph] = {
            name: BATCH_RANGE if any(k in name for k in ("batch", "block", "rows")) else (1, min(512, max_tokens), max_tokens)
            for name in sorted(names)
        }
    return profiles


def build(
    export_dir: str | os.PathLike[str],
    backend: str,
    target: str,
    out: str | os.PathLike[str] | None = None,
    precision: str | None = None,
    kernel: str | None = None,
    op_fusion: bool = True,
    cuda_graphs: bool | None = None,
    gated_delta_inputs: str | None = None,
    merged_projections: bool = False,
    fused_mixers: bool = False,
    bf16_convolutions: bool = False,
    fused_attention: bool = False,
    attention_inputs: str | None = None,
    vision_cuda_graphs: bool = False,
    cuda_arch: int | None = None,
    fused_silu: bool = False,
    fused_residual_norms: bool = False,
    fused_short_convolutions: bool = False,
    fused_convolution_heads: bool = False,
    fused_delta_gates: bool = False,
    fused_output_norms: bool = False,
    fused_head_rotary: bool = False,
) -> Path:
    """Build the engine and return its directory. ONNX Runtime CUDA only: ``precision`` (``ORT_PRECISIONS``),
    ``kernel``, the contrib op the fused Gated DeltaNet graphs run (``s1omni.export.cuda_kernels.KERNELS``),
    ``op_fusion`` (``s1omni.export.cuda_fusions``), ``cuda_graphs`` (``s1omni.runtime.runners.cuda_graphs``; None:
    on for onnxruntime/cuda), ``gated_delta_inputs``, the type of GatedDeltaNet's q/k/v
    (``s1omni.export.cuda_kernels.INPUT_TYPES``; None: fp32), ``merged_projections``
    (``s1omni.export.merged_projections``; bf16 builds only), ``fused_mixers``
    (``s1omni.export.mixer_fusions``), ``bf16_convolutions`` (their short convolutions on the bfloat16 products,
    ``s1omni.export.bf16_convolutions``; bf16 builds with fused mixers), ``fused_attention`` (``s1omni.export.attention_fusions``) and ``attention_inputs``,
    the type of its q/k/v (``INPUT_TYPES``; None: fp32), ``vision_cuda_graphs`` (a vision member's tower replayed as a
    CUDA graph per patch count, ``s1omni.runtime.omnijev.engine.VisionSession``; opt-in), ``cuda_arch``, the
    compute capability ``ChunkedGatedDeltaRule``'s kernels are compiled for (None: the visible GPU's), and
    ``fused_silu``, the MLPs' SiLU products as that library's ``SiluProduct`` (``s1omni.export.silu_products``),
    ``fused_residual_norms``, the residual adds and their RMSNorms as its ``ResidualRmsNorm`` (``s1omni.export.residual_norms``),
    ``fused_short_convolutions``, the bfloat16 short convolutions as its ``ShortConvolution``
    (``s1omni.export.short_convolutions``; with ``bf16_convolutions``), ``fused_convolution_heads``, those that
    make the rule's q, k and v as its ``ShortConvolutionHeads`` (``s1omni.export.convolution_heads``), and
    ``fused_delta_gates``, the rule's decay and beta as its ``GatedDeltaGates`` (``s1omni.export.delta_gates``), and
    ``fused_output_norms``, the Gated DeltaNet output norms as its ``GatedOutputNorm`` (``s1omni.export.output_norms``;
    with ``fused_mixers``), and ``fused_head_rotary``, the attention's q and k head norms and rotary embeddings as its
    ``HeadNormRotary`` (``s1omni.export.head_rotary``)."""
    export_dir = Path(export_dir)
    manifest = read_stage(export_dir, "export")
    out = Path(out) if out else default_engine_dir(manifest, backend, target)
    if cuda_graphs and (backend, target) != ("onnxruntime", "cuda"):
        raise UsageError("--cuda-graphs is for onnxruntime/cuda")
    if fused_mixers and (backend, target) != ("onnxruntime", "cuda"):
        raise UsageError("--fused-mixers is for onnxruntime/cuda: TensorRT parses no ONNX Runtime contrib op, and the ops' CPU "
                         "kernels are slower than the exported spelling")  # fmt: skip
    if fused_attention and (backend, target) != ("onnxruntime", "cuda"):
        raise UsageError("--fused-attention is for onnxruntime/cuda: TensorRT parses no ONNX Runtime contrib op, and CPU engines run "
                         "the portable graphs, which attend in chunks already")  # fmt: skip
    if bf16_convolutions and not (fused_mixers and (precision or "bf16") == "bf16" and (backend, target) == ("onnxruntime", "cuda")):
        raise UsageError("--bf16-convolutions rewrites the fused mixers' convolutions of a bf16 build: add --fused-mixers "
                         "(onnxruntime/cuda, --precision bf16)")  # fmt: skip
    if fused_short_convolutions and not bf16_convolutions:
        raise UsageError("--fused-short-convolutions runs the convolutions --bf16-convolutions writes as an op: add --bf16-convolutions "
                         "(and --fused-mixers, --precision bf16)")  # fmt: skip
    if fused_convolution_heads and not fused_short_convolutions:
        raise UsageError("--fused-convolution-heads extends the op --fused-short-convolutions writes: add --fused-short-convolutions "
                         "(and --bf16-convolutions, --fused-mixers, --precision bf16)")  # fmt: skip
    if fused_output_norms and not fused_mixers:
        raise UsageError("--fused-output-norms runs the output norms --fused-mixers writes as an op: add --fused-mixers")
    if vision_cuda_graphs and (backend, target) != ("onnxruntime", "cuda"):
        raise UsageError("--vision-cuda-graphs is for onnxruntime/cuda")
    if precision == "fp8" and (backend, target) != ("onnxruntime", "cuda"):
        raise UsageError("--precision fp8 (the reduced copy max_speed serves) is for onnxruntime/cuda only: GemmFloat8 is a CUDA kernel")
    if precision == "fp8" and cuda_graphs:  # GemmFloat8 allocates its workspace on every call: nothing a CUDA graph can capture
        raise UsageError("--precision fp8 builds run without CUDA graphs (GemmFloat8 allocates its cuBLASLt workspace on every call)")
    cuda_graphs = (backend, target) == ("onnxruntime", "cuda") and precision != "fp8" if cuda_graphs is None else cuda_graphs
    record: dict[str, Any]
    with staged_directory(out, "engine") as stage:
        if backend == "onnxruntime":
            if target not in ORT_TARGETS:
                raise UsageError(f"ONNX Runtime targets are {', '.join(ORT_TARGETS)}")
            import onnxruntime

            precision = precision or next(iter(ORT_PRECISIONS[target]))
            if precision not in ORT_PRECISIONS[target]:
                raise UsageError(f"onnxruntime/{target} precisions are {', '.join(ORT_PRECISIONS[target])}")
            recurrence, files = ort_files(export_dir, target)
            if vision_cuda_graphs and VISION_GRAPH not in files:
                raise UsageError(f"--vision-cuda-graphs is for vision members: {export_dir} has no {VISION_GRAPH}")
            kernel = kernel or ("GatedDeltaNet" if target == "cuda" and recurrence == "fused" else None)
            if kernel and (target != "cuda" or recurrence != "fused" or kernel not in KERNELS):
                raise UsageError(f"--gated-delta-kernel ({', '.join(KERNELS)}) is for onnxruntime/cuda from fused graphs")
            op_fusion = op_fusion and target == "cuda"
            inputs = _gated_delta_inputs(gated_delta_inputs, kernel, precision)
            for option, asked in (("--fused-silu", fused_silu), ("--fused-residual-norms", fused_residual_norms),
                                  ("--fused-short-convolutions", fused_short_convolutions), ("--fused-delta-gates", fused_delta_gates),
                                  ("--fused-output-norms", fused_output_norms), ("--fused-head-rotary", fused_head_rotary)):
                if asked and kernel != OP_TYPE:
                    raise UsageError(f"{option} runs the op library of --gated-delta-kernel {OP_TYPE}: add it (--precision bf16)")
            if cuda_arch is not None and kernel != OP_TYPE:
                raise UsageError(f"--cuda-arch is the GPU architecture --gated-delta-kernel {OP_TYPE} compiles its kernels for")
            if kernel == OP_TYPE:
                from ..runtime.runners.tensorrt_runner import device_compute_capability
                from .gdn_library import build_library

                visible = device_compute_capability()
                cuda_arch = cuda_arch or (int(visible.removeprefix("sm_")) if visible else None)
                if cuda_arch is None:
                    raise UsageError(f"--gated-delta-kernel {OP_TYPE}: no GPU here to compile for; name one with --cuda-arch (90: sm_90)")
            shapes: list[tuple[int, int, int]] = []
            # What each op of the library is compiled for, read from the rewritten graphs (build_library's keywords).
            sizers: dict[str, Callable[[onnx.ModelProto], list[Any]]] = {
                keyword: sizer for keyword, wanted, sizer in (
                    ("norm_widths", fused_residual_norms, norm_widths), ("convolution_sizes", fused_short_convolutions, kernel_sizes),
                    ("heads", fused_convolution_heads, head_kernels), ("output_widths", fused_output_norms, output_norm_widths),
                    ("rotary_widths", fused_head_rotary, head_rotary_widths)) if wanted
            }  # fmt: skip
            sized: dict[str, list[Any]] = {keyword: [] for keyword in sizers}
            merged_projections = merged_projections and precision == "bf16"
            attention = _attention_inputs(attention_inputs, fused_attention, precision)
            rewrites = _graph_rewrites(target, kernel, inputs, precision, recurrence, op_fusion, merged_projections,
                                       Bf16Weights(export_dir, stage), Bf16Weights(export_dir, stage, FP8_FILE), fused_mixers, attention,
                                       bf16_convolutions, fused_silu, fused_residual_norms, fused_short_convolutions,
                                       fused_convolution_heads, fused_delta_gates, fused_output_norms, fused_head_rotary)  # fmt: skip
            for name, source in progress.track(files.items(), f"onnxruntime/{target} files", unit="file"):
                if rewrites and name in BACKBONE_FILES:
                    progress.note(f"onnxruntime/{target}: {source} -> {name}: {', '.join(rewrites)} ...")
                    graph = onnx.load(str(export_dir / source), load_external_data=False)
                    if kernel == "GatedDeltaNet":  # said before the rewrite replaces the nodes it reads
                        progress.note(f"onnxruntime/{target}: {name}: {chunked_prefill(graph, inputs)}")
                    if kernel == OP_TYPE:
                        shapes += state_shapes(graph)
                    done = ", ".join(f"{rewrite(graph)} {what}" for what, rewrite in rewrites.items())
                    for keyword, sizer in sizers.items():
                        sized[keyword] += sizer(graph)
                    onnx.save(graph, str(stage / name))
                    progress.note(f"onnxruntime/{target}: {name}: {done}")
                    continue
                if name == VISION_GRAPH and (precision == "bf16" or attention):  # OmniJev's vision tower: its linears and attention too
                    graph = onnx.load(str(export_dir / source))
                    done = [f"{fuse_attention(graph, attention)} MultiHeadAttention nodes"] if attention else []
                    if precision == "bf16":
                        done.append(f"{use_bf16_gemms(graph, Bf16Weights(export_dir, stage))} bfloat16 GEMMs")
                    onnx.save(graph, str(stage / name))
                    progress.note(f"onnxruntime/{target}: {source} -> {name}: {', '.join(done)}")
                    continue
                progress.note(f"onnxruntime/{target}: {source} -> {name}")
                link_or_copy(export_dir / source, stage / name)
            library = None
            if kernel == OP_TYPE:
                progress.note(f"onnxruntime/{target}: compiling {OP_TYPE} for sm_{cuda_arch}, head shapes {sorted(set(shapes))} ...")
                library = build_library(stage, shapes, cuda_arch, **sized)
                progress.note(f"onnxruntime/{target}: {library['library']} (Triton {library['triton_version']}, fla {library['fla_version']})")
            record = {
                "backend": "onnxruntime",
                "library": "onnxruntime",
                "library_version": onnxruntime.__version__,
                "target": target,
                "device": target,
                "precision": precision,
                "recurrence": recurrence,
                "gated_delta_kernel": kernel or ("LinearAttention" if recurrence == "fused" else "Scan"),
                "gated_delta_inputs": inputs,
                "op_fusion": op_fusion,
                "merged_projections": merged_projections,
                "fused_mixers": fused_mixers,
                "bf16_convolutions": bf16_convolutions,
                "fused_silu": fused_silu,
                "fused_residual_norms": fused_residual_norms,
                "fused_short_convolutions": fused_short_convolutions,
                "fused_convolution_heads": fused_convolution_heads,
                "fused_delta_gates": fused_delta_gates,
                "fused_output_norms": fused_output_norms,
                "fused_head_rotary": fused_head_rotary,
                "fused_attention": fused_attention,
                "attention_inputs": attention,
                "cuda_graphs": cuda_graphs,
                "vision_cuda_graphs": vision_cuda_graphs,
                "gated_delta_library": library,
                "provider_options": ORT_PRECISIONS[target][precision],
            }
        elif backend == "tensorrt":
            from .tensorrt_build import build_plans

            if precision:
                raise UsageError("a TensorRT plan's precision is its graphs' (--precision is for onnxruntime/cuda)")
            if "scan" not in backbone_variants(export_dir):
                raise InputError(f"TensorRT parses the portable graphs; export again with --recurrence scan ({export_dir} has none)")

            max_tokens = int(manifest.get("max_tokens") or 16384)
            record = build_plans(export_dir, stage, target, tensorrt_profiles(export_dir, max_tokens))
            record["device"] = "cuda"
        else:
            raise UsageError("--backend is onnxruntime or tensorrt")
        for name in SHARED_FILES:
            link_or_copy(export_dir / name, stage / name)
        write_manifest(
            stage,
            {
                "stage": "engine",
                "family": manifest["family"],
                "member": manifest["member"],
                "source": {"export_files": manifest["files"], **manifest["source"]},
                "export_dir": str(export_dir.resolve()),
                **record,
                "validation": None,
            },
        )
    return out
