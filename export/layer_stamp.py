"""A member's graph from a trace of its first layers: the traced layers stamped once per later layer.

Tracing costs time per layer (``torch.export``, the exporter's decompositions and its translation),
and a Qwen3.5 backbone is two layer kinds repeated (``config.layer_types``: ``linear_attention`` x3
then ``full_attention``, for the released members). So the exporter traces a *template*
(``template_types``): the member's first two layers, then one layer of each kind the second lacks,
``linear_attention`` x2 and ``full_attention``. ``stamp_layers`` turns the template's translated
graph, before the optimiser sees it, into the member's: the first two layers are the member's own;
every later layer is a copy of the template's last layer of its kind (past the first, so a copy's
residual input is always a layer's output), in ``layer_types`` order; the template layers that are
not the member's own are removed once copied. The optimiser then runs over the whole graph as over
a full trace's, so what it does across layers (folding each layer's own small weights, merging
equal constants and common subexpressions) is done the same way.

How a copy is wired, from what the exporter records on each node (``pkg.torch.onnx.name_scopes``
names the decoder layer ``model.layers.N`` a node was traced in; a ``Scan`` body travels with its
node, its outer-scope references remapped with the node's):

- the residual stream: a layer's output is its last node's; a copy reads the previous layer's
  output where its template read its own predecessor's, and the nodes after the layers (final norm,
  readouts) read the last layer's;
- a layer's weights (initializers ``model.layers.N.*``) are the copy's own, renamed to its index, so
  the weights are bound by name (``s1omni.export.graph_weights``) as for a full trace;
- a layer's state inputs and outputs (graph inputs only it reads, bar their shapes, and graph outputs
  it writes) are the copy's own, in layer order after the template's (``patches.state_names``);
- anything else a layer reads from outside itself (rotary cos/sin, masks, realign indices, shape
  values and constants the trace computed once in an earlier layer) is shared. Such a value must
  not depend on any layer's data, which is checked: a copy that would read another layer's
  activations fails the export rather than computing something else. What read a removed template
  layer's values (the trace reads the batch and past lengths off any state input) reads its first
  copy's.

Every copied node and value gets its layer's name (``.layers.N`` suffix) and its metadata names the
copy's layer, so the graph reads as a full trace's. ``tests/test_layer_stamp.py`` shows the result
is a full trace's graph, node for node, with the same initializers and bit-identical outputs.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Sequence

import onnx_ir as ir
from onnx_ir._cloner import Cloner

SCOPES = "pkg.torch.onnx.name_scopes"  # the exporter's module path of a node, one entry per module
LAYER_SCOPE = re.compile(r"^model\.layers\.(\d+)$")
LAYER_WEIGHT = re.compile(r"^model\.layers\.(\d+)\.")
LAYER_NAME = re.compile(r"\bmodel\.layers\.\d+\b")
SHAPE_OPS = frozenset({("", "Shape"), ("", "Size")})  # their outputs carry no data of their input


def template_types(layer_types: Sequence[str]) -> list[str]:
    """The layers to trace for ``layer_types``: its first two, then one of each kind those lack past the
    first layer (so every kind has a layer to copy whose residual input is a layer's output, never the
    embedding). ``linear_attention`` x3 then ``full_attention``, repeated, gives three layers."""
    head = list(layer_types[:2])
    template = head + [kind for kind in dict.fromkeys(layer_types) if kind not in head[1:]]
    return template if len(template) < len(layer_types) else list(layer_types)


def layer_of(node: ir.Node) -> int | None:
    """The decoder layer a node was traced in, from its exporter metadata; None outside the layers."""
    scopes = ast.literal_eval(node.metadata_props.get(SCOPES, "[]"))
    layers = {int(match.group(1)) for scope in scopes if (match := LAYER_SCOPE.match(scope))}
    if len(layers) > 1:
        raise ValueError(f"{node.name} is traced in layers {sorted(layers)}")
    return layers.pop() if layers else None


def _subgraphs(node: ir.Node) -> list[ir.Graph]:
    graphs = []
    for attribute in node.attributes.values():
        if attribute.type == ir.AttributeType.GRAPH:
            graphs.append(attribute.as_graph())
        elif attribute.type == ir.AttributeType.GRAPHS:
            graphs.extend(attribute.as_graphs())
    return graphs


def _inner_nodes(node: ir.Node) -> list[ir.Node]:
    """The nodes of ``node``'s subgraphs, at every depth."""
    return [inner for graph in _subgraphs(node) for inner in ir.traversal.RecursiveGraphIterator(graph)]


