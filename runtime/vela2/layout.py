"""The decoder layout: the parts once as a prefix, then one block per question (a tree).

Prefix: ``Context:\\n`` and per part ``<segment role="R">\\n`` TEXT ``\\n</segment>\\n``. A Choice, Noul,
Score or Set block is a head, one canonical-JSON option block per option (abstain last for Choice
and Noul) and a suffix; it is read at each option's last token against its last token. A Span
block lists its labels the same way and repeats a target of at most 2,048 tokens, whose words it
reads; a longer target is read in windows of at most 1,800 tokens (stride 1,536, at word starts),
each its own tree, and its span block stays in the row's tree, run but unread (§2.6). Every piece is tokenized on its own and the ids are concatenated. Rows that do
not fit are truncated in the packages' order
(vllm-project/semantic-router:src/model-runtime/vllm_srun/families/vela2/{decoder_layout,layout}.py;
vela2-decoder.md §2, §4).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np

from ..digest import canonical_json
from ..runners.base import Block, Prefix, Tree
from .dispatch import Dispatcher, Route
from .request import Question, ReadRequest
from .words import Words, words_of

SUFFIX = {
    "choice": "\n\nSelect the single option best supported by the context and instructions.\nDecision:",
    "score": "\n\nSelect the single option best supported by the context and instructions.\nDecision:",
    "set": "\n\nSelect every option supported by the context and instructions.\nDecision:",
    "span": "\n\nMark every span of the target text that carries one of the labels.\nSpans:",
}
ABSTAIN = ("[ABS]", "None of the shown options applies.")
PARTS_HEAD = "Context:\n"
SEGMENT_CLOSE = "\n</segment>\n"
TEXT_HEAD = "\n\nText:\n"
PROMPT_FLOOR = 64
TOKEN_CACHE = 8192


def segment_open(role: str) -> str:
    return f'<segment role="{role}">\n'


# Cached: a request's options are rendered afresh for each plan, and a client's requests repeat them (the router
# request's 50 option blocks took a seventh of its plan in canonical JSON).
@lru_cache(maxsize=TOKEN_CACHE)
def option_block(key: str, description: str, tag: str = "option") -> str:
    return f"\n<{tag}>\n" + canonical_json({"key": key, "description": description}) + f"\n</{tag}>"


def question_head(engine_type: str, over: str | tuple[str, ...], text: str, span: bool = False) -> str:
    target = ", ".join(over) if isinstance(over, tuple) else over
    return f"\n\nTask type: {engine_type}\nTarget: {target}\nQuestion:\n{text}\n" + ("Labels:" if span else "Options:")


class SchemaTooLong(ValueError):
    """A row's questions alone do not fit the member's input (``max_length_exceeded``)."""


class Tokens:
    """Tokenization without special tokens; short layout strings are cached."""

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        self._cached: Callable[[str], tuple[int, ...]] = lru_cache(maxsize=TOKEN_CACHE)(
            lambda text: tuple(tokenizer.encode(text, add_special_tokens=False).ids)
        )

    def ids(self, text: str) -> list[int]:
        return list(self._cached(text))

    def part(self, role: str, text: str, with_words: bool) -> EncodedPart:
        # encode_batch lets go of the GIL while it tokenizes, encode holds it: a request's texts (600 tokens
        # of the router request: 1.6 ms) no longer stop a server's head and finish threads. Same encoding.
        encoding = self.tokenizer.encode_batch([text], add_special_tokens=False)[0]
        ids = np.asarray(encoding.ids, np.int64)
        if not with_words:
            return EncodedPart(role, ids)
        offsets = np.asarray(encoding.offsets, np.int32).reshape(-1, 2)
        return EncodedPart(role, ids, offsets, words_of(text, offsets))


@dataclass(frozen=True)
class EncodedPart:
    """A part's ids; offsets and words only where a span question reads it. ``whole`` is the whole
    part's token count where ``ids`` are only its first tokens (``cut``)."""

    role: str
    ids: np.ndarray
    offsets: np.ndarray | None = None
    words: Words | None = None
    whole: int | None = None

    @property
    def length(self) -> int:
        """Tokens of the whole part (the PII length rule reads them), cut or not."""
        return len(self.ids) if self.whole is None else self.whole

    def window(self, start: int, end: int) -> EncodedPart:
        """Tokens ``[start, end)``, with the words whose first token lies inside, re-based."""
        assert self.words is not None and self.offsets is not None
        words, _ = window_words(self.words, start, end)
        return EncodedPart(self.role, self.ids[start:end], self.offsets[start:end], words)

    def cut(self, length: int) -> EncodedPart:
        """The part's first ``length`` tokens, with the words they start (``overflow: truncate``)."""
        if len(self.ids) <= length:
            return self
        if self.words is None or self.offsets is None:
            return EncodedPart(self.role, self.ids[:length], whole=self.length)
        words, _ = window_words(self.words, 0, length)
        return EncodedPart(self.role, self.ids[:length], self.offsets[:length], words, self.length)


