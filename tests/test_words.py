"""Vela 2.0 word units, units and span decoding (runtime/vela2/words.py).

Expected values are worked out by hand from the rules in vela2-decoder.md §5. Probabilities are
mostly dyadic (0.25, 0.375, 0.75, ...) so float32 sums are exact and a mean is one rounding.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from tokenizers import Tokenizer

from s1omni.runtime.synth.tokenizer import train_tokenizer
from s1omni.runtime.vela2.words import _UNIT_RE, _WORD_RE, Words, decode_spans, trim, word_units, words_of


def split(text: str) -> list[tuple[int, int]]:
    """Every word of ``text``: one token spanning the whole text covers them all."""
    words = words_of(text, np.array([[0, len(text)]], np.int32))
    return [(int(a), int(b)) for a, b in words.offsets]


def pieces(text: str) -> list[str]:
    return [text[a:b] for a, b in split(text)]


def chars(text: str) -> np.ndarray:
    """One word per code point."""
    return np.array([(i, i + 1) for i in range(len(text))], np.int32)


def decode(rows: list[list[float]], offsets, text: str, threshold: float = 0.5, labels=("X",)):
    probabilities = np.array(rows, np.float64)
    return decode_spans(probabilities, np.array(offsets, np.int32), list(labels), text, threshold)


def span(label: str, start: int, end: int, probability: float) -> dict:
    return {"label": label, "start": start, "end": end, "probability": probability}


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer.from_str(train_tokenizer(2048))


# --- the basic case and the answer shape --------------------------------------------------------


def test_alice_met_bob():
    text = "Alice met Bob"
    assert split(text) == [(0, 5), (6, 9), (10, 13)]
    spans = decode([[0.9], [0.1], [0.9]], split(text), text, labels=["person"])
    f32_09 = float(np.float32(0.9))
    assert spans == [span("person", 0, 5, f32_09), span("person", 10, 13, f32_09)]
    assert all(list(s) == ["label", "start", "end", "probability"] for s in spans)
    assert all(type(s["probability"]) is float for s in spans)


def test_adjacent_words_with_different_labels_are_separate_spans():
    text = "Anna Berlin"
    spans = decode([[0.75, 0.25], [0.25, 0.875]], split(text), text, labels=["person", "city"])
    assert spans == [span("person", 0, 4, 0.75), span("city", 5, 11, 0.875)]


def test_no_words_or_nothing_above_threshold():
    assert decode_spans(np.zeros((0, 1)), np.zeros((0, 2), np.int32), ["X"], "", 0.5) == []
    assert decode([[0.25], [0.5]], [(0, 1), (2, 3)], "a b") == []

    def unasked() -> np.ndarray:
        raise AssertionError("units computed for a text with no labelled word")

    assert decode_spans(np.array([[0.25], [0.5]]), np.array([[0, 1], [2, 3]], np.int32), ["X"], "a b", 0.5, unasked) == []


def test_span_that_trims_to_nothing_is_dropped():
    assert decode([[0.75], [0.25]], [(0, 1), (2, 3)], "( x") == []


# --- spans end at rejected words, except inside a unit ------------------------------------------


def test_rejected_word_starts_a_new_span():
    text = "Anna Maria and Bob"
    assert split(text) == [(0, 4), (5, 10), (11, 14), (15, 18)]
    spans = decode([[0.75], [0.5], [0.25], [0.875]], split(text), text, threshold=0.4)
    assert spans == [span("X", 0, 10, 0.625), span("X", 15, 18, 0.875)]


def test_rejected_words_between_labelled_words_of_one_unit_are_filled():
    text = "jane.doe.smith"  # one unit (letters and dots), five words
    assert split(text) == [(0, 4), (4, 5), (5, 8), (8, 9), (9, 14)]
    spans = decode([[0.75], [0.25], [0.25], [0.25], [0.75]], split(text), text)
    # Filled words count in the mean: (0.75 + 3 * 0.25 + 0.75) / 5.
    assert spans == [span("X", 0, 14, float(np.float32(0.45)))]


def test_unit_edges_are_not_filled():
    text = "jane.doe.smith"
    assert decode([[0.75], [0.25], [0.25], [0.25], [0.25]], split(text), text) == [span("X", 0, 4, 0.75)]
    assert decode([[0.25], [0.25], [0.75], [0.25], [0.25]], split(text), text) == [span("X", 5, 8, 0.75)]


def test_rejected_word_between_units_is_not_filled():
    text = "jane doe smith"  # three units
    spans = decode([[0.75], [0.25], [0.75]], split(text), text)
    assert spans == [span("X", 0, 4, 0.75), span("X", 9, 14, 0.75)]


def test_words_outside_every_unit_are_left_alone():
    # The three whitespace words have unit -1; one run of them is not voted or filled, so the
    # rejected middle one still splits "a" from "b".
    text = "a   b"
    offsets = [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5)]
    spans = decode([[0.75], [0.75], [0.25], [0.75], [0.75]], offsets, text)
    assert spans == [span("X", 0, 1, 0.75), span("X", 4, 5, 0.75)]


def test_cjk_address_split_by_rejected_characters():
    text = "北京市朝阳区和上海市"
    assert split(text) == [(i, i + 1) for i in range(10)]
    rows = [[0.75]] * 6 + [[0.25]] + [[0.75]] * 3
    assert decode(rows, split(text), text, labels=["address"]) == [
        span("address", 0, 6, 0.75),
        span("address", 7, 10, 0.75),
    ]
    # Every CJK character is its own unit, so a rejected one inside the address is not filled.
    rows = [[0.75]] * 3 + [[0.25]] + [[0.75]] * 2
    assert decode(rows, split(text[:6]), text[:6], labels=["address"]) == [
        span("address", 0, 3, 0.75),
        span("address", 4, 6, 0.75),
    ]


def test_units_recognise_only_lower_case_url_prefixes():
    # A lower-case URL is one unit, so the rejected "://" between labelled words is filled...
    offsets = [(0, 4), (4, 7), (7, 10)]
    rows = [[0.75], [0.25], [0.75]]
    assert decode(rows, offsets, "http://a.b") == [
        span("X", 0, 10, float(np.float32(1.75) / np.float32(3)))
    ]
    # ...but units match case-sensitively: "HTTP", ":", "/", "/", "A.B" are separate units.
    assert decode(rows, offsets, "HTTP://A.B") == [span("X", 0, 4, 0.75), span("X", 7, 10, 0.75)]


# --- voting inside a unit ------------------------------------------------------------------------

EMAIL = "jane.doe@example.com"
EMAIL_WORDS = [(0, 4), (4, 5), (5, 8), (8, 9), (9, 16), (16, 17), (17, 20)]  # jane . doe @ example . com


def test_vote_takes_the_larger_summed_probability():
    rows = [  # [person, email]
        [0.75, 0.125],  # jane: person
        [0.25, 0.25],  # .
        [0.5625, 0.25],  # doe: person          person sums to 1.3125
        [0.25, 0.25],  # @
        [0.125, 0.875],  # example: email      email sums to 1.5
        [0.25, 0.25],  # .
        [0.25, 0.625],  # com: email
    ]
    spans = decode(rows, EMAIL_WORDS, EMAIL, labels=["person", "email"])
    # The winner's column is averaged over all seven words: 2.625 / 7.
    assert spans == [span("email", 0, 20, 0.375)]


def test_vote_is_by_sum_not_by_count():
    rows = [[0.0, 0.5625], [0.9375, 0.0], [0.0, 0.5625], [0.9375, 0.0], [0.0, 0.5625]]
    # email: 3 words, 1.6875; person: 2 words, 1.875.
    spans = decode(rows, chars("abcde"), "abcde", labels=["person", "email"])
    assert spans == [span("person", 0, 5, 0.375)]


def test_vote_tie_goes_to_the_label_seen_first():
    labels = ["person", "email"]
    third = float(np.float32(1) / np.float32(3))
    rows = [[0.0, 0.75], [0.25, 0.25], [0.75, 0.0]]
    assert decode(rows, chars("abc"), "abc", labels=labels) == [span("email", 0, 3, third)]
    assert decode(rows[::-1], chars("abc"), "abc", labels=labels) == [span("person", 0, 3, third)]


def test_vote_sums_in_float64():
    # B's words sum to 0.75 + 2**-25 in float64 but round to 0.75 (a tie A would win) in float32.
    rows = [[0.75, 0.0], [0.0, 0.375], [0.0, 0.375 + 2**-25]]
    spans = decode(rows, chars("abc"), "abc", threshold=0.25, labels=["A", "B"])
    # B's column sums to 0.75 in float32 whatever the order: mean 0.25.
    assert spans == [span("B", 0, 3, 0.25)]


# --- threshold and float32 ----------------------------------------------------------------------


def test_threshold_is_strict():
    assert decode([[0.5]], [(0, 5)], "Tokyo") == []
    above = float(np.nextafter(np.float32(0.5), np.float32(1)))
    assert decode([[above]], [(0, 5)], "Tokyo") == [span("X", 0, 5, above)]


def test_threshold_is_compared_in_float32():
    # Both sides round to float32(0.1): equal, so not selected, though float64 would say ">".
    assert decode([[0.1 + 1e-12]], [(0, 5)], "Tokyo", threshold=0.1) == []
    assert decode([[float(np.float32(0.1))]], [(0, 5)], "Tokyo", threshold=0.1 + 1e-12) == []


def test_best_label_is_chosen_in_float32():
    # 0.7 and 0.7 + 1e-12 are one float32 value: the first label wins.
    spans = decode([[0.7, 0.7 + 1e-12]], [(0, 5)], "Tokyo", labels=["A", "B"])
    assert spans == [span("A", 0, 5, float(np.float32(0.7)))]


def test_span_probability_is_a_float32_mean():
    text = "Anna Maria"
    spans = decode([[0.9], [0.8]], split(text), text)
    # float32(0.9) = 15099494 * 2**-24 and float32(0.8) = 13421773 * 2**-24; their sum rounds
    # (to even) to 14260634 * 2**-23, and half of it is 7130317 * 2**-23. In float64 it would be
    # 28521267 * 2**-25 = 0.84999999403953552.
    assert spans == [span("X", 0, 10, 7130317 / 2**23)]


def test_every_span_is_averaged_as_its_own_contiguous_column():
    """Spans of many lengths, several of each (decoded together, grouped by length): each mean is
    bitwise numpy's float32 mean of that span's column alone, pairwise summation included."""
    rng = np.random.default_rng(0)
    lengths = [1, 2, 7, 8, 9, 16, 17, 127, 128, 129, 300, 2, 9, 129, 1, 300]
    text = " ".join("w" for _ in range(sum(lengths)))
    probabilities = np.zeros((sum(lengths), 2))
    column, begin = 0, 0
    for length in lengths:  # alternate labels so each run is one span
        probabilities[begin : begin + length, column] = rng.uniform(0.5, 1.0, length)
        column, begin = 1 - column, begin + length
    spans = decode_spans(probabilities, split(text), ["A", "B"], text, 0.4)
    assert [s["end"] - s["start"] for s in spans] == [2 * n - 1 for n in lengths]
    begin = 0
    for entry, length in zip(spans, lengths, strict=True):
        values = np.ascontiguousarray(probabilities[begin : begin + length].max(1).astype(np.float32))
        assert entry["probability"] == float(values.mean())
        begin += length


def test_units_settle_each_on_their_own():
    """Three e-mail units in one text, each with its own vote: one unit's words never count in
    another's, and unlabelled words between units stay unlabelled."""
    text = f"{EMAIL} x {EMAIL} {EMAIL}"
    words = [*EMAIL_WORDS, (21, 22), *((a + 23, b + 23) for a, b in EMAIL_WORDS), *((a + 44, b + 44) for a, b in EMAIL_WORDS)]
    person, email = [0.75, 0.0], [0.0, 0.5625]
    rows = [person, [0.0, 0.0], email, [0.0, 0.0], email, [0.0, 0.0], email]  # email wins, 1.6875 > 0.75
    rows += [[0.0, 0.0]]  # x
    rows += [person, [0.0, 0.0], person, [0.0, 0.0], [0.0, 0.0], [0.0, 0.0], email]  # person wins, 1.5 > 0.5625
    rows += [[0.0, 0.0]] * 6 + [email]  # one labelled word: nothing to fill
    spans = decode(rows, words, text, labels=["person", "email"])
    assert [(s["label"], text[s["start"] : s["end"]]) for s in spans] == [
        ("email", EMAIL), ("person", EMAIL), ("email", "com")]  # fmt: skip


