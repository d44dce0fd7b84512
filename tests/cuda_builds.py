"""CUDA builds of the tiny member checked on the CPU: built as a user builds them (``s1omni build``), then
validated with the CPU EP (``LinearAttention`` and every rewritten op have CPU kernels; ``GatedDeltaNet``
nodes in emulation)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from s1omni.export.convolution_heads import HEADS_OP
from s1omni.export.cuda_kernels import INPUT_TYPES
from s1omni.export.delta_gates import GATES_OP
from s1omni.export.head_rotary import HEAD_ROTARY_OP
from s1omni.export.naming import CONTRIB_DOMAIN, OP_TYPE
from s1omni.export.output_norms import OUTPUT_NORM_OP
from s1omni.export.residual_norms import NORM_OP
from s1omni.export.short_convolutions import CONVOLUTION_OP
from s1omni.export.silu_products import SILU_OP
from s1omni.runtime.engine import read_manifest, write_manifest
from tests.cli import run_s1omni, s1omni


def cuda_engine_available() -> bool:
    """A CUDA GPU torch sees and ONNX Runtime's CUDA EP (onnxruntime-gpu): the device, not CI."""
    try:
        import onnxruntime
    except ImportError:
        return False
    return torch.cuda.is_available() and "CUDAExecutionProvider" in onnxruntime.get_available_providers()


# The GPU tests: marked ``gpu`` (``pytest -m gpu`` on the device) and skipped, saying why, elsewhere.
needs_cuda = pytest.mark.skipif(not cuda_engine_available(), reason="needs a CUDA GPU and onnxruntime-gpu (runs on the device)")


def build_cuda_engine(exported: Path, out: Path, *options: str) -> str:
    """``s1omni build EXPORT --backend onnxruntime --target cuda OPTIONS``; returns its progress (stderr).
    Float32 without CUDA graphs unless ``options`` say otherwise: the CPU EP runs no bfloat16 GEMM."""
    parity = [*(() if "--precision" in options else ("--precision", "fp32")),
              *(() if {"--cuda-graphs", "--no-cuda-graphs"} & set(options) else ("--no-cuda-graphs",))]  # fmt: skip
    return s1omni("build", str(exported), "--backend", "onnxruntime", "--target", "cuda", *parity, *options, "--out", str(out)).stderr


def validate_on_the_cpu(engine: Path, package: Path, report: Path) -> dict[str, Any]:
    """``s1omni validate`` of a CUDA engine whose manifest now points at the CPU; the gate stays the
    engine's (its precision decides it). Returns the report."""
    manifest = read_manifest(engine)
    write_manifest(engine, {**{k: v for k, v in manifest.items() if k != "files"}, "target": "cpu", "device": "cpu", "provider_options": {}})
    run_s1omni("validate", str(engine), "--package", str(package), "--report", str(report))  # a missed gate exits 1
    return json.loads(report.read_text())


