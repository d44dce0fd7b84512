"""ONNX export of a Qwen3.5 text backbone (a Vela 2.0 decoder's; OmniJev's language model) as graphs
with explicit state.

``prefill.onnx`` runs left-padded prefixes from zero state and returns the hidden states at the
readouts plus every state tensor; ``continue.onnx`` runs right-padded blocks from those states;
``packed.onnx`` (Vela 2.0's ``shared_context``; ``patches.PackedForward``) runs each prefix's blocks
packed into one row from the same states. Batch, sequence, readout, prefix and block axes are dynamic. A vision member's prefill takes token
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

The graph depends on the member's config, not on its weight values, so each graph is traced from
a model on the ``meta`` device: no copy of the weights is made while tracing, and the graphs
(prefill and continue, per recurrence) are traced side by side in worker processes, one per CPU
core (this process one of them where there are no more cores than graphs). Only three layers are traced, whatever the member's depth: the rest are stamped from them
before the optimiser runs (``s1omni.export.layer_stamp``), which leaves the optimiser's pass over
the whole graph as the one cost that grows with the layers. The weights the optimiser folds by
value (small ones) go to the trace; every larger weight is a placeholder there
(``s1omni.export.graph_weights``), filled from the package's safetensors one tensor at a time (the
next one read while this one is written). The graphs are those a trace of the loaded model gives,
node for node and byte for byte (``tests/test_onnx_export.py``, ``tests/test_layer_stamp.py``).

Members whose weights exceed ``EXTERNAL_DATA_BYTES`` keep them in ``weights.data`` (several files
for the largest: ``graph_weights.weights_files``), written once for both graphs, and written while
the graphs are traced: which weights a graph binds, and transposed or not, follows from the config
(``traced_bindings``), so the placeholders only have to be pointed at them once the graphs exist.
Every export is checked before it is kept (``s1omni.export.onnx_check``).
"""

from __future__ import annotations

import copy
import json
import logging
import os
import shutil
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import onnx
import onnx_ir as ir
import torch
from onnx.defs import OpSchema
from onnxscript import opset18 as op
from onnxscript import rewriter
from onnxscript.optimizer._constant_folding import FOLDED_FROM_KEY
from onnxscript.values import Op, Opset
from torch import nn

from s1omni.runtime import progress
from s1omni.runtime.runners.packing import MIN_BLOCK_WIDTH, PACKING_INPUTS
from s1omni.runtime.runners.torch_runner import BACKBONE_PREFIX, eager_config, empty_backbone
from s1omni.runtime.staging import staged_directory
from s1omni.runtime.vela2.package import shard_names

from .graph_weights import (
    FOLD_LIMIT,
    PLACEHOLDER,
    Binding,
    ModuleTensors,
    PackageTensors,
    SharedWeights,
    TensorSource,
    bind_weights,
    foldable,
    read_float32,
    write_ahead,
)
from .layer_stamp import stamp_layers, template_types
from .onnx_check import LENGTHS, Expected, check_graphs, reference_outputs
from .naming import CONTRIB_DOMAIN, GRAPHS, RECURRENCES, graph_file
from .patches import ContinueForward, PackedForward, PrefillForward, explicit_state_forward, state_names
from .workers import share, worker_count

T = TypeVar("T")

OPSET = 18  # Scan, Trilu, CumSum and Softplus are all there; TensorRT 10 parses it
EXTERNAL_DATA_BYTES = 1_500_000_000  # weights above this go to weights.data (protobuf stops at 2 GiB)
EXAMPLE_LENGTH = 70  # crosses a chunk boundary; any length traces the same graph
# The optimiser's one rule of two output nodes matches each Slice against every node of the graph, a
# cost that grows with the square of the layers (85% of the optimiser's time at 16 layers); it rewrites
# nothing in these graphs, which are byte for byte the same without it (tests/test_onnx_export.py).
QUADRATIC_RULES = ("SlicesSplit",)
PREFILL_INPUTS = ["input_ids", "position_ids", "attention_mask", "readout_index"]
# Vision members' prefill: token embeddings with the image features in place (the runner looks them up).
PREFILL_EMBEDS_INPUTS = ["inputs_embeds", "position_ids", "attention_mask", "readout_index"]
CONTINUE_INPUTS = ["input_ids", "position_ids", "past_mask", "readout_index"]
PACKED_INPUTS = CONTINUE_INPUTS + list(PACKING_INPUTS)


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
        CONTRIB_DOMAIN,
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


