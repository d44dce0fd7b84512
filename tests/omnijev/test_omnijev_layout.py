"""Prompt, tokens, shared prefix, rows, readouts, M-RoPE positions and token limits (omnijev.md §4-§5)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer

from s1omni.runtime.omnijev.contract import ContractError, Kind, Question
from s1omni.runtime.omnijev.layout import TokenIds, plan_layout, prompt, rope_positions, tokenize

GRID = (1, 14, 20)  # the warm-up image's grid: 7 x 10 = 70 image tokens
IMAGE_TOKENS = 70


@pytest.fixture(scope="module")
def tokenizer(omnijev_package: Path) -> Tokenizer:
    return Tokenizer.from_file(str(omnijev_package / "tokenizer.json"))


@pytest.fixture(scope="module")
def ids(omnijev_package: Path) -> TokenIds:
    config = json.loads((omnijev_package / "config.json").read_text())
    options = json.loads((omnijev_package / "omnijev_export.json").read_text())["option_tokens"]
    return TokenIds(config["image_token_id"], options["<|opt|>"], options["<|/opt|>"])


def noul(qid: str, instructions: str, region: str = "") -> Question:
    return Question(qid, Kind.NOUL, instructions, ("yes",), (region,))


def choice(qid: str, instructions: str, *options: str) -> Question:
    return Question(qid, Kind.CHOICE, instructions, options, options)


def score(qid: str, instructions: str, *levels: str) -> Question:
    return Question(qid, Kind.SCORE, instructions, levels, levels)


def test_prompt_renders_the_chat_template_with_every_option_block() -> None:
    question = choice("q", "  Is it dark?  \n\x1f ", "a ", " b: rubric ")
    assert prompt(question) == (
        "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>  Is it dark?<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n<|opt|>a <|/opt|><|opt|> b: rubric <|/opt|>"
    )
    assert prompt(noul("n", "Pick one.\u3000")).endswith(
        "Pick one.<|im_end|>\n<|im_start|>assistant\n<think>\n<|opt|><|/opt|>"
    )


def test_tokenize_expands_the_placeholder_between_the_encoded_sides(tokenizer: Tokenizer, ids: TokenIds) -> None:
    question = choice("q", "Which colour <|im_end|> dominates?", "red", "green: Mostly green")
    sequence = tokenize(tokenizer, question, IMAGE_TOKENS, ids)
    expanded = prompt(question).replace("<|image_pad|>", "<|image_pad|>" * IMAGE_TOKENS)
    assert sequence == tokenizer.encode(expanded, add_special_tokens=False).ids
    assert sequence.count(ids.image) == IMAGE_TOKENS
    assert sequence.count(ids.option_open) == sequence.count(ids.option_close) == 2
    assert tokenizer.token_to_id("<|im_end|>") in sequence[IMAGE_TOKENS:]  # spelled in the text: a special token


def test_rope_positions_equal_transformers_get_rope_index(
    omnijev_package: Path, tokenizer: Tokenizer, ids: TokenIds
) -> None:
    from transformers import Qwen3_5Config
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5Model

    config = json.loads((omnijev_package / "config.json").read_text())
    with torch.device("meta"):
        model = Qwen3_5Model(
            Qwen3_5Config(**{k: v for k, v in config.items() if k not in ("architectures", "model_type")})
        )
    for grid in [GRID, (1, 36, 64), (1, 2, 160), (1, 48, 48)]:
        tokens = grid[1] * grid[2] // 4
        sequence = tokenize(tokenizer, choice("q", "Which?", "a", "b"), tokens, ids)
        input_ids = torch.tensor([sequence])
        expected, _ = model.get_rope_index(input_ids, (input_ids == ids.image).int(), torch.tensor([grid]))
        np.testing.assert_array_equal(rope_positions(sequence, ids.image, grid, 2), expected[:, 0].numpy())


def rows_tokens(layout) -> list[list[list[int]]]:
    return [[row.tokens.tolist() for row in rows] for rows in layout.rows]


QUESTIONS = [
    choice("next", "Which operation comes next?", "click", "type: Enter text into the focused field", "scroll"),
    score("risk", "How risky is acting on this screen?", "safe", "check first", "dangerous"),
    noul("done", "The task looks finished."),
    noul("where", "The cursor is inside this region.", "region [10,20,300,400]"),
]


def test_rows_readouts_and_usage(tokenizer: Tokenizer, ids: TokenIds) -> None:
    layout = plan_layout(QUESTIONS, tokenizer, IMAGE_TOKENS, GRID, 2, ids)
    sequences = [tokenize(tokenizer, q, IMAGE_TOKENS, ids) for q in QUESTIONS]
    prefix = len(layout.prefix)
    # The prefix is the common prefix: the template head and the image, up to the instructions.
    assert layout.prefix.tolist() == sequences[0][:prefix]
    assert all(s[:prefix] == sequences[0][:prefix] for s in sequences)
    assert len({s[prefix] for s in sequences}) > 1
    assert layout.image_index.tolist() == list(range(prefix - IMAGE_TOKENS - 1, prefix - 1))  # <|vision_end|> follows
    for question, sequence, rows in zip(QUESTIONS, sequences, layout.rows, strict=True):
        opens = [i for i, t in enumerate(sequence) if t == ids.option_open]
        closes = [i for i, t in enumerate(sequence) if t == ids.option_close]
        assert len(rows) == len(question.options) == len(opens)
        head = sequence[prefix : opens[0]]
        for row, o, c, text in zip(rows, opens, closes, question.options, strict=True):
            assert row.tokens.tolist() == head + sequence[o : c + 1]
            assert row.zq == len(head) - 1 and row.tokens[row.zq + 1] == ids.option_open
            assert row.u == len(row.tokens) - 1 and row.tokens[row.u] == ids.option_close
            inner = row.tokens[row.zq + 2 : row.u].tolist()
            assert [(p, t) for p, t in row.targets] == [(row.zq + 1 + i, t) for i, t in enumerate(inner)]
            assert row.first == (inner[0] if inner else None)
            assert tokenizer.decode(inner, skip_special_tokens=False) == text
    # "done" is a plain Noul: its row has no option text at all.
    assert layout.rows[2][0].targets == () and layout.rows[2][0].first is None
    assert layout.input_tokens == prefix + sum(len(r.tokens) for rows in layout.rows for r in rows)


def test_rows_continue_from_the_prefix_positions(tokenizer: Tokenizer, ids: TokenIds) -> None:
    layout = plan_layout(QUESTIONS, tokenizer, IMAGE_TOKENS, GRID, 2, ids)
    sequence = tokenize(tokenizer, QUESTIONS[0], IMAGE_TOKENS, ids)
    full = rope_positions(sequence, ids.image, GRID, 2)
    prefix = len(layout.prefix)
    np.testing.assert_array_equal(layout.positions, full[:, :prefix])
    assert layout.next_position == int(full[:, :prefix].max()) + 1
    # Each row sits where it would in a plain sequence of prefix + row.
    for rows in layout.rows:
        for row in rows:
            plain = rope_positions([*layout.prefix.tolist(), *row.tokens.tolist()], ids.image, GRID, 2)
            expected = np.arange(layout.next_position, layout.next_position + len(row.tokens))
            np.testing.assert_array_equal(plain[:, prefix:], np.broadcast_to(expected, (3, len(row.tokens))))


def test_the_prefix_stops_before_the_token_ahead_of_the_first_option(tokenizer: Tokenizer, ids: TokenIds) -> None:
    same = [noul("a", "Is the button blue?"), noul("b", "Is the button blue?")]
    layout = plan_layout(same, tokenizer, IMAGE_TOKENS, GRID, 2, ids)
    sequence = tokenize(tokenizer, same[0], IMAGE_TOKENS, ids)
    first_open = sequence.index(ids.option_open)
    assert len(layout.prefix) == first_open - 1
    assert [row.tokens.tolist() for row in layout.rows[0]] == [sequence[first_open - 1 :]]
    assert layout.rows[0][0].zq == 0
    shared_start = [noul("a", "Is the button on the left side blue?"), noul("b", "Is the button on the left side red?")]
    longer = plan_layout(shared_start, tokenizer, IMAGE_TOKENS, GRID, 2, ids)
    assert len(longer.prefix) > len(plan_layout(QUESTIONS, tokenizer, IMAGE_TOKENS, GRID, 2, ids).prefix)


def test_the_layout_does_not_depend_on_question_order(tokenizer: Tokenizer, ids: TokenIds) -> None:
    forward = plan_layout(QUESTIONS, tokenizer, IMAGE_TOKENS, GRID, 2, ids)
    backward = plan_layout(QUESTIONS[::-1], tokenizer, IMAGE_TOKENS, GRID, 2, ids)
    assert forward.prefix.tolist() == backward.prefix.tolist()
    assert rows_tokens(forward) == rows_tokens(backward)[::-1]
    assert forward.input_tokens == backward.input_tokens


# ----------------------------------------------------------------------------- token limits


def test_one_question_over_8192_tokens_is_refused(tokenizer: Tokenizer, ids: TokenIds) -> None:
    big = choice("wide", "Pick.", *[f"{i}" + "选" * 199 for i in range(60)])
    with pytest.raises(ContractError) as error:
        plan_layout([noul("a", "x"), big], tokenizer, IMAGE_TOKENS, GRID, 2, ids)
    assert error.value.status == 422
    assert error.value.detail.startswith("question wide: ") and error.value.detail.endswith(" tokens exceeds 8192")


def test_more_than_65536_processed_tokens_are_refused(tokenizer: Tokenizer, ids: TokenIds) -> None:
    # Every row repeats its question's long head: 64 questions x 16 rows of about 2,000 tokens.
    questions = [choice(f"q{i}", f"{i} " + "é" * 2000, *[f"o{k}" for k in range(16)]) for i in range(64)]
    with pytest.raises(ContractError) as error:
        plan_layout(questions, tokenizer, IMAGE_TOKENS, GRID, 2, ids)
    assert error.value.status == 422
    assert error.value.detail.startswith("request needs ") and error.value.detail.endswith(" tokens, above 65536")


def test_more_than_16384_option_text_tokens_are_refused(tokenizer: Tokenizer, ids: TokenIds) -> None:
    options = [f"{k} " + "z q " * 5 for k in range(255)]
    questions = [choice(f"q{i}", "Pick.", *options) for i in range(4)]
    with pytest.raises(ContractError) as error:
        plan_layout(questions, tokenizer, IMAGE_TOKENS, GRID, 2, ids)
    assert error.value.status == 422
    assert error.value.detail.startswith("request reads ") and error.value.detail.endswith(
        " option-text tokens, above 16384"
    )
    # Score reads no log-probabilities, so the same rows as levels pass.
    levels = [score(f"q{i}", "Rate.", *options) for i in range(4)]
    assert plan_layout(levels, tokenizer, IMAGE_TOKENS, GRID, 2, ids).input_tokens <= 65536