@dataclass
class Row:
    """The questions of one tree and the parts they read."""

    questions: list[Question]
    parts: list[EncodedPart]

    @property
    def span(self) -> Question | None:
        return next((q for q in self.questions if q.type == "span"), None)

    @property
    def roles(self) -> list[str]:
        return [part.role for part in self.parts]

    def part(self, role: str) -> EncodedPart:
        return next(part for part in self.parts if part.role == role)

    def read_roles(self) -> set[str]:
        return {role for question in self.questions for role in question.roles}

    def shrink_role(self) -> str | None:
        read = self.read_roles()
        return next((role for role in self.roles if role not in read), None)

    @property
    def requires_full_input(self) -> bool:
        return any(question.require_full_input for question in self.questions)


def fit(
    question_costs: list[int],
    label_costs: list[int],
    parts: list[tuple[str, int]],
    available: int,
    protected: set[str],
    shrink: str | None,
) -> dict[str, int]:
    """Kept tokens per part under the packages' truncation order (their token accounting, §4.1)."""
    schema = sum(question_costs) + sum(label_costs)
    lengths = dict(parts)
    fixed = 2 + 1 + len(parts)

    def over() -> int:
        return fixed + schema + sum(lengths.values()) - available

    if shrink is not None:
        if over() > 0:
            lengths[shrink] = max(min(lengths[shrink], PROMPT_FLOOR), lengths[shrink] - over())
        if over() > 0:
            lengths[shrink] = max(1, lengths[shrink] - over())
    for role, _ in parts:
        if role in protected and over() > 0:
            lengths[role] = max(1, lengths[role] - over())
    if over() > 0:
        raise SchemaTooLong(f"the questions alone exceed the input by {over()} tokens")
    return lengths


def word_windows(first: np.ndarray, length: int, window: int, stride: int) -> list[tuple[int, int]]:
    """Token windows ``[a, b)`` that start at word starts and never split a word (§4.3)."""
    starts = sorted({int(x) for x in first})
    if not starts:
        return [(0, length)]
    out, start = [], starts[0]
    while True:
        limit = start + window
        inside = bisect.bisect_left(starts, limit) - 1  # the last word start below limit
        if limit >= length:
            end = length
        elif inside >= 0 and starts[inside] > start:
            end = starts[inside]
        else:
            end = min(length, limit)
        out.append((start, end))
        if end >= length:
            return out
        later = bisect.bisect_left(starts, start + stride)
        start = starts[later] if later < len(starts) and starts[later] < end else end


def window_words(words: Words, start: int, end: int) -> tuple[Words, np.ndarray]:
    """The words whose first token lies in ``[start, end)``, re-based, and their indices in ``words``."""
    selected = np.nonzero((words.first >= start) & (words.first < end))[0]
    return Words(words.offsets[selected], words.first[selected] - start), selected