LINEAR_ATTENTION = Op(Opset(CONTRIB_DOMAIN, 1), "LinearAttention", _linear_attention_schema())


def linear_attention(query, key, value, state, decay, beta, heads: int):
    """``s1omni::gated_delta_rule`` as ONNX Runtime's contrib node (same argument order and meaning)."""
    return LINEAR_ATTENTION(query, key, value, state, decay, beta, q_num_heads=heads, kv_num_heads=heads, update_rule="gated_delta")


LOWERINGS = {
    torch.ops.aten.sigmoid.default: exact_sigmoid,
    torch.ops.aten.silu.default: exact_silu,
    torch.ops.s1omni.gated_delta_rule.default: linear_attention,
}


def move_into(directory: Path, target: Path) -> None:
    """Move the files of ``directory`` (an exporter's own atomic output) into ``target`` and remove it."""
    for path in sorted(directory.iterdir()):
        shutil.move(str(path), target / path.name)
    directory.rmdir()


def package_backbone(package_dir: Path) -> tuple[Any, PackageTensors]:
    """The config of a Vela 2.0 decoder package's backbone and its weights, not read yet."""
    config = json.loads((package_dir / "config.json").read_text(encoding="utf-8"))
    shards = [package_dir / name for name in shard_names(package_dir)]
    return eager_config(config["backbone_config"]), PackageTensors(shards, BACKBONE_PREFIX)


def loaded_backbone(config: Any, source: TensorSource) -> nn.Module:
    """The model the torch reference loads (float32, every weight strictly), converted one tensor at a time:
    the member's weights are in memory once, never beside a second copy of them."""
    model = empty_backbone(config)
    model.load_state_dict({name: torch.from_numpy(read_float32(source, name)) for name in source.shapes()}, strict=True, assign=True)
    return model


def load_package_backbone(package_dir: Path) -> nn.Module:
    """The backbone of a Vela 2.0 decoder package in float32, as the torch reference loads it."""
    return loaded_backbone(*package_backbone(package_dir))


def _dims() -> dict[str, torch.export.Dim]:
    dims = {name: torch.export.Dim(name, min=1) for name in ("batch", "sequence", "readouts", "past_sequence", "blocks")}
    # Block rows are at least MIN_BLOCK_WIDTH wide (the runner pads one-token blocks): the Gated DeltaNet mixer
    # reshapes a transposed view of them, which the trace can do only for a width known not to be 1.
    return {**dims, "block_sequence": torch.export.Dim("block_sequence", min=MIN_BLOCK_WIDTH)}


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