def test_a_word_read_from_a_space_finds_its_unit_past_the_space():
    text = "see jane.doe@example.com"
    # The first word's range starts at the space before the address; the unit is the address.
    offsets = [(3, 8), (8, 9), (9, 12), (12, 13), (13, 20), (20, 21), (21, 24)]
    rows = [[0.75], [0.0], [0.0], [0.0], [0.0], [0.0], [0.75]]
    assert [text[s["start"] : s["end"]] for s in decode(rows, offsets, text)] == ["jane.doe@example.com"]
    ideographic = "\u3000\u3000ab"  # U+3000 is a CJK word and a space: skipped for the unit
    assert decode([[0.75], [0.75]], [(0, 3), (3, 4)], ideographic) == [span("X", 2, 4, 0.75)]


# --- the decoder against a plain reference ------------------------------------------------------


def _finditer_spans(pattern: re.Pattern[str], text: str) -> list[tuple[int, int]]:
    """The spans of the module's patterns as ``finditer`` gives them, one match object per match."""
    return [match.span() for match in pattern.finditer(text)]


def _reference_units(text: str, offsets) -> list[int]:
    """word_units word by word: the unit holding the word's first non-space character, or -1."""
    owner = {p: i for i, (a, b) in enumerate(_finditer_spans(_UNIT_RE, text)) for p in range(a, b)}
    unit = []
    for start, end in offsets:
        while start < end and start < len(text) and text[start].isspace():
            start += 1
        unit.append(owner.get(start, -1) if start < end else -1)
    return unit