def _references(node: ir.Node) -> set[ir.Value]:
    """The values ``node`` reads: its inputs and what its subgraphs read from outside them."""
    inner = _inner_nodes(node)
    defined = {value for each in inner for value in each.outputs}
    defined.update(value for each in [node, *inner] for graph in _subgraphs(each) for value in graph.inputs)
    return {value for each in [node, *inner] for value in each.inputs if value is not None and value not in defined}


class _Template:
    """The traced graph's layers: their nodes, weights, state inputs and outputs, and residual outputs."""

    def __init__(self, graph: ir.Graph, layers: int):
        self.graph = graph
        self.nodes: list[list[ir.Node]] = [[] for _ in range(layers)]
        self.owner: dict[ir.Value, int] = {}
        self.tail: list[ir.Node] = []  # the nodes after the last layer
        for node in graph:
            layer = layer_of(node)
            if layer is None:
                if any(self.nodes):
                    self.tail.append(node)
                continue
            if layer >= layers or self.tail:
                raise ValueError(f"{node.name}: layer {layer} where {layers} contiguous layers were traced")
            self.nodes[layer].append(node)
            self.owner.update((value, layer) for value in node.outputs)
        if not all(self.nodes):
            raise ValueError("a traced layer has no nodes")
        self.residual = [nodes[-1].outputs[0] for nodes in self.nodes]
        self.weights: list[list[ir.Value]] = [[] for _ in range(layers)]
        for value in graph.initializers.values():
            if match := LAYER_WEIGHT.match(value.name or ""):
                self.weights[int(match.group(1))].append(value)
        self.reads = {node: _references(node) for node in graph}
        readers: dict[ir.Value, set[int | None]] = {}
        for node, values in self.reads.items():
            if (node.domain, node.op_type) in SHAPE_OPS:
                continue  # the trace reads the batch and past lengths off any state input
            for value in values:
                readers.setdefault(value, set()).add(layer_of(node))
        self.state_inputs = [[value for value in graph.inputs if readers.get(value) == {layer}] for layer in range(layers)]
        self.state_outputs = [[value for value in graph.outputs if self.owner.get(value) == layer] for layer in range(layers)]
        self.data = self._layer_data()

    def _layer_data(self) -> set[ir.Value]:
        """The values computed from some layer's weights or states (through anything but a shape)."""
        data = {value for values in (*self.weights, *self.state_inputs) for value in values}
        for node in self.graph:
            if (node.domain, node.op_type) not in SHAPE_OPS and not data.isdisjoint(self.reads[node]):
                data.update(node.outputs)
        return data


def _rename(node: ir.Node, index: int) -> None:
    """Name a copied node, its outputs and its subgraphs' values after layer ``index``."""
    suffix = f".layers.{index}"
    for inner in [node, *_inner_nodes(node)]:
        inner.name = f"{inner.name}{suffix}" if inner.name else None
        for key in list(inner.metadata_props):
            inner.metadata_props[key] = LAYER_NAME.sub(f"model.layers.{index}", inner.metadata_props[key])
        for value in inner.outputs:
            value.name = f"{value.name}{suffix}"
        for graph in _subgraphs(inner):
            if len(graph.initializers):
                raise ValueError(f"{inner.name}: a subgraph with initializers")
            for value in graph.inputs:
                value.name = f"{value.name}{suffix}"