def packed_example(model: nn.Module, length: int) -> tuple[tuple[torch.Tensor, ...], tuple[Any, ...]]:
    """Example packed blocks (``patches.Packing``): two prefixes of ``length + 5``, the first with blocks of
    ``length`` and ``length // 2`` tokens, the second with one of ``length``; and their dynamic axes."""
    rows_, past, d = 2, length + 5, _dims()
    names = state_names(model.config.layer_types)
    lengths, owner = [length, length // 2, length], [0, 0, 1]
    width = length + length // 2
    ids = torch.randint(1, model.config.vocab_size, (rows_, width))
    positions = (past + torch.arange(width)).expand(3, rows_, width).clone()
    block_index = torch.zeros(len(lengths), length, dtype=torch.long)
    packed_index = torch.zeros(rows_, width, dtype=torch.long)
    used = [0] * rows_
    for block, (size, row) in enumerate(zip(lengths, owner, strict=True)):
        flat = row * width + used[row] + torch.arange(size)
        block_index[block, :size], block_index[block, size:] = flat, flat[-1]
        packed_index[row, used[row] : used[row] + size] = block * length + torch.arange(size)
        used[row] += size
    past_mask = torch.ones(rows_, past, dtype=torch.long)
    readouts = torch.tensor([[length - 1, width - 1, 0], [length - 1, 2, 0]])
    states = [_example_state(model, name, rows_, past) for name in names]
    state_axes = tuple({0: d["batch"], 2: d["past_sequence"]} if name.startswith(("key", "value")) else {0: d["batch"]} for name in names)
    block_axes = {0: d["blocks"], 1: d["block_sequence"]}
    shapes = (
        {0: d["batch"], 1: d["sequence"]},
        {1: d["batch"], 2: d["sequence"]},
        {0: d["batch"], 1: d["past_sequence"]},
        {0: d["batch"], 1: d["readouts"]},
        block_axes,
        {0: d["batch"], 1: d["sequence"]},
        {0: d["blocks"]},
        state_axes,
    )
    return (ids, positions, past_mask, readouts, block_index, packed_index, torch.tensor(owner), *states), shapes


# What torch.export, the ONNX exporter and transformers print during an export that says nothing about it:
# (logger, message start) for their log records, (category, message pattern) for their warnings.
NOISE_LOGS = (
    # The exporter lists the torchvision ops it cannot register (torchvision is not a dependency).
    ("torch.onnx._internal.exporter._registration", "torchvision is not installed"),
    # The check's torch reference runs transformers' readable Gated DeltaNet, as it is meant to.
    ("transformers.integrations.hub_kernels", "`causal_conv1d_fn` is falling back to its reference"),
    ("transformers.integrations.hub_kernels", "`chunk_gated_delta_rule` is falling back to its reference"),
)
NOISE_WARNINGS = (
    # torch.export deep-copies its own tree specs through a deprecated isinstance check.
    (FutureWarning, r"`isinstance\(treespec, LeafSpec\)` is deprecated"),
    # Axes shared by several inputs (batch, past_sequence) are named once; the exporter warns per axis.
    (UserWarning, r".*will not be used, since it shares the same shape constraints"),
)


class _DropMessages(logging.Filter):
    def __init__(self, starts: tuple[str, ...]):
        super().__init__()
        self.starts = starts

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.starts)


@contextmanager
def quiet_third_party() -> Iterator[None]:
    """Silence ``NOISE_LOGS`` and ``NOISE_WARNINGS`` (only those) for the duration of the block."""
    filters = []
    for name in dict.fromkeys(logger for logger, _ in NOISE_LOGS):
        drop = _DropMessages(tuple(start for logger, start in NOISE_LOGS if logger == name))
        logging.getLogger(name).addFilter(drop)
        filters.append((name, drop))
    try:
        with warnings.catch_warnings():
            for category, pattern in NOISE_WARNINGS:
                warnings.filterwarnings("ignore", message=pattern, category=category)
            yield
    finally:
        for name, drop in filters:
            logging.getLogger(name).removeFilter(drop)


def without_fake_tensor_cache() -> AbstractContextManager[None]:
    """Fake tensor modes created in the block dispatch every op rather than look its output up: with
    symbolic shapes, the cache's keys and the outputs it rebuilds cost more than the meta kernels they
    save (the tiny member's four graphs take 42 s of CPU without it, 48 s with it, and are the same graphs)."""
    return torch._dynamo.config.patch(fake_tensor_cache_enabled=False)


def trace(module: nn.Module, args: tuple[torch.Tensor, ...], shapes: tuple[Any, ...], recurrence: str) -> torch.export.ExportedProgram:
    """``torch.export`` with the state-explicit mixers installed; a guard that narrows an axis fails here."""
    with (
        torch.no_grad(),
        quiet_third_party(),
        explicit_state_forward(module.model, recurrence),
        # Size-oblivious reasoning: an axis of size 1 is not a special case (one token, one chunk, one row).
        torch.fx.experimental._config.patch(backed_size_oblivious=True),
        # The program keeps the fake tensor mode this creates, so ``to_onnx``'s passes run without the cache too.
        without_fake_tensor_cache(),
    ):
        return torch.export.export(module, args, dynamic_shapes=shapes, strict=False)