def gated_delta_net_emulated(rewritten: onnx.ModelProto, inputs: str) -> onnx.ModelProto:
    """A copy of ``rewritten`` with each ``GatedDeltaNet`` or ``ChunkedGatedDeltaRule`` node (CUDA only) as the
    CPU's ``LinearAttention``: q/k/v ``[B, T, H, D]`` (in ``inputs``'s type; float16 for the custom op) packed to
    float32 ``[B, T, H*D]``, ``GatedDeltaNet``'s value-major state transposed to key-major and back, the custom
    op's ``scale`` passed on, the output unpacked and rounded to the node's type."""
    model = onnx.ModelProto.FromString(rewritten.SerializeToString())
    graph = model.graph
    producers = {output: node for node in graph.node for output in node.output}
    constants = {tensor.name: tensor for tensor in graph.initializer}  # weights may be external: read only the reshapes'
    nodes = []
    for index, node in enumerate(graph.node):
        if node.op_type not in ("GatedDeltaNet", OP_TYPE):
            nodes.append(node)
            continue
        value_major = node.op_type == "GatedDeltaNet"
        if value_major:
            query, key, value, _, decay, beta, state = node.input
        else:
            query, key, value, decay, beta, state = node.input
        reshape = producers[query]
        heads = int(numpy_helper.to_array(constants[reshape.input[1]])[2])
        tag = f"emulated{index}"
        packed = []
        for name in (query, key, value):
            nodes += [helper.make_node("Cast", [name], [f"{tag}.{name}.wide"], to=TensorProto.FLOAT),
                      helper.make_node("Reshape", [f"{tag}.{name}.wide", f"{tag}.pack"], [f"{tag}.{name}"])]  # fmt: skip
            packed.append(f"{tag}.{name}")
        scale = {attribute.name: helper.get_attribute_value(attribute) for attribute in node.attribute if attribute.name == "scale"}
        nodes += [
            *([helper.make_node("Transpose", [state], [f"{tag}.state"], perm=[0, 1, 3, 2])] if value_major else []),
            helper.make_node(
                "LinearAttention", [*packed, f"{tag}.state" if value_major else state, decay, beta],
                [f"{tag}.out", f"{tag}.present" if value_major else node.output[1]], domain=CONTRIB_DOMAIN,
                q_num_heads=heads, kv_num_heads=heads, update_rule="gated_delta", **scale,
            ),  # fmt: skip
            helper.make_node("Reshape", [f"{tag}.out", f"{tag}.heads"], [f"{tag}.out4"]),
            helper.make_node("Cast", [f"{tag}.out4"], [node.output[0]], to=INPUT_TYPES[inputs] if value_major else TensorProto.FLOAT16),
            *([helper.make_node("Transpose", [f"{tag}.present"], [node.output[1]], perm=[0, 1, 3, 2])] if value_major else []),
        ]
        graph.initializer.extend([numpy_helper.from_array(np.array([0, 0, -1], np.int64), f"{tag}.pack"),
                                  numpy_helper.from_array(np.array([0, 0, heads, -1], np.int64), f"{tag}.heads")])  # fmt: skip
    del graph.node[:]
    graph.node.extend(nodes)
    return model


def microseconds_a_call(session: Any, feeds: dict[str, np.ndarray], warmup: int = 10, calls: int = 200) -> float:
    """One call of ``session`` (a CUDA EP session) in microseconds, its inputs and outputs on the GPU (bound once):
    the mean of ``calls`` runs after ``warmup``, ONNX Runtime's own run overhead included."""
    import onnxruntime

    binding = session.io_binding()
    for name, value in feeds.items():
        binding.bind_ortvalue_input(name, onnxruntime.OrtValue.ortvalue_from_numpy(value, "cuda", 0))
    for output in session.get_outputs():
        binding.bind_output(output.name, "cuda")
    for _ in range(warmup):
        session.run_with_iobinding(binding)
    started = time.perf_counter()
    for _ in range(calls):
        session.run_with_iobinding(binding)
    return round((time.perf_counter() - started) / calls * 1e6, 2)


def op_library_built(export: Path, graph: str, weights: Any, merged: bool, **options: bool) -> onnx.ModelProto:
    """``graph`` of the fused ``export`` as a ``ChunkedGatedDeltaRule`` bf16 build with fused mixers and the short
    convolutions writing the rule's q, k and v writes it (``s1omni.export.build``'s own rewrites, ``weights`` its
    ``Bf16Weights``), with ``options`` (the rewrites' flags: ``fused_delta_gates=True``, ...) on top."""
    from s1omni.export.build import _graph_rewrites

    model = onnx.load(str(export / f"{graph}.fused.onnx"), load_external_data=False)
    flags = {"bf16_convolutions": True, "fused_short_convolutions": True, "fused_convolution_heads": True, **options}
    for rewrite in _graph_rewrites("cuda", OP_TYPE, "fp16", "bf16", "fused", True, merged, weights, weights, True, None, **flags).values():
        rewrite(model)
    return model