def _reference_decode(probabilities, offsets, labels, text, threshold):
    """decode_spans word by word and span by span: the loops the vectorised decoder replaced."""
    probs = np.asarray(probabilities, np.float32)
    if len(offsets) == 0:
        return []
    label = [int(np.argmax(row)) if row.max() > np.float32(threshold) else -1 for row in probs]
    if max(label) < 0:
        return []
    unit = _reference_units(text, offsets)
    w = 0
    while w < len(offsets):  # each run of words in one unit
        stop = w + 1
        while stop < len(offsets) and unit[stop] == unit[w]:
            stop += 1
        members = [m for m in range(w, stop) if unit[w] >= 0 and label[m] >= 0]
        if members:
            votes: dict[int, float] = {}
            for m in members:
                votes[label[m]] = votes.get(label[m], 0.0) + float(probs[m].max())
            winner = max(votes, key=votes.__getitem__)  # the first of equal sums
            for m in range(members[0], members[-1] + 1):
                label[m] = winner
        w = stop
    spans = []
    w = 0
    while w < len(offsets):  # each run of one label
        stop = w + 1
        while stop < len(offsets) and label[stop] == label[w]:
            stop += 1
        if label[w] >= 0:
            start, end = trim(text, int(offsets[w][0]), int(offsets[stop - 1][1]))
            if end > start:
                column = np.array([probs[m, label[w]] for m in range(w, stop)], np.float32)
                spans.append(span(labels[label[w]], start, end, float(column.mean())))
        w = stop
    return spans