@contextmanager
def rewrite_rules_left_out(names: tuple[str, ...]) -> Iterator[None]:
    """The onnxscript optimiser's default rewrite rules less ``names``, for the duration of the block."""
    rules = rewriter._DEFAULT_REWRITE_RULES  # what ``optimize_ir`` applies, read when it runs
    rewriter._DEFAULT_REWRITE_RULES = tuple(rule for rule in rules if rule.name not in names)
    try:
        yield
    finally:
        rewriter._DEFAULT_REWRITE_RULES = rules


def to_onnx(
    program: torch.export.ExportedProgram,
    shapes: tuple[Any, ...],
    inputs: list[str],
    outputs: list[str],
    opset: int,
    prepare: Callable[[ir.Model], None] | None = None,
    rules_left_out: tuple[str, ...] = QUADRATIC_RULES,
) -> ir.Model:
    """The exported program as an ONNX model, optimised as the exporter optimises (constants folded) less
    ``rules_left_out``, then its inputs and outputs named. ``prepare`` sees the translated model before
    the optimiser does."""
    # Without grad: with it, decomposing the scan goes through its autograd partitioner, which fails.
    with torch.no_grad(), quiet_third_party():
        onnx_program = torch.onnx.export(
            program,
            dynamic_shapes=shapes,
            opset_version=opset,
            custom_translation_table=LOWERINGS,
            dynamo=True,
            optimize=False,
            verbose=False,
        )
        if prepare:
            prepare(onnx_program.model)
        with rewrite_rules_left_out(rules_left_out):
            onnx_program.optimize()
    model = onnx_program.model
    for values, names in ((model.graph.inputs, inputs), (model.graph.outputs, outputs)):
        if len(values) != len(names):
            raise ValueError(f"the graph has {len(values)} inputs or outputs where {len(names)} names were given")
        for value, name in zip(values, names, strict=True):
            value.name = name
    return model


class _Placeholders:
    """The weights of a graph traced on the ``meta`` device, before the optimiser sees them: the foldable
    ones by value, every other one as a placeholder, whose lone ``Transpose`` is folded here as the
    optimiser would fold it (into an initializer named after the transpose's output)."""

    def __init__(self, values: Mapping[str, np.ndarray], prefix: str):
        self.values, self.prefix = values, prefix
        # By placeholder tensor (the optimiser renames values, and their tensors with them, but keeps the tensors).
        self.bindings: dict[int, tuple[ir.ExternalTensor, Binding]] = {}

    def _placeholder(self, value: ir.Value, binding: Binding, shape: tuple[int, ...]) -> None:
        size = 4 * int(np.prod(shape))
        tensor = ir.ExternalTensor(PLACEHOLDER, 0, size, ir.DataType.FLOAT, shape=ir.Shape(shape), name=value.name, base_dir="")
        self.bindings[id(tensor)] = (tensor, binding)
        value.const_value = tensor

    def __call__(self, model: ir.Model) -> None:
        graph = model.graph
        for value in list(graph.initializers.values()):
            tensor = value.const_value
            raw = getattr(tensor, "raw", None)  # the exporter wraps the program's tensors, so a meta weight shows here
            if not (isinstance(raw, torch.Tensor) and raw.is_meta):
                continue
            weight = value.name.removeprefix(self.prefix)
            if weight in self.values:
                value.const_value = ir.tensor(self.values[weight], name=value.name)
                continue
            if tensor.dtype != ir.DataType.FLOAT:
                raise ValueError(f"{weight}: a {tensor.dtype} weight; the export binds float32 weights")
            shape = tuple(int(d) for d in tensor.shape)
            uses = list(value.uses())
            node = uses[0].node if len(uses) == 1 else None
            if node is None or (node.domain, node.op_type) != ("", "Transpose") or node.outputs[0].is_graph_output():
                self._placeholder(value, Binding(weight), shape)
                continue
            perm_attribute = node.attributes.get("perm")
            perm = tuple(perm_attribute.as_ints()) if perm_attribute is not None else tuple(reversed(range(len(shape))))
            folded = tuple(shape[i] for i in perm)
            transposed = ir.Value(name=node.outputs[0].name, type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape(folded))
            self._placeholder(transposed, Binding(weight, perm), folded)
            transposed.meta[FOLDED_FROM_KEY] = {value.name}
            transposed.metadata_props[FOLDED_FROM_KEY] = repr([value.name])
            graph.register_initializer(transposed)
            ir.convenience.replace_nodes_and_values(graph, node, [node], [], node.outputs, [transposed])
            graph.initializers.pop(value.name)

    def named(self, model: ir.Model) -> dict[str, Binding]:
        """The bindings by the names the optimised graph gives the placeholders."""
        return {
            value.name: self.bindings[id(value.const_value)][1]
            for value in model.graph.initializers.values()
            if id(value.const_value) in self.bindings
        }