def op_library_on_the_cpu(model: onnx.ModelProto) -> onnx.ModelProto:
    """``op_library_built``'s graph with its rule, convolutions and convolution heads spelled for the CPU EP."""
    return gated_delta_net_emulated(short_convolutions_emulated(convolution_heads_emulated(model)), "fp16")


def spelled_out(rewritten: onnx.ModelProto, op_type: str, spell: Callable[[onnx.NodeProto, onnx.GraphProto], list[onnx.NodeProto]]) -> onnx.ModelProto:
    """A copy of ``rewritten`` with each ``op_type`` node replaced by the nodes ``spell`` gives for it (given the node and
    the copy's graph, to which it may add initializers)."""
    model = onnx.ModelProto.FromString(rewritten.SerializeToString())
    graph = model.graph
    nodes = [new for node in graph.node for new in (spell(node, graph) if node.op_type == op_type else [node])]
    del graph.node[:]
    graph.node.extend(nodes)
    return model


def silu_products_emulated(rewritten: onnx.ModelProto, swap: bool = False) -> onnx.ModelProto:
    """A copy of ``rewritten`` with each ``SiluProduct`` (CUDA only) spelled as the graph had it: the bfloat16 products
    cast to float32 (a merged one cast, then split in halves), ``Sigmoid``, ``Mul``, ``Mul``, the result cast to
    bfloat16. ``swap`` reads the halves the wrong way round, for a test that must tell."""
    def spell(node: onnx.NodeProto, _: onnx.GraphProto) -> list[onnx.NodeProto]:
        tag = f"{node.name}/emulated"
        gate, up = f"{tag}/gate", f"{tag}/up"
        if len(node.input) == 2:
            nodes = [helper.make_node("Cast", [node.input[0]], [gate], to=TensorProto.FLOAT),
                     helper.make_node("Cast", [node.input[1]], [up], to=TensorProto.FLOAT)]  # fmt: skip
        else:
            nodes = [helper.make_node("Cast", [node.input[0]], [f"{tag}/product"], to=TensorProto.FLOAT),
                     helper.make_node("Split", [f"{tag}/product"], [gate, up], axis=-1, num_outputs=2)]  # fmt: skip
        if swap:
            gate, up = up, gate
        return [
            *nodes,
            helper.make_node("Sigmoid", [gate], [f"{tag}/sigmoid"]),
            helper.make_node("Mul", [gate, f"{tag}/sigmoid"], [f"{tag}/silu"]),
            helper.make_node("Mul", [f"{tag}/silu", up], [f"{tag}/product32"]),
            helper.make_node("Cast", [f"{tag}/product32"], list(node.output), to=TensorProto.BFLOAT16),
        ]

    return spelled_out(rewritten, SILU_OP, spell)


def delta_gates_emulated(rewritten: onnx.ModelProto, swap: bool = False) -> onnx.ModelProto:
    """A copy of ``rewritten`` with each ``GatedDeltaGates`` (CUDA only) spelled as the graph had it: the bfloat16
    products cast to float32, ``Add`` of ``dt_bias``, ``Softplus``, ``Greater`` than the threshold, ``Where``, ``Mul`` by
    the scale (then by the mask, where the op has one) for the decay; ``Sigmoid`` for beta. ``swap`` reads a and b the
    wrong way round, for a test that must tell."""
    def spell(node: onnx.NodeProto, graph: onnx.GraphProto) -> list[onnx.NodeProto]:
        tag = f"{node.name}/emulated"
        a, b, dt_bias, scale, *mask = node.input
        if swap:
            a, b = b, a
        decay, beta = node.output
        scaled = f"{tag}/scaled" if mask else decay
        threshold = np.array(next(at.f for at in node.attribute if at.name == "threshold"), np.float32)
        graph.initializer.append(numpy_helper.from_array(threshold, f"{tag}/threshold"))
        return [
            helper.make_node("Cast", [a], [f"{tag}/a"], to=TensorProto.FLOAT),
            helper.make_node("Add", [f"{tag}/a", dt_bias], [f"{tag}/x"]),
            helper.make_node("Softplus", [f"{tag}/x"], [f"{tag}/softplus"]),
            helper.make_node("Greater", [f"{tag}/x", f"{tag}/threshold"], [f"{tag}/above"]),
            helper.make_node("Where", [f"{tag}/above", f"{tag}/x", f"{tag}/softplus"], [f"{tag}/gated"]),
            helper.make_node("Mul", [scale, f"{tag}/gated"], [scaled]),
            *([helper.make_node("Mul", [scaled, mask[0]], [decay])] if mask else []),
            helper.make_node("Cast", [b], [f"{tag}/b"], to=TensorProto.FLOAT),
            helper.make_node("Sigmoid", [f"{tag}/b"], [beta]),
        ]

    return spelled_out(rewritten, GATES_OP, spell)


