"""The decoder layout: exact prompt pieces, readout positions, truncation order and span windows."""

from __future__ import annotations

import numpy as np
import pytest

from s1omni.runtime.vela2.layout import SchemaTooLong, fit, option_block, question_head, word_windows


def test_prefix_is_each_piece_tokenized_on_its_own(tiny_model) -> None:
    ids = tiny_model.tokens.ids
    plan = tiny_model.plan({"state": {"request": "hello world", "answer": "done"},
                            "questions": {"q": {"type": "noul", "instructions": "Is it done?"}}})  # fmt: skip
    tree, blocks = plan.trees[0]
    expected = (
        ids("Context:\n") + ids('<segment role="user">\n') + ids("hello world") + ids("\n</segment>\n")
        + ids('<segment role="answer">\n') + ids("done") + ids("\n</segment>\n")
    )  # fmt: skip
    assert tree.prefix.ids.tolist() == expected
    block = blocks[0]
    head = ids("\n\nTask type: choice\nTarget: user, answer\nQuestion:\nIs it done?\nOptions:")
    no = ids('\n<option>\n{"description":"No. The statement or question is not satisfied.","key":"no"}\n</option>')
    yes = ids('\n<option>\n{"description":"Yes. The statement or question is satisfied.","key":"yes"}\n</option>')
    abstain = ids('\n<option>\n{"description":"None of the shown options applies.","key":"[ABS]"}\n</option>')
    suffix = ids("\n\nSelect the single option best supported by the context and instructions.\nDecision:")
    assert block.ids == head + no + yes + abstain + suffix
    assert block.ends == [len(head) + len(no) - 1, len(head) + len(no) + len(yes) - 1, len(head + no + yes + abstain) - 1]
    decode = tiny_model.tokens.tokenizer.decode
    assert all(decode([block.ids[end]]).endswith(">") for end in block.ends)
    assert tree.blocks[0].readouts.tolist() == [*block.ends, len(block.ids) - 1]
    assert plan.input_tokens == len(expected) + len(block.ids)


def test_option_and_head_strings() -> None:
    assert option_block("k", "d é") == '\n<option>\n{"description":"d é","key":"k"}\n</option>'
    assert option_block("PERSON", "a person", "label") == '\n<label>\n{"description":"a person","key":"PERSON"}\n</label>'
    assert question_head("set", ("user", "context"), "Q?") == "\n\nTask type: set\nTarget: user, context\nQuestion:\nQ?\nOptions:"
    assert question_head("span", "answer", "Q?", span=True).endswith("Question:\nQ?\nLabels:")


def test_score_levels_are_keys_with_empty_descriptions_and_no_abstain(tiny_model) -> None:
    plan = tiny_model.plan({"state": "x", "questions": {"s": {"type": "score", "instructions": "How?", "levels": ["Low", "High"]}}})
    block = plan.trees[0][1][0]
    ids = tiny_model.tokens.ids
    head = ids("\n\nTask type: score\nTarget: user\nQuestion:\nHow?\nOptions:")
    options = ids('\n<option>\n{"description":"","key":"Low"}\n</option>') + ids('\n<option>\n{"description":"","key":"High"}\n</option>')
    suffix = ids("\n\nSelect the single option best supported by the context and instructions.\nDecision:")
    assert block.ids == head + options + suffix and len(block.ends) == 2


def test_span_block_repeats_the_target_and_reads_each_word_at_its_first_token(tiny_model) -> None:
    text = "Alice met Bob in Lisbon."
    plan = tiny_model.plan({"state": text, "questions": {"s": {"type": "span", "instructions": "Mark names.",
                                                              "criteria": {"name": "a person"}}}})  # fmt: skip
    (_, blocks), = plan.trees
    block = blocks[0]
    ids = tiny_model.tokens.ids
    encoding = tiny_model.tokens.tokenizer.encode(text, add_special_tokens=False)
    label = ids(option_block("name", "a person", "label"))
    head = ids("\n\nTask type: span\nTarget: user\nQuestion:\nMark names.\nLabels:")
    repeat = ids("\n\nText:\n") + ids('<segment role="user">\n')
    assert block.ids[: len(head) + len(label)] == head + label
    offset = len(head) + len(label) + len(repeat)
    assert block.ids[offset : offset + len(encoding.ids)] == encoding.ids
    assert block.starts == [len(head)] and block.ends == [len(head) + len(label) - 1]
    words = [text[a:b] for a, b in block.word_offsets]
    assert words == ["Alice", "met", "Bob", "in", "Lisbon", "."]
    first = [offset + i for i, (a, b) in enumerate(encoding.offsets) if b > a]
    assert block.words.tolist()[0] == offset and set(block.words.tolist()) <= set(first)


def test_truncation_shrinks_the_unread_part_first_then_the_read_ones() -> None:
    # fixed = 3 + 3 parts = 6; schema 10; available 100: 84 tokens of parts fit.
    parts = [("user", 40), ("context", 200), ("answer", 30)]
    assert fit([10], [], parts, 100, {"user", "answer"}, "context") == {"user": 40, "context": 14, "answer": 30}
    # The unread part keeps at least 64 tokens while that suffices; then it goes to 1, then the read parts shrink.
    assert fit([10], [], parts, 150, {"user", "answer"}, "context") == {"user": 40, "context": 64, "answer": 30}
    assert fit([10], [], parts, 60, {"user", "answer"}, "context") == {"user": 13, "context": 1, "answer": 30}
    with pytest.raises(SchemaTooLong):
        fit([100], [], parts, 60, {"user", "answer"}, "context")


def test_word_windows_start_at_word_starts_and_never_split_a_word() -> None:
    first = np.asarray([0, 3, 7, 10, 14, 18, 22, 25])
    assert word_windows(first, 28, 10, 8) == [(0, 7), (7, 14), (14, 22), (22, 28)]
    assert word_windows(np.asarray([0]), 30, 10, 8) == [(0, 10), (10, 20), (20, 30)]  # one long word
    assert word_windows(np.zeros(0, np.int64), 5, 10, 8) == [(0, 5)]
