"""The short convolution writing the gated delta rule's q, k and v (``s1omni build --fused-convolution-heads``,
``s1omni.export.convolution_heads``): on the tiny member the graphs it writes and what they compute, emulated on the CPU
EP (``tests.cuda_builds.convolution_heads_emulated`` spells each ``ShortConvolutionHeads`` as the nodes it replaced);
the convolutions it leaves alone; its Triton kernel compiled for sm_90 and run by Triton's interpreter; and on the GPU,
the op against the graph it replaced and against ONNX Runtime's nodes for it, timed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

from s1omni.export.bf16_gemms import Bf16Weights, bfloat16_bits
from s1omni.export.convolution_heads import HEADS_OP, head_kernels, use_convolution_heads
from s1omni.export.fla_kernels import compile_kernel
from s1omni.export.gdn_library import convolution_heads_spec
from s1omni.export.naming import OP_DOMAIN, OP_TYPE
from s1omni.export.short_convolutions import CONVOLUTION_OP
from s1omni.runtime.engine import read_manifest
from s1omni.runtime.runners.onnxruntime_runner import session_options
from tests.cli import run_s1omni
from tests.cuda_builds import (convolution_heads_emulated, gated_delta_net_emulated, microseconds_a_call, needs_cuda, op_library_built,
                               short_convolutions_emulated)  # fmt: skip
from tests.graph_edits import node_making, rewritten_edits, set_initializer
from tests.test_bf16_convolutions import LAYERS, assert_cuda_ep_runs_the_rewrite_as_without, emulated_variants

SIZE = 4  # the members' convolution taps, K
TINY = (2, 4, 16)  # the tiny member's key heads, value heads and head size
CUDA = [("CUDAExecutionProvider", {"use_tf32": 0}), "CPUExecutionProvider"]


def _built(export: Path, graph: str, weights: Bf16Weights, merged: bool, heads: bool) -> onnx.ModelProto:
    return op_library_built(export, graph, weights, merged, fused_convolution_heads=heads)


def _on_the_cpu(model: onnx.ModelProto) -> onnx.ModelProto:
    return gated_delta_net_emulated(short_convolutions_emulated(model), "fp16")


@pytest.mark.parametrize("merged", [True, False], ids=["merged", "unmerged"])
def test_the_op_computes_what_the_graph_did(external_export: Path, tmp_path: Path, merged: bool) -> None:
    """Prefill (left-padded rows: the mask) then continue from its state: every output of the rewritten graphs, the op
    spelled back, the same bit for bit as the graphs without the rewrite; an op that repeated the heads as a whole
    instead of each in a row is told apart."""
    def built(graph: str, weights: Bf16Weights, heads: bool) -> onnx.ModelProto:
        model = _built(external_export, graph, weights, merged, heads)
        return model if heads else _on_the_cpu(model)

    spellings = {"op": lambda model: _on_the_cpu(convolution_heads_emulated(model)),
                 "tiled": lambda model: _on_the_cpu(convolution_heads_emulated(model, tiled=True))}  # fmt: skip
    outputs = emulated_variants(external_export, tmp_path, built, spellings)
    assert all(np.array_equal(a, b) for a, b in zip(outputs["op"], outputs["graph"], strict=True))
    assert not all(np.array_equal(a, b) for a, b in zip(outputs["tiled"], outputs["graph"], strict=True))


def test_each_convolution_becomes_one_op_writing_the_rule_s_inputs(external_export: Path, tmp_path: Path) -> None:
    """In every graph each ``ShortConvolution`` and the nodes between it and its ``ChunkedGatedDeltaRule`` (and the
    nodes that only sized them) are one ``ShortConvolutionHeads`` writing the rule's q, k and v under their names, with
    the tiny member's heads and the l2 norm's scale and epsilon; the prefill graph's reads the padding mask; nothing
    else changes, and the library compiles the one kernel they need."""
    weights = Bf16Weights(external_export, tmp_path)
    for graph in ("prefill", "continue", "packed"):
        before = _built(external_export, graph, weights, True, False)
        model = _built(external_export, graph, weights, True, True)
        ops = [node for node in model.graph.node if node.op_type == HEADS_OP]
        rules = [node for node in model.graph.node if node.op_type == OP_TYPE]
        assert len(ops) == LAYERS and all(op.domain == OP_DOMAIN for op in ops), graph
        for op, rule in zip(ops, rules, strict=True):
            facts = {a.name: helper.get_attribute_value(a) for a in op.attribute}
            assert (facts["key_heads"], facts["value_heads"], facts["key_size"]) == TINY and facts["scale"] == 0.25, graph
            assert np.isclose(facts["epsilon"] * TINY[2], 1e-6), graph  # the l2 norm's epsilon, per head
            assert list(op.output[:3]) == list(rule.input[:3]) and (len(op.input) == 5) == (graph == "prefill"), graph
        kinds = Counter(node.op_type for node in model.graph.node)
        removed = Counter(node.op_type for node in before.graph.node) - kinds
        assert kinds[CONVOLUTION_OP] == 0 and kinds["Split"] == Counter(n.op_type for n in before.graph.node)["Split"] - LAYERS, graph
        assert removed["SimplifiedLayerNormalization"] == 2 * LAYERS and removed["Expand"] == 2 * LAYERS, graph
        outputs = {name for node in model.graph.node for name in node.output}
        assert all(name in outputs or name in {t.name for t in model.graph.initializer} or name in {i.name for i in model.graph.input}
                   for node in model.graph.node for name in node.input if name), graph  # fmt: skip
        assert head_kernels(model) == [(SIZE, TINY[2], TINY[1] // TINY[0])]


def _unit_model(key_heads: int, value_heads: int, key_size: int, value_size: int, mask: bool, past: bool, bias: bool,
                weight: np.ndarray | None = None, bias_values: np.ndarray | None = None, rule: bool = True) -> onnx.ModelProto:  # fmt: skip
    """One Gated DeltaNet layer's convolution and what makes the rule's inputs from it, as a build writes them
    (``ShortConvolution``, cast, mask, split, the heads repeated in a row, l2 norms, float16 casts), on float32 graph
    inputs ``x`` ``[B, T, C]``, ``mask`` ``[B, T, 1]`` and ``past`` ``[B, K-1, C]``, with shapes recorded as the export
    records them; ending in a ``ChunkedGatedDeltaRule`` (``rule``) or with q, k, v and the window as the outputs."""
    key_width = key_heads * key_size
    channels = 2 * key_width + value_heads * value_size
    repeat = value_heads // key_heads
    weight = np.ones((channels, 1, SIZE), np.float32) if weight is None else weight
    def constant(name: str, values: list[int]) -> onnx.TensorProto:
        return numpy_helper.from_array(np.array(values, np.int64), name)

    def info(name: str, elem: int, dims: list[int | str]) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(name, elem, dims)

    initializers = [
        helper.make_tensor("weight", TensorProto.BFLOAT16, weight.shape, bfloat16_bits(weight).tobytes(), raw=True),
        *([helper.make_tensor("bias", TensorProto.BFLOAT16, [channels], bfloat16_bits(bias_values).tobytes(), raw=True)] if bias else []),
        constant("sizes", [key_width, key_width, value_heads * value_size]), constant("heads", [0, 0, key_heads, key_size]),
        constant("axis", [3]), constant("factors", [1, 1, 1, repeat, 1]), constant("repeated", [0, 0, value_heads, key_size]),
        constant("flat", [0, 0, -1]), constant("rule_heads", [0, 0, value_heads, -1]), constant("values", [0, 0, value_heads, value_size]),
        numpy_helper.from_array(np.full(key_size, 1 / np.sqrt(key_size), np.float32), "norm_scale"),
    ]  # fmt: skip
    nodes = [helper.make_node("Cast", ["x"], ["x/bf16"], to=TensorProto.BFLOAT16),
             *([helper.make_node("Cast", ["past"], ["past/bf16"], to=TensorProto.BFLOAT16)] if past else []),
             helper.make_node(CONVOLUTION_OP, ["x/bf16", "weight", "bias" if bias else "", "past/bf16" if past else ""], ["y/bf16", "present/bf16"],
                              name="conv", domain=OP_DOMAIN),
             helper.make_node("Cast", ["y/bf16"], ["y/unmasked" if mask else "y"], to=TensorProto.FLOAT),
             *([helper.make_node("Mul", ["y/unmasked", "mask"], ["y"])] if mask else []),
             helper.make_node("Split", ["y", "sizes"], ["q", "k", "v"], axis=2),
             helper.make_node("Reshape", ["v", "values"], ["v/heads"]), helper.make_node("Reshape", ["v/heads", "flat"], ["v/flat"]),
             helper.make_node("Cast", ["v/flat"], ["v/fp16"], to=TensorProto.FLOAT16),
             helper.make_node("Reshape", ["v/fp16", "rule_heads"], ["v/rule"])]  # fmt: skip
    shapes = [info("y", TensorProto.FLOAT, ["B", "T", channels]), info("v/heads", TensorProto.FLOAT, ["B", "T", value_heads, value_size]),
              info("v/flat", TensorProto.FLOAT, ["B", "T", value_heads * value_size])]  # fmt: skip
    for part in ("q", "k"):
        nodes += [helper.make_node("Reshape", [part, "heads"], [f"{part}/heads"])]
        source = f"{part}/heads"
        if repeat > 1:
            nodes += [helper.make_node("Unsqueeze", [source, "axis"], [f"{part}/unsqueezed"]),
                      helper.make_node("Expand", [f"{part}/unsqueezed", "factors"], [f"{part}/expanded"]),
                      helper.make_node("Reshape", [f"{part}/expanded", "repeated"], [f"{part}/repeated"])]  # fmt: skip
            source = f"{part}/repeated"
        nodes += [helper.make_node("SimplifiedLayerNormalization", [source, "norm_scale"], [f"{part}/normalized"], axis=-1,
                                   epsilon=1e-6 / key_size, stash_type=1),
                  helper.make_node("Reshape", [f"{part}/normalized", "flat"], [f"{part}/flat"]),
                  helper.make_node("Cast", [f"{part}/flat"], [f"{part}/fp16"], to=TensorProto.FLOAT16),
                  helper.make_node("Reshape", [f"{part}/fp16", "rule_heads"], [f"{part}/rule"])]  # fmt: skip
        shapes += [info(f"{part}/heads", TensorProto.FLOAT, ["B", "T", key_heads, key_size]),
                   info(f"{part}/repeated", TensorProto.FLOAT, ["B", "T", value_heads, key_size]),
                   info(f"{part}/flat", TensorProto.FLOAT, ["B", "T", value_heads * key_size])]  # fmt: skip
    nodes.append(helper.make_node("Cast", ["present/bf16"], ["present"], to=TensorProto.FLOAT))  # read after the parts, as the export's
    outputs = [info(f"{part}/rule", TensorProto.FLOAT16, None) for part in ("q", "k", "v")] + [info("present", TensorProto.FLOAT, None)]
    if rule:
        nodes.append(helper.make_node(OP_TYPE, ["q/rule", "k/rule", "v/rule", "decay", "beta", "state"], ["out", "state/out"],
                                      domain=OP_DOMAIN, scale=0.1))  # fmt: skip
        outputs = [info("out", TensorProto.FLOAT16, None), info("present", TensorProto.FLOAT, None)]
    inputs = [info("x", TensorProto.FLOAT, ["B", "T", channels]), *([info("mask", TensorProto.FLOAT, ["B", "T", 1])] if mask else []),
              *([info("past", TensorProto.FLOAT, ["B", SIZE - 1, channels])] if past else []),
              *([info(name, TensorProto.FLOAT, None) for name in ("decay", "beta", "state")] if rule else [])]  # fmt: skip
    graph = helper.make_graph(nodes, "heads", inputs, outputs, initializers, value_info=shapes)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(OP_DOMAIN, 1)], ir_version=10)


@pytest.mark.parametrize("heads", [(16, 16, 128, 128), (16, 32, 128, 128)], ids=["0.8B", "4B"])
def test_only_what_the_op_computes_is_rewritten(heads: tuple[int, int, int, int]) -> None:
    """The 0.8B's layer (no repeat) and the 4B's (each head twice), with and without the mask, become the op; a layer
    that differs from what it computes in any one way stays as it was: a norm whose scale is not one value, q's and
    k's norms with other epsilons, heads repeated as a whole (``Expand`` on the other axis), a part read by another
    node, a rule reading q as other heads, a mask of another shape, k and q the other way round into the rule."""
    for mask in (False, True):
        assert use_convolution_heads(_unit_model(*heads, mask, True, False)) == 1, (heads, mask)
    model = _unit_model(*heads, True, True, False)
    key_size = heads[2]
    def swap_rule_inputs(graph: onnx.GraphProto) -> None:
        rule = next(node for node in graph.node if node.op_type == OP_TYPE)
        rule.input[0], rule.input[1] = rule.input[1], rule.input[0]

    edits: dict[str, Callable[[onnx.GraphProto], None]] = {
        "scale": lambda g: set_initializer(g, "norm_scale", np.linspace(0.5, 1.5, key_size, dtype=np.float32)),
        "epsilon": lambda g: node_making(g, "k/normalized").attribute[0].CopyFrom(helper.make_attribute("epsilon", 1e-3)),
        "tiled": lambda g: (set_initializer(g, "axis", np.array([2], np.int64)), set_initializer(g, "factors", np.array([1, 1, 2, 1, 1], np.int64))),
        "read": lambda g: g.output.append(helper.make_tensor_value_info("k/flat", TensorProto.FLOAT, None)),
        "rule heads": lambda g: set_initializer(g, "rule_heads", np.array([0, 0, heads[1] * 2, -1], np.int64)),
        "mask": lambda g: next(i for i in g.input if i.name == "mask").CopyFrom(helper.make_tensor_value_info("mask", TensorProto.FLOAT, ["B", 1, "T"])),
        "swapped": swap_rule_inputs,
    }  # fmt: skip
    if heads[0] == heads[1]:  # no repeat in the 0.8B's graph: its "tiled" is the same graph
        del edits["tiled"]
    assert rewritten_edits(model, edits, use_convolution_heads) == [], heads


def test_the_build_option_needs_its_prerequisites(exported: Path, tmp_path: Path, cuda_engine: Callable[..., tuple[Path, str]]) -> None:
    """Refused without --fused-short-convolutions, saying so and writing nothing; with it, every graph's convolutions
    are the op and the library carries its kernel."""
    build = ["build", str(exported), "--backend", "onnxruntime", "--target", "cuda", "--precision", "bf16", "--fused-mixers",
             "--bf16-convolutions", "--gated-delta-kernel", OP_TYPE, "--cuda-arch", "90"]  # fmt: skip
    refused = run_s1omni(*build, "--fused-convolution-heads", "--out", str(tmp_path / "refused"))
    assert refused.returncode == 2 and "--fused-convolution-heads extends the op --fused-short-convolutions" in refused.stderr
    assert not (tmp_path / "refused").exists()
    engine, progress = cuda_engine("--precision", "bf16", "--gated-delta-kernel", OP_TYPE, "--cuda-arch", "90", "--fused-mixers",
                                   "--bf16-convolutions", "--fused-short-convolutions", "--fused-convolution-heads")  # fmt: skip
    assert f"{LAYERS} {HEADS_OP} nodes" in progress
    manifest = read_manifest(engine)
    assert manifest["fused_convolution_heads"] is True and f"short_convolution_heads_{SIZE}_16_2" in manifest["gated_delta_library"]["kernels"]
    for graph in ("prefill", "continue", "packed"):
        ops = Counter(node.op_type for node in onnx.load(str(engine / f"{graph}.onnx"), load_external_data=False).graph.node)
        assert ops[HEADS_OP] == LAYERS and ops[CONVOLUTION_OP] == 0 and ops[OP_TYPE] == 3, graph


def test_the_kernel_compiles_for_sm_90_to_16_byte_accesses(tmp_path: Path) -> None:
    """Without a GPU: the 4B's kernel (heads of 128, each twice) reads its rows and writes q, k and v as 16-byte vectors
    (128-bit ``LDG``/``STG`` in the sm_90 machine code; the weight and bias a value a channel and tap, and the mask a
    value a token, are read narrower)."""
    import triton

    cuobjdump = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    kernel = compile_kernel(convolution_heads_spec(SIZE, 128, 2), 90)
    (tmp_path / "kernel.cubin").write_bytes(kernel.cubin)
    sass = subprocess.run([str(cuobjdump), "-sass", str(tmp_path / "kernel.cubin")], capture_output=True, text=True, check=True).stdout
    stores = {word for word in sass.split() if word.startswith("STG")}
    loads = {word for word in sass.split() if word.startswith("LDG")}
    assert stores and all(store.startswith("STG.E.128") for store in stores), stores
    assert any(load.startswith("LDG.E.128") for load in loads) and all(load.startswith(("LDG.E.128", "LDG.E.U16", "LDG.E")) for load in loads), loads


# Run by test_the_kernel_in_triton_s_interpreter in a process of its own (TRITON_INTERPRET before Triton's import).
_INTERPRETER = """
import sys
import numpy as np, torch, triton
from s1omni.export.gdn_library import convolution_heads_spec
from s1omni.export.short_convolution_kernel import short_convolution_heads_kernel
cases = np.load(sys.argv[1])
ran = {}
for case in range(int(cases["count"])):
    key_heads, value_heads, key_size = (int(n) for n in cases[f"heads{case}"])
    constants = convolution_heads_spec(int(cases["size"]), key_size, value_heads // key_heads).constants
    x, weight, bias, past = (torch.from_numpy(cases[f"{name}{case}"]).view(torch.bfloat16) for name in ("x", "weight", "bias", "past"))
    mask = torch.from_numpy(cases[f"mask{case}"])
    rows, tokens, channels = x.shape
    value_size = (channels - 2 * key_heads * key_size) // value_heads
    q = torch.empty(rows, tokens, value_heads, key_size, dtype=torch.float16)
    k, v = torch.empty_like(q), torch.empty(rows, tokens, value_heads, value_size, dtype=torch.float16)
    present = torch.empty(rows, constants["K"] - 1, channels, dtype=torch.bfloat16)
    grid = (triton.cdiv(channels, constants["BLOCK_C"]), max(1, triton.cdiv(tokens, constants["BLOCK_T"])), rows)
    short_convolution_heads_kernel[grid](x, weight, bias, past, mask, q, k, v, present, tokens, channels, bias.numel(), past.shape[1],
                                         int(mask.numel() > 0), key_heads, key_size ** -0.5, 1e-6 / key_size, **constants)
    ran[f"q{case}"], ran[f"k{case}"], ran[f"v{case}"] = q.numpy(), k.numpy(), v.numpy()
    ran[f"present{case}"] = present.view(torch.int16).numpy()
np.savez(sys.argv[2], **ran)
"""


def _inputs(rng: np.random.Generator, rows: int, tokens: int, heads: tuple[int, int, int, int], bias: bool, past: bool, mask: bool) -> dict[str, np.ndarray]:
    """A layer's bfloat16 inputs (as float32; multiples of 1/16 under 8, the weight and bias of 1/64 under 2, so that
    float32 sums them exactly) for ``heads`` (key heads, value heads, key size, value size); a float32 0/1 mask
    ``[B, T, 1]`` (``[0]`` without), the bias ``[0]`` and the past ``[B, 0, C]`` where there is none."""
    key_heads, value_heads, key_size, value_size = heads
    channels = 2 * key_heads * key_size + value_heads * value_size
    def grid(shape: tuple[int, ...], scale: float, unit: int) -> np.ndarray:
        return (np.clip(np.round(rng.standard_normal(shape) * scale * unit), -127, 127) / unit).astype(np.float32)

    return {"x": grid((rows, tokens, channels), 2.0, 16), "weight": grid((channels, 1, SIZE), 0.5, 64),
            "bias": grid((channels if bias else 0,), 0.5, 64), "past": grid((rows, SIZE - 1 if past else 0, channels), 2.0, 16),
            "mask": (rng.random((rows, tokens, 1)) > 0.3).astype(np.float32) if mask else np.zeros(0, np.float32)}  # fmt: skip


def _exact(inputs: dict[str, np.ndarray], heads: tuple[int, int, int, int]) -> dict[str, np.ndarray]:
    """float64 q, k, v of ``inputs`` (the convolution and SiLU unrounded, masked, q's and k's heads l2-normalized with
    the norm's epsilon and repeated in a row) and the window after the last token."""
    key_heads, value_heads, key_size, value_size = heads
    x = inputs["x"].astype(np.float64)
    rows, tokens, channels = x.shape
    past = inputs["past"] if inputs["past"].shape[1] else np.zeros((rows, SIZE - 1, channels), np.float32)
    padded = np.concatenate([past.astype(np.float64), x], axis=1)
    weight = inputs["weight"][:, 0, :].astype(np.float64)
    total = sum(weight[:, k] * padded[:, k : k + tokens] for k in range(SIZE)) + (inputs["bias"] if inputs["bias"].size else 0.0)
    y = total / (1.0 + np.exp(-total)) * (inputs["mask"] if inputs["mask"].size else 1.0)
    width = key_heads * key_size
    parts = {}
    for name, part in (("q", y[..., :width]), ("k", y[..., width : 2 * width])):
        split = part.reshape(rows, tokens, key_heads, key_size)
        normalized = split / np.sqrt((split**2).sum(-1, keepdims=True) + 1e-6)
        parts[name] = np.repeat(normalized, value_heads // key_heads, axis=2)
    parts["v"] = y[..., 2 * width :].reshape(rows, tokens, value_heads, value_size)
    parts["present"] = padded[:, tokens:].astype(np.float32)
    return parts


def _widened(bits: np.ndarray) -> np.ndarray:
    return (bits.view(np.uint16).astype(np.uint32) << 16).view(np.float32)


def test_the_kernel_in_triton_s_interpreter(tmp_path: Path) -> None:
    """The kernel's indexing, run by Triton's interpreter on the CPU: q, k and v within 1% (the bfloat16 rounding
    before the norm, which the interpreter truncates, and float16's) of the float64 heads, each q/k head in its value
    heads in a row, masked tokens zero, the window after the last token bit for bit; the tiny member's heads (16, twice)
    and the 0.8B's (128) across a 256-channel block cut short, over inputs shorter than the window, with and without a
    mask, a past window and a bias."""
    rng = np.random.default_rng(7)
    shapes = [(1, 1, (2, 4, 16, 16), True, True, True), (2, 37, (2, 4, 16, 16), False, True, True),
              (3, 2, (1, 1, 128, 128), True, False, False), (2, 19, (2, 2, 128, 64), False, False, True)]  # fmt: skip
    cases = [_inputs(rng, rows, tokens, heads, bias, past, mask) for rows, tokens, heads, bias, past, mask in shapes]
    packed = {f"{name}{i}": (bfloat16_bits(value).view(np.int16) if name != "mask" else value) for i, case in enumerate(cases) for name, value in case.items()}
    packed.update({f"heads{i}": np.array(shape[2][:3]) for i, shape in enumerate(shapes)})
    np.savez(tmp_path / "cases.npz", size=SIZE, count=len(cases), **packed)
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
    subprocess.run([sys.executable, "-c", _INTERPRETER, str(tmp_path / "cases.npz"), str(tmp_path / "ran.npz")], env=env, check=True)
    ran = np.load(tmp_path / "ran.npz")
    for i, (shape, case) in enumerate(zip(shapes, cases, strict=True)):
        exact = _exact(case, shape[2])
        for name in ("q", "k", "v"):
            got = ran[f"{name}{i}"].astype(np.float64)
            assert got.shape == exact[name].shape and np.allclose(got, exact[name], rtol=0.01, atol=0.01 * np.abs(exact[name]).max()), (shape, name)
        assert np.array_equal(_widened(ran[f"present{i}"]), exact["present"]), shape


def _feeds(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {"x": inputs["x"], **({"past": inputs["past"]} if inputs["past"].shape[1] else {}), **({"mask": inputs["mask"]} if inputs["mask"].size else {})}


def _unit_sessions(library: Path, inputs: dict[str, np.ndarray], heads: tuple[int, int, int, int]) -> dict[str, onnxruntime.InferenceSession]:
    """The layer's graph as a build writes it, on the CUDA EP, without the rule (q, k, v and the window its outputs):
    ``graph`` (ONNX Runtime's nodes after the op library's convolution) and ``op`` (rewritten to the op)."""
    facts = {"mask": bool(inputs["mask"].size), "past": bool(inputs["past"].shape[1]), "bias": bool(inputs["bias"].size)}
    made = {}
    for name in ("graph", "op"):
        model = _unit_model(*heads, **facts, weight=inputs["weight"], bias_values=inputs["bias"])
        if name == "op":
            assert use_convolution_heads(model) == 1
        rule = next(node for node in model.graph.node if node.op_type == OP_TYPE)
        model.graph.node.remove(rule)
        del model.graph.output[:], model.graph.input[len(model.graph.input) - 3 :]
        model.graph.output.extend([helper.make_tensor_value_info(f"{part}/rule", TensorProto.FLOAT16, None) for part in ("q", "k", "v")]
                                  + [helper.make_tensor_value_info("present", TensorProto.FLOAT, None)])  # fmt: skip
        made[name] = onnxruntime.InferenceSession(model.SerializeToString(), session_options("cuda", library), providers=CUDA)
    return made


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("tokens", [1, 3, 64, 600, 2048])
@pytest.mark.parametrize("heads", [(16, 16, 128, 128), (16, 32, 128, 128), (2, 4, 16, 16)], ids=["0.8B", "4B", "tiny"])
def test_the_op_writes_what_the_graph_did_on_the_gpu(gpu_library: Path, heads: tuple[int, int, int, int], tokens: int) -> None:
    """The op against the graph it replaced (the op library's convolution, then ONNX Runtime's cast, mask, split,
    repeat, norms and casts), both on this GPU: v and the window bit for bit (the same convolution, and casts that
    round alike), q and k within one float16 step (float32 norms in another order), at most 1% of them not the same;
    and q, k, v within 1% of the float64 heads. One or three rows, with and without a mask, a past window and a bias."""
    rng = np.random.default_rng(tokens + heads[1])
    for rows, bias, past, mask in ((1, False, False, False), (3, True, True, True), (1, True, False, True), (3, False, True, False)):
        inputs = _inputs(rng, rows, tokens, heads, bias, past, mask)
        sessions = _unit_sessions(gpu_library, inputs, heads)
        ours, theirs = (dict(zip(("q", "k", "v", "present"), sessions[name].run(None, _feeds(inputs)), strict=True)) for name in ("op", "graph"))
        case = (rows, tokens, heads, bias, past, mask)
        assert np.array_equal(ours["v"], theirs["v"]) and np.array_equal(ours["present"], theirs["present"]), case
        exact = _exact(inputs, heads)
        for name in ("q", "k"):
            got, want = ours[name].astype(np.float32), theirs[name].astype(np.float32)
            step = np.spacing(np.maximum(np.abs(got), np.abs(want)).astype(np.float16)).astype(np.float32)
            assert np.all(np.abs(got - want) <= step) and np.mean(got != want) <= 0.01, (case, name)
        for name in ("q", "k", "v"):
            got = ours[name].astype(np.float64)
            assert np.allclose(got, exact[name], rtol=0.01, atol=0.01 * max(np.abs(exact[name]).max(), 1e-3)), (case, name)


@pytest.mark.gpu
@needs_cuda
def test_the_op_s_time_beside_the_graph_s(gpu_library: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Printed, not held to anything: microseconds a layer's call of the op and of the graph it replaced (the op
    library's convolution and ONNX Runtime's nodes after it), on the 0.8B's and the 4B's heads at 600 and 2,048
    tokens, the inputs resident on the GPU, 200 calls after 10."""
    timings = {}
    for name, heads in (("0.8B", (16, 16, 128, 128)), ("4B", (16, 32, 128, 128))):
        for tokens in (600, 2048):
            inputs = _inputs(np.random.default_rng(tokens), 1, tokens, heads, False, True, False)
            for variant, session in _unit_sessions(gpu_library, inputs, heads).items():
                timings[f"{variant} {name} T={tokens}"] = microseconds_a_call(session, _feeds(inputs))
    with capsys.disabled():
        print(f"\nconvolution heads, us a call (the input casts included): {json.dumps(timings)}")


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("merged", [True, False], ids=["merged", "unmerged"])
def test_the_cuda_ep_runs_the_rewrite_as_the_graph_without_it(gpu_library: Path, external_export: Path, tmp_path: Path, merged: bool) -> None:
    """Prefill, then continue from its state, through the tiny member's rewritten graphs on the CUDA EP (the op library's
    rule, convolution heads, bfloat16 GEMMs) against the same graphs without the rewrite there: every output within a
    few bfloat16 steps (a q or k value a float16 step apart moves the rule's output a little, and it travels)."""
    assert_cuda_ep_runs_the_rewrite_as_without(gpu_library, external_export, tmp_path, lambda graph, weights, heads: _built(external_export, graph, weights, merged, heads))