def output_norms_emulated(rewritten: onnx.ModelProto, gated: bool = True) -> onnx.ModelProto:
    """A copy of ``rewritten`` with each ``GatedOutputNorm`` (CUDA only) spelled as the graph had it: the rule's output
    and the z product cast to float32 and reshaped to the ``[N, D]`` heads, ``GatedRMSNorm`` (silu), the result cast to
    bfloat16. ``gated=False`` leaves the gate out (a plain RMSNorm), for a test that must tell."""
    def spell(node: onnx.NodeProto, graph: onnx.GraphProto) -> list[onnx.NodeProto]:
        tag = f"{node.name}/emulated"
        o, z, weight = node.input
        width = next(tensor for tensor in graph.initializer if tensor.name == weight).dims[0]
        graph.initializer.append(numpy_helper.from_array(np.array([-1, width], np.int64), f"{tag}/heads"))
        norm = (helper.make_node("GatedRMSNorm", [f"{tag}/x", weight, f"{tag}/z"], [f"{tag}/y"], domain=CONTRIB_DOMAIN, activation="silu",
                                 epsilon=node.attribute[0].f)
                if gated else
                helper.make_node("SimplifiedLayerNormalization", [f"{tag}/x", weight], [f"{tag}/y"], axis=-1, epsilon=node.attribute[0].f,
                                 stash_type=1))  # fmt: skip
        return [
            helper.make_node("Cast", [o], [f"{tag}/o"], to=TensorProto.FLOAT),
            helper.make_node("Reshape", [f"{tag}/o", f"{tag}/heads"], [f"{tag}/x"]),
            helper.make_node("Cast", [z], [f"{tag}/z32"], to=TensorProto.FLOAT),
            helper.make_node("Reshape", [f"{tag}/z32", f"{tag}/heads"], [f"{tag}/z"]),
            norm,
            helper.make_node("Cast", [f"{tag}/y"], list(node.output), to=TensorProto.BFLOAT16),
        ]

    return spelled_out(rewritten, OUTPUT_NORM_OP, spell)


