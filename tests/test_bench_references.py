"""The reference subjects of ``s1omni bench``: the torch fallback, and ``reference+fla`` where
flash-linear-attention runs; every engine's ratio against the faster of them.

On the CPU, "FLA importable" is simulated through the real import machinery only: a subprocess
whose ``sys.path`` starts with a package named ``fla`` that exposes the two gated delta rules with
the torch fallbacks' signatures (each call is counted, then handed to transformers' own torch
function). That checks the wiring: which function each runner's layers call, that the module's
functions come back after a call, and what the record says. FLA's real kernels (Triton, CUDA only)
run in the ``gpu`` tests at the end, on the device, against the fallback within a BF16 tolerance.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from importlib import metadata
from pathlib import Path

import numpy as np
import pytest
import torch

from s1omni.bench.records import label
from s1omni.bench.references import FLA_REFERENCE, REFERENCE, fla_status, reference_names, release_cached_memory, workload_ratios
from s1omni.runtime.errors import EnvironmentMissing
from s1omni.runtime.runners.torch_runner import TorchRunner

ROOT = Path(__file__).resolve().parents[1]

FAKE_RULES = '''
import inspect

CALLS = []
TORCH = {}  # transformers' torch functions, kept by ``capture`` before any runner binds these in their place


def capture():
    from transformers.models.qwen3_5 import modeling_qwen3_5

    for name in ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule"):
        TORCH[name] = inspect.unwrap(getattr(modeling_qwen3_5, name))


def _torch(name):
    return TORCH[name]


def chunk_gated_delta_rule(query, key, value, g, beta, chunk_size=64, initial_state=None, output_final_state=False,
                           use_qk_l2norm_in_kernel=False, **kwargs):
    CALLS.append("chunk")
    return _torch("torch_chunk_gated_delta_rule")(query, key, value, g, beta, chunk_size, initial_state,
                                                  output_final_state, use_qk_l2norm_in_kernel)


def fused_recurrent_gated_delta_rule(query, key, value, g, beta, initial_state=None, output_final_state=False,
                                     use_qk_l2norm_in_kernel=False, **kwargs):
    CALLS.append("recurrent")
    return _torch("torch_recurrent_gated_delta_rule")(query, key, value, g, beta, initial_state, output_final_state,
                                                      use_qk_l2norm_in_kernel)
'''

# Run in the subprocess: which functions the reference and its FLA twin call, on the tiny member.
WIRING = '''
import json, sys
import numpy as np, torch
from s1omni.bench import references
from s1omni.bench.workloads import backbone, measure
from s1omni.runtime.api import load_model
from s1omni.runtime.runners.base import Block, Prefix, Tree
from transformers.models.qwen3_5 import modeling_qwen3_5 as modeling
import fla.ops.gated_delta_rule as fake

fake.capture()
out = {"status_cuda": references.fla_status("cuda"), "status_cpu": references.fla_status("cpu")}
q, k, v = (torch.randn(1, 5, 2, 16) for _ in range(3))
modeling.torch_chunk_gated_delta_rule(q, k, v, g=-torch.rand(1, 5, 2), beta=torch.rand(1, 5, 2))
out["import_time_choice"] = list(fake.CALLS)  # transformers' own pick at import: the installed fla


class Rule(torch.nn.Module):
    def forward(self, q, k, v, g, beta):
        return modeling.torch_chunk_gated_delta_rule(q, k, v, g=g, beta=beta, chunk_size=4)[0]  # a short trace


fake.CALLS.clear()
torch.export.export(Rule(), (q, k, v, -torch.rand(1, 5, 2), torch.rand(1, 5, 2)), strict=False)
out["export_calls"] = list(fake.CALLS)  # transformers' wrapper takes the torch path under torch.export
module_functions = {name: getattr(modeling, name) for name in ("torch_chunk_gated_delta_rule", "causal_conv1d_fn")}

model = load_model(sys.argv[1])  # the reference validation and serving load: no kernels named
twin = references.with_kernels(model, references.FLA_REFERENCE)
ids = np.arange(1, 41, dtype=np.int64)
# An 8-token block takes the chunked rule, a lone 1-token block the recurrent one.
trees = [Tree(Prefix(ids), (Block(np.arange(3, 11, dtype=np.int64), np.array([2, 7])),)), Tree(Prefix(ids), (Block(np.array([5]), np.array([0])),))]
hidden, blocks = {}, {}
for name, subject in (("reference", model), ("reference+fla", twin)):
    fake.CALLS.clear()
    hidden[name] = subject.runner.forward(ids)
    blocks[name] = np.concatenate([row for rows in subject.runner.run(trees) for row in rows])
    out[name] = {"calls": sorted(set(fake.CALLS)), "kernels": subject.runner.kernels,
                 "facts": references.kernel_facts(subject.runner, out["status_cuda"])}
out["same_hidden"] = bool(np.array_equal(hidden["reference"], hidden["reference+fla"]))
out["same_blocks"] = bool(np.array_equal(blocks["reference"], blocks["reference+fla"]))
out["functions_restored"] = all(getattr(modeling, name) is value for name, value in module_functions.items())
out["shared_weights"] = twin.runner.model is model.runner.model
entry = measure(backbone(16), {"reference": model, "reference+fla": twin, "engine": model}, 2, 0, lambda _: None)
out["entry"] = {key: entry[key] for key in ("ratio_reference", "ratios", "reference_ratios")}
out["p50"] = {name: result["p50_ms"] for name, result in entry["results"].items()}
print(json.dumps(out))
'''


def fla_package(root: Path, rules: str) -> Path:
    """A package named ``fla`` under ``root`` whose ``fla.ops.gated_delta_rule`` holds ``rules``."""
    package = root / "fla"
    (package / "ops" / "gated_delta_rule").mkdir(parents=True)
    (package / "__init__.py").write_text('__version__ = "0.0.0+simulated"\n', encoding="utf-8")
    (package / "ops" / "__init__.py").write_text("", encoding="utf-8")
    (package / "ops" / "gated_delta_rule" / "__init__.py").write_text(textwrap.dedent(rules), encoding="utf-8")
    return root


def run_with(path: Path, script: str, *args: str) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(path), str(ROOT), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, env=env, timeout=300, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.splitlines()[-1])


def test_an_importable_fla_gives_the_fla_subject_its_functions_and_the_reference_keeps_torch(tiny_vela: Path, tmp_path: Path) -> None:
    out = run_with(fla_package(tmp_path, FAKE_RULES), WIRING, str(tiny_vela))
    assert out["status_cuda"] == {"available": True, "version": "0.0.0+simulated", "reason": None}
    assert out["status_cpu"]["available"] is False and "CUDA devices only" in out["status_cpu"]["reason"]
    # transformers itself took the installed fla at import; the reference still never calls it.
    assert out["import_time_choice"] == ["chunk"] and out["export_calls"] == []
    assert out["reference"]["calls"] == [] and out["reference"]["kernels"] == "torch"
    assert out["reference+fla"]["calls"] == ["chunk", "recurrent"] and out["reference+fla"]["kernels"] == "fla"
    torch_module = "transformers.models.qwen3_5.modeling_qwen3_5"
    assert out["reference"]["facts"] == {"kernels": "torch", "fla_version": None, "layer_functions": {
        "torch_chunk_gated_delta_rule": torch_module, "torch_recurrent_gated_delta_rule": torch_module,
        "causal_conv1d_fn": torch_module, "causal_conv1d_update": torch_module}}  # fmt: skip
    assert out["reference+fla"]["facts"] == {"kernels": "torch+fla", "fla_version": "0.0.0+simulated", "layer_functions": {
        "torch_chunk_gated_delta_rule": "fla.ops.gated_delta_rule", "torch_recurrent_gated_delta_rule": "fla.ops.gated_delta_rule",
        "causal_conv1d_fn": torch_module, "causal_conv1d_update": torch_module}}  # fmt: skip
    # The simulated fla hands each call to the torch function: the same numbers through either binding,
    # prefix and continuing blocks alike, and the module's own functions back after every call.
    assert out["same_hidden"] and out["same_blocks"] and out["functions_restored"] and out["shared_weights"]
    entry, p50 = out["entry"], out["p50"]
    assert entry["ratio_reference"] == min((REFERENCE, FLA_REFERENCE), key=p50.get)
    assert set(entry["ratios"]) == {"engine"} and set(entry["reference_ratios"]) == {FLA_REFERENCE}
    assert entry["ratios"]["engine"]["p50"] == round(p50["engine"] / p50[entry["ratio_reference"]], 4)


def test_an_fla_that_does_not_import_leaves_the_fallback_alone(tmp_path: Path) -> None:
    broken = fla_package(tmp_path, "raise ImportError('simulated: fla is not installed here')")
    script = """