@dataclass
class RenderedBlock:
    """One question block. ``ends``: option endpoints (abstain last) or label ends (``starts`` their
    first tokens). ``words``: positions of the target's word starts in the block; ``word_index``
    their indices among the target part's words."""

    question: Question
    ids: list[int]
    ends: list[int]
    head: str = "router"
    starts: list[int] = field(default_factory=list)
    words: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    word_offsets: np.ndarray = field(default_factory=lambda: np.zeros((0, 2), np.int32))
    word_index: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    alias: dict[str, str] | None = None
    read: bool = True  # False for a span block that windows replace: it runs, and nothing is read

    @property
    def is_span(self) -> bool:
        return self.question.type == "span"

    def readouts(self) -> np.ndarray:
        """Positions whose hidden states the heads need: every label token then the words (span),
        or the option endpoints then the query (the block's last token); none for an unread block."""
        if not self.read:
            return np.zeros(0, np.int64)
        if self.is_span:
            labels = [np.arange(s, e + 1) for s, e in zip(self.starts, self.ends, strict=True)]
            return np.concatenate([*labels, self.words]).astype(np.int64)
        return np.asarray([*self.ends, len(self.ids) - 1], np.int64)


@dataclass
class RowTrees:
    """Where a row's questions are answered; ``tokens`` counts the row as rendered (for usage)."""

    row: Row
    tokens: int
    blocks: list[RenderedBlock] = field(default_factory=list)
    span: RenderedBlock | None = None
    windows: list[RenderedBlock] = field(default_factory=list)
    trees: list[tuple[Prefix, list[RenderedBlock]]] = field(default_factory=list)


