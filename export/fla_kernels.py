"""flash-linear-attention's chunked gated-delta forward, compiled ahead of time for one GPU architecture.

The five Triton kernels ``fla.ops.gated_delta_rule.chunk.chunk_gated_delta_rule_fwd`` launches for a
64-token chunk size (fla-core 0.6.0): the chunk-local cumulative sum of the log decay
(``fla.ops.utils.cumsum``), the fused ``beta K K^T`` and its triangular solve
(``fla.ops.gated_delta_rule.chunk_fwd``), the WY representation's ``w`` and ``u``
(``fla.ops.gated_delta_rule.wy_fast``), the chunk states (``fla.ops.common.chunk_delta_h``) and the output
(``fla.ops.common.chunk_o``). Each is specialised here as the library launches it: variable-length
mode (the rows of a batch are sequences of one packed row, so one binary serves every batch size),
the member's head count and head sizes, and one of the launch configurations fla's autotuner tries on
Hopper (``num_warps``, ``num_stages``, block sizes), fixed, since a CPU build machine cannot time them.
Every pointer is declared 16-byte aligned (the op checks it at run time), as Triton's JIT would find, and so is
each integer a spec names a multiple of something (``KernelSpec.multiples``; the op checks it too).

``compile_kernel`` runs Triton's compiler for a ``cuda:ARCH`` target without a GPU (its bundled
``ptxas``) and reads the entry point's parameter list from the PTX, so the launcher passes exactly the
parameters this Triton version appends (the global and profile scratch pointers) as null. A kernel
whose signature in the installed fla differs from its spec fails the build by name, never at launch.

Fused multiply-adds are on, as Triton's JIT has them by default. The solve's small dots run in IEEE float32 (``input_precision``), not TF32 as fla picks on GPUs that
have it: the gate holds the engine to the float32 reference, and the dots are a small part of the work.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

CHUNK = 64  # tokens a chunk: the fused KK^T solve is fla's 64-token path
SOLVE_PRECISION = "ieee"

# The element type of each runtime parameter, as Triton spells it ("*" a pointer, aligned to 16 bytes).
HALF, SINGLE, INDEX = "*fp16", "*fp32", "*i32"


@dataclass(frozen=True)
class KernelSpec:
    """One fla kernel as the library launches it."""

    name: str  # the op's name for it (C++ identifier)
    module: str
    function: str
    params: tuple[tuple[str, str], ...]  # the runtime parameters in the kernel's order: (name, Triton type)
    constants: dict[str, Any] = field(default_factory=dict)
    num_warps: int = 4
    num_stages: int = 2
    multiples: dict[str, int] = field(default_factory=dict)  # integer parameters the launcher passes as multiples of these
    fp_fusion: bool = True  # products and sums fused into FMAs (off where each is to round as ONNX Runtime's own nodes do)


@dataclass(frozen=True)
class CompiledKernel:
    spec: KernelSpec
    symbol: str  # the entry point in the cubin
    cubin: bytes
    shared: int  # bytes of dynamic shared memory a launch takes
    num_warps: int
    scratch_params: int  # trailing pointer parameters the compiler appended (passed as null)


def kernel_specs(heads: int, key_size: int, value_size: int) -> list[KernelSpec]:
    """The five kernels for ``heads`` heads (q, k and v alike) of ``key_size`` and ``value_size``."""
    shape = {"H": heads, "HV": heads, "K": key_size, "V": value_size, "BT": CHUNK}
    varlen = {"IS_VARLEN": True}
    return [
        KernelSpec(
            "cumsum", "fla.ops.utils.cumsum", "chunk_local_cumsum_scalar_kernel",
            (("s", SINGLE), ("o", SINGLE), ("scale", "fp32"), ("cu_seqlens", INDEX), ("chunk_indices", INDEX), ("T", "i32")),
            {"B": 1, "H": heads, "BT": CHUNK, "REVERSE": False, "HAS_SCALE": True, "USE_GRAPH": False, **varlen},
            num_warps=2,
        ),
        KernelSpec(
            "kkt_solve", "fla.ops.gated_delta_rule.chunk_fwd", "chunk_gated_delta_rule_fwd_kkt_solve_kernel",
            (("k", HALF), ("g", SINGLE), ("beta", SINGLE), ("A", HALF), ("cu_seqlens", INDEX), ("chunk_indices", INDEX), ("T", "i32")),
            {**{k: shape[k] for k in ("H", "HV", "K", "BT")}, "BC": 16, "BK": 64, "USE_G": True, **varlen},
            num_warps=4,
        ),
        KernelSpec(
            "recompute_w_u", "fla.ops.gated_delta_rule.wy_fast", "recompute_w_u_fwd_kernel",
            (("k", HALF), ("v", HALF), ("beta", SINGLE), ("w", HALF), ("u", HALF), ("A", HALF), ("g", SINGLE),
             ("cu_seqlens", INDEX), ("chunk_indices", INDEX), ("T", "i32")),
            {**shape, "BK": 64, "BV": 64, "USE_G": True, **varlen},
            num_warps=4, num_stages=3,
        ),
        KernelSpec(
            "chunk_states", "fla.ops.common.chunk_delta_h", "chunk_gated_delta_rule_fwd_kernel_h_blockdim64",
            (("k", HALF), ("v", HALF), ("w", HALF), ("v_new", HALF), ("g", SINGLE), ("gk", SINGLE), ("h", HALF),
             ("h0", SINGLE), ("ht", SINGLE), ("cu_seqlens", INDEX), ("chunk_offsets", INDEX), ("T", "i32")),
            {**shape, "BV": 32, "USE_G": True, "USE_GK": False, "USE_INITIAL_STATE": True, "STORE_FINAL_STATE": True,
             "SAVE_NEW_VALUE": True, "STATE_V_FIRST": False, **varlen},
            num_warps=4, num_stages=2,
        ),
        KernelSpec(
            "output", "fla.ops.common.chunk_o", "chunk_fwd_kernel_o",
            (("q", HALF), ("k", HALF), ("v", HALF), ("h", HALF), ("g", SINGLE), ("g_gamma", SINGLE), ("o", HALF),
             ("cu_seqlens", INDEX), ("chunk_indices", INDEX), ("scale", "fp32"), ("T", "i32")),
            {**shape, "BK": 64, "BV": 64, "USE_G": True, "USE_G_GAMMA": False, "STATE_V_FIRST": False, **varlen},
            num_warps=4, num_stages=3,
        ),
    ]  # fmt: skip


def _jit_function(spec: KernelSpec) -> Any:
    """The kernel's ``triton.JITFunction`` (under fla's autotune and heuristics wrappers)."""
    import importlib
    import warnings

    from triton.runtime.jit import JITFunction

    with warnings.catch_warnings():  # fla warns that it found no GPU to run on: this build needs none
        warnings.simplefilter("ignore")
        module = importlib.import_module(spec.module)
    if hasattr(module, "SOLVE_TRIL_DOT_PRECISION"):  # fla sets it at import from the GPU it finds (none here)
        import triton.language as tl

        module.SOLVE_TRIL_DOT_PRECISION = tl.constexpr(SOLVE_PRECISION)
    kernel = getattr(module, spec.function)
    while not isinstance(kernel, JITFunction):
        kernel = kernel.fn
    runtime = [name for name in kernel.arg_names if name not in spec.constants]
    if runtime != [name for name, _ in spec.params]:
        raise RuntimeError(f"{spec.module}.{spec.function} takes ({', '.join(runtime)}); this build launches it with "
                           f"({', '.join(name for name, _ in spec.params)}): install fla-core 0.6.0")  # fmt: skip
    return kernel


def compile_kernel(spec: KernelSpec, arch: int) -> CompiledKernel:
    """Compile ``spec`` for ``sm_{arch}`` (no GPU needed)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    kernel = _jit_function(spec)
    types = dict(spec.params)
    signature = {name: ("constexpr" if name in spec.constants else types[name]) for name in kernel.arg_names}
    divisible = {**{name: 16 for name, kind in spec.params if kind.startswith("*")}, **spec.multiples}
    attrs = {(kernel.arg_names.index(name),): [["tt.divisibility", divisor]] for name, divisor in divisible.items()}
    source = ASTSource(fn=kernel, constexprs=dict(spec.constants), signature=signature, attrs=attrs)
    target = GPUTarget("cuda", arch, 32)
    backend = triton.compiler.make_backend(target)
    # Fused multiply-adds as Triton has always made them (its default changes in 3.10), where the spec allows them.
    options = backend.parse_options({"num_warps": spec.num_warps, "num_stages": spec.num_stages, "enable_fp_fusion": spec.fp_fusion})
    compiled = triton.compile(source, target=target, options=options.__dict__)
    if getattr(compiled.metadata, "global_scratch_size", 0) or getattr(compiled.metadata, "profile_scratch_size", 0):
        raise RuntimeError(f"{spec.function}: needs Triton's scratch memory, which this launcher does not provide")
    symbol = compiled.metadata.name
    entry = re.search(rf"\.entry\s+{re.escape(symbol)}\s*\((.*?)\)", compiled.asm["ptx"], re.S)
    if entry is None:
        raise RuntimeError(f"{spec.function}: no entry {symbol} in its PTX")
    declared = len(re.findall(r"\.param\s", entry.group(1)))
    scratch = declared - len(spec.params)
    if scratch < 0:
        raise RuntimeError(f"{spec.function}: its entry takes {declared} parameters, fewer than its {len(spec.params)}")
    return CompiledKernel(spec, symbol, compiled.asm["cubin"], compiled.metadata.shared, compiled.metadata.num_warps, scratch)
