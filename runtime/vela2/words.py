"""Vela 2.0 span words, voting units and the span decoder.

A span head gives one probability row per *word*: URLs, e-mail addresses and @handles stay whole,
every CJK character stands alone, and each word is read at the first sub-word token that covers it.
Decoding labels words above the threshold, settles each coarser *unit* (an e-mail-like or URL run)
on one label, joins neighbouring words that share a label and trims brackets, quotes and URL tails.
Parity with the packages depends on every quirk kept here: the odd CJK range, which patterns ignore
case, float32 comparisons and means, float64 vote sums
(vllm-project/semantic-router:src/model-runtime/vllm_srun/families/vela2/words.py).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

# The packages' CJK class. "\u8c48-\ufaff" is a U+F900 that NFC turned into U+8C48 upstream; the
# range it became (Hangul, private use, everything up to U+FAFF) is what the models were scored with.
_CJK = (
    "\u2e80-\u2fff\u3000-\u303f\u3040-\u30ff\u3100-\u31ff\u3400-\u4dbf\u4e00-\u9fff"
    "\ua000-\ua4cf\uac00-\ud7af\u8c48-\ufaff\ufe30-\ufe4f\uff00-\uffef"
)
_URL_PREFIX = r"(?:https?://|www\.)"
# Punctuation and closers a URL word may be followed by without owning them.
_URL_FOLLOWERS = re.escape(".,;:!?)]}>\"'\u201d\u2019\u00bb")
_URL_CHAR = rf"[^\s{_CJK}]"
# Case-insensitive as a whole, so the CJK class also takes characters whose case partner is in it.
_WORD_RE = re.compile(
    rf"{_URL_PREFIX}{_URL_CHAR}+?(?=[{_URL_FOLLOWERS}]*(?!{_URL_CHAR}))"
    r"|[a-z0-9._%+-]+@[a-z0-9.-]+\.[a-z]{2,}"
    r"|@[a-z0-9_]+"
    rf"|[{_CJK}]"
    rf"|[^\W{_CJK}]+(?:[-_][^\W{_CJK}]+)*"
    r"|\S",
    re.IGNORECASE,
)
# Units are matched case-sensitively (an upper-case "HTTP://" is not a URL unit), as upstream.
_UNIT_CHAR = rf"[^\s{re.escape('])}>「」『』')}\"'\u201c\u201d{_CJK}]"
_UNIT_RE = re.compile(
    rf"{_URL_PREFIX}{_UNIT_CHAR}+?(?=[.,;:!?]*(?!{_UNIT_CHAR}))"
    rf"|(?:[^\W_{_CJK}]|[@._+-])+"
    r"|\S"
)
_URL_START_RE = re.compile(_URL_PREFIX, re.IGNORECASE)
_CJK_RE = re.compile(f"[{_CJK}]")
# Brackets and quotes: 「」『』【】《》〈〉 “” ‘’ «» ‹›.
_EDGE = frozenset(
    "[](){}<>\"'"
    "\u300c\u300d\u300e\u300f\u3010\u3011\u300a\u300b\u3008\u3009"
    "\u201c\u201d\u2018\u2019\u00ab\u00bb\u2039\u203a"
)
_URL_TAIL = frozenset(".,;:!?)")


@dataclass(frozen=True)
class Words:
    """The kept words of one part: code-point ``[start, end)`` offsets (int32 [W, 2]) and the
    part-relative index of each word's first sub-word token (int64 [W])."""

    offsets: npt.NDArray[np.int32]
    first: npt.NDArray[np.int64]

    def __len__(self) -> int:
        return len(self.first)


def words_of(text: str, token_offsets: npt.NDArray[np.int32]) -> Words:
    """The words of ``text`` with their first covering token; words no token covers are dropped.

    ``token_offsets`` are the tokenizer's code-point offsets, which byte-level BPE may repeat or
    overlap; tokens with ``end <= start`` never count.
    """
    spans = np.asarray([m.span() for m in _WORD_RE.finditer(text)], np.int64).reshape(-1, 2)
    tokens = np.asarray(token_offsets, np.int64).reshape(-1, 2)
    ends = np.where(tokens[:, 1] > tokens[:, 0], tokens[:, 1], -1)
    # The running end is sorted, so one search finds the first token ending past each word start;
    # that token always has a non-empty range (only such tokens raise the running end).
    first = np.searchsorted(np.maximum.accumulate(ends), spans[:, 0], side="right")
    kept = first < len(tokens)
    kept[kept] = tokens[first[kept], 0] < spans[kept, 1]
    return Words(spans[kept].astype(np.int32), first[kept].astype(np.int64))