def head_rotary_emulated(rewritten: onnx.ModelProto, turned: bool = True) -> onnx.ModelProto:
    """A copy of ``rewritten`` with each ``HeadNormRotary`` (CUDA only) spelled as the graph had it:
    ``SimplifiedLayerNormalization``, ``Transpose`` to ``[B, H, T, D]``, the slices of the rotated and the passed values
    and of the rotated halves, ``Neg``, ``Concat``, ``Mul`` by cos and sin, ``Add`` and the ``Concat`` of the two parts.
    ``turned=False`` rotates the halves the other way (``[first, -second]``), for a test that must tell."""
    def spell(node: onnx.NodeProto, graph: onnx.GraphProto) -> list[onnx.NodeProto]:
        tag = f"{node.name}/emulated"
        x, weight, cos, sin = node.input
        width = next(tensor for tensor in graph.initializer if tensor.name == weight).dims[0]
        rotary = next(value for value in graph.value_info if value.name == cos).type.tensor_type.shape.dim[3].dim_value
        bounds = {"zero": 0, "half": rotary // 2, "rotary": rotary, "end": width, "axis": -1, "step": 1}
        graph.initializer.extend(numpy_helper.from_array(np.array([v], np.int64), f"{tag}/{k}") for k, v in bounds.items())
        def part(source: str, start: str, end: str, output: str) -> onnx.NodeProto:
            return helper.make_node("Slice", [source, f"{tag}/{start}", f"{tag}/{end}", f"{tag}/axis", f"{tag}/step"], [f"{tag}/{output}"])

        halves = [f"{tag}/negated", f"{tag}/low"] if turned else [f"{tag}/low", f"{tag}/negated"]
        return [
            helper.make_node("SimplifiedLayerNormalization", [x, weight], [f"{tag}/normed"], axis=-1, epsilon=node.attribute[0].f, stash_type=1),
            helper.make_node("Transpose", [f"{tag}/normed"], [f"{tag}/heads"], perm=[0, 2, 1, 3]),
            part(f"{tag}/heads", "zero", "rotary", "rotated"), part(f"{tag}/heads", "rotary", "end", "passed"),
            part(f"{tag}/rotated", "zero", "half", "low"), part(f"{tag}/rotated", "half", "rotary", "high"),
            helper.make_node("Neg", [f"{tag}/high"], [f"{tag}/negated"]),
            helper.make_node("Concat", halves, [f"{tag}/turned"], axis=-1),
            helper.make_node("Mul", [f"{tag}/rotated", cos], [f"{tag}/by_cos"]),
            helper.make_node("Mul", [f"{tag}/turned", sin], [f"{tag}/by_sin"]),
            helper.make_node("Add", [f"{tag}/by_cos", f"{tag}/by_sin"], [f"{tag}/sum"]),
            helper.make_node("Concat", [f"{tag}/sum", f"{tag}/passed"], list(node.output), axis=-1),
        ]  # fmt: skip

    return spelled_out(rewritten, HEAD_ROTARY_OP, spell)


def residual_norms_emulated(rewritten: onnx.ModelProto, add: bool = True) -> onnx.ModelProto:
    """A copy of ``rewritten`` with each ``ResidualRmsNorm`` (CUDA only) spelled as the graph had it: the bfloat16
    addend cast to float32, ``Add``, ``SimplifiedLayerNormalization`` (float32 statistics), the result cast to
    bfloat16. ``add=False`` normalizes the residual alone, for a test that must tell."""
    def spell(node: onnx.NodeProto, _: onnx.GraphProto) -> list[onnx.NodeProto]:
        tag = f"{node.name}/emulated"
        residual, addend, weight = node.input
        normalized, total = node.output
        epsilon = helper.get_attribute_value(node.attribute[0])
        return [
            helper.make_node("Cast", [addend], [f"{tag}/addend"], to=TensorProto.FLOAT),
            helper.make_node("Add", [residual, f"{tag}/addend"], [total]) if add else helper.make_node("Identity", [residual], [total]),
            helper.make_node("SimplifiedLayerNormalization", [total, weight], [f"{tag}/norm"], axis=-1, epsilon=epsilon, stash_type=1),
            helper.make_node("Cast", [f"{tag}/norm"], [normalized], to=TensorProto.BFLOAT16),
        ]

    return spelled_out(rewritten, NORM_OP, spell)


def short_convolutions_emulated(rewritten: onnx.ModelProto, past: bool = True) -> onnx.ModelProto:
    """A copy of ``rewritten`` with each ``ShortConvolution`` (CUDA only) as the ``CausalConvWithState`` it computes,
    sequence-major with its SiLU, on the same inputs and outputs (the CPU EP runs it in float32; ``bfloat16_emulated``
    rounds its output). ``past=False`` leaves out the past window, for a test that must tell."""
    model = onnx.ModelProto.FromString(rewritten.SerializeToString())
    for node in model.graph.node:
        if node.op_type == CONVOLUTION_OP:
            node.op_type, node.domain = "CausalConvWithState", CONTRIB_DOMAIN
            node.attribute.extend([helper.make_attribute("activation", "silu"), helper.make_attribute("channels_last", 1)])
            if not past:
                del node.input[3:]
    return model


def convolution_heads_emulated(rewritten: onnx.ModelProto, tiled: bool = False) -> onnx.ModelProto:
    """A copy of ``rewritten`` with each ``ShortConvolutionHeads`` (CUDA only) spelled as the nodes it replaced: the
    convolution (``CausalConvWithState``, its output named ``.../bf16`` for ``bfloat16_emulated`` to round), the cast
    to float32, the mask's ``Mul``, the ``Split``, each q/k head repeated in a row, ``SimplifiedLayerNormalization``
    and the casts to float16. ``tiled`` repeats the heads as a whole instead (heads 0, 1, .., 0, 1, ..), for a test
    that must tell."""
    def spell(node: onnx.NodeProto, graph: onnx.GraphProto) -> list[onnx.NodeProto]:
        facts = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        key_heads, value_heads, key_size = facts["key_heads"], facts["value_heads"], facts["key_size"]
        repeat = value_heads // key_heads
        channels = next(tensor for tensor in graph.initializer if tensor.name == node.input[1]).dims[0]
        tag = f"{node.name}/emulated"
        constants = {
            "sizes": [key_heads * key_size, key_heads * key_size, channels - 2 * key_heads * key_size],
            "heads": [0, 0, key_heads, key_size], "axis": [2 if tiled else 3], "repeated": [0, 0, value_heads, key_size],
            "factors": [1, 1, repeat, 1, 1] if tiled else [1, 1, 1, repeat, 1], "values": [0, 0, value_heads, -1],
        }  # fmt: skip
        graph.initializer.extend(numpy_helper.from_array(np.array(v, np.int64), f"{tag}/{k}") for k, v in constants.items())
        graph.initializer.append(numpy_helper.from_array(np.full(key_size, facts["scale"], np.float32), f"{tag}/scale"))
        x, weight, bias, past, *mask = node.input
        q, k, v, present = node.output
        widened = f"{tag}/y" if not mask else f"{tag}/unmasked"
        nodes = [
            helper.make_node("CausalConvWithState", [x, weight, bias, past], [f"{tag}/y/bf16", present], domain=CONTRIB_DOMAIN,
                             activation="silu", channels_last=1),
            helper.make_node("Cast", [f"{tag}/y/bf16"], [widened], to=TensorProto.FLOAT),
            *([helper.make_node("Mul", [widened, mask[0]], [f"{tag}/y"])] if mask else []),
            helper.make_node("Split", [f"{tag}/y", f"{tag}/sizes"], [f"{tag}/q", f"{tag}/k", f"{tag}/v"], axis=-1),
            helper.make_node("Cast", [f"{tag}/v"], [f"{tag}/v/fp16"], to=TensorProto.FLOAT16),
            helper.make_node("Reshape", [f"{tag}/v/fp16", f"{tag}/values"], [v]),  # the rule's inputs end in a reshape to its heads
        ]  # fmt: skip
        for part, output in (("q", q), ("k", k)):
            at = f"{tag}/{part}"
            nodes += [
                helper.make_node("Reshape", [at, f"{tag}/heads"], [f"{at}/heads"]),
                helper.make_node("Unsqueeze", [f"{at}/heads", f"{tag}/axis"], [f"{at}/unsqueezed"]),
                helper.make_node("Expand", [f"{at}/unsqueezed", f"{tag}/factors"], [f"{at}/expanded"]),
                helper.make_node("Reshape", [f"{at}/expanded", f"{tag}/repeated"], [f"{at}/repeated"]),
                helper.make_node("SimplifiedLayerNormalization", [f"{at}/repeated", f"{tag}/scale"], [f"{at}/normalized"], axis=-1,
                                 epsilon=facts["epsilon"], stash_type=1),
                helper.make_node("Cast", [f"{at}/normalized"], [f"{at}/fp16"], to=TensorProto.FLOAT16),
                helper.make_node("Reshape", [f"{at}/fp16", f"{tag}/values"], [output]),
            ]  # fmt: skip
        return nodes

    return spelled_out(rewritten, HEADS_OP, spell)


def gemm_float8_emulated(rewritten: onnx.ModelProto) -> onnx.ModelProto:
    """An emulation for tests, never served: a copy of an fp8 build's graph (``s1omni.export.fp8_gemms``) with each
    ``GemmFloat8`` (CUDA only) as what it computes, on the CPU EP: both float8 operands cast to float32 (exact) and
    multiplied by a float32 ``MatMul`` with the weight transposed (``transB=1``); only the accumulation order differs.
    The activation's scaling and float8 cast, and the scales after the product, are the build's own nodes."""
    def spell(node: onnx.NodeProto, _: onnx.GraphProto) -> list[onnx.NodeProto]:
        activation, weight = node.input[:2]
        tag = f"{node.name}/emulated"
        return [
            helper.make_node("Cast", [activation], [f"{tag}/a"], to=TensorProto.FLOAT),
            helper.make_node("Cast", [weight], [f"{tag}/w"], to=TensorProto.FLOAT),
            helper.make_node("Transpose", [f"{tag}/w"], [f"{tag}/wt"], perm=[1, 0]),
            helper.make_node("MatMul", [f"{tag}/a", f"{tag}/wt"], [node.output[0]]),
        ]

    return spelled_out(rewritten, "GemmFloat8", spell)


def bfloat16_widened(tensor: onnx.TensorProto, directory: Path) -> np.ndarray:
    """A bfloat16 initializer's values in float32 (exact)."""
    bits = numpy_helper.to_array(tensor, base_dir=str(directory)).view(np.uint16)
    return (bits.astype(np.uint32) << 16).view(np.float32)


def bfloat16_linears(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` computing what a bf16 graph should: every ``nn.Linear`` with its weight, its bias, its input and its
    output rounded to bfloat16 (a linear under BF16 autocast), the sums in float32."""
    for module in model.modules():
        if isinstance(module, torch.nn.Linear):
            module.weight.data = module.weight.data.bfloat16().float()
            if module.bias is not None:
                module.bias.data = module.bias.data.bfloat16().float()
            module.register_forward_pre_hook(lambda _, args: (args[0].bfloat16().float(), *args[1:]))
            module.register_forward_hook(lambda _, args, output: output.bfloat16().float())
    return model


def bfloat16_emulated(model: onnx.ModelProto, directory: Path) -> onnx.ModelProto:
    """``model`` with its bfloat16 values carried in float32: each bfloat16 weight widened, each cast to
    bfloat16 followed by a cast back (the rounding kept, the type float32 again), and each bfloat16 value an
    op computes (the rewrites name them ``.../bf16``: GEMM products, bfloat16 convolutions, the parts of a
    split product) rounded to bfloat16 as it is made (the CUDA kernels accumulate in float32 and write
    bfloat16; a split's parts are bfloat16 already)."""
    graph = model.graph
    widened = [numpy_helper.from_array(bfloat16_widened(t, directory), t.name) if t.data_type == TensorProto.BFLOAT16 else t for t in graph.initializer]
    del graph.initializer[:]
    graph.initializer.extend(widened)
    nodes = []
    for node in graph.node:
        nodes.append(node)
        if node.op_type == "Cast" and helper.get_attribute_value(node.attribute[0]) == TensorProto.BFLOAT16:
            rounded = node.output[0]
            node.output[0] = f"{rounded}/rounded"
            nodes.append(helper.make_node("Cast", [f"{rounded}/rounded"], [rounded], to=TensorProto.FLOAT))
            continue
        for position, name in enumerate(node.output):
            if node.op_type != "Cast" and name.endswith("/bf16"):
                node.output[position] = f"{name}/exact"
                nodes += [helper.make_node("Cast", [f"{name}/exact"], [f"{name}/rounded"], to=TensorProto.BFLOAT16),
                          helper.make_node("Cast", [f"{name}/rounded"], [name], to=TensorProto.FLOAT)]  # fmt: skip
    del graph.node[:]
    graph.node.extend(nodes)
    return model