_FRAGMENTS = [
    "Alice", "Müller", "met", "bob", "東京", "大阪市", "jane.doe@example.com", "a.b+c@x.org", "@handle",
    "https://example.org/x?y=1", "www.example.com/path.", "HTTP://EXAMPLE.COM", "(urgent)", "「引用」",
    "\u201cquoted\u201d", "[1]", "42", "3.14", "co-op", "snake_case", ",", ".", "!", "-", "'", "\u3000",
]
_SPACES = [" ", " ", " ", "  ", "\t", "\n", "\u3000", ""]


def _random_words(rng: np.random.Generator, text: str) -> list[tuple[int, int]]:
    """Word offsets as a decoder receives them, some read from the whitespace before the word,
    cut as words, finer (at every non-letter) or one per code point, with a few empty words."""
    mode = rng.integers(3)
    if mode == 0:
        words = split(text)
    elif mode == 1:
        words = [(a + m.start(), a + m.end()) for a, b in split(text) for m in re.finditer(r"\w+|\W", text[a:b])]
    else:
        words = [(i, i + 1) for i in range(len(text)) if not text[i].isspace() or rng.random() < 0.2]
    out = []
    for start, end in words:
        if rng.random() < 0.3:
            while start > 0 and text[start - 1].isspace() and (not out or out[-1][1] < start):
                start -= 1
        if rng.random() < 0.03:
            out.append((start, start))
        out.append((start, end))
    return out


