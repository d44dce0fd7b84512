"""Attention in the portable graphs: queries in chunks (``s1omni.export.patches.chunked_attention``).

The chunked and the unchunked form are exported side by side as one small ONNX graph and run in
ONNX Runtime on rows that cross several chunk boundaries, left-padded prefill rows and prefixes with
padded keys: every row must come out bit for bit as the unchunked form computes it. The key masks
both forms share are held against the masks written out here, and the long calibration case runs
through the exported engine in a process of its own, whose peak memory is read.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx_ir as ir
import onnxruntime
import pytest
import torch
from torch import nn
from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5TextConfig
from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5Attention, eager_attention_forward

from s1omni.calib import CALIB
from s1omni.export.families import export_family
from s1omni.export.onnx_export import OPSET, to_onnx
from s1omni.export.patches import MASKED, chunked_attention, continue_state, prefill_state
from s1omni.export.reference import load_cases

SIZE = 16  # small chunks, so short rows cross several boundaries
HEADS, KV_HEADS, HEAD_DIM = 4, 2, 8
LONG_CASE = "span-windowed-long"  # 18,557 tokens: the calibration case whose unchunked scores took 5.5 GB
PEAK_BYTES = 1_500_000_000  # the process's peak RSS on that case; the unchunked graphs took 6.3 GB


class BothForms(nn.Module):
    """The attention of one prefill (``past`` False) or continue graph in both forms: ``(chunked, unchunked)``.

    Queries, keys and values come in ``[B, S, heads, D]`` and are transposed as the model's projections
    are; a continue graph's prefix keys and values (``[B, heads, P, D]``, as the state holds them) go first.
    """

    def __init__(self, size: int, past: bool):
        super().__init__()
        config = Qwen3_5TextConfig(hidden_size=32, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, head_dim=HEAD_DIM)
        self.attention = Qwen3_5Attention(config, 0).eval()
        self.size, self.past = size, past

    def forward(self, query, key, value, mask, *past):
        query, key, value = (x.transpose(1, 2) for x in (query, key, value))
        if self.past:
            state = continue_state(mask, query.shape[2], {})
            key, value = (torch.cat([before, own], dim=2) for before, own in zip(past, (key, value), strict=True))
        else:
            state = prefill_state(mask)
        unchunked, _ = eager_attention_forward(self.attention, query, key, value, state.bias, scaling=self.attention.scaling)
        return chunked_attention(self.attention, query, key, value, state.keys, self.size), unchunked


def _session(size: int, past: bool) -> onnxruntime.InferenceSession:
    """``BothForms`` traced as the backbone graphs are (``s1omni.export.onnx_export``), in ONNX Runtime."""
    # Two tokens or more: traced from inputs rather than projections, repeat_kv would guard on one.
    batch, prefix, length = torch.export.Dim("batch", min=1), torch.export.Dim("prefix", min=1), torch.export.Dim("length", min=2)
    args = [torch.randn(2, 40, HEADS, HEAD_DIM), *(torch.randn(2, 40, KV_HEADS, HEAD_DIM) for _ in range(2))]
    shapes = [{0: batch, 1: length}, {0: batch, 1: length}, {0: batch, 1: length}]
    names = ["query", "key", "value", "past_mask" if past else "attention_mask"]
    if past:
        args += [torch.ones(2, 45, dtype=torch.long), *(torch.randn(2, KV_HEADS, 45, HEAD_DIM) for _ in range(2))]
        shapes += [{0: batch, 1: prefix}, ({0: batch, 2: prefix}, {0: batch, 2: prefix})]
        names += ["past_key", "past_value"]
    else:
        args.append(torch.ones(2, 40, dtype=torch.long))
        shapes.append({0: batch, 1: length})
    with torch.no_grad(), torch.fx.experimental._config.patch(backed_size_oblivious=True):
        program = torch.export.export(BothForms(size, past), tuple(args), dynamic_shapes=tuple(shapes), strict=False)
    model = to_onnx(program, tuple(shapes), names, ["chunked", "unchunked"], OPSET)
    return onnxruntime.InferenceSession(ir.to_proto(model).SerializeToString(), providers=["CPUExecutionProvider"])


@pytest.fixture(scope="module")
def prefill_forms() -> onnxruntime.InferenceSession:
    return _session(SIZE, past=False)


@pytest.fixture(scope="module")
def continue_forms() -> onnxruntime.InferenceSession:
    return _session(SIZE, past=True)


def _run(session: onnxruntime.InferenceSession, mask: torch.Tensor, length: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Random queries, keys and values of ``length`` tokens (and of the prefix, for a continue graph) under ``mask``."""
    rng = np.random.default_rng(seed)
    batch = mask.shape[0]

    def states(*shape: int) -> np.ndarray:
        return rng.standard_normal((batch, *shape, HEAD_DIM), dtype=np.float32)

    names = [value.name for value in session.get_inputs()]
    feeds = {"query": states(length, HEADS), "key": states(length, KV_HEADS), "value": states(length, KV_HEADS), names[3]: mask.numpy()}
    if "past_key" in names:
        feeds |= {"past_key": states(KV_HEADS, mask.shape[1]), "past_value": states(KV_HEADS, mask.shape[1])}
    chunked, unchunked = session.run(None, feeds)
    return chunked, unchunked


