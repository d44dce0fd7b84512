"""Stamped graphs (``s1omni.export.layer_stamp``) are full traces' graphs.

A synthetic backbone of eight layers, the released members' two kinds in their order
(``linear_attention`` x3, ``full_attention``) twice, with random weights, every small weight
distinct per layer. Its template is ``linear_attention`` x2 and ``full_attention``: layers 0 and 1
are traced, the Gated DeltaNet layers after them are stamped from layer 1 and the attention layers
from the template's third, which is then removed. Each graph is built twice, stamped and fully
traced, and compared node by node (op, attributes, where each input comes from, the bytes of each
initializer it reads) and on ONNX Runtime outputs, bit for bit.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from s1omni.export.graph_weights import ModuleTensors, bind_weights, foldable
from s1omni.export.layer_stamp import template_types
from s1omni.export.onnx_export import OPSET, GraphJob, build_graphs, continue_example, prefill_example, traced_bindings
from s1omni.runtime.runners.torch_runner import eager_config
from s1omni.runtime.synth import vela2
from tests.onnx_graphs import structure

LINEAR, FULL = "linear_attention", "full_attention"
LAYER_TYPES = ([LINEAR] * 3 + [FULL]) * 2  # the released members' pattern, two cycles
# (graph, recurrence, embeds). Between them: a Scan body's outer-scope references, state inputs and
# outputs, the fused recurrence's contrib node, a vision member's prefill (the other two pairs take
# 3 minutes more; their figures are in benchmarks/README.md).
CASES = [("continue", "scan", False), ("prefill", "fused", True)]


def test_the_template_is_two_layers_and_each_kind_they_lack() -> None:
    assert template_types(LAYER_TYPES * 4) == template_types(LAYER_TYPES) == [LINEAR, LINEAR, FULL]
    assert template_types([LINEAR, FULL] * 3) == [LINEAR, FULL, LINEAR]
    assert template_types([FULL] * 5) == [FULL, FULL]
    assert template_types(LAYER_TYPES[:3]) == [LINEAR, LINEAR]
    assert template_types([LINEAR, LINEAR, FULL]) == [LINEAR, LINEAR, FULL]  # nothing to stamp: traced whole
    assert template_types([LINEAR, FULL]) == [LINEAR, FULL]


@pytest.fixture(scope="module")
def member() -> torch.nn.Module:
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5TextModel

    backbone = {**vela2.backbone_config(vela2.SIZES["tiny"]), "num_hidden_layers": len(LAYER_TYPES), "layer_types": LAYER_TYPES}
    torch.manual_seed(0)
    model = Qwen3_5TextModel(eager_config(backbone)).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() == 1:  # norms, biases, A_log: each layer's own values
                parameter.add_(0.1 * torch.randn_like(parameter))
    return model


def _jobs(model: torch.nn.Module, case: tuple[str, str, bool], directory: Path, values: dict[str, np.ndarray]) -> list[GraphJob]:
    graph, recurrence, embeds = case
    job = GraphJob(graph, recurrence, model.config, embeds, 70, OPSET, values, directory / "stamped.onnx")
    return [job, dataclasses.replace(job, stamp=False, path=directory / "traced.onnx")]


def _bound(model: torch.nn.Module, job: GraphJob, bindings: dict) -> onnx.ModelProto:
    graph = onnx.load(str(job.path), load_external_data=False)
    bind_weights(graph, bindings, ModuleTensors(model), None)
    return graph


def _case_id(case: tuple[str, str, bool]) -> str:
    return "-".join(map(str, case))


def _wrong_values(model: torch.nn.Module) -> dict[str, np.ndarray]:
    """The foldable values with layer 4 given layer 0's small weights (which the optimiser folds)."""
    values = foldable(ModuleTensors(model))
    for name in [name for name in values if name.startswith("layers.4.")]:
        values[name] = values[name.replace("layers.4.", "layers.0.", 1)]
    return values


WRONG = "wrong"