def test_decoder_matches_the_plain_reference_on_random_texts():
    """Random texts of words, units (e-mails, URLs, handles), CJK, brackets and odd spaces; random
    word cuts and probabilities, dyadic ones for tied votes and means at the threshold: the
    decoder's spans equal the reference's exactly (labels, offsets, float32 means), with the words' units
    computed by the decoder or given to it (``word_units``, as a caller decoding one text twice gives them), and
    the first spans alone where the decode is limited."""
    rng = np.random.default_rng(0)
    spans_seen = edge_spans = 0
    for case in range(600):
        count = int(rng.integers(1, 4)) if case % 10 == 0 else int(rng.integers(1, 40))
        text = "".join(str(rng.choice(_FRAGMENTS)) + str(rng.choice(_SPACES)) for _ in range(count))
        offsets = _random_words(rng, text)
        labels = ["A", "B", "C", "D"][: int(rng.integers(1, 5))]
        if rng.random() < 0.5:
            rows = rng.integers(0, 9, (len(offsets), len(labels))) / 8
        else:
            rows = rng.uniform(0, 1, (len(offsets), len(labels))) ** 3
        threshold = float(rng.choice([0.0, 0.25, 0.5, 0.5, 0.7]))
        want = _reference_decode(rows, offsets, labels, text, threshold)
        got = decode(rows, offsets or np.zeros((0, 2)), text, threshold, labels)
        assert got == want, (text, offsets, rows.tolist(), threshold)
        if offsets:
            given = np.array(offsets, np.int32)
            assert decode_spans(rows, given, labels, text, threshold, lambda: word_units(text, given)) == want
            limit = int(rng.integers(1, 4))  # a decode that stops early (the sparse gate's count) gives the first spans
            assert decode_spans(rows, given, labels, text, threshold, limit=limit) == want[:limit]
        assert all(type(s["probability"]) is float for s in got)
        spans_seen += len(want)
        edge_spans += sum(s["start"] <= offsets[0][1] or s["end"] >= offsets[-1][0] for s in want)
    assert spans_seen > 3000 and edge_spans > 300  # the cases do reach the decoder's paths


@pytest.mark.parametrize(
    "rows, offsets, text",
    [
        ([], [], ""),  # no words
        ([], [], "text no word covers"),
        ([[0.75]], [(0, 1)], "x"),  # one word, one character
        ([[0.75]], [(0, 1)], "("),  # trims to nothing
        ([[0.75]], [(1, 1)], " x"),  # an empty word
        ([[0.75], [0.75]], [(0, 3), (3, 6)], " @ab  "),  # read from spaces, ending at the text's end
        ([[0.75], [0.0], [0.75]], [(0, 4), (4, 5), (5, 8)], "jane.doe"),  # a unit filled end to end
        ([[0.75, 0.0], [0.0, 0.75]], [(0, 1), (1, 2)], "ab"),  # a tie settles on the first label
    ],
)
def test_decoder_matches_the_plain_reference_at_the_edges(rows, offsets, text):
    labels = ["A", "B"][: len(rows[0])] if rows else ["A"]
    probabilities = np.array(rows, np.float64).reshape(len(rows), len(labels))
    for threshold in (0.0, 0.5, 0.75):
        got = decode_spans(probabilities, np.array(offsets, np.int32).reshape(-1, 2), labels, text, threshold)
        assert got == _reference_decode(probabilities, offsets, labels, text, threshold)