def traced_bindings(config: Any) -> list[Binding]:
    """The bindings the graphs of ``config`` get, known before they are traced: every weight the trace
    does not take by value (``FOLD_LIMIT``), transposed where an ``nn.Linear`` reads it (the exporter's
    ``MatMul`` of the transposed weight, the ``Transpose`` that ``_Placeholders`` folds), as stored
    elsewhere (embedding, convolution). Held to the traced graphs' own by ``tests/test_onnx_export.py``."""
    model = empty_backbone(config)
    linear = {f"{name}.weight" for name, module in model.named_modules() if isinstance(module, nn.Linear)}
    return [
        Binding(name, (1, 0) if name in linear else None) for name, value in model.state_dict().items() if value.numel() > FOLD_LIMIT
    ]


@dataclass(frozen=True)
class GraphJob:
    """One graph to trace: which, from which config, with which weights by value, written where."""

    graph: str  # one of GRAPHS
    recurrence: str
    config: Any  # transformers' Qwen3_5TextConfig
    prefill_embeds: bool
    example_length: int
    opset: int
    values: Mapping[str, np.ndarray]  # the foldable weights
    path: Path
    stamp: bool = True  # trace the template layers only and stamp the rest (``s1omni.export.layer_stamp``)


def template_config(config: Any, layer_types: list[str]) -> Any:
    """``config`` with only the first ``len(layer_types)`` layers (``layer_types``, a prefix of its own)."""
    template = copy.deepcopy(config)
    template.num_hidden_layers, template.layer_types = len(layer_types), list(layer_types)
    return template


def build_graph(job: GraphJob) -> dict[str, Binding]:
    """Trace ``job``'s graph from its config into ``job.path``, the larger weights as placeholders; their bindings."""
    layer_types = list(job.config.layer_types)
    template = template_types(layer_types) if job.stamp else layer_types
    model = empty_backbone(template_config(job.config, template))
    names = state_names(layer_types)
    module: nn.Module
    if job.graph == "prefill":
        module, (args, shapes) = PrefillForward(model, job.prefill_embeds), prefill_example(model, job.example_length, job.prefill_embeds)
        inputs, outputs = prefill_names(job.prefill_embeds), ["hidden", *names]
    elif job.graph == "continue":
        module, (args, shapes) = ContinueForward(model), continue_example(model, job.example_length)
        inputs, outputs = CONTINUE_INPUTS + [f"past_{n}" for n in names], ["hidden"]
    else:
        module, (args, shapes) = PackedForward(model), packed_example(model, job.example_length)
        inputs, outputs = PACKED_INPUTS + [f"past_{n}" for n in names], ["hidden"]
    progress.note(f"tracing {job.graph} ({len(template)} of {len(layer_types)} layers, {job.recurrence} recurrence)")
    # Everything on the meta device; the buffers built from the config (rotary frequencies) go in by value.
    buffers = {name: buffer.numpy() for name, buffer in model.named_buffers()}
    program = trace(module.to("meta"), tuple(arg.to("meta") for arg in args), shapes, job.recurrence)
    placeholders = _Placeholders({**job.values, **buffers}, "model.")

    def prepare(translated: ir.Model) -> None:
        if job.stamp:
            stamp_layers(translated, template, layer_types)
        placeholders(translated)

    graph = to_onnx(program, shapes, inputs, outputs, job.opset, prepare=prepare)
    ir.save(graph, job.path)
    return placeholders.named(graph)


