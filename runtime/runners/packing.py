"""The inputs of a packed forward (the ``shared_context`` profile): each tree's blocks one after another in
one row behind its prefix, with the indices the packed graph moves its tokens by.

The graph (``s1omni.export.patches.PackedForward``) runs embeddings, norms, projections and MLP on the
packed rows (``R`` rows, one per prefix, ``T`` wide), and its Gated DeltaNet layers and each block's
own attention on block rows (``N`` blocks, ``L`` wide), so it takes both layouts' indices:
``block_index`` (where each block-row token lies in the packed rows), ``packed_index`` (the reverse)
and ``block_owner`` (each block's prefix row). Rows and block rows are right-padded: a padded token
follows every real one of its row, so nothing real attends to it or reads its state.

Under CUDA graphs (``round_up``) every one of those sizes is rounded up to a bucket: packed rows and
block rows wider, more readouts (index 0), more block rows (each reading packed position 0 of row 0, owned
by row 0, and read by nothing) and, where the caller pads them, prefix rows without blocks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from .base import Block

# Block rows are at least this wide (one-token blocks padded): the export traces the graph for such widths only.
MIN_BLOCK_WIDTH = 2
PACKING_INPUTS = ("block_index", "packed_index", "block_owner")  # the packed graph's, after the continue graph's four


@dataclass(frozen=True)
class PackedBlocks:
    """A packed forward's token inputs, and where each block's readouts land in its output."""

    feeds: dict[str, np.ndarray]  # input_ids, position_ids, readout_index and the PACKING_INPUTS
    reads: list[tuple[int, int, int]]  # per block in order: its row, first readout and readout count

    def split(self, hidden: np.ndarray) -> list[np.ndarray]:
        """Each block's hidden states at its readouts, from the graph's ``[R, K, H]`` output."""
        return [hidden[row, first : first + count] for row, first, count in self.reads]


def pack_blocks(rows: Sequence[Sequence[Block]], starts: np.ndarray, round_up: Callable[[int], int] | None = None) -> PackedBlocks:
    """The blocks of each prefix row in ``rows`` packed, in order; a row's blocks take positions from its
    ``starts`` on, each block from the same start (every block continues from its prefix alone). A row may
    hold no blocks (a padded one). ``round_up``: the bucket every size is rounded up to (CUDA graphs)."""
    blocks = [block for row in rows for block in row]
    if not blocks or any(len(block.ids) == 0 for block in blocks):
        raise ValueError("a packed forward takes one or more blocks, each of one or more tokens")
    sizes = (max(sum(len(block.ids) for block in row) for row in rows), max(MIN_BLOCK_WIDTH, *(len(block.ids) for block in blocks)),
             max(1, *(sum(len(block.readouts) for block in row) for row in rows)), len(blocks))  # fmt: skip
    width, block_width, reads, count = map(round_up, sizes) if round_up is not None else sizes
    ids = np.zeros((len(rows), width), np.int64)
    positions = np.zeros((3, len(rows), width), np.int64)
    packed_index = np.zeros((len(rows), width), np.int64)
    readout_index = np.zeros((len(rows), reads), np.int64)
    block_index = np.zeros((count, block_width), np.int64)
    owner = np.zeros(count, np.int64)
    placed: list[tuple[int, int, int]] = []
    for row, row_blocks in enumerate(rows):
        at = first = 0
        for block in row_blocks:
            index, size, count = len(placed), len(block.ids), len(block.readouts)
            steps = np.arange(size)
            ids[row, at : at + size] = block.ids
            positions[:, row, at : at + size] = starts[row] + steps
            block_index[index, :size] = row * width + at + steps
            block_index[index, size:] = row * width + at + size - 1
            packed_index[row, at : at + size] = index * block_width + steps
            owner[index] = row
            readout_index[row, first : first + count] = at + np.asarray(block.readouts, np.int64)
            placed.append((row, first, count))
            at, first = at + size, first + count
    feeds = {"input_ids": ids, "position_ids": positions, "readout_index": readout_index,
             "block_index": block_index, "packed_index": packed_index, "block_owner": owner}  # fmt: skip
    return PackedBlocks(feeds, placed)
