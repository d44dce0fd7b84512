"""``s1omni.runtime.runners.qwen3_5``: transformers' Qwen3.5 module imported with its torch Gated DeltaNet
functions where flash-linear-attention is installed too (``make setup`` installs it: the ``fla`` extra), fla
itself left importable. Each check runs in a fresh interpreter, where the module is not imported yet; on this
GPU-less machine fla's rules cannot run, so a rule that runs is the torch one."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytest.importorskip("fla", reason="flash-linear-attention (the fla extra) is what the import hides")

# The module's chunked rule on a small random input: q, k, v [B, T, H, D], the log decay g and beta [B, T, H].
RUN_THE_RULE = """
import torch
torch.manual_seed(0)
q, k, v = (torch.randn(1, 8, 2, 16) for _ in range(3))
g, beta = -torch.rand(1, 8, 2), torch.rand(1, 8, 2)
out = module.torch_chunk_gated_delta_rule(q, k, v, g=g, beta=beta, use_qk_l2norm_in_kernel=True)[0]
assert torch.isfinite(out).all()
print("ran")
"""


def _fresh(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("fla_first", [False, True], ids=["fla-not-imported", "fla-imported-before"])
def test_the_module_runs_its_torch_rules_and_fla_stays_importable(fla_first: bool) -> None:
    code = f"""
import importlib, sys, warnings
warnings.simplefilter("ignore")  # fla's own import warns on a machine without a GPU
{"import fla.ops.gated_delta_rule" if fla_first else ""}
warnings.resetwarnings()
from s1omni.runtime.runners.qwen3_5 import MODULE, modeling
module = modeling()
assert module is sys.modules[MODULE] and modeling() is module
assert ("fla" in sys.modules) == {fla_first}, "the module's import imported fla"
{RUN_THE_RULE}
warnings.simplefilter("ignore")
assert importlib.import_module("fla.ops.gated_delta_rule").chunk_gated_delta_rule.__module__.startswith("fla.")
"""
    result = _fresh(code)
    assert result.returncode == 0 and result.stdout.strip() == "ran", result.stderr
    assert "Triton is not supported" not in result.stderr, result.stderr


def test_a_plain_import_would_have_bound_fla() -> None:
    """What the helper prevents: transformers' own import binds fla's rules, which fail here."""
    result = _fresh(f"from transformers.models.qwen3_5 import modeling_qwen3_5 as module\n{RUN_THE_RULE}")
    assert result.returncode != 0 and "ran" not in result.stdout and "driver" in result.stderr, (result.stdout, result.stderr[-2000:])
