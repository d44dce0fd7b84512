"""The check every backbone export passes before it is kept: its graphs against the untouched model.

The graphs run in ONNX Runtime (CPU EP) at two lengths that cross chunk boundaries, and every
output is compared with transformers' own model: the prefill's hidden states and each state
tensor with its DynamicCache, the continuation's hidden states with the reference runner's. The
packed graph, where exported, runs two blocks in one row after the prefix, the case's block and
its first half, each compared with that block continued alone (the half's hidden states are the
block's first ones, attention being causal): a half that saw the block before it, or a block that
started from the other's state, would be off. The
check is structural (a wrong graph is off by O(1) of the values' scale); the float32 gates of
the numerical contract are the validation stage's.

The reference's outputs (``reference_outputs``) need the model and not the graphs, so the export
computes them while its workers trace, and frees the model before the graphs' sessions open
(``check_graphs``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime
import torch
from torch import nn

from s1omni.runtime import progress
from s1omni.runtime.runners.base import Block, Prefix, text_positions
from s1omni.runtime.runners.packing import pack_blocks
from s1omni.runtime.runners.torch_runner import TorchRunner

from .patches import state_names

LENGTHS = (37, 200)
# Largest difference allowed, relative to the largest magnitude of the reference output.
RELATIVE = 1e-4


@dataclass(frozen=True)
class Expected:
    """The untouched model's outputs for one prefix and the block after it."""

    ids: np.ndarray
    embeds: np.ndarray  # the prefix tokens' own embeddings: what the reference runner's prefill looks up
    block_ids: np.ndarray
    hidden: np.ndarray  # the prefix's hidden states
    state: dict[str, np.ndarray]  # every state tensor after the prefix, as the graphs hold it
    continued: np.ndarray  # the block's hidden states


def reference_outputs(model: nn.Module, lengths: tuple[int, int] = LENGTHS) -> list[Expected]:
    """The model's outputs for prefix/block lengths ``lengths`` and reversed (random ids, seed 0): what
    ``check_graphs`` compares the graphs with."""
    reference = TorchRunner(model)
    names = state_names(model.config.layer_types)
    rng = np.random.default_rng(0)
    out = []
    for prefix_length, block_length in (lengths, lengths[::-1]):
        ids, block_ids = (rng.integers(1, model.config.vocab_size, n) for n in (prefix_length, block_length))
        cache = reference.prefill(Prefix(ids))
        state = {name: np.array(_cached(cache, name)) for name in names}  # copies, taken before the cache is continued
        continued = reference.continue_blocks(cache, Prefix(ids), [Block(block_ids, np.arange(block_length))])[0]
        with torch.no_grad():
            embeds = model.embed_tokens(torch.as_tensor(ids)[None]).numpy()
        out.append(Expected(ids, embeds, block_ids, reference.forward(ids), state, continued))
    return out


def check_graphs(expected: list[Expected], directory: Path, variants: Mapping[str, Mapping[str, str]]) -> dict[str, dict[str, float]]:
    """Per variant, the largest relative difference per output kind from the reference's ``expected``
    outputs (``reference_outputs``); ``RuntimeError`` where one exceeds ``RELATIVE``.

    ``variants`` names each variant's graphs in ``directory`` (``{"fused": {"prefill": ...,
    "continue": ..., "packed": ...}}``; packed optional). One graph's session is open at a time (a 9B member's float32 weights are
    32 GB), and the caller holds no model beside it.
    """
    return {variant: _check(directory, files, expected) for variant, files in variants.items()}


def _check(directory: Path, files: Mapping[str, str], expected: list[Expected]) -> dict[str, float]:
    found: list[dict[str, float]] = [{} for _ in expected]
    states = []
    prefill = _session(directory / files["prefill"])
    embeds = prefill.get_inputs()[0].name == "inputs_embeds"
    for case, row in zip(expected, found, strict=True):
        feeds = _feeds(case.ids, 0, "attention_mask")
        if embeds:
            del feeds["input_ids"]
            feeds["inputs_embeds"] = case.embeds
        hidden, *state = prefill.run(None, feeds)
        states.append(state)
        row["prefill.hidden"] = _relative(hidden[0], case.hidden)
        for (name, reference), value in zip(case.state.items(), state, strict=True):
            kind = f"prefill.{name.split('.')[0]}"
            row[kind] = max(row.get(kind, 0.0), _relative(value, reference))
    del prefill
    pasts = [{f"past_{name}": value for name, value in zip(case.state, state, strict=True)} for case, state in zip(expected, states, strict=True)]
    block = _session(directory / files["continue"])
    for case, past, row in zip(expected, pasts, found, strict=True):
        hidden = block.run(None, _feeds(case.block_ids, len(case.ids), "past_mask") | past)[0]
        row["continue.hidden"] = _relative(hidden[0], case.continued)
    del block
    if "packed" in files:
        packed = _session(directory / files["packed"])
        for case, past, row in zip(expected, pasts, found, strict=True):
            hidden, half = packed_halves(packed, case, past)
            row["packed.hidden"] = max(_relative(hidden, case.continued), _relative(half, case.continued[: len(half)]))
        del packed
    for case, row in zip(expected, found, strict=True):
        summary = ", ".join(f"{kind} {value:.1e}" for kind, value in row.items())
        progress.note(f"checked {files['prefill']} prefix {len(case.ids)} + block {len(case.block_ids)}: {summary}")
    report = {kind: max(row[kind] for row in found) for kind in found[0]}
    failed = {kind: value for kind, value in report.items() if value > RELATIVE}
    if failed:
        raise RuntimeError(f"the exported graphs differ from the transformers model (relative to its scale): {failed}")
    return report


def packed_halves(session: onnxruntime.InferenceSession, case: Expected, past: dict[str, np.ndarray]) -> list[np.ndarray]:
    """The packed graph over one row holding ``case``'s block, then its first half, both after the case's
    prefix (``past``): each one's hidden states at every token."""
    block = case.block_ids
    blocks = [Block(ids, np.arange(len(ids))) for ids in (block, block[: (len(block) + 1) // 2])]
    packed = pack_blocks([blocks], np.array([len(case.ids)]))
    hidden = session.run(None, {**packed.feeds, "past_mask": np.ones((1, len(case.ids)), np.int64), **past})[0]
    return packed.split(hidden)


def _session(path: Path) -> onnxruntime.InferenceSession:
    options = onnxruntime.SessionOptions()
    # The weights as ONNX Runtime maps them from weights.data, not a second, pre-packed copy: a check runs
    # each graph twice, and the pre-packed copy would put the member's weights in memory twice over.
    options.add_session_config_entry("session.disable_prepacking", "1")
    return onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


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