# --- words and units are finditer's matches -----------------------------------------------------

# Every kind of space, U+3000 among them: ``\s`` matches it, yet it is a CJK word (and starts no unit).
_SPACE_CHARS = " \t\n\r\x0b\x0c\x1c\x85\xa0\u1680\u2003\u2028\u202f\u205f\u3000"
_PIECES = [
    "word", "Ab", "x9", "co-op", "snake_case", "a--b", "Müller", "é", "ſ", "\u212a", "\u0265", "\ua7b5", "42", "3.14",
    ",", ".", "!", "?", ";", ":", "-", "_", "%", "+", "/", "(", ")", "[", "]", "{", "}", "<", ">", "「", "」", "『", "』",
    '"', "'", "\u201c", "\u201d", "\u2018", "\u2019", "\u00ab", "\u00bb", "東京", "是", "。", "、", "\uff01", "Ａ", "서울", "한",
    "http://x.y/z", "https://a.b/c?d=1", "HTTPS://A.B/", "www.a.b", "WWW.x.org/p", "http://", "www.", "httpſ://s.t",
    "a@b.cd", "Jane.Doe@Example.COM", "x@y", "@handle", "@", "@_a", "😀", "𝒳", "\u0301",
]  # fmt: skip


def _mixed_text(rng: np.random.Generator) -> str:
    """Pieces glued together or apart, by runs of one to three spaces of any kind."""
    out = []
    for _ in range(int(rng.integers(0, 30))):
        out.append(str(rng.choice(_PIECES)))
        if rng.random() < 0.6:
            out.append("".join(rng.choice(list(_SPACE_CHARS), int(rng.integers(1, 4)))))
    return "".join(out)


def _assert_finditer_spans(text: str, offsets) -> None:
    assert split(text) == _finditer_spans(_WORD_RE, text), text
    for given in (chars(text).reshape(-1, 2), np.array(offsets, np.int64).reshape(-1, 2)):
        assert word_units(text, given).tolist() == _reference_units(text, given.tolist()), (text, given.tolist())


def test_words_and_units_are_finditer_matches_on_random_texts():
    """Words (through ``words_of``) and units (through ``word_units``, per code point and per word read
    from the spaces before it) of random texts of words, URLs, e-mails, handles, CJK, Hangul, brackets,
    quotes and all kinds of spaces are finditer's matches."""
    rng = np.random.default_rng(0)
    ideographic = 0
    for _ in range(2000):
        text = _mixed_text(rng)
        _assert_finditer_spans(text, _random_words(rng, text))
        ideographic += "\u3000" in text
    assert ideographic > 500


@pytest.mark.parametrize(
    "text",
    [
        "", " ", "\t\n ", "\u3000", "\u3000\u3000\u3000", " \u3000 \u3000", "a\u3000\u3000b", "end ", "end\u3000",
        "end\n\u00a0\u2003", "x\u00a0y\u2003z", "http://x.y/z.", "http://x.y/z)」更多", "www.a.b。", "http://x.y/z\u3000a",
        "see https://a.b/c), ok", "a@b.cd\u3000@x", "東京\u3000\u3000大阪", " " * 50 + "a" + " " * 50, "😀\u3000𝒳 ",
    ],
)
def test_words_and_units_are_finditer_matches_at_the_edges(text):
    _assert_finditer_spans(text, split(text))


# --- word units ---------------------------------------------------------------------------------


def test_urls_emails_and_handles_are_whole_words():
    text = "Mail Jane.Doe@Example.COM or @jane_d, see HTTPS://Example.com/a?b=1,c. Also www.x.org)."
    assert pieces(text) == [
        "Mail", "Jane.Doe@Example.COM", "or", "@jane_d", ",", "see",
        "HTTPS://Example.com/a?b=1,c", ".", "Also", "www.x.org", ")", ".",
    ]  # fmt: skip
    assert split(EMAIL) == [(0, 20)]


