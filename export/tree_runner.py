"""Backbone runners as Polygraphy runners, so one comparator validates every backend.

One Polygraphy iteration is one calibration case: all of its trees, flattened into a fixed set of
int64 inputs, and one output, ``hidden``: the final-norm hidden states at every readout of every
block, in tree and block order. The torch reference and each engine answer the same feeds through
the runner protocol of ``runtime.runners.base``, batching exactly as they do when serving.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import sys
import time

import numpy as np
from polygraphy.backend.base import BaseRunner
from polygraphy.common import TensorMetadata
from polygraphy.logger import G_LOGGER

from runtime.runners.base import BackboneRunner, Block, Prefix, Tree

# Polygraphy logs every iteration's tensors at INFO; the runner reports its own progress instead.
G_LOGGER.module_severity = G_LOGGER.WARNING
INPUTS = ("prefix_ids", "prefix_lengths", "block_ids", "block_lengths", "block_tree", "readouts", "readout_counts")


def encode(trees: Sequence[Tree]) -> OrderedDict[str, np.ndarray]:
    """One case's trees as Polygraphy feeds (text positions only: vision prefixes are not encoded)."""
    blocks = [(index, block) for index, tree in enumerate(trees) for block in tree.blocks]

    def cat(parts: list[np.ndarray]) -> np.ndarray:
        return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)

    return OrderedDict(
        prefix_ids=cat([tree.prefix.ids for tree in trees]),
        prefix_lengths=np.asarray([len(tree.prefix.ids) for tree in trees], np.int64),
        block_ids=cat([block.ids for _, block in blocks]),
        block_lengths=np.asarray([len(block.ids) for _, block in blocks], np.int64),
        block_tree=np.asarray([index for index, _ in blocks], np.int64),
        readouts=cat([block.readouts for _, block in blocks]),
        readout_counts=np.asarray([len(block.readouts) for _, block in blocks], np.int64),
    )


def decode(feed: dict[str, np.ndarray]) -> list[Tree]:
    prefixes = np.split(feed["prefix_ids"], np.cumsum(feed["prefix_lengths"])[:-1])
    ids = np.split(feed["block_ids"], np.cumsum(feed["block_lengths"])[:-1])
    reads = np.split(feed["readouts"], np.cumsum(feed["readout_counts"])[:-1])
    grouped: list[list[Block]] = [[] for _ in prefixes]
    for tree, block_ids, readouts in zip(feed["block_tree"], ids, reads, strict=True):
        grouped[int(tree)].append(Block(block_ids, readouts))
    return [Tree(Prefix(prefix), tuple(blocks)) for prefix, blocks in zip(prefixes, grouped, strict=True)]


class TreeRunner(BaseRunner):
    """A Polygraphy runner over a backbone runner: feeds of ``encode`` in, ``hidden`` out."""

    def __init__(self, backbone: BackboneRunner, name: str | None = None):
        super().__init__(name=name or f"{backbone.name}-{backbone.device}-{backbone.precision}", prefix="s1omni-tree")
        self.backbone = backbone
        self.iterations = 0

    def activate_impl(self) -> None:
        pass

    def get_input_metadata_impl(self) -> TensorMetadata:
        metadata = TensorMetadata()
        for name in INPUTS:
            metadata.add(name, np.int64, (None,))
        return metadata

    def infer_impl(self, feed_dict: dict[str, np.ndarray]) -> OrderedDict[str, np.ndarray]:
        trees = decode(feed_dict)
        start = time.perf_counter()
        hidden = self.backbone.run(trees)
        self.inference_time = time.perf_counter() - start
        self.iterations += 1
        tokens = len(feed_dict["prefix_ids"]) + len(feed_dict["block_ids"])
        print(f"{self.name}: case {self.iterations}: {len(trees)} trees, {tokens} tokens, {self.inference_time * 1e3:.1f} ms",
              file=sys.stderr, flush=True)  # fmt: skip
        rows = [block for tree in hidden for block in tree]
        width = self.backbone.hidden_size
        return OrderedDict(hidden=np.concatenate(rows).astype(np.float32) if rows else np.zeros((0, width), np.float32))

    def deactivate_impl(self) -> None:
        pass


def split_hidden(hidden: np.ndarray, trees: Sequence[Tree]) -> list[list[np.ndarray]]:
    """The ``hidden`` output back into per-tree, per-block arrays."""
    out, cursor = [], 0
    for tree in trees:
        blocks = []
        for block in tree.blocks:
            blocks.append(hidden[cursor : cursor + len(block.readouts)])
            cursor += len(block.readouts)
        out.append(blocks)
    return out