def _kept(template: Sequence[str], layer_types: Sequence[str]) -> int:
    """How many of the template's layers are the member's own first layers (the rest are only copied)."""
    kept = 0
    while kept < min(len(template), len(layer_types)) and template[kept] == layer_types[kept]:
        kept += 1
    return kept


def stamp_layers(model: ir.Model, template: Sequence[str], layer_types: Sequence[str]) -> None:
    """Turn ``model``, traced from the layers ``template`` (``template_types``), into the graph of the layers
    ``layer_types``, in place. The template's layers past those it shares with ``layer_types`` are removed
    once copied; the first copy of each takes its place for whatever else read it (shape values)."""
    if list(template) != template_types(layer_types):
        raise ValueError(f"{list(template)} is not the template of {list(layer_types)}")
    kept = _kept(template, layer_types)
    if kept == len(template) == len(layer_types):
        return
    graph = model.graph
    traced = _Template(graph, len(template))
    source = {kind: max(i for i, k in enumerate(template) if k == kind) for kind in set(template)}
    for layer in range(kept, len(template)):  # their names are the copies' now
        for weight in traced.weights[layer]:
            graph.initializers.pop(weight.name)
    residual = traced.residual[kept - 1]
    stamped: list[ir.Node] = []
    inputs: list[ir.Value] = []
    outputs: list[ir.Value] = []
    first_copies: dict[int, dict[ir.Value, ir.Value | None]] = {}
    for index in range(kept, len(layer_types)):
        layer = source[layer_types[index]]
        value_map: dict[ir.Value, ir.Value | None] = {traced.residual[layer - 1]: residual}
        for weight in traced.weights[layer]:
            name = LAYER_WEIGHT.sub(f"model.layers.{index}.", weight.name, count=1)
            copy = ir.Value(name=name, type=weight.type, shape=weight.shape, const_value=weight.const_value)
            graph.register_initializer(copy)
            value_map[weight] = copy
        for state in traced.state_inputs[layer]:
            value_map[state] = ir.Value(name=f"{state.name}.layers.{index}", type=state.type, shape=state.shape)
        inputs += [value_map[state] for state in traced.state_inputs[layer]]
        cloner = Cloner(attr_map={}, value_map=value_map, metadata_props={}, allow_outer_scope_values=True)
        for node in traced.nodes[layer]:
            shared = [value for value in traced.reads[node] if value not in value_map and value in traced.data]
            if shared:
                raise ValueError(f"layer {index}, copied from layer {layer}: {node.name} reads another layer's data ({shared[0].name})")
            copy = cloner.clone_node(node)
            _rename(copy, index)
            stamped.append(copy)
        outputs += [value_map[state] for state in traced.state_outputs[layer]]
        residual = value_map[traced.residual[layer]]
        first_copies.setdefault(layer, value_map)
    graph.insert_after(traced.nodes[-1][-1], stamped)
    for use in list(traced.residual[-1].uses()):
        if use.node in traced.tail:
            use.node.replace_input_with(use.idx, residual)
    _remove_copied(graph, traced, kept, first_copies)
    # The template's state inputs and outputs come last, in layer order (``state_names``); the copies' follow.
    graph.inputs.extend(inputs)
    graph.outputs.extend(outputs)


def _remove_copied(graph: ir.Graph, traced: _Template, kept: int, first_copies: dict[int, dict[ir.Value, ir.Value | None]]) -> None:
    """Remove the template's layers from ``kept`` on, what still reads them reading their first copies."""
    states = {value for layer in range(kept, len(traced.nodes)) for value in (*traced.state_inputs[layer], *traced.state_outputs[layer])}
    graph.inputs[:] = [value for value in graph.inputs if value not in states]
    graph.outputs[:] = [value for value in graph.outputs if value not in states]
    for layer in range(kept, len(traced.nodes)):
        copies = first_copies[layer]
        for value in [*traced.state_inputs[layer], *(value for node in traced.nodes[layer] for value in node.outputs)]:
            if value in copies:
                value.replace_all_uses_with(copies[value])
    graph.remove([node for layer in range(kept, len(traced.nodes)) for node in traced.nodes[layer]], safe=True)