def test_url_word_edges():
    assert pieces('"https://x.y"') == ['"', "https://x.y", '"']
    assert pieces("https://example.com/路径") == ["https://example.com/", "路", "径"]
    assert pieces("WwW.Example.org/a」b") == ["WwW.Example.org/a", "」", "b"]  # 」 is CJK
    assert pieces("https:// x") == ["https", ":", "/", "/", "x"]  # a URL needs a body


def test_other_words():
    assert pieces("a@b") == ["a", "@b"]  # no dot-TLD: not an e-mail, "@b" is a handle
    assert pieces("state-of_the-art, e.g. x--y") == [
        "state-of_the-art", ",", "e", ".", "g", ".", "x", "-", "-", "y",
    ]  # fmt: skip
    assert pieces("  \tcafé 42\n") == ["café", "42"]
    assert pieces("서울ＡＢ") == ["서", "울", "Ａ", "Ｂ"]


def test_cjk_class_keeps_the_upstream_range_quirk():
    # U+A7B5 is a Latin letter that only the widened U+8C48-FAFF range makes "CJK".
    assert pieces("\ua7b5\ua7b5") == ["\ua7b5", "\ua7b5"]
    # Case-insensitive matching: U+0265 is not in the range but its upper case U+A78D is.
    assert pieces("\u0265\u0265") == ["\u0265", "\u0265"]
    assert pieces("ab") == ["ab"]
    # Trimming looks for CJK case-sensitively: U+0265 does not cut a URL, U+A7B5 does.
    assert trim("https://x.y/\u0265", 0, 13) == (0, 13)
    assert trim("https://x.y/\ua7b5", 0, 13) == (0, 12)


def test_offsets_are_code_points():
    text = "🎉𝒳 met Alice"  # two astral characters before the span
    assert split(text) == [(0, 1), (1, 2), (3, 6), (7, 12)]
    spans = decode([[0.25], [0.25], [0.25], [0.75]], split(text), text)
    assert spans == [span("X", 7, 12, 0.75)]
    assert text[7:12] == "Alice"


# --- trimming -----------------------------------------------------------------------------------

PAIRS = ["()", "[]", "{}", "<>", '""', "''", "「」", "『』", "【】", "《》", "〈〉", "“”", "‘’", "«»", "‹›"]


@pytest.mark.parametrize("pair", PAIRS)
def test_trim_brackets_and_quotes(pair):
    text = f"x {pair[0]}Tokyo{pair[1]} y"
    assert trim(text, 2, 9) == (3, 8)


def test_trim_layers_whitespace_and_inner_characters():
    assert trim(" 「『Tokyo』」 ", 0, 11) == (3, 8)
    assert trim("“A” and “B”", 0, 11) == (1, 10)
    assert trim("¿Tokyo?", 0, 7) == (0, 7)
    assert trim("„Tokyo“", 0, 7) == (0, 6)  # „ is not an edge character
    assert trim("（東京）", 0, 4) == (0, 4)  # nor are full-width parentheses
    assert trim("()", 0, 2) == (2, 2)  # the leading pass alone empties it


def test_trim_url_tails():
    assert trim("(https://example.com/a).", 0, 24) == (1, 22)
    assert trim("WWW.Example.com!)", 0, 17) == (0, 15)
    assert trim("www.example.com/路径/x", 0, 20) == (0, 16)
    # Without a URL prefix, trailing punctuation stays.
    assert trim("example.com).", 0, 13) == (0, 13)
    assert trim("Dr.", 0, 3) == (0, 3)
    # The prefix is matched against the text, not the span: "http:" of "http://x" is a URL.
    assert trim("http://x", 0, 5) == (0, 4)


