"""Prompt, tokens and the branch layout: one shared prefix, then one row per (question, option).

Follows omnijev.md §4–§5 and wire-contract.md §11.4, which document ``MSO1._prompt``,
``MSO1._encode_many`` and ``MSO1.ask_branch`` with ``mso/branch.py``'s ``rows_from_ids``
(``tinnel123666888/OmniJev``), as ported by
``ThinkFlowLab/system1-omni:src/models/omnijev/native/src/processing.rs``:

- each question renders the chat template with the image placeholder and all its option blocks;
  the text is tokenized on both sides of the one placeholder, which expands to the image tokens;
- the prefix L is the questions' common token prefix, cut so that every row keeps the token
  before its first option marker (where ``zq`` is read);
- a row is the question's remaining head plus one ``<|opt|>text<|/opt|>`` block, positioned
  contiguously from (max prefix position) + 1 on all three M-RoPE axes;
- ``input_tokens`` = L + every row's length.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from tokenizers import Tokenizer

from .contract import ContractError, Kind, Question

IMAGE_PAD = "<|image_pad|>"
OPTION_OPEN = "<|opt|>"
OPTION_CLOSE = "<|/opt|>"
MAX_SEQUENCE = 8192  # one question's tokens: prompt, image and every option block
MAX_PROCESSED = 65_536  # the prefix once plus every row (the reported input_tokens)
MAX_TARGETS = 16_384  # option-text tokens whose log-probabilities are read (not Score)


@dataclass(frozen=True)
class TokenIds:
    """The ids the layout looks for, as the package's tokenizer and config define them."""

    image: int
    option_open: int
    option_close: int


@dataclass(frozen=True)
class Row:
    """One (question, option) row; indices are row-relative."""

    tokens: np.ndarray  # int64: the question's head after the prefix, then one option block
    zq: int  # the token before the option marker: the question-end state
    u: int  # the closing marker, the row's last token: the option state
    targets: tuple[tuple[int, int], ...]  # (position that predicts it, token) per option-text token
    first: int | None  # the first option-text token, predicted from zq


@dataclass(frozen=True)
class Layout:
    prefix: np.ndarray  # int64 [L]
    positions: np.ndarray  # int64 [3, L], the prefix's M-RoPE positions
    image_index: np.ndarray  # int64: prefix positions of the image tokens
    next_position: int  # the position of every row's first token
    rows: tuple[tuple[Row, ...], ...]  # per question, one row per option

    @property
    def input_tokens(self) -> int:
        return len(self.prefix) + sum(len(row.tokens) for rows in self.rows for row in rows)


def prompt(question: Question) -> str:
    """The chat template of one question with its option blocks; the one image placeholder unexpanded.

    The template trims the user content, which starts with the image markers, so only the
    instructions' trailing whitespace goes (``str.rstrip``: Python's ``isspace``, U+001C-U+001F too).
    """
    text = (
        f"<|im_start|>user\n<|vision_start|>{IMAGE_PAD}<|vision_end|>{question.instructions.rstrip()}<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n"
    )
    return text + "".join(f"{OPTION_OPEN}{option}{OPTION_CLOSE}" for option in question.options)


def tokenize(tokenizer: Tokenizer, question: Question, image_tokens: int, ids: TokenIds) -> list[int]:
    """The single-question sequence: each side of the placeholder encoded alone, the image run between."""
    before, after = prompt(question).split(IMAGE_PAD)
    head = tokenizer.encode(before, add_special_tokens=False).ids
    tail = tokenizer.encode(after, add_special_tokens=False).ids
    return head + [ids.image] * image_tokens + tail


