"""The check every backbone export passes before it is kept: both graphs against the untouched model.

Both graphs run in ONNX Runtime (CPU EP) at two lengths that cross chunk boundaries, and every
output is compared with transformers' own model: the prefill's hidden states and each state
tensor with its DynamicCache, the continuation's hidden states with the reference runner's. The
check is structural (a wrong graph is off by O(1) of the values' scale); the float32 gates of
the numerical contract are the validation stage's.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime
import torch
from torch import nn

from runtime.runners.base import Block, Prefix, text_positions
from runtime.runners.torch_runner import TorchRunner

from .patches import state_names

LENGTHS = (37, 200)
# Largest difference allowed, relative to the largest magnitude of the reference output.
RELATIVE = 1e-4


def check_graphs(model: nn.Module, directory: Path, files: Mapping[str, str], lengths: tuple[int, int] = LENGTHS) -> dict[str, float]:
    """The largest relative difference per output kind over prefix/block lengths ``lengths`` and reversed.

    ``files`` names the two graphs in ``directory`` (``{"prefill": ..., "continue": ...}``). One graph's
    session is open at a time: a 9B member's float32 weights are 32 GB per session.
    """
    reference = TorchRunner(model)
    names = state_names(model.config.layer_types)
    rng = np.random.default_rng(0)
    pairs = [(rng.integers(1, model.config.vocab_size, p), rng.integers(1, model.config.vocab_size, b)) for p, b in (lengths, lengths[::-1])]
    found: list[dict[str, float]] = [{} for _ in pairs]
    states, caches = [], []
    prefill = _session(directory / files["prefill"])
    embeds = prefill.get_inputs()[0].name == "inputs_embeds"
    for (ids, _), row in zip(pairs, found, strict=True):
        feeds = _feeds(ids, 0, "attention_mask")
        if embeds:  # the tokens' own embeddings: what the reference runner's prefill looks up
            with torch.no_grad():
                feeds["inputs_embeds"] = model.embed_tokens(torch.as_tensor(feeds.pop("input_ids"))).numpy()
        hidden, *state = prefill.run(None, feeds)
        caches.append(reference.prefill(Prefix(ids)))
        states.append(state)
        row["prefill.hidden"] = _relative(hidden[0], reference.forward(ids))
        for name, value in zip(names, state, strict=True):
            kind = f"prefill.{name.split('.')[0]}"
            row[kind] = max(row.get(kind, 0.0), _relative(value, _cached(caches[-1], name)))
    del prefill
    block = _session(directory / files["continue"])
    for (ids, block_ids), state, cache, row in zip(pairs, states, caches, found, strict=True):
        past = {f"past_{name}": value for name, value in zip(names, state, strict=True)}
        hidden = block.run(None, _feeds(block_ids, len(ids), "past_mask") | past)[0]
        expected = reference.continue_blocks(cache, Prefix(ids), [Block(block_ids, np.arange(len(block_ids)))])[0]
        row["continue.hidden"] = _relative(hidden[0], expected)
        summary = ", ".join(f"{kind} {value:.1e}" for kind, value in row.items())
        print(f"export: checked {files['prefill']} prefix {len(ids)} + block {len(block_ids)}: {summary}", file=sys.stderr, flush=True)
    report = {kind: max(row[kind] for row in found) for kind in found[0]}
    failed = {kind: value for kind, value in report.items() if value > RELATIVE}
    if failed:
        raise RuntimeError(f"the exported graphs differ from the transformers model (relative to its scale): {failed}")
    return report


def _session(path: Path) -> onnxruntime.InferenceSession:
    return onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def _feeds(ids: np.ndarray, start: int, mask_name: str) -> dict[str, np.ndarray]:
    """One unpadded row from ``start``; the key mask covers ``start`` prefix keys (continue) or the row (prefill)."""
    mask = np.ones((1, start if mask_name == "past_mask" else len(ids)), np.int64)
    return {
        "input_ids": ids[None],
        "position_ids": text_positions(start, len(ids))[:, None],
        mask_name: mask,
        "readout_index": np.arange(len(ids))[None],
    }


def _relative(value: np.ndarray, reference: np.ndarray) -> float:
    return float(np.abs(value - reference).max() / max(float(np.abs(reference).max()), 1e-30))


def _cached(cache: Any, name: str) -> np.ndarray:
    """The state tensor ``name`` as transformers' cache holds it (it keeps K conv inputs; the graphs keep K-1)."""
    kind, index = name.split(".")
    layer = cache.layers[int(index)]
    tensors = {
        "conv": lambda: layer.conv_states[0][..., 1:],
        "recurrent": lambda: layer.recurrent_states[0],
        "key": lambda: layer.keys,
        "value": lambda: layer.values,
    }
    return tensors[kind]().float().numpy()