def test_decoded_url_followed_by_paren_and_dot():
    text = "see https://example.com/a). ok"
    assert split(text) == [(0, 3), (4, 25), (25, 26), (26, 27), (28, 30)]
    spans = decode([[0.25], [0.75], [0.75], [0.75], [0.25]], split(text), text)
    assert spans == [span("X", 4, 25, 0.75)]


def test_decoded_url_followed_by_cjk():
    text = "https://example.com/x。更多"
    assert split(text) == [(0, 21), (21, 22), (22, 23), (23, 24)]
    spans = decode([[0.75], [0.75], [0.75], [0.25]], split(text), text)
    assert spans == [span("X", 0, 21, 0.75)]


# --- word -> first token ------------------------------------------------------------------------


def first_overlapping(word: tuple[int, int], tokens: list[tuple[int, int]]) -> int | None:
    """The first non-empty token sharing a code point with the word."""
    for i, (a, b) in enumerate(tokens):
        if a < b and a < word[1] and b > word[0]:
            return i
    return None


def test_words_of_real_tokenizer(tokenizer):
    text = "东京是日本😀 Anna Müller"
    tokens = tokenizer.encode(text, add_special_tokens=False).offsets
    assert tokens == [(0, 2), (2, 4), (3, 5), (4, 5), (4, 5), (5, 6), (5, 6), (6, 11), (11, 18)]
    words = words_of(text, np.asarray(tokens, np.int32))
    assert isinstance(words, Words) and len(words) == 8
    assert words.offsets.tolist() == [[0, 1], [1, 2], [2, 3], [3, 4], [4, 5], [5, 6], [7, 11], [12, 18]]
    # 是 starts at 2, where token 0 ends; 本 starts at 4, where token 1 ends.
    assert words.first.tolist() == [0, 0, 1, 1, 2, 5, 7, 8]
    assert words.offsets.dtype == np.int32 and words.first.dtype == np.int64


TOKENIZED = ["东京是日本😀 Anna Müller", "🎉𝒳 met Alice", "see https://example.com/a). 访问", EMAIL, "Ünïcödé — ok!"]


@pytest.mark.parametrize("text", TOKENIZED)
def test_words_of_picks_the_first_overlapping_token(tokenizer, text):
    tokens = tokenizer.encode(text, add_special_tokens=False).offsets
    words = words_of(text, np.asarray(tokens, np.int32))
    assert len(words) == len(split(text))  # byte-level BPE covers every word
    for word, first in zip(words.offsets.tolist(), words.first.tolist(), strict=True):
        assert first == first_overlapping(tuple(word), tokens)


def test_words_of_ignores_empty_tokens():
    words = words_of("ab cd", np.array([(0, 0), (0, 2), (2, 2), (3, 3), (3, 5)], np.int32))
    assert words.offsets.tolist() == [[0, 2], [3, 5]]
    assert words.first.tolist() == [1, 4]
    # Empty (1, 1) and reversed (5, 4) tokens end past a word start yet must not be chosen.
    words = words_of("ab cd", np.array([(1, 1), (0, 2), (5, 4), (3, 5)], np.int32))
    assert words.offsets.tolist() == [[0, 2], [3, 5]]
    assert words.first.tolist() == [1, 3]


def test_words_of_drops_uncovered_words():
    # "c" (3, 4): the first token ending past 3 is (4, 5), which starts at its end; "de": none.
    words = words_of("ab c de", np.array([(0, 2), (4, 5)], np.int32))
    assert words.offsets.tolist() == [[0, 2]]
    assert words.first.tolist() == [0]


def test_words_of_shared_token():
    words = words_of("a b", np.array([(0, 3)], np.int32))
    assert words.offsets.tolist() == [[0, 1], [2, 3]]
    assert words.first.tolist() == [0, 0]


@pytest.mark.parametrize(("text", "tokens"), [("", [(0, 0)]), ("abc", []), ("   ", [(0, 3)])])
def test_words_of_empty(text, tokens):
    words = words_of(text, np.array(tokens, np.int32).reshape(-1, 2))
    assert len(words) == 0
    assert words.offsets.shape == (0, 2) and words.offsets.dtype == np.int32
    assert words.first.shape == (0,) and words.first.dtype == np.int64
