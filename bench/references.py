"""The torch reference subjects of a run, and the ratios of every engine to the faster one.

A run times the reference twice where its users would run it faster: ``reference``, transformers'
torch functions for the Gated DeltaNet layers (the fallback every machine has, the one validation
holds engines to), and, on a CUDA device where flash-linear-attention imports, ``reference+fla``,
the same model with FLA's gated delta rules (its Triton kernels), as ``pip install
flash-linear-attention`` gives a transformers user. Both are subjects of the same run, on the same
workloads, one after the other.

How both run in one process: transformers fixes the layers' functions when it imports its Qwen3.5
module, so the choice is taken per runner instead (``TorchRunner(kernels=...)``): each call binds
the layer's module-level functions to that runner's own and puts them back after, and the runner
checks each function by the module that defines it (``fla.ops.gated_delta_rule...`` against
``transformers.models.qwen3_5...``); the record lists those modules. The FLA subject is the
reference's model with a second runner over the same weights (``with_kernels``): no second copy on
the device, and planning, heads and finishing are the reference's own. A second process was the
other way; it would hold a second copy of the weights and could not share the workloads' loop.

Every engine's ratio in a workload is against the faster of the two references there (by p50;
``ratio_reference`` names it, ``reference_ratios`` gives FLA's against the fallback). Where FLA
cannot run (a CPU run, or not installed) the record says why and the ratios are against the
fallback alone. Over HTTP only the fallback is served (``s1omni serve`` loads the package's
reference with its default kernels), and the HTTP ratios say so.
"""

from __future__ import annotations

import copy
import importlib
from collections.abc import Mapping
from typing import Any

from s1omni.runtime.errors import EnvironmentMissing
from s1omni.runtime.runners.torch_runner import FLA_RULES_MODULE, function_modules, layer_functions

from .stats import ratios

REFERENCE = "reference"
FLA_REFERENCE = "reference+fla"
REFERENCES = (REFERENCE, FLA_REFERENCE)
KERNELS = {REFERENCE: "torch", FLA_REFERENCE: "fla"}  # each reference subject's ``TorchRunner`` kernels


def release_cached_memory(subject: str) -> None:
    """After a torch subject's samples, hand the blocks torch's CUDA allocator caches back to the driver: the
    next subject may be an engine whose ONNX Runtime arena grows from the same free memory. Without it the 9B's
    engine ran out of an 80 GB H100 at 2,048 tokens, right after the references' own 2,048-token runs
    (``benchmarks/h100-op-serving/9B/bench-9B.log``)."""
    if subject not in REFERENCES:
        return
    import torch

    if torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def fla_status(device: str) -> dict[str, Any]:
    """Whether ``reference+fla`` runs on ``device`` here: ``available``, FLA's ``version``, and the ``reason`` it does not."""
    if not str(device).startswith("cuda"):
        return {"available": False, "version": None, "reason": "flash-linear-attention runs on CUDA devices only"}
    try:
        layer_functions(KERNELS[FLA_REFERENCE])
    except EnvironmentMissing as exc:
        return {"available": False, "version": None, "reason": str(exc)}
    return {"available": True, "version": fla_version(), "reason": None}


def fla_version() -> str | None:
    return getattr(importlib.import_module(FLA_RULES_MODULE.partition(".")[0]), "__version__", None)


def reference_names(fla: Mapping[str, Any]) -> list[str]:
    return [REFERENCE, FLA_REFERENCE] if fla["available"] else [REFERENCE]


def with_kernels(model: Any, name: str) -> Any:
    """The reference ``model`` answering through a runner of ``name``'s kernels over the same weights."""
    twin = copy.copy(model)  # the planning, heads and finishing state is shared, never written by a call
    twin.runner = model.runner.with_kernels(KERNELS[name])
    return twin


def kernel_facts(runner: Any, fla: Mapping[str, Any]) -> dict[str, Any]:
    """What the record says of a reference subject's kernels: ``torch`` or ``torch+fla``, FLA's version, and
    the module that defines each Gated DeltaNet function the runner binds."""
    uses_fla = runner.kernels == KERNELS[FLA_REFERENCE]
    return {
        "kernels": "torch+fla" if uses_fla else "torch",
        "fla_version": fla["version"] if uses_fla else None,
        "layer_functions": function_modules(runner.functions),
    }


def faster_reference(results: Mapping[str, Mapping[str, Any]]) -> str:
    """The reference subject with the lower p50 among those in ``results`` (the fallback on a tie)."""
    return min((name for name in REFERENCES if name in results), key=lambda name: results[name]["p50_ms"])


def workload_ratios(results: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """``ratio_reference`` (the faster reference), each engine's ``ratios`` to it, and ``reference_ratios``:
    the FLA reference's to the fallback where both ran."""
    against = faster_reference(results)
    return {
        "ratio_reference": against,
        "ratios": {name: ratios(results[name], results[against]) for name in results if name not in REFERENCES},
        "reference_ratios": {FLA_REFERENCE: ratios(results[FLA_REFERENCE], results[REFERENCE])} if FLA_REFERENCE in results else {},
    }


def ratio_note(entry: Mapping[str, Any]) -> str:
    """The log line of a workload's ratios: which reference the engines are held against, and FLA's gain."""
    gains = [f"{name} / {REFERENCE} p50 {value['p50']}" for name, value in entry["reference_ratios"].items()]
    return ", ".join([f"{entry['name']}: engine ratios against {entry['ratio_reference']}", *gains])
