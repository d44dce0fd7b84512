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
from collections.abc import Callable, Sequence
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
# Each pattern is one group, the whole match, for ``_spans`` to read the matches from ``split``.
# Case-insensitive as a whole, so the CJK class also takes characters whose case partner is in it.
_WORD_RE = re.compile(
    rf"({_URL_PREFIX}{_URL_CHAR}+?(?=[{_URL_FOLLOWERS}]*(?!{_URL_CHAR}))"
    r"|[a-z0-9._%+-]+@[a-z0-9.-]+\.[a-z]{2,}"
    r"|@[a-z0-9_]+"
    rf"|[{_CJK}]"
    rf"|[^\W{_CJK}]+(?:[-_][^\W{_CJK}]+)*"
    r"|\S)",
    re.IGNORECASE,
)
# Units are matched case-sensitively (an upper-case "HTTP://" is not a URL unit), as upstream.
_UNIT_CHAR = rf"[^\s{re.escape('])}>「」『』')}\"'\u201c\u201d{_CJK}]"
_UNIT_RE = re.compile(
    rf"({_URL_PREFIX}{_UNIT_CHAR}+?(?=[.,;:!?]*(?!{_UNIT_CHAR}))"
    rf"|(?:[^\W_{_CJK}]|[@._+-])+"
    r"|\S)"
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


def _spans(pattern: re.Pattern[str], text: str) -> npt.NDArray[np.int64]:
    """Code-point ``[start, end)`` of each match of ``pattern`` in ``text`` (int64 [N, 2]), as ``finditer``
    finds them.

    The pattern's one group is the whole match, so ``split`` lists the text each match skipped and the
    match in turn, and the running lengths of the pieces are the bounds: the C engine walks the text
    without a match object, a Python step, per match.
    """
    pieces = pattern.split(text)
    bounds = np.cumsum(np.fromiter(map(len, pieces), np.int64, len(pieces)))
    return bounds[:-1].reshape(-1, 2)


def words_of(text: str, token_offsets: npt.NDArray[np.int32]) -> Words:
    """The words of ``text`` with their first covering token; words no token covers are dropped.

    ``token_offsets`` are the tokenizer's code-point offsets, which byte-level BPE may repeat or
    overlap; tokens with ``end <= start`` never count.
    """
    spans = _spans(_WORD_RE, text)
    tokens = np.asarray(token_offsets, np.int64).reshape(-1, 2)
    ends = np.where(tokens[:, 1] > tokens[:, 0], tokens[:, 1], -1)
    # The running end is sorted, so one search finds the first token ending past each word start;
    # that token always has a non-empty range (only such tokens raise the running end).
    first = np.searchsorted(np.maximum.accumulate(ends), spans[:, 0], side="right")
    kept = first < len(tokens)
    kept[kept] = tokens[first[kept], 0] < spans[kept, 1]
    return Words(spans[kept].astype(np.int32), first[kept].astype(np.int64))


def _visible_starts(text: str, offsets: npt.NDArray[np.integer]) -> npt.NDArray[np.int64]:
    """Each word's start moved past leading whitespace (not past its end or the text's)."""
    starts = offsets[:, 0].astype(np.int64)
    ends = np.minimum(offsets[:, 1], len(text))
    inside = np.flatnonzero(starts < ends)
    if not len(inside):
        return starts
    # Code points of the text; only words that start with a space (U+3000 is a CJK word) walk on.
    points = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), np.uint32)
    first = points[starts[inside]]
    distinct = np.unique(first)
    spaces = distinct[[chr(point).isspace() for point in distinct.tolist()]]
    for word in inside[np.isin(first, spaces)].tolist():
        start, end = int(starts[word]), int(ends[word])
        while start < end and text[start].isspace():
            start += 1
        starts[word] = start
    return starts


def word_units(text: str, offsets: npt.NDArray[np.integer]) -> npt.NDArray[np.int64]:
    """The unit holding each word's first non-space character, or -1 when there is none: what ``decode_spans``
    settles labels by, a function of the text and its words alone."""
    bounds = _spans(_UNIT_RE, text)
    first = _visible_starts(text, offsets)
    unit = np.searchsorted(bounds[:, 0], first, side="right") - 1
    inside = (unit >= 0) & (first < offsets[:, 1]) & (first < len(text))
    inside[inside] = first[inside] < bounds[unit[inside], 1]
    return np.where(inside, unit, -1)