def rope_positions(ids: Sequence[int], image_token: int, grid: tuple[int, int, int], merge: int) -> np.ndarray:
    """``[3, len(ids)]`` M-RoPE positions of a sequence with one image run, as Qwen3.5's ``get_rope_index``.

    Text counts up on all three axes; the image's tokens take (t, row, column) offsets from the
    position where it starts; text after it resumes at that start + max(rows, columns).
    """
    ids = np.asarray(ids)
    where = np.flatnonzero(ids == image_token)
    positions = np.broadcast_to(np.arange(len(ids), dtype=np.int64), (3, len(ids))).copy()
    if len(where):
        start, count = int(where[0]), len(where)
        t, rows, cols = grid[0], grid[1] // merge, grid[2] // merge
        tt, hh, ww = np.meshgrid(np.arange(t), np.arange(rows), np.arange(cols), indexing="ij")
        positions[:, start : start + count] = np.stack([tt.ravel(), hh.ravel(), ww.ravel()]) + start
        after = start + max(rows, cols)
        positions[:, start + count :] = np.arange(after, after + len(ids) - start - count)
    return positions


def _spans(ids: list[int], token_ids: TokenIds) -> tuple[list[int], list[int]]:
    opens = [i for i, t in enumerate(ids) if t == token_ids.option_open]
    closes = [i for i, t in enumerate(ids) if t == token_ids.option_close]
    ordered = (
        bool(opens)
        and len(opens) == len(closes)
        and all(o < c for o, c in zip(opens, closes, strict=True))
        and all(c < o for c, o in zip(closes, opens[1:], strict=False))
    )
    if not ordered:
        raise ContractError(422, "every option needs one opening and one closing marker, in order")
    if opens[0] < 2:
        raise ContractError(422, "options must follow the prompt")
    return opens, closes


def _rows(ids: list[int], prefix: int, opens: list[int], closes: list[int]) -> tuple[Row, ...]:
    head = ids[prefix : opens[0]]
    rows = []
    for o, c in zip(opens, closes, strict=True):
        tokens = head + ids[o : c + 1]
        last = len(tokens) - 1
        inner = range(len(head) + 1, last)
        rows.append(
            Row(
                tokens=np.asarray(tokens, np.int64),
                zq=len(head) - 1,
                u=last,
                targets=tuple((t - 1, tokens[t]) for t in inner),
                first=tokens[inner[0]] if inner else None,
            )
        )
    return tuple(rows)


def plan_layout(
    questions: Sequence[Question],
    tokenizer: Tokenizer,
    image_tokens: int,
    grid: tuple[int, int, int],
    merge: int,
    token_ids: TokenIds,
) -> Layout:
    """Tokenize every question, split off the shared prefix and check the token limits (422)."""
    sequences = []
    for question in questions:
        ids = tokenize(tokenizer, question, image_tokens, token_ids)
        if len(ids) > MAX_SEQUENCE:
            raise ContractError(422, f"question {question.id}: {len(ids)} tokens exceeds {MAX_SEQUENCE}")
        sequences.append(ids)
    shortest = min(len(ids) for ids in sequences)
    prefix = 0
    while prefix < shortest and all(ids[prefix] == sequences[0][prefix] for ids in sequences):
        prefix += 1
    spans = [_spans(ids, token_ids) for ids in sequences]
    prefix = max(1, min([prefix] + [opens[0] - 1 for opens, _ in spans]))
    rows = tuple(_rows(ids, prefix, *span) for ids, span in zip(sequences, spans, strict=True))
    positions = rope_positions(sequences[0], token_ids.image, grid, merge)[:, :prefix]
    layout = Layout(
        prefix=np.asarray(sequences[0][:prefix], np.int64),
        positions=positions,
        image_index=np.flatnonzero(np.asarray(sequences[0][:prefix]) == token_ids.image),
        next_position=int(positions.max()) + 1,
        rows=rows,
    )
    if layout.input_tokens > MAX_PROCESSED:
        raise ContractError(422, f"request needs {layout.input_tokens} tokens, above {MAX_PROCESSED}")
    # Score's ordinal head reads no log-probabilities.
    targets = sum(
        len(row.targets) + (row.first is not None)
        for question, question_rows in zip(questions, rows, strict=True)
        if question.kind != Kind.SCORE
        for row in question_rows
    )
    if targets > MAX_TARGETS:
        raise ContractError(422, f"request reads {targets} option-text tokens, above {MAX_TARGETS}")
    return layout