def prefill_names(embeds: bool) -> list[str]:
    return PREFILL_EMBEDS_INPUTS if embeds else PREFILL_INPUTS


def build_graphs(jobs: list[GraphJob]) -> list[dict[str, Binding]]:
    """Every job's graph, side by side in worker processes (tracing is single-threaded Python), one per
    core this process may run on, this process among them where there are no more cores than jobs
    (``s1omni.export.workers``)."""
    return build_graphs_beside(jobs, lambda: None)[0]


def build_graphs_beside(jobs: list[GraphJob], meanwhile: Callable[[], T]) -> tuple[list[dict[str, Binding]], T]:
    """``build_graphs``, and ``meanwhile()`` run here while the workers trace, before this process traces
    any (its torch threads on the cores they leave); both results."""

    def beside() -> T:
        threads = torch.get_num_threads()
        torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) - worker_count(len(jobs))))
        try:
            return meanwhile()
        finally:
            torch.set_num_threads(threads)

    return share(build_graph, jobs, beside)


def node_count(model: onnx.ModelProto) -> int:
    """Nodes of the graph and of every subgraph (a Scan body counts once, whatever the length)."""

    def count(graph: onnx.GraphProto) -> int:
        subgraphs = (attribute.g for node in graph.node for attribute in node.attribute if attribute.type == onnx.AttributeProto.GRAPH)
        return len(graph.node) + sum(count(subgraph) for subgraph in subgraphs)

    return count(model.graph)


