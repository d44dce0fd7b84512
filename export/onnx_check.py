"""The check every backbone export passes before it is kept: both graphs against the untouched model.

Both graphs run in ONNX Runtime (CPU EP) at two lengths that cross chunk boundaries, and every
output is compared with transformers' own model: the prefill's hidden states and each state
tensor with its DynamicCache, the continuation's hidden states with the reference runner's. The
check is structural (a wrong graph is off by O(1) of the values' scale); the float32 gates of
the numerical contract are the validation stage's.
"""

from __future__ import annotations

import sys
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


def check_graphs(model: nn.Module, directory: Path, lengths: tuple[int, int] = LENGTHS) -> dict[str, float]:
    """The largest relative difference per output kind over prefix/block lengths ``lengths`` and reversed."""
    prefill, block = (
        onnxruntime.InferenceSession(str(directory / f"{name}.onnx"), providers=["CPUExecutionProvider"])
        for name in ("prefill", "continue")
    )
    reference = TorchRunner(model)
    names = state_names(model.config.layer_types)
    embeds = prefill.get_inputs()[0].name == "inputs_embeds"
    rng = np.random.default_rng(0)
    report: dict[str, float] = {}
    for prefix_length, block_length in (lengths, lengths[::-1]):
        ids = rng.integers(1, model.config.vocab_size, prefix_length)
        feeds = _feeds(ids, 0, "attention_mask")
        if embeds:  # the tokens' own embeddings: what the reference runner's prefill looks up
            with torch.no_grad():
                feeds["inputs_embeds"] = model.embed_tokens(torch.as_tensor(feeds.pop("input_ids"))).numpy()
        hidden, *state = prefill.run(None, feeds)
        cache = reference.prefill(Prefix(ids))
        found = {"prefill.hidden": _relative(hidden[0], reference.forward(ids))}
        for name, value in zip(names, state, strict=True):
            kind = f"prefill.{name.split('.')[0]}"
            found[kind] = max(found.get(kind, 0.0), _relative(value, _cached(cache, name)))
        block_ids = rng.integers(1, model.config.vocab_size, block_length)
        past = {f"past_{name}": value for name, value in zip(names, state, strict=True)}
        hidden = block.run(None, _feeds(block_ids, prefix_length, "past_mask") | past)[0]
        expected = reference.continue_blocks(cache, Prefix(ids), [Block(block_ids, np.arange(block_length))])[0]
        found["continue.hidden"] = _relative(hidden[0], expected)
        for kind, value in found.items():
            report[kind] = max(report.get(kind, 0.0), value)
        summary = ", ".join(f"{kind} {value:.1e}" for kind, value in found.items())
        print(f"export: checked prefix {prefix_length} + block {block_length}: {summary}", file=sys.stderr, flush=True)
    failed = {kind: value for kind, value in report.items() if value > RELATIVE}
    if failed:
        raise RuntimeError(f"the exported graphs differ from the transformers model (relative to its scale): {failed}")
    return report


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