@pytest.fixture(scope="module")
def graphs(member: torch.nn.Module, tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[tuple[onnx.ModelProto, dict]]]:
    """Each case's graph stamped and fully traced, and (under ``WRONG``) the first case's stamped from wrong
    weights, each with its weights bound and its bindings: all traced in one pool of workers, which then
    spawns once and keeps both cores busy."""
    values = foldable(ModuleTensors(member))
    jobs = {_case_id(case): _jobs(member, case, tmp_path_factory.mktemp("stamp"), values) for case in CASES}
    jobs[WRONG] = _jobs(member, CASES[0], tmp_path_factory.mktemp("wrong"), _wrong_values(member))[:1]
    bindings = iter(build_graphs([job for group in jobs.values() for job in group]))
    return {key: [(_bound(member, job, bound), bound) for job, bound in zip(group, bindings)] for key, group in jobs.items()}


def test_the_bindings_are_known_before_the_graphs_are_traced(member: torch.nn.Module, graphs: dict) -> None:
    """What an export writes while it traces (``traced_bindings``, from the config) is what the traced graphs
    bind, stamped or not: every weight they do not fold, transposed exactly where they read it so."""
    found = {binding for case in CASES for _, bound in graphs[_case_id(case)] for binding in bound.values()}
    assert set(traced_bindings(member.config)) == found
    assert any(binding.perm == (1, 0) for binding in found) and any(binding.perm is None for binding in found)


@pytest.fixture(scope="module", params=CASES, ids=[_case_id(case) for case in CASES])
def built(request: pytest.FixtureRequest, graphs: dict[str, list[tuple[onnx.ModelProto, dict]]]):
    """The case's graph stamped and fully traced, weights bound; and the stamped one's bindings."""
    (stamped, stamped_bindings), (traced, traced_bindings) = graphs[_case_id(request.param)]
    return request.param, [stamped, traced], (stamped_bindings, traced_bindings)


def _outputs(graph: onnx.ModelProto, model: torch.nn.Module, case: tuple[str, str, bool]) -> list[np.ndarray]:
    name, _, embeds = case
    torch.manual_seed(1)
    args, _ = prefill_example(model, 77, embeds) if name == "prefill" else continue_example(model, 77)
    session = ort.InferenceSession(graph.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {value.name: arg.numpy() for value, arg in zip(graph.graph.input, args, strict=True)})


@pytest.mark.slow
def test_a_stamped_graph_is_the_full_trace(built, member: torch.nn.Module) -> None:
    case, (stamped, traced), (stamped_bindings, traced_bindings) = built
    assert [v.name for v in stamped.graph.input] == [v.name for v in traced.graph.input]
    assert [v.name for v in stamped.graph.output] == [v.name for v in traced.graph.output]
    # The same nodes in the same order, reading the same values and the same initializer bytes.
    assert [(n.domain, n.op_type) for n in stamped.graph.node] == [(n.domain, n.op_type) for n in traced.graph.node]
    assert structure(stamped.graph) == structure(traced.graph)
    assert sorted(map(repr, stamped_bindings.values())) == sorted(map(repr, traced_bindings.values()))
    found, expected = _outputs(stamped, member, case), _outputs(traced, member, case)
    assert [a.shape for a in found] == [b.shape for b in expected]
    assert all(a.tobytes() == b.tobytes() for a, b in zip(found, expected, strict=True)), case


@pytest.mark.slow
@pytest.mark.parametrize("built", CASES[:1], ids=[_case_id(CASES[0])], indirect=True)  # one case shows it
def test_a_layer_stamped_with_another_layers_weights_is_caught(built, graphs, member: torch.nn.Module) -> None:
    """Layer 4 given layer 0's small weights (which the optimiser folds): the comparison above fails."""
    case, (_, traced), _ = built
    ((wrong, _),) = graphs[WRONG]
    assert structure(wrong.graph) != structure(traced.graph)
    found, expected = _outputs(wrong, member, case), _outputs(traced, member, case)
    assert not all(a.tobytes() == b.tobytes() for a, b in zip(found, expected, strict=True))