def export_graphs(
    config: Any,
    source: TensorSource,
    reference: Callable[[], nn.Module],
    out_dir: Path,
    *,
    opset: int = OPSET,
    example_length: int = EXAMPLE_LENGTH,
    external_data_bytes: int = EXTERNAL_DATA_BYTES,
    check: bool = True,
    prefill_embeds: bool = False,
    recurrences: tuple[str, ...] = RECURRENCES,
    packed: bool = True,
) -> Path:
    """Trace the backbone of ``config`` into ``out_dir``, atomically, its weights from ``source``:
    ``prefill.onnx``, ``continue.onnx``, ``packed.onnx`` (and their ``.fused`` twins; see ``graph_file``), ``export.json``.

    ``reference()`` gives the loaded model the check compares the graphs with (``s1omni.export.onnx_check``).
    ``prefill_embeds``: the prefill takes ``inputs_embeds`` rather than token ids (vision members).
    ``recurrences``: which Gated DeltaNet forms to write (``RECURRENCES``), each as every graph.
    ``packed``: write the packed blocks' graph too (the ``shared_context`` profile's; vision members have none).
    """
    if not recurrences or set(recurrences) - set(RECURRENCES):
        raise ValueError(f"recurrences: one or more of {', '.join(RECURRENCES)}")
    names = state_names(config.layer_types)
    weights = 4 * sum(int(np.prod(shape)) for shape in source.shapes().values())  # bytes in float32
    graphs = GRAPHS if packed else GRAPHS[:2]
    files = {recurrence: {name: graph_file(name, recurrence) for name in graphs} for recurrence in recurrences}
    started = time.perf_counter()
    with staged_directory(out_dir, "backbone") as stage, tempfile.TemporaryDirectory(prefix=".traced-", dir=stage) as traced:
        values = foldable(source)
        jobs = [
            GraphJob(name, recurrence, config, prefill_embeds, example_length, opset, values, Path(traced) / file)
            for recurrence, graphs in files.items()
            for name, file in graphs.items()
        ]
        shared = SharedWeights(stage, weights) if weights > external_data_bytes else None
        ahead = traced_bindings(config) if shared else []

        def meanwhile() -> list[Expected] | None:
            # While the graphs are traced: the reference's outputs (the model is loaded, run and freed, so
            # it is never in memory beside the weights or the graphs' sessions), then the weights written
            # to their files, on the cores the tracing leaves.
            expected = _reference(reference) if check else None
            if shared:
                with progress.timed(f"wrote the weights into {_files(shared.names)}"):
                    write_ahead(ahead, source, shared, torch.get_num_threads())
            return expected

        bindings, expected = build_graphs_beside(jobs, meanwhile)
        traced_seconds = time.perf_counter() - started
        nodes: dict[str, dict[str, int]] = {recurrence: {} for recurrence in recurrences}
        for job, bound in zip(jobs, bindings, strict=True):
            file = files[job.recurrence][job.graph]
            progress.note(f"writing {file}" + (f" (weights in {_files(shared.names)})" if shared else ""))
            graph = onnx.load(str(job.path), load_external_data=False)
            bind_weights(graph, bound, source, shared)
            onnx.save(graph, str(stage / file))
            onnx.checker.check_model(str(stage / file))
            nodes[job.recurrence][job.graph] = node_count(graph)
        if shared:
            unused = set(ahead) - {binding for bound in bindings for binding in bound.values()}
            if unused:  # harmless (the bytes are never read), but ``traced_bindings`` is then wrong
                progress.note(f"{len(unused)} weights written ahead are not in the graphs: {sorted(b.weight for b in unused)[:3]} ...")
            shared.finish()
        seconds = time.perf_counter() - started
        progress.note(f"traced {len(jobs)} graphs in {traced_seconds:.1f} s, wrote them in {seconds - traced_seconds:.1f} s")
        report = None
        if expected is not None:
            with progress.timed(f"checked {len(jobs)} graphs against the torch reference"), quiet_third_party():
                report = check_graphs(expected, stage, files)
        record = {
            "format": "s1omni-backbone-onnx/3",
            "graphs": files,
            "weights": shared.names if shared else None,
            "state": names,
            "prefill_input": prefill_names(prefill_embeds)[0],
            "opset": opset,
            "example_length": example_length,
            "nodes": nodes,
            "export_seconds": round(seconds, 1),
            "check": {"lengths": list(LENGTHS), "max_relative": report} if report else None,
            "versions": {package: version(package) for package in ("torch", "transformers", "onnx", "onnxruntime", "onnxscript")},
        }
        (stage / "export.json").write_text(json.dumps(record, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    progress.note(f"wrote {out_dir} in {time.perf_counter() - started:.1f} s")
    return out_dir


def _files(names: list[str]) -> str:
    return names[0] if len(names) == 1 else f"{len(names)} files, {names[0]} ..."


def _reference(reference: Callable[[], nn.Module]) -> list[Expected]:
    """The check's reference outputs, from the model ``reference()`` gives (dropped once they are computed)."""
    with progress.timed("ran the torch reference for the check"), quiet_third_party():
        return reference_outputs(reference())


def export_model(model: nn.Module, out_dir: Path, **options: Any) -> Path:
    """``export_graphs`` for a model already loaded (its weights in memory); ``options`` as there."""
    return export_graphs(model.config, ModuleTensors(model), lambda: model, Path(out_dir), **options)


def export_backbone(package_dir: str | Path, out_dir: str | Path, *, opset: int = OPSET, recurrences: tuple[str, ...] = RECURRENCES) -> Path:
    """Export a Vela 2.0 decoder package's backbone into ``out_dir``; the caller has verified the package.
    The weights are read from the package as they are written; the model is loaded for the check only."""
    config, source = package_backbone(Path(package_dir))
    return export_graphs(config, source, lambda: loaded_backbone(config, source), Path(out_dir), opset=opset, recurrences=recurrences)
