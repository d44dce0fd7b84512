"""The backbone runner protocol: the only part that differs between the reference and an engine.

A request is planned into trees: a prefix (the shared parts) and blocks that each continue from the
prefix's state and attend to the prefix and to themselves only. A runner computes, per block, the
final-norm hidden states at the block's readout positions. Heads, planning and finishing never
know which runner they got, so a parity failure always points at the backbone.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np


@dataclass(frozen=True)
class Block:
    """Tokens that continue from a prefix; ``readouts`` are block-relative positions to return."""

    ids: np.ndarray  # int64 [L]
    readouts: np.ndarray  # int64 [R]


@dataclass(frozen=True)
class Prefix:
    """The shared part of a tree.

    ``positions`` are the three M-RoPE rows (``[3, P]``); None means ``arange(P)`` on every axis (text).
    ``embeds`` replace the token embeddings at ``embed_index`` (image features of vision members).
    Blocks take positions from ``next_position`` on (None: P).
    """

    ids: np.ndarray  # int64 [P]
    positions: np.ndarray | None = None
    embeds: np.ndarray | None = None
    embed_index: np.ndarray | None = None
    next_position: int | None = None

    @property
    def start(self) -> int:
        return len(self.ids) if self.next_position is None else self.next_position


@dataclass(frozen=True)
class Tree:
    prefix: Prefix
    blocks: tuple[Block, ...]

    @property
    def tokens(self) -> int:
        return len(self.prefix.ids) + sum(len(block.ids) for block in self.blocks)


# Called by ``run`` with a block's hidden states as soon as they are on the host: the tree's index in
# ``run``'s trees, the block's index in that tree, and its readout rows (what ``run`` returns for it).
BlockReady = Callable[[int, int, np.ndarray], None]


class BackboneRunner(Protocol):
    """``prefill`` then ``continue_blocks``; ``run`` answers many trees (runners may batch them), handing
    each block to ``ready`` once its forward is done, so that its heads may start while others run."""

    name: str  # torch | onnxruntime | tensorrt
    device: str  # cpu | cuda
    precision: str  # fp32 | bf16
    hidden_size: int

    def prefill(self, prefix: Prefix) -> Any: ...

    def continue_blocks(self, state: Any, prefix: Prefix, blocks: Sequence[Block]) -> list[np.ndarray]: ...

    def run(self, trees: Sequence[Tree], ready: BlockReady | None = None) -> list[list[np.ndarray]]: ...


def numerics(precision: str) -> str:
    """A backbone's numerics on a card: ``exact`` in float32 (the reference's), ``approximate`` in reduced precision."""
    return "exact" if precision == "fp32" else "approximate"


def run_one_by_one(runner: BackboneRunner, trees: Sequence[Tree], ready: BlockReady | None = None) -> list[list[np.ndarray]]:
    """Each tree's prefix once, then its blocks from that state: the reference order of work."""
    out = []
    for index, tree in enumerate(trees):
        state = runner.prefill(tree.prefix)
        out.append(runner.continue_blocks(state, tree.prefix, tree.blocks))
        for number, rows in enumerate(out[-1]):
            if ready is not None:
                ready(index, number, rows)
    return out


def text_positions(start: int, length: int) -> np.ndarray:
    """M-RoPE rows for text: the same ``start .. start+length-1`` on all three axes, ``[3, length]``."""
    return np.broadcast_to(np.arange(start, start + length, dtype=np.int64), (3, length)).copy()


def pad_blocks(blocks: Sequence[Block], round_up: Callable[[int], int] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Blocks right-padded with id 0 to the widest (``[N, L]``) and readouts padded with 0 (``[N, R]``),
    both widths rounded up by ``round_up`` where given.

    Right padding never changes a real token's hidden state: attention is causal and the Gated
    DeltaNet recurrence runs forward, so padding only follows the readouts.
    """
    width = max(len(block.ids) for block in blocks)
    reads = max(len(block.readouts) for block in blocks)
    if round_up is not None:
        width, reads = round_up(width), round_up(reads)
    ids = np.zeros((len(blocks), width), np.int64)
    readouts = np.zeros((len(blocks), max(reads, 1)), np.int64)
    for row, block in enumerate(blocks):
        ids[row, : len(block.ids)] = block.ids
        readouts[row, : len(block.readouts)] = block.readouts
    return ids, readouts
