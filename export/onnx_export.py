"""ONNX export of a Qwen3.5 text backbone (a Vela 2.0 decoder's; OmniJev's language model) as two
graphs with explicit state.

``prefill.onnx`` runs left-padded prefixes from zero state and returns the hidden states at the
readouts plus every state tensor; ``continue.onnx`` runs right-padded blocks from those states.
Batch, sequence, readout and prefix axes are dynamic. A vision member's prefill takes token
embeddings (``inputs_embeds``) rather than ids, so that its image features can take the place of
the image placeholders' embeddings.

How: ``torch.export`` of the forward in ``s1omni.export.patches`` (the model's own modules, with the two
token mixers made state-explicit), then the dynamo ONNX exporter. The projections, norms, rotary
and MLP are traced rather than rewritten, and the one construct a trace cannot express, the
recurrence over a dynamic number of chunks, is a ``torch`` ``scan`` that the exporter lowers to a
single ONNX ``Scan``. TorchScript export is deprecated in torch 2.13, and an ``onnx.helper``
writer would re-implement every module by hand. ``torch.export`` runs with its shape guards
enforced, so a guard that holds only for some lengths fails the export; ``torch.onnx.export``'s
own capture would instead narrow the dynamic axes silently (to lengths 64k + 6, say).

Members whose weights exceed ``EXTERNAL_DATA_BYTES`` keep them in ``weights.data``, written once
for both graphs (the two traces fold the same weights into the same constants). Every export is
checked before it is kept (``s1omni.export.onnx_check``).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
import time
import warnings
from importlib.metadata import version
from pathlib import Path
from typing import Any

import onnx
import onnx_ir as ir
import torch
from onnxscript import opset18 as op
from onnx.defs import OpSchema
from onnxscript.values import Op, Opset
from torch import nn

from s1omni.runtime.runners.torch_runner import load_backbone
from s1omni.runtime.staging import staged_directory
from s1omni.runtime.vela2.package import shard_names

from .onnx_check import LENGTHS, check_graphs
from .patches import RECURRENCES, ContinueForward, PrefillForward, explicit_state_forward, state_names

OPSET = 18  # Scan, Trilu, CumSum and Softplus are all there; TensorRT 10 parses it
EXTERNAL_DATA_BYTES = 1_500_000_000  # weights above this go to weights.data (protobuf stops at 2 GiB)
WEIGHTS_FILE = "weights.data"
EXTERNAL_MIN_BYTES = 1024  # smaller constants stay in the graphs
ALIGNMENT = 65536  # large tensors start at offsets ONNX Runtime can memory-map on any page size
EXAMPLE_LENGTH = 70  # crosses a chunk boundary; any length traces the same graph
PREFILL_INPUTS = ["input_ids", "position_ids", "attention_mask", "readout_index"]
# Vision members' prefill: token embeddings with the image features in place (the runner looks them up).
PREFILL_EMBEDS_INPUTS = ["inputs_embeds", "position_ids", "attention_mask", "readout_index"]
CONTINUE_INPUTS = ["input_ids", "position_ids", "past_mask", "readout_index"]


def exact_sigmoid(self):
    """``1 / (1 + exp(-x))``, as torch computes it. ONNX Runtime's CPU ``Sigmoid`` is a polynomial fit
    good to ~1.5e-7 absolute, thousands of ulps off for small outputs (torch's: 2 ulps)."""
    return op.Reciprocal(op.Add(op.CastLike(1.0, self), op.Exp(op.Neg(self))))


def exact_silu(self):
    """``x / (1 + exp(-x))``, as torch computes it (the exporter's default is ``x * Sigmoid(x)``)."""
    return op.Div(self, op.Add(op.CastLike(1.0, self), op.Exp(op.Neg(self))))


def _linear_attention_schema() -> OpSchema:
    """The part of ONNX Runtime's ``com.microsoft`` ``LinearAttention`` schema (1.31) these graphs use;
    onnx itself registers no contrib schemas, and the exporter needs one to emit the node."""
    parameter, optional = OpSchema.FormalParameter, OpSchema.FormalParameterOption.Optional
    attribute = OpSchema.Attribute
    return OpSchema(
        "LinearAttention",
        "com.microsoft",
        1,
        inputs=[
            *(parameter(name, "T") for name in ("query", "key", "value")),
            parameter("past_state", "S", param_option=optional),
            *(parameter(name, "T", param_option=optional) for name in ("decay", "beta")),
        ],
        outputs=[parameter("output", "T"), parameter("present_state", "S")],
        type_constraints=[("T", ["tensor(float)"], "activations"), ("S", ["tensor(float)"], "recurrent state")],
        attributes=[
            attribute("q_num_heads", OpSchema.AttrType.INT, "query heads"),
            attribute("kv_num_heads", OpSchema.AttrType.INT, "key/value heads"),
            attribute("update_rule", OpSchema.AttrType.STRING, "linear, gated, delta or gated_delta"),
        ],
    )


LINEAR_ATTENTION = Op(Opset("com.microsoft", 1), "LinearAttention", _linear_attention_schema())


def linear_attention(query, key, value, state, decay, beta, heads: int):
    """``s1omni::gated_delta_rule`` as ONNX Runtime's contrib node (same argument order and meaning)."""
    return LINEAR_ATTENTION(query, key, value, state, decay, beta, q_num_heads=heads, kv_num_heads=heads, update_rule="gated_delta")


LOWERINGS = {
    torch.ops.aten.sigmoid.default: exact_sigmoid,
    torch.ops.aten.silu.default: exact_silu,
    torch.ops.s1omni.gated_delta_rule.default: linear_attention,
}


def graph_file(graph: str, recurrence: str) -> str:
    """``prefill.onnx`` (portable ``Scan``), ``prefill.fused.onnx`` (ONNX Runtime's fused kernels), ..."""
    return f"{graph}.onnx" if recurrence == "scan" else f"{graph}.{recurrence}.onnx"


def progress(message: str) -> None:
    print(f"export: {message}", file=sys.stderr, flush=True)


def move_into(directory: Path, target: Path) -> None:
    """Move the files of ``directory`` (an exporter's own atomic output) into ``target`` and remove it."""
    for path in sorted(directory.iterdir()):
        shutil.move(str(path), target / path.name)
    directory.rmdir()


def load_package_backbone(package_dir: Path) -> nn.Module:
    """The backbone of a Vela 2.0 decoder package in float32, loaded as the torch reference loads it."""
    config = json.loads((package_dir / "config.json").read_text(encoding="utf-8"))
    return load_backbone(config["backbone_config"], [package_dir / name for name in shard_names(package_dir)])


def _dims() -> dict[str, torch.export.Dim]:
    return {name: torch.export.Dim(name, min=1) for name in ("batch", "sequence", "readouts", "past_sequence")}


def prefill_example(model: nn.Module, length: int, embeds: bool = False) -> tuple[tuple[torch.Tensor, ...], tuple[Any, ...]]:
    """Example inputs (two rows, the first left-padded; token ids or embeddings) and their dynamic axes."""
    batch, d = 2, _dims()
    if embeds:
        inputs = torch.randn(batch, length, model.config.hidden_size)
    else:
        inputs = torch.randint(1, model.config.vocab_size, (batch, length))
    mask = torch.ones(batch, length, dtype=torch.long)
    mask[0, :3] = 0
    positions = torch.arange(length).expand(3, batch, length).clone()
    readouts = torch.tensor([[length - 1, 5, 3], [length - 1, 0, 2]])
    rows = {0: d["batch"], 1: d["sequence"]}
    return (inputs, positions, mask, readouts), (rows, {1: d["batch"], 2: d["sequence"]}, rows, {0: d["batch"], 1: d["readouts"]})


def _example_state(model: nn.Module, name: str, batch: int, past: int) -> torch.Tensor:
    kind, index = name.split(".")
    layer = model.layers[int(index)]
    if kind == "conv":
        return torch.randn(batch, layer.linear_attn.conv_dim, layer.linear_attn.conv_kernel_size - 1)
    if kind == "recurrent":
        mixer = layer.linear_attn
        return 0.1 * torch.randn(batch, mixer.num_v_heads, mixer.head_k_dim, mixer.head_v_dim)
    return torch.randn(batch, model.config.num_key_value_heads, past, layer.self_attn.head_dim)


def continue_example(model: nn.Module, length: int) -> tuple[tuple[torch.Tensor, ...], tuple[Any, ...]]:
    """Example blocks (three rows of ``length``) after a prefix of ``length + 5`` and their dynamic axes."""
    batch, past, d = 3, length + 5, _dims()
    names = state_names(model.config.layer_types)
    ids = torch.randint(1, model.config.vocab_size, (batch, length))
    positions = (past + torch.arange(length)).expand(3, batch, length).clone()
    past_mask = torch.ones(batch, past, dtype=torch.long)
    readouts = torch.tensor([[length - 1, 0], [1, 2], [0, 0]])
    states = [_example_state(model, name, batch, past) for name in names]
    state_axes = tuple({0: d["batch"], 2: d["past_sequence"]} if name.startswith(("key", "value")) else {0: d["batch"]} for name in names)
    shapes = (
        {0: d["batch"], 1: d["sequence"]},
        {1: d["batch"], 2: d["sequence"]},
        {0: d["batch"], 1: d["past_sequence"]},
        {0: d["batch"], 1: d["readouts"]},
        state_axes,  # ``*past`` is one argument to torch.export
    )
    return (ids, positions, past_mask, readouts, *states), shapes


def trace(module: nn.Module, args: tuple[torch.Tensor, ...], shapes: tuple[Any, ...], recurrence: str) -> torch.export.ExportedProgram:
    """``torch.export`` with the state-explicit mixers installed; a guard that narrows an axis fails here."""
    with (
        torch.no_grad(),
        explicit_state_forward(module.model, recurrence),
        # Size-oblivious reasoning: an axis of size 1 is not a special case (one token, one chunk, one row).
        torch.fx.experimental._config.patch(backed_size_oblivious=True),
    ):
        return torch.export.export(module, args, dynamic_shapes=shapes, strict=False)


def to_onnx(program: torch.export.ExportedProgram, shapes: tuple[Any, ...], inputs: list[str], outputs: list[str], opset: int) -> ir.Model:
    """The exported program as an ONNX model (optimised by the exporter: constants folded, names given)."""
    # Without grad: with it, decomposing the scan goes through its autograd partitioner, which fails.
    with torch.no_grad(), warnings.catch_warnings():
        # Axes shared by several inputs (batch, past_sequence) are named once; the exporter warns per axis.
        warnings.filterwarnings("ignore", message=".*will not be used, since it shares the same shape constraints")
        onnx_program = torch.onnx.export(
            program,
            dynamic_shapes=shapes,
            input_names=inputs,
            output_names=outputs,
            opset_version=opset,
            custom_translation_table=LOWERINGS,
            dynamo=True,
            verbose=False,
        )
    return onnx_program.model


class SharedWeights:
    """One external data file for several graphs: constants already written are referenced, not repeated."""

    def __init__(self, directory: Path):
        self.directory = directory
        self.offsets: dict[tuple[Any, ...], int] = {}

    def externalize(self, model: ir.Model) -> None:
        with (self.directory / WEIGHTS_FILE).open("ab") as data:
            for value in model.graph.initializers.values():
                tensor = value.const_value
                if tensor is None or tensor.nbytes < EXTERNAL_MIN_BYTES:
                    continue
                raw = tensor.tobytes()
                key = (tensor.dtype, tuple(tensor.shape), hashlib.sha256(raw).digest())
                if key not in self.offsets:
                    if len(raw) >= ALIGNMENT:
                        data.write(b"\0" * (-data.tell() % ALIGNMENT))
                    self.offsets[key] = data.tell()
                    data.write(raw)
                value.const_value = ir.ExternalTensor(
                    WEIGHTS_FILE, self.offsets[key], len(raw), tensor.dtype, shape=tensor.shape, name=value.name, base_dir=self.directory
                )


def node_count(model: onnx.ModelProto) -> int:
    """Nodes of the graph and of every subgraph (a Scan body counts once, whatever the length)."""

    def count(graph: onnx.GraphProto) -> int:
        subgraphs = (attribute.g for node in graph.node for attribute in node.attribute if attribute.type == onnx.AttributeProto.GRAPH)
        return len(graph.node) + sum(count(subgraph) for subgraph in subgraphs)

    return count(model.graph)


def export_model(
    model: nn.Module,
    out_dir: Path,
    *,
    opset: int = OPSET,
    example_length: int = EXAMPLE_LENGTH,
    external_data_bytes: int = EXTERNAL_DATA_BYTES,
    check: bool = True,
    prefill_embeds: bool = False,
    recurrences: tuple[str, ...] = RECURRENCES,
) -> Path:
    """Trace ``model`` into ``out_dir``, atomically: ``prefill.onnx``, ``continue.onnx`` (and their
    ``.fused`` twins; see ``graph_file``), ``export.json``.

    ``prefill_embeds``: the prefill takes ``inputs_embeds`` rather than token ids (vision members).
    ``recurrences``: which Gated DeltaNet forms to write (``RECURRENCES``), each as both graphs.
    """
    if not recurrences or set(recurrences) - set(RECURRENCES):
        raise ValueError(f"recurrences: one or more of {', '.join(RECURRENCES)}")
    names = state_names(model.config.layer_types)
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    prefill_inputs = PREFILL_EMBEDS_INPUTS if prefill_embeds else PREFILL_INPUTS
    graphs = {
        "prefill": (
            PrefillForward(model, prefill_embeds),
            prefill_example(model, example_length, prefill_embeds),
            prefill_inputs,
            ["hidden", *names],
        ),
        "continue": (ContinueForward(model), continue_example(model, example_length), CONTINUE_INPUTS + [f"past_{n}" for n in names], ["hidden"]),
    }
    started = time.perf_counter()
    with staged_directory(out_dir) as stage:
        shared = SharedWeights(stage) if weights > external_data_bytes else None
        files = {recurrence: {name: graph_file(name, recurrence) for name in graphs} for recurrence in recurrences}
        nodes: dict[str, dict[str, int]] = {recurrence: {} for recurrence in recurrences}
        for recurrence in recurrences:
            for name, (module, (args, shapes), inputs, outputs) in graphs.items():
                file = files[recurrence][name]
                progress(f"tracing {name} ({len(model.layers)} layers, {recurrence} recurrence)")
                graph = to_onnx(trace(module, args, shapes, recurrence), shapes, inputs, outputs, opset)
                progress(f"writing {file}" + (f" (weights in {WEIGHTS_FILE})" if shared else ""))
                if shared:
                    shared.externalize(graph)
                ir.save(graph, stage / file)
                onnx.checker.check_model(str(stage / file))
                nodes[recurrence][name] = node_count(onnx.load(str(stage / file), load_external_data=False))
        seconds = time.perf_counter() - started
        report = check_graphs(model, stage, files) if check else None
        record = {
            "format": "s1omni-backbone-onnx/2",
            "graphs": files,
            "weights": WEIGHTS_FILE if shared else None,
            "state": names,
            "prefill_input": prefill_inputs[0],
            "opset": opset,
            "example_length": example_length,
            "nodes": nodes,
            "export_seconds": round(seconds, 1),
            "check": {"lengths": list(LENGTHS), "max_relative": report} if report else None,
            "versions": {package: version(package) for package in ("torch", "transformers", "onnx", "onnxruntime", "onnxscript")},
        }
        (stage / "export.json").write_text(json.dumps(record, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    progress(f"wrote {out_dir} in {time.perf_counter() - started:.0f} s")
    return out_dir


def export_backbone(package_dir: str | Path, out_dir: str | Path, *, opset: int = OPSET, recurrences: tuple[str, ...] = RECURRENCES) -> Path:
    """Export a Vela 2.0 decoder package's backbone into ``out_dir``; the caller has verified the package."""
    progress(f"loading {package_dir}")
    return export_model(load_package_backbone(Path(package_dir)), Path(out_dir), opset=opset, recurrences=recurrences)