import json
from s1omni.bench import references
from s1omni.runtime.runners.torch_runner import function_modules, layer_functions
status = references.fla_status("cuda")
print(json.dumps({"status": status, "names": references.reference_names(status),
                  "torch": sorted(set(function_modules(layer_functions("torch")).values()))}))
"""
    out = run_with(broken, script)
    assert out["status"]["available"] is False and "simulated: fla is not installed here" in out["status"]["reason"]
    assert out["names"] == [REFERENCE]
    assert out["torch"] == ["transformers.models.qwen3_5.modeling_qwen3_5"]


@pytest.mark.skipif(importlib.util.find_spec("fla") is not None, reason="flash-linear-attention is installed here")
def test_a_runner_refuses_fla_kernels_it_cannot_import(tiny_model) -> None:
    assert fla_status("cuda")["available"] is False and reference_names(fla_status("cuda")) == [REFERENCE]
    with pytest.raises(EnvironmentMissing, match="flash-linear-attention does not import"):
        tiny_model.runner.with_kernels("fla")
    with pytest.raises(ValueError, match="one of torch, fla"):
        TorchRunner(tiny_model.runner.model, kernels="triton")


def summary(p50: float) -> dict:
    return {"p50_ms": p50, "p95_ms": p50 * 1.5}


def test_engines_are_held_against_the_faster_reference() -> None:
    fla_faster = workload_ratios({REFERENCE: summary(250.0), FLA_REFERENCE: summary(125.0), "engine": summary(50.0)})
    assert fla_faster == {
        "ratio_reference": FLA_REFERENCE,
        "ratios": {"engine": {"p50": 0.4, "p95": 0.4}},
        "reference_ratios": {FLA_REFERENCE: {"p50": 0.5, "p95": 0.5}},
    }
    fallback_faster = workload_ratios({REFERENCE: summary(10.0), FLA_REFERENCE: summary(20.0), "engine": summary(5.0)})
    assert fallback_faster["ratio_reference"] == REFERENCE and fallback_faster["ratios"]["engine"]["p50"] == 0.5
    alone = workload_ratios({REFERENCE: summary(10.0), "engine": summary(5.0), "other": summary(40.0)})
    assert alone == {"ratio_reference": REFERENCE, "ratios": {"engine": {"p50": 0.5, "p95": 0.5}, "other": {"p50": 4.0, "p95": 4.0}},
                     "reference_ratios": {}}  # fmt: skip


def test_the_plot_names_each_reference_by_its_kernels() -> None:
    assert label(FLA_REFERENCE, {"kernels": "torch+fla", "fla_version": "0.6.0"}) == "reference+fla [torch+fla 0.6.0]"
    assert label(REFERENCE, {"kernels": "torch", "fla_version": None}) == "reference [torch]"
    assert label("onnxruntime/cuda/GatedDeltaNet", {"backend": "onnxruntime"}) == "onnxruntime/cuda/GatedDeltaNet"


# -- on the device: FLA's real kernels -----------------------------------------------------------


def fla_on_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available() and importlib.util.find_spec("fla") is not None


needs_fla = pytest.mark.skipif(not fla_on_cuda(), reason="needs a CUDA GPU and flash-linear-attention (runs on the device)")


def relative(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


@pytest.mark.gpu
@needs_fla
def test_fla_kernels_match_the_fallback_within_bf16(tiny_vela: Path) -> None:
    """The tiny member on CUDA: FLA's hidden states against the BF16 fallback's, and both against float32."""
    from s1omni.runtime.api import load_model
    from s1omni.runtime.runners.base import Block, Prefix, Tree

    reference = load_model(tiny_vela, device="cuda").runner  # BF16 autocast, torch kernels
    fla = reference.with_kernels("fla")
    exact = load_model(tiny_vela, device="cuda", precision="fp32").runner
    rng = np.random.default_rng(0)
    ids = rng.integers(1, 1000, 300, dtype=np.int64)  # several 64-token chunks
    # An 8-token block continues through the chunked rule, a lone 1-token block through the recurrent one.
    trees = [Tree(Prefix(ids), (Block(rng.integers(1, 1000, 8, dtype=np.int64), np.array([3, 7])),)),
             Tree(Prefix(ids), (Block(ids[:1], np.array([0])),))]  # fmt: skip
    errors = {}
    blocks = lambda runner: np.concatenate([row for rows in runner.run(trees) for row in rows])  # noqa: E731
    for what, run in (("forward", lambda runner: runner.forward(ids)), ("blocks", blocks)):
        torch_out, fla_out, fp32_out = run(reference), run(fla), run(exact)
        errors[what] = (relative(fla_out, torch_out), relative(fla_out, fp32_out), relative(torch_out, fp32_out))
        assert not np.array_equal(fla_out, torch_out), f"{what}: FLA's kernels did not run (identical to the fallback)"
    for what, (fla_torch, fla_fp32, torch_fp32) in errors.items():
        # BF16 keeps 8 bits (a relative rounding of 2**-9 to 2**-8 per operation), and FLA runs its chunk
        # products on BF16 inputs where the fallback upcasts to float32, so FLA is held to a few times the
        # fallback's own BF16 error. Two BF16 runs each ~0.05 from float32 differ by as much from each other
        # (H200: 0.045 over the forward, 0.067 over the blocks); a wiring fault (the scale, the layout, a
        # dropped state) is off by far more than 0.1.
        assert fla_torch < 0.1, (what, errors)
        assert fla_fp32 <= 3 * torch_fp32 + 1e-2, (what, errors)


@pytest.mark.gpu
@needs_fla
def test_a_cuda_bench_times_both_references(tiny_vela: Path, tmp_path: Path) -> None:
    from s1omni.cli.main import main

    argv = ["bench", "--package", str(tiny_vela), "--device", "cuda", "--workloads", "backbone", "--tokens", "64",
            "--requests", "3", "--warmup", "1", "--out", str(tmp_path)]  # fmt: skip
    assert main(argv) == 0
    data = json.loads((tmp_path / "bench.json").read_text(encoding="utf-8"))
    version = metadata.version("flash-linear-attention")
    assert data["references"]["subjects"] == [REFERENCE, FLA_REFERENCE]
    assert data["references"]["fla"] == {"available": True, "version": version, "reason": None}
    facts = data["subjects"][FLA_REFERENCE]
    assert (facts["kernels"], facts["fla_version"], facts["precision"]) == ("torch+fla", version, "bf16")
    assert facts["layer_functions"]["torch_chunk_gated_delta_rule"].startswith("fla.ops.gated_delta_rule")
    assert data["subjects"][REFERENCE]["layer_functions"]["torch_chunk_gated_delta_rule"].startswith("transformers.")
    (entry,) = data["workloads"]
    assert set(entry["results"]) == {REFERENCE, FLA_REFERENCE} and entry["ratios"] == {}
    assert entry["ratio_reference"] == min((REFERENCE, FLA_REFERENCE), key=lambda name: entry["results"][name]["p50_ms"])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (runs on the device)")
def test_a_reference_subject_hands_its_cached_blocks_back() -> None:
    """After a torch reference's samples the blocks torch's allocator cached go back to the driver, for the engine
    timed next; after an engine's nothing of torch's is touched."""
    block = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    del block
    cached = torch.cuda.memory_reserved()
    assert cached >= 256 << 20
    release_cached_memory("onnxruntime/cuda")
    assert torch.cuda.memory_reserved() == cached
    release_cached_memory(REFERENCE)
    assert torch.cuda.memory_reserved() < cached