def _left_padded(width: int, pads: list[int]) -> torch.Tensor:
    return torch.as_tensor(np.arange(width)[None, :] >= np.array(pads)[:, None]).long()


# Rows of 70 queries: four chunk boundaries and a partial last chunk. Pads of 20 leave a whole chunk
# of fully masked rows and end mid-chunk; 69 leaves one real token.
PREFILLS = {"unpadded": [0], "left-padded rows": [0, 20, 69, SIZE]}
CONTINUES = {"one block": (30, [0], 50), "padded prefixes, several chunks": (30, [0, 7, 29], 70), "prefix of one key": (1, [0, 0], 33)}


@pytest.mark.parametrize("pads", PREFILLS.values(), ids=PREFILLS.keys())
def test_chunked_prefill_attention_is_the_unchunked_graph_bit_for_bit(prefill_forms: onnxruntime.InferenceSession, pads: list[int]) -> None:
    length = 70
    chunked, unchunked = _run(prefill_forms, _left_padded(length, pads), length, seed=len(pads))
    assert chunked.shape == unchunked.shape == (len(pads), length, HEADS, HEAD_DIM)
    assert np.isfinite(chunked).all()
    assert np.array_equal(chunked, unchunked), f"max abs {np.abs(chunked - unchunked).max():.2e}"


@pytest.mark.parametrize(("prefix", "pads", "length"), CONTINUES.values(), ids=CONTINUES.keys())
def test_chunked_continue_attention_is_the_unchunked_graph_bit_for_bit(
    continue_forms: onnxruntime.InferenceSession, prefix: int, pads: list[int], length: int
) -> None:
    chunked, unchunked = _run(continue_forms, _left_padded(prefix, pads), length, seed=prefix + length)
    assert chunked.shape == unchunked.shape == (len(pads), length, HEADS, HEAD_DIM)
    assert np.array_equal(chunked, unchunked), f"max abs {np.abs(chunked - unchunked).max():.2e}"


def test_a_single_query_differs_from_the_unchunked_graph_by_rounding_only(continue_forms: onnxruntime.InferenceSession) -> None:
    """One query (a one-token block): the unchunked MatMuls take ONNX Runtime's one-row kernel, whose sums
    run in another order, while the chunk computes the row as it computes every other."""
    chunked, unchunked = _run(continue_forms, _left_padded(300, [0, 40]), 1, seed=1)
    assert np.allclose(chunked, unchunked, rtol=0, atol=1e-6)


def test_key_masks_are_causal_over_the_valid_keys() -> None:
    """The masks both forms share, written out: a prefill row sees its real tokens up to itself; a block
    sees its prefix's real tokens and its own up to itself; a fully masked row stays finite."""
    mask = _left_padded(5, [0, 2])
    allowed = np.tril(np.ones((5, 5), bool))[None] & mask.bool().numpy()[:, None, :]
    bias = prefill_state(mask).keys.bias(torch.arange(5)).numpy()
    assert bias.shape == (2, 1, 5, 5) and np.array_equal(bias[:, 0] == 0, allowed) and (bias[:, 0][~allowed] == MASKED).all()
    assert (bias[1, 0, :2] == MASKED).all()  # the padded rows: every key masked, finitely

    past = _left_padded(4, [0, 3])
    keys = continue_state(past, 3, {}).keys
    own = np.tril(np.ones((3, 3), bool))
    allowed = np.concatenate([np.broadcast_to(past.bool().numpy()[:, None, :], (2, 3, 4)), np.broadcast_to(own, (2, 3, 3))], axis=-1)
    assert np.array_equal(keys.allowed(torch.arange(3)).numpy(), allowed)


@pytest.mark.slow
def test_validating_the_long_case_stays_within_its_memory(exported: Path, tiny_model, tmp_path: Path) -> None:
    """The 18,557-token calibration case through the exported graphs (``OnnxRuntimeRunner``, as validate
    runs it), in a process of its own: its peak RSS stays under ``PEAK_BYTES``."""
    case = next(case for case in load_cases(CALIB / "vela2") if case["name"] == LONG_CASE)
    plan = tiny_model.plan(case["request"])
    np.savez(tmp_path / "feeds.npz", **export_family("vela2").cases.feeds(plan))
    script = (
        "import json, resource, sys, numpy as np\n"
        "from s1omni.export.tree_runner import decode\n"
        "from s1omni.runtime.runners.onnxruntime_runner import OnnxRuntimeRunner\n"
        "trees = decode(dict(np.load(sys.argv[2])))\n"
        "OnnxRuntimeRunner(sys.argv[1]).run(trees)\n"
        "tokens = sum(len(t.prefix.ids) + sum(len(b.ids) for b in t.blocks) for t in trees)\n"
        "print(json.dumps({'tokens': tokens, 'peak': resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))\n"
    )
    command = [sys.executable, "-c", script, str(exported), str(tmp_path / "feeds.npz")]
    result = subprocess.run(command, capture_output=True, text=True, check=True)
    figures = json.loads(result.stdout)
    assert figures["tokens"] == 18557
    assert figures["peak"] < PEAK_BYTES, f"peak RSS {figures['peak'] / 1e9:.2f} GB"
