"""Backbone runners as Polygraphy runners, so one comparator validates every backend.

One Polygraphy iteration is one calibration case: all of its trees, flattened into a fixed set of
int64 inputs, and one output, ``hidden``: the final-norm hidden states at every readout of every
block, in tree and block order. The torch reference and each engine answer the same feeds through
the runner protocol of ``s1omni.runtime.runners.base``, batching exactly as they do when serving.

Vision members' cases also carry each tree's image (processed patches and grid) and its prefix's
M-RoPE positions, placeholders and block start: the runner runs its own vision tower on the image
and puts the features at the placeholders, so the engine is validated from pixels to readouts,
and the features themselves are a second output, ``image_embeds``.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np
from polygraphy.backend.base import BaseRunner
from polygraphy.common import TensorMetadata
from polygraphy.logger import G_LOGGER

from s1omni.runtime.runners.base import BackboneRunner, Block, Prefix, Tree, text_positions

# Polygraphy logs every iteration's tensors at INFO; the runner reports its own progress instead.
G_LOGGER.module_severity = G_LOGGER.WARNING
INPUTS = ("prefix_ids", "prefix_lengths", "block_ids", "block_lengths", "block_tree", "readouts", "readout_counts")
# Per tree: its prefix's [3, P] positions, block start, placeholders (and their count), image patches and grid.
IMAGE_INPUTS = ("prefix_positions", "next_positions", "embed_index", "embed_counts", "pixel_values", "image_grids")
Image = tuple[np.ndarray, tuple[int, int, int]]  # processed patches [N, D] and their (t, h, w) grid
Vision = Callable[[np.ndarray, tuple[int, int, int]], np.ndarray]  # image features of one image


def encode(trees: Sequence[Tree], images: Sequence[Image] | None = None) -> OrderedDict[str, np.ndarray]:
    """One case's trees as Polygraphy feeds; with ``images`` (one per tree), vision prefixes too."""
    blocks = [(index, block) for index, tree in enumerate(trees) for block in tree.blocks]

    def cat(parts: list[np.ndarray]) -> np.ndarray:
        return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)

    feeds = OrderedDict(
        prefix_ids=cat([tree.prefix.ids for tree in trees]),
        prefix_lengths=np.asarray([len(tree.prefix.ids) for tree in trees], np.int64),
        block_ids=cat([block.ids for _, block in blocks]),
        block_lengths=np.asarray([len(block.ids) for _, block in blocks], np.int64),
        block_tree=np.asarray([index for index, _ in blocks], np.int64),
        readouts=cat([block.readouts for _, block in blocks]),
        readout_counts=np.asarray([len(block.readouts) for _, block in blocks], np.int64),
    )
    if images is not None:
        prefixes = [tree.prefix for tree in trees]
        positions = [p.positions if p.positions is not None else text_positions(0, len(p.ids)) for p in prefixes]
        index = [np.zeros(0, np.int64) if p.embed_index is None else np.asarray(p.embed_index) for p in prefixes]
        feeds.update(
            prefix_positions=np.concatenate(positions, axis=1).astype(np.int64).reshape(3, -1),
            next_positions=np.asarray([p.start for p in prefixes], np.int64),
            embed_index=cat(index),
            embed_counts=np.asarray([len(i) for i in index], np.int64),
            pixel_values=np.concatenate([values for values, _ in images]).astype(np.float32),
            image_grids=np.asarray([grid for _, grid in images], np.int64).reshape(-1, 3),
        )
    return feeds


def _split(values: np.ndarray, counts: np.ndarray, axis: int = 0) -> list[np.ndarray]:
    return np.split(values, np.cumsum(counts)[:-1], axis=axis)


def decode(feed: dict[str, np.ndarray]) -> list[Tree]:
    """The trees of ``encode``'s feeds; vision prefixes come back without their image features."""
    prefixes = [Prefix(ids) for ids in _split(feed["prefix_ids"], feed["prefix_lengths"])]
    if "prefix_positions" in feed:
        positions = _split(feed["prefix_positions"], feed["prefix_lengths"], axis=1)
        index = _split(feed["embed_index"], feed["embed_counts"])
        prefixes = [
            Prefix(p.ids, positions=rows, embed_index=places, next_position=int(start))
            for p, rows, places, start in zip(prefixes, positions, index, feed["next_positions"], strict=True)
        ]
    ids = _split(feed["block_ids"], feed["block_lengths"])
    reads = _split(feed["readouts"], feed["readout_counts"])
    grouped: list[list[Block]] = [[] for _ in prefixes]
    for tree, block_ids, readouts in zip(feed["block_tree"], ids, reads, strict=True):
        grouped[int(tree)].append(Block(block_ids, readouts))
    return [Tree(prefix, tuple(blocks)) for prefix, blocks in zip(prefixes, grouped, strict=True)]


def decode_images(feed: dict[str, np.ndarray]) -> list[Image]:
    grids = [tuple(int(v) for v in grid) for grid in feed["image_grids"]]
    values = _split(feed["pixel_values"], [t * h * w for t, h, w in grids])
    return list(zip(values, grids, strict=True))


class TreeRunner(BaseRunner):
    """A Polygraphy runner over a backbone runner: feeds of ``encode`` in, ``hidden`` out.

    With ``vision`` (a vision member's tower), the feeds carry images and ``image_embeds`` comes out too.
    """

    def __init__(self, backbone: BackboneRunner, name: str | None = None, vision: Vision | None = None):
        super().__init__(name=name or f"{backbone.name}-{backbone.device}-{backbone.precision}", prefix="s1omni-tree")
        self.backbone = backbone
        self.vision = vision
        self.iterations = 0

    def activate_impl(self) -> None:
        pass

    def get_input_metadata_impl(self) -> TensorMetadata:
        metadata = TensorMetadata()
        for name in INPUTS:
            metadata.add(name, np.int64, (None,))
        if self.vision is not None:
            for name in IMAGE_INPUTS:
                metadata.add(name, np.int64, (None,))
            metadata.add("prefix_positions", np.int64, (3, None))
            metadata.add("pixel_values", np.float32, (None, None))
            metadata.add("image_grids", np.int64, (None, 3))
        return metadata

    def infer_impl(self, feed_dict: dict[str, np.ndarray]) -> OrderedDict[str, np.ndarray]:
        trees = decode(feed_dict)
        start = time.perf_counter()
        outputs: OrderedDict[str, np.ndarray] = OrderedDict()
        if self.vision is not None:
            features = [self.vision(values, grid) for values, grid in decode_images(feed_dict)]
            trees = [Tree(replace(tree.prefix, embeds=f), tree.blocks) for tree, f in zip(trees, features, strict=True)]
            outputs["image_embeds"] = np.concatenate(features).astype(np.float32)
        hidden = self.backbone.run(trees)
        self.inference_time = time.perf_counter() - start
        self.iterations += 1
        outputs["hidden"] = flat_hidden(hidden, self.backbone.hidden_size)
        return outputs

    def deactivate_impl(self) -> None:
        pass


def flat_hidden(hidden: Sequence[Sequence[np.ndarray]], width: int) -> np.ndarray:
    """Per-tree, per-block readout states as the one ``hidden`` output ``[rows, width]`` (``split_hidden``
    undoes it)."""
    rows = [block for tree in hidden for block in tree]
    return np.concatenate(rows).astype(np.float32) if rows else np.zeros((0, width), np.float32)


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