def _runs(values: npt.NDArray[np.int64]) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """``begin`` and ``stop`` (exclusive) of each maximal run of equal values."""
    cuts = np.flatnonzero(values[1:] != values[:-1]) + 1
    return np.concatenate(([0], cuts)), np.concatenate((cuts, [len(values)]))


def _fill(values: npt.NDArray[np.int64], low: npt.NDArray[np.int64], high: npt.NDArray[np.int64], fill: npt.NDArray[np.int64]) -> None:
    """``values[low[i] : high[i] + 1] = fill[i]`` for disjoint ranges, at once."""
    lengths = high - low + 1
    offsets = np.arange(lengths.sum()) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    values[np.repeat(low, lengths) + offsets] = np.repeat(fill, lengths)


def _settle(label: npt.NDArray[np.int64], best: npt.NDArray[np.float32], units: npt.NDArray[np.int64], labels: int) -> None:
    """Give the labelled words of each unit run a single label and fill the gaps between them.

    The label is the one whose probabilities sum highest over the run (float64, summed in word
    order), the first to appear among equal sums; every word from the run's first labelled word to
    its last takes it.
    """
    begins, stops = _runs(units)
    run = np.repeat(np.arange(len(begins)), stops - begins)
    words = np.flatnonzero((label >= 0) & (units >= 0))
    if not len(words):
        return
    keys = run[words] * labels + label[words]
    # ``first``: where each (run, label) first appears; bincount adds in input order, as a loop would.
    pairs, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
    sums = np.bincount(inverse, weights=best[words].astype(np.float64))
    pair_run = pairs // labels
    order = np.lexsort((first, -sums, pair_run))
    winners = order[np.concatenate(([True], pair_run[order][1:] != pair_run[order][:-1]))]
    _, low = np.unique(run[words], return_index=True)
    high = np.concatenate((low[1:], [len(words)])) - 1
    _fill(label, words[low], words[high], pairs[winners] % labels)


def _means(probs: npt.NDArray[np.float32], begins: npt.NDArray[np.int64], stops: npt.NDArray[np.int64], values: npt.NDArray[np.int64]) -> npt.NDArray[np.float32]:
    """The float32 mean of ``probs[begin:stop, value]`` per span, as numpy averages a contiguous copy
    of it (the packages' gather): spans of one length are averaged as the rows of one array, which
    numpy sums row by row with the same pairwise order as each row alone."""
    lengths = stops - begins
    means = np.empty(len(begins), np.float32)
    for length in np.unique(lengths).tolist():
        which = np.flatnonzero(lengths == length)
        rows = begins[which, None] + np.arange(length)
        means[which] = probs[rows, values[which, None]].mean(axis=1)
    return means


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
    units: Callable[[], npt.NDArray[np.int64]] | None = None,
    limit: int | None = None,
) -> list[dict[str, str | int | float]]:
    """Labelled spans from word x label probabilities (the first ``limit`` of them, where given).

    Each word takes its most probable label when that probability is strictly above ``threshold``,
    both in float32 as the packages compare. Within one unit, disagreeing labels are settled by
    summed probability and unlabelled words between labelled ones are filled; runs of words with
    the same label become spans, trimmed, with the float32 mean probability of their words. ``units``
    gives ``word_units(text, word_offsets)`` where a caller decoding one text twice keeps it (called only
    when some word is labelled). ``limit`` serves a caller that only counts spans up to a bound (the PII
    sparse gate): the trimming, a Python step per span, stops there, and each span is the one a whole
    decode gives (a span's mean does not depend on the others averaged beside it).
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
    _settle(label, best, word_units(text, offsets) if units is None else units(), probs.shape[1])
    begins, stops = _runs(label)
    kept = label[begins] >= 0
    begins, stops = begins[kept], stops[kept]
    runs: list[int] = []
    bounds: list[tuple[int, int]] = []
    edges = zip(offsets[begins, 0].tolist(), offsets[stops - 1, 1].tolist(), strict=True)
    for run, (first, last) in enumerate(edges):
        start, end = trim(text, first, last)
        if end > start:
            runs.append(run)
            bounds.append((start, end))
            if len(runs) == limit:
                break
    kept_runs = np.asarray(runs, np.int64)
    values = label[begins[kept_runs]]
    means = _means(probs, begins[kept_runs], stops[kept_runs], values).tolist()
    return [
        {"label": labels[value], "start": start, "end": end, "probability": mean}
        for value, (start, end), mean in zip(values.tolist(), bounds, means, strict=True)
    ]