class DecoderLayout:
    """Renders a request's rows into trees for one package's config and span dispatch."""

    def __init__(self, config: dict[str, Any], dispatcher: Dispatcher, tokens: Tokens):
        spans = config.get("span_layout") or {}
        self.max_length = int(config["max_length"])
        self.repeat_limit = int(spans.get("hybrid_rmax", 2048))
        self.window = int(spans.get("window", 1800))
        self.stride = int(spans.get("stride", 1536))
        self.dispatcher = dispatcher
        self.tokens = tokens

    def encode(self, request: ReadRequest, questions: list[Question]) -> list[EncodedPart]:
        """Every part once; offsets and words only for parts a span question reads."""
        span_roles = {q.over for q in questions if q.type == "span"}
        return [self.tokens.part(p.role, p.text, p.role in span_roles) for p in request.state.parts]

    @staticmethod
    def rows(questions: list[Question], parts: list[EncodedPart]) -> list[Row]:
        """Row 1: every non-span question plus the first span; each further span gets its own row."""
        spans = [q for q in questions if q.type == "span"]
        rest = [q for q in questions if q.type != "span"]
        groups = [rest + spans[:1]] + [[span] for span in spans[1:]]
        return [Row(group, parts) for group in groups if group]

    def trees(self, row: Row) -> RowTrees:
        """The row's trees; ``SchemaTooLong`` when its questions do not fit."""
        span = row.span
        route = self.dispatcher.route(span) if span is not None else None
        questions = [route.question if q is span and route else q for q in row.questions]
        prefix, blocks, span_block, rendered = self._render(row, questions, route)
        plan = RowTrees(row, rendered, blocks=[b for b in blocks if not b.is_span], span=span_block)
        target = row.part(span.over) if span is not None else None  # type: ignore[arg-type]
        if target is None or len(target.ids) <= self.repeat_limit:
            plan.trees.append((prefix, blocks))
            return plan
        assert route is not None and target.words is not None and span_block is not None
        # The span block that windows replace stays in the row's tree and runs unread, as the
        # packages render it (§2.6): the row's trees, and so the batches and their widths, match.
        span_block.read = False
        plan.trees.append((prefix, [*plan.blocks, span_block]))
        position = row.parts.index(target)
        windows = word_windows(target.words.first, len(target.ids), self.window, self.stride)
        covered = np.zeros(len(target.words), bool)
        for start, end in windows:
            parts = list(row.parts)
            parts[position] = target.window(start, end)
            window_prefix, window_blocks, window_span, window_tokens = self._render(
                Row([route.question], parts), [route.question], route
            )
            assert window_span is not None
            window_span.word_index = window_words(target.words, start, end)[1][: len(window_span.words)]
            covered[window_span.word_index] = True
            plan.windows.append(window_span)
            plan.tokens += window_tokens
            plan.trees.append((window_prefix, window_blocks))
        if row.requires_full_input and not covered.all():
            raise SchemaTooLong("the windows do not cover every word of the full input")
        return plan

    def _render(
        self, row: Row, questions: list[Question], route: Route | None
    ) -> tuple[Prefix, list[RenderedBlock], RenderedBlock | None, int]:
        """One tree: the prefix, the blocks to run, the span block, and the rendered token count."""
        ids = self.tokens.ids
        compiled = []
        span_question: Question | None = None
        labels: list[list[int]] = []
        for question in questions:
            if question.type == "span":
                span_question = question
                labels = [ids(option_block(n, d, "label")) for n, d in question.options]
                continue
            options = [ids(option_block(n, d)) for n, d in question.options]
            head = ids(question_head(question.type, question.over, question.text))
            suffix = ids(SUFFIX[question.type])
            abstain = ids(option_block(*ABSTAIN)) if question.abstain else []
            cost = 1 + len(head) + len(suffix) + len(abstain) + sum(1 + len(o) for o in options) + int(question.abstain)
            compiled.append((question, head, options, abstain, suffix, cost))
        overhead = len(ids(PARTS_HEAD)) + sum(len(ids(segment_open(r))) + len(ids(SEGMENT_CLOSE)) for r in row.roles)
        repeat = False
        if span_question is not None:
            span_head = ids(question_head("span", span_question.over, span_question.text, True))
            span_suffix = ids(SUFFIX["span"])
            overhead += len(span_head) + len(span_suffix)
            span_role: str = span_question.over  # type: ignore[assignment]
            target = len(row.part(span_role).ids)
            repeat = target <= self.repeat_limit
            if repeat:
                overhead += len(ids(TEXT_HEAD)) + len(ids(segment_open(span_role))) + len(ids(SEGMENT_CLOSE))
                overhead += min(target, max(0, self.max_length - overhead) // 2)
        lengths = fit(
            [entry[-1] for entry in compiled],
            [1 + len(label) for label in labels],
            [(part.role, len(part.ids)) for part in row.parts],
            max(PROMPT_FLOOR, self.max_length - overhead),
            row.read_roles(),
            row.shrink_role(),
        )
        if row.requires_full_input:
            # Only a span row's own windows may stand in for its clipped target part.
            all_spans = all(q.type == "span" for q in row.questions)
            windowed = span_question.over if span_question is not None and not repeat and all_spans else None
            if any(part.role != windowed and lengths[part.role] < len(part.ids) for part in row.parts):
                raise SchemaTooLong("the full input was clipped to fit the questions")
        prefix = list(ids(PARTS_HEAD))
        for part in row.parts:
            prefix += ids(segment_open(part.role)) + part.ids[: lengths[part.role]].tolist() + ids(SEGMENT_CLOSE)
        blocks = []
        for question, head, options, abstain, suffix, _ in compiled:
            block_ids, ends = list(head), []
            for option in options + ([abstain] if question.abstain else []):
                block_ids += option
                ends.append(len(block_ids) - 1)
            blocks.append(RenderedBlock(question, block_ids + suffix, ends))
        rendered = len(prefix) + sum(len(block.ids) for block in blocks)
        tree_prefix = Prefix(np.asarray(prefix, np.int64))
        if span_question is None:
            return tree_prefix, blocks, None, rendered
        assert route is not None
        block_ids, starts, ends = list(span_head), [], []
        for label in labels:
            starts.append(len(block_ids))
            block_ids += label
            ends.append(len(block_ids) - 1)
        part = row.part(span_role)
        assert part.words is not None
        kept = lengths[span_role]
        keep = part.words.first < kept
        words = np.zeros(0, np.int64)
        if repeat:
            block_ids += ids(TEXT_HEAD) + ids(segment_open(span_role))
            words = (len(block_ids) + part.words.first[keep]).astype(np.int64)
            block_ids += part.ids[:kept].tolist() + ids(SEGMENT_CLOSE)
        span_block = RenderedBlock(
            span_question,
            block_ids + span_suffix,
            ends,
            head=route.head,
            starts=starts,
            words=words,
            word_offsets=part.words.offsets[keep],
            word_index=np.nonzero(keep)[0],
            alias=route.alias,
        )
        if repeat:
            blocks.append(span_block)
        return tree_prefix, blocks, span_block, rendered + len(span_block.ids)


def runner_tree(prefix: Prefix, blocks: list[RenderedBlock]) -> Tree:
    return Tree(prefix, tuple(Block(np.asarray(b.ids, np.int64), b.readouts()) for b in blocks))