def _unit_ids(text: str, offsets: npt.NDArray[np.integer]) -> npt.NDArray[np.int64]:
    """The unit holding each word's first non-space character, or -1 when there is none."""
    bounds = np.asarray([m.span() for m in _UNIT_RE.finditer(text)], np.int64).reshape(-1, 2)
    visible: list[int] = []
    for start, end in offsets.tolist():
        while start < end and start < len(text) and text[start].isspace():
            start += 1
        visible.append(start)
    first = np.asarray(visible, np.int64)
    unit = np.searchsorted(bounds[:, 0], first, side="right") - 1
    inside = (unit >= 0) & (first < offsets[:, 1]) & (first < len(text))
    inside[inside] = first[inside] < bounds[unit[inside], 1]
    return np.where(inside, unit, -1)


def _runs(values: npt.NDArray[np.int64]) -> list[tuple[int, int]]:
    """``[begin, stop)`` of each maximal run of equal values."""
    cuts = [0, *(np.flatnonzero(values[1:] != values[:-1]) + 1).tolist(), len(values)]
    return list(zip(cuts[:-1], cuts[1:], strict=True))


def _settle(label: npt.NDArray[np.int64], best: npt.NDArray[np.float32], begin: int, stop: int) -> None:
    """Give the labelled words of one unit run a single label and fill the gaps between them."""
    members = [w for w in range(begin, stop) if label[w] >= 0]
    if not members:
        return
    votes: dict[int, float] = {}
    for w in members:
        votes[int(label[w])] = votes.get(int(label[w]), 0.0) + float(best[w])
    if len(votes) > 1:
        # max() keeps the first of equal sums, i.e. the label that appeared first.
        label[members] = max(votes, key=votes.__getitem__)
    low, high = members[0], members[-1]
    gap = label[low + 1 : high]
    gap[gap < 0] = label[low]


def trim(text: str, start: int, end: int) -> tuple[int, int]:
    """Narrow ``[start, end)`` past edge whitespace, brackets and quotes; a URL also loses any CJK
    tail and trailing ``.,;:!?)``."""
    while start < end and (text[start].isspace() or text[start] in _EDGE):
        start += 1
    while end > start and (text[end - 1].isspace() or text[end - 1] in _EDGE):
        end -= 1
    # Upstream tests the prefix against the text from ``start`` on, not bounded by ``end``.
    if _URL_START_RE.match(text, start):
        cjk = _CJK_RE.search(text, start, end)
        if cjk:
            end = cjk.start()
        while end > start and (
            text[end - 1].isspace() or text[end - 1] in _EDGE or text[end - 1] in _URL_TAIL
        ):
            end -= 1
    return start, end


def decode_spans(
    probabilities: npt.NDArray[np.float64],
    word_offsets: npt.NDArray[np.integer],
    labels: Sequence[str],
    text: str,
    threshold: float,
) -> list[dict[str, str | int | float]]:
    """Labelled spans from word x label probabilities.

    Each word takes its most probable label when that probability is strictly above ``threshold``,
    both in float32 as the packages compare. Within one unit, disagreeing labels are settled by
    summed probability and unlabelled words between labelled ones are filled; runs of words with
    the same label become spans, trimmed, with the float32 mean probability of their words.
    """
    probs = np.asarray(probabilities, np.float32)
    offsets = np.asarray(word_offsets)
    if len(offsets) == 0:
        return []
    best_label = probs.argmax(axis=1)
    best = probs[np.arange(len(offsets)), best_label]
    label = np.where(best > np.float32(threshold), best_label, -1).astype(np.int64)
    if not (label >= 0).any():
        return []
    units = _unit_ids(text, offsets)
    for begin, stop in _runs(units):
        if units[begin] >= 0:
            _settle(label, best, begin, stop)
    spans: list[dict[str, str | int | float]] = []
    for begin, stop in _runs(label):
        value = int(label[begin])
        if value < 0:
            continue
        start, end = trim(text, int(offsets[begin, 0]), int(offsets[stop - 1, 1]))
        if end <= start:
            continue
        # Averaged from a contiguous copy, as the packages gather it, so float32 sums round alike.
        column = np.ascontiguousarray(probs[begin:stop, value])
        spans.append(
            {"label": labels[value], "start": start, "end": end, "probability": float(column.mean())}
        )
    return spans
