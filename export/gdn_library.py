"""The custom op library of ``--gated-delta-kernel ChunkedGatedDeltaRule``: one shared object per engine.

``build_library`` compiles flash-linear-attention's chunked forward for the engine's architecture and
every head shape its graphs use (``s1omni.export.fla_kernels``), the MLP's SiLU product
(``s1omni.export.silu_kernel``, which ``--fused-silu`` builds use), the rule's gates (``s1omni.export.delta_gates_kernel``,
which ``--fused-delta-gates`` builds use) and, for each hidden width a
``--fused-residual-norms`` build asks for, the residual add and RMSNorm (``s1omni.export.residual_norm_kernel``) and, for
each kernel size a ``--fused-short-convolutions`` build asks for, the Gated DeltaNet short convolution
(``s1omni.export.short_convolution_kernel``; for each (taps, head size, repeat) a ``--fused-convolution-heads``
build asks for, the one writing the gated delta rule's q, k and v) and, for each head size a ``--fused-output-norms`` build
asks for, the layer's output norm (``s1omni.export.output_norm_kernel``) and, for each head size a ``--fused-head-rotary``
build asks for, the attention's q and k head norm and rotary embedding (``s1omni.export.head_rotary_kernel``), embeds the
cubins in generated C++
(``gdn_kernels.inc``) and compiles ``gdn_op.cc`` with the system's ``g++`` into ``OP_LIBRARY``, which the
engine's manifest pins like its graphs and the runner registers with each ONNX Runtime session
(``SessionOptions.register_custom_ops_library``). The ops' schemas are in ``gdn_op.cc``.

Two headers come from outside this package: ONNX Runtime's C API (``onnxruntime_c_api.h`` and its C++
wrappers; no ONNX Runtime wheel ships them, so ``make setup`` unpacks Debian's ``libonnxruntime-dev``
into ``.venv/include/onnxruntime``; ``S1OMNI_ORT_INCLUDE`` names another directory), and the CUDA
driver's ``cuda.h``, from Triton's NVIDIA backend. The op keeps to the C API of ONNX Runtime 1.21,
which every later runtime serves (``ORT_API_VERSION``), and opens the CUDA driver at run time.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..runtime.errors import InputError
from ..runtime.runners.onnxruntime_runner import OP_LIBRARY
from .fla_kernels import CHUNK, HALF, SINGLE, CompiledKernel, KernelSpec, compile_kernel, kernel_specs
from .short_convolutions import CHANNEL_MULTIPLE

SOURCE = Path(__file__).with_name("gdn_op.cc")
ORT_INCLUDE_VARIABLE = "S1OMNI_ORT_INCLUDE"
BFLOAT16 = "*bf16"
SILU_PRODUCT = KernelSpec(
    "silu_product", "s1omni.export.silu_kernel", "silu_product_kernel",
    (("gate", BFLOAT16), ("up", BFLOAT16), ("out", BFLOAT16), ("width", "i32"), ("stride", "i32")),
    {"BLOCK": 1024}, num_warps=4, num_stages=1,
)  # fmt: skip


DELTA_GATES = KernelSpec(
    "delta_gates", "s1omni.export.delta_gates_kernel", "delta_gates_kernel",
    (("a", BFLOAT16), ("b", BFLOAT16), ("dt_bias", SINGLE), ("scale", SINGLE), ("mask", SINGLE), ("decay", SINGLE), ("beta", SINGLE),
     ("count", "i32"), ("heads", "i32"), ("has_mask", "i32"), ("threshold", "fp32")),
    {"BLOCK": 1024}, num_warps=4, num_stages=1,
)  # fmt: skip


def _block(width: int) -> int:
    """The block a row of ``width`` values is computed in: the power of two at or above it, at least 16."""
    return max(16, 1 << (width - 1).bit_length())


def residual_norm_spec(width: int) -> KernelSpec:
    """The residual RMSNorm kernel for rows of ``width`` columns: one block of the power of two at or above it."""
    block = _block(width)
    return KernelSpec(
        f"residual_rms_norm_{block}", "s1omni.export.residual_norm_kernel", "residual_rms_norm_kernel",
        (("residual", "*fp32"), ("addend", BFLOAT16), ("weight", "*fp32"), ("normalized", BFLOAT16), ("total", "*fp32"),
         ("width", "i32"), ("epsilon", "fp32")),
        {"BLOCK": block}, num_warps=4 if block <= 1024 else 8 if block <= 4096 else 16, num_stages=1,
    )  # fmt: skip


def output_norm_spec(width: int) -> KernelSpec:
    """The output norm kernel for heads of ``width`` values: blocks of the power of two at or above it, 1,024 values a program."""
    block = _block(width)
    return KernelSpec(
        f"gated_output_norm_{block}", "s1omni.export.output_norm_kernel", "gated_output_norm_kernel",
        (("o", HALF), ("z", BFLOAT16), ("weight", SINGLE), ("out", BFLOAT16), ("rows", "i32"), ("width", "i32"), ("epsilon", "fp32")),
        {"ROWS": max(1, 1024 // block), "BLOCK": block}, num_warps=4, num_stages=1,
    )  # fmt: skip


def head_rotary_spec(width: int) -> KernelSpec:
    """The head norm and rotary kernel for heads of ``width`` values: one block of the power of two at or above it; no
    fused multiply-adds (the rotation rounds as the graph's nodes do)."""
    block = _block(width)
    return KernelSpec(
        f"head_norm_rotary_{block}", "s1omni.export.head_rotary_kernel", "head_norm_rotary_kernel",
        (("x", SINGLE), ("weight", SINGLE), ("cos", SINGLE), ("sin", SINGLE), ("out", SINGLE), ("heads", "i32"), ("tokens", "i32"),
         ("width", "i32"), ("rotary", "i32"), ("epsilon", "fp32")),
        {"BLOCK": block}, num_warps=1 if block <= 256 else 4, num_stages=1, fp_fusion=False,
    )  # fmt: skip


def short_convolution_spec(size: int) -> KernelSpec:
    """The short convolution kernel for ``size`` taps (K): tiles of ``BLOCK_T`` tokens (at least the K - 1 rows of the
    window the last block writes) by ``BLOCK_C`` channels, rows of a multiple of ``CHANNEL_MULTIPLE`` channels."""
    return KernelSpec(
        f"short_convolution_{size}", "s1omni.export.short_convolution_kernel", "short_convolution_kernel",
        (("x", BFLOAT16), ("weight", BFLOAT16), ("bias", BFLOAT16), ("past", BFLOAT16), ("y", BFLOAT16), ("present", BFLOAT16),
         ("tokens", "i32"), ("channels", "i32"), ("bias_size", "i32"), ("past_rows", "i32")),
        {"K": size, "BLOCK_T": max(16, 1 << (size - 2).bit_length()), "BLOCK_C": 256}, num_warps=8, num_stages=1,
        multiples={"channels": CHANNEL_MULTIPLE},
    )  # fmt: skip


def convolution_heads_spec(size: int, key_size: int, repeat: int) -> KernelSpec:
    """The short convolution that writes the gated delta rule's q, k and v (``--fused-convolution-heads``) for ``size``
    taps, heads of ``key_size`` (a power of two dividing ``BLOCK_C``: a tile holds whole heads) and q/k heads each
    repeated ``repeat`` times; the tiles of ``short_convolution_spec``."""
    tiles = short_convolution_spec(size)
    if key_size & (key_size - 1) or tiles.constants["BLOCK_C"] % key_size:
        raise InputError(f"the convolution heads kernel takes heads of a power of two up to {tiles.constants['BLOCK_C']}, not {key_size}")
    return KernelSpec(
        f"short_convolution_heads_{size}_{key_size}_{repeat}", "s1omni.export.short_convolution_kernel", "short_convolution_heads_kernel",
        (("x", BFLOAT16), ("weight", BFLOAT16), ("bias", BFLOAT16), ("past", BFLOAT16), ("mask", SINGLE), ("q", HALF),
         ("k", HALF), ("v", HALF), ("present", BFLOAT16), ("tokens", "i32"), ("channels", "i32"), ("bias_size", "i32"),
         ("past_rows", "i32"), ("has_mask", "i32"), ("key_heads", "i32"), ("scale", "fp32"), ("epsilon", "fp32")),
        {**tiles.constants, "KEY_SIZE": key_size, "REPEAT": repeat}, num_warps=tiles.num_warps, num_stages=1, multiples=tiles.multiples,
    )  # fmt: skip


def ort_include() -> Path:
    """The directory holding ``onnxruntime_c_api.h``."""
    configured = os.environ.get(ORT_INCLUDE_VARIABLE)
    directory = Path(configured) if configured else Path(sys.prefix) / "include" / "onnxruntime"
    if not (directory / "onnxruntime_c_api.h").is_file():
        raise InputError(f"{directory} has no onnxruntime_c_api.h: run `make setup` (it unpacks Debian's libonnxruntime-dev "
                         f"there) or set {ORT_INCLUDE_VARIABLE} to a directory with ONNX Runtime's C and C++ API headers")  # fmt: skip
    return directory


def cuda_include() -> Path:
    """Triton's copy of the CUDA driver's headers."""
    import triton

    directory = Path(triton.__file__).parent / "backends" / "nvidia" / "include"
    if not (directory / "cuda.h").is_file():
        raise InputError(f"{directory} has no cuda.h (Triton's NVIDIA backend)")
    return directory


def _c_bytes(data: bytes) -> str:
    return ",".join(str(byte) for byte in data)


def _binary(kernel: CompiledKernel, array: str) -> str:
    return f'{{"{kernel.symbol}", {array}, {kernel.shared}u, {kernel.num_warps}u, {kernel.scratch_params}u}}'


def _table(struct: str, name: str, kernels: list[CompiledKernel], facts: list[str]) -> list[str]:
    """The lines of ``kernels``' cubins and of the table ``name`` of their ``struct`` entries, each led by the
    constants ``facts`` of its spec (none: the table's one entry a zeroed placeholder), and of its count."""
    lines, entries = [], []
    for kernel in kernels:
        lines.append(f"alignas(8) static const unsigned char kCubin_{kernel.spec.name}[] = {{{_c_bytes(kernel.cubin)}}};")
        entries.append(f"  {{{', '.join(str(kernel.spec.constants[fact]) for fact in facts)}, {_binary(kernel, f'kCubin_{kernel.spec.name}')}}},")
    return [*lines, f"static const {struct} {name}[] = {{", *(entries or ["  {},"]), "};", f"constexpr int {name}Count = {len(kernels)};"]


def kernels_source(variants: dict[tuple[int, int, int], list[CompiledKernel]], silu: CompiledKernel, gates: CompiledKernel,
                   norms: list[CompiledKernel], convolutions: list[CompiledKernel], convolution_heads: list[CompiledKernel],
                   output_norms: list[CompiledKernel], head_rotaries: list[CompiledKernel]) -> str:  # fmt: skip
    """``gdn_kernels.inc``: the cubins and the launch facts of each head shape's five kernels, of the SiLU product, of the
    rule's gates, of each residual RMSNorm block, of each short convolution size, of each convolution writing q, k and
    v, of each output norm block and of each head norm and rotary block (none: an empty table, its one entry a
    placeholder)."""
    lines = ["// Generated by s1omni.export.gdn_library: flash-linear-attention kernels, compiled ahead of time.",
             "namespace s1omni_gdn {", f"constexpr int64_t kChunk = {CHUNK};"]  # fmt: skip
    entries = []
    for (heads, key_size, value_size), kernels in variants.items():
        fields = []
        for kernel in kernels:
            array = f"kCubin_{heads}_{key_size}_{value_size}_{kernel.spec.name}"
            lines.append(f"alignas(8) static const unsigned char {array}[] = {{{_c_bytes(kernel.cubin)}}};")
            fields.append(_binary(kernel, array))
        by_name = {kernel.spec.name: kernel.spec for kernel in kernels}
        states_bv, output_bv = by_name["chunk_states"].constants["BV"], by_name["output"].constants["BV"]
        entries.append(f"  {{{heads}, {key_size}, {value_size}, {states_bv}, {output_bv}, {{{', '.join(fields)}}}}},")
    lines += ["static const Variant kVariants[] = {", *entries, "};",
              f"alignas(8) static const unsigned char kCubin_silu_product[] = {{{_c_bytes(silu.cubin)}}};",
              f"static const KernelBinary kSiluProduct = {_binary(silu, 'kCubin_silu_product')};",
              f"constexpr int64_t kSiluBlock = {silu.spec.constants['BLOCK']};",
              f"alignas(8) static const unsigned char kCubin_delta_gates[] = {{{_c_bytes(gates.cubin)}}};",
              f"static const KernelBinary kDeltaGates = {_binary(gates, 'kCubin_delta_gates')};",
              f"constexpr int64_t kGatesBlock = {gates.spec.constants['BLOCK']};"]  # fmt: skip
    lines += [*_table("NormBinary", "kResidualNorms", norms, ["BLOCK"]),
              *_table("ConvolutionBinary", "kShortConvolutions", convolutions, ["K", "BLOCK_T", "BLOCK_C"]),
              *_table("HeadsBinary", "kConvolutionHeads", convolution_heads, ["K", "KEY_SIZE", "REPEAT", "BLOCK_T", "BLOCK_C"]),
              *_table("OutputNormBinary", "kOutputNorms", output_norms, ["BLOCK", "ROWS"]),
              *_table("NormBinary", "kHeadRotaries", head_rotaries, ["BLOCK"]),
              f"constexpr int64_t kChannelMultiple = {CHANNEL_MULTIPLE};", "}  // namespace s1omni_gdn", ""]  # fmt: skip
    return "\n".join(lines)


def _per_block(spec_of: Callable[[int], KernelSpec], widths: list[int] | None, arch: int) -> list[CompiledKernel]:
    """``spec_of``'s kernel for each of ``widths`` compiled for ``sm_{arch}``, once per block (widths sharing one share it)."""
    specs = {spec.name: spec for spec in map(spec_of, sorted(set(widths or [])))}
    return [compile_kernel(spec, arch) for spec in specs.values()]


def build_library(out_dir: Path, shapes: list[tuple[int, int, int]], arch: int, *, norm_widths: list[int] | None = None,
                  convolution_sizes: list[int] | None = None, heads: list[tuple[int, int, int]] | None = None,
                  output_widths: list[int] | None = None, rotary_widths: list[int] | None = None) -> dict[str, Any]:  # fmt: skip
    """Write ``out_dir / OP_LIBRARY`` with kernels for each (heads, key size, value size) of ``shapes`` on
    ``sm_{arch}``, a residual RMSNorm for each of ``norm_widths``, a short convolution for each of
    ``convolution_sizes``, one writing q, k and v for each (taps, key size, repeat) of ``heads``, an output norm for
    each head size of ``output_widths`` and a head norm and rotary for each of ``rotary_widths``; returns the facts the
    manifest records."""
    import triton

    compiler = shutil.which("g++")
    if compiler is None:
        raise InputError("the ChunkedGatedDeltaRule library is compiled with g++, which is not on PATH")
    variants = {shape: [compile_kernel(spec, arch) for spec in kernel_specs(*shape)] for shape in sorted(set(shapes))}
    silu, gates = compile_kernel(SILU_PRODUCT, arch), compile_kernel(DELTA_GATES, arch)
    norms = _per_block(residual_norm_spec, norm_widths, arch)
    convolutions = [compile_kernel(short_convolution_spec(size), arch) for size in sorted(set(convolution_sizes or []))]
    head_kernels = [compile_kernel(convolution_heads_spec(*shape), arch) for shape in sorted(set(heads or []))]
    output_norms = _per_block(output_norm_spec, output_widths, arch)
    head_rotaries = _per_block(head_rotary_spec, rotary_widths, arch)
    with tempfile.TemporaryDirectory(prefix="s1omni-gdn-") as work:
        (Path(work) / "gdn_kernels.inc").write_text(kernels_source(variants, silu, gates, norms, convolutions, head_kernels, output_norms,
                                                                                   head_rotaries))
        partial = out_dir / f".{OP_LIBRARY}.partial"
        command = [compiler, "-std=c++17", "-O2", "-shared", "-fPIC", "-fvisibility=hidden", "-o", str(partial),
                   f"-I{work}", f"-I{ort_include()}", f"-I{cuda_include()}", str(SOURCE), "-ldl"]  # fmt: skip
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            partial.unlink(missing_ok=True)
            raise RuntimeError(f"g++ failed on {SOURCE.name}:\n{result.stderr[-4000:]}")
        partial.replace(out_dir / OP_LIBRARY)
    import fla

    return {
        "library": OP_LIBRARY,
        "arch": f"sm_{arch}",
        "shapes": [list(shape) for shape in sorted(set(shapes))],
        "triton_version": triton.__version__,
        "fla_version": getattr(fla, "__version__", None),
        "kernels": {k.spec.name: {"num_warps": k.num_warps, "num_stages": k.spec.num_stages, "shared": k.shared,
                                  **{n: v for n, v in k.spec.constants.items() if n.startswith("B") and n != "B"}}
                    for k in [*next(iter(variants.values())), silu, gates, *norms, *convolutions, *head_kernels, *output_norms,
                              *head_rotaries]},
    }  # fmt: skip
