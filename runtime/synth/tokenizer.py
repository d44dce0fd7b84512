"""A real byte-level BPE tokenizer, trained deterministically at synth time on a small corpus."""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

CORPUS = Path(__file__).with_name("corpus.txt")
# Qwen-style split: contractions, letter runs, single digits, punctuation runs, whitespace.
SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def train_tokenizer(vocab_size: int, special_tokens: dict[int, str] | None = None) -> str:
    """The tokenizer as ``tokenizer.json`` text; the same arguments give the same bytes.

    ``special_tokens`` places added tokens at fixed ids (they must lie past the trained vocabulary).
    """
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=1,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    lines = CORPUS.read_text(encoding="utf-8").splitlines()
    tokenizer.train_from_iterator(lines * 4, trainer=trainer, length=len(lines) * 4)
    data = json.loads(tokenizer.to_str())
    if special_tokens:
        trained = max(data["model"]["vocab"].values()) + 1
        if min(special_tokens) < trained:
            raise ValueError(f"special token ids must be >= {trained}")
        data["added_tokens"] = [
            {"id": i, "content": text, "single_word": False, "lstrip": False, "rstrip": False,
             "normalized": False, "special": True}
            for i, text in sorted(special_tokens.items())
        ]
    return json.dumps(data, ensure_ascii=False, indent=None, sort_keys=True) + "\n"
