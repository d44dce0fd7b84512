"""Span words and units from ``finditer`` (a commit's ``words.py``) against this tree's, on one text, in one process.

    .venv/bin/python benchmarks/cpu-host-path/gil/words/words_bench.py --before 32a070d \\
        --out benchmarks/cpu-host-path/gil/words/per-call.json

The text is calibration case router-signals-600's request, its tokens the synthetic member's tokenizer's; both
modules must give the same words and units before anything is timed. Rounds alternate the four arms (50 calls
each); the record keeps each arm's per-call microseconds of every round and their median.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

ROOT = Path(__file__).resolve().parents[4]
CALLS = 50


def module_at(commit: str, directory: Path):
    source = subprocess.run(["git", "-C", str(ROOT), "show", f"{commit}:runtime/vela2/words.py"], check=True, capture_output=True, text=True).stdout
    path = directory / "words_before.py"
    path.write_text(source, encoding="utf-8")
    spec = importlib.util.spec_from_file_location("words_before", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def per_call_us(call) -> float:
    start = time.perf_counter()
    for _ in range(CALLS):
        call()
    return (time.perf_counter() - start) / CALLS * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, metavar="COMMIT", help="the commit whose words.py is the before arm")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=200)
    args = parser.parse_args()

    from s1omni.runtime.synth import vela2 as synth
    from s1omni.runtime.synth.tokenizer import train_tokenizer
    from s1omni.runtime.vela2 import words as after

    cases = json.loads((ROOT / "calib/vela2/cases.json").read_text(encoding="utf-8"))["cases"]
    text = next(case["request"] for case in cases if case["name"] == "router-signals-600")["state"]["request"]
    tokenizer = Tokenizer.from_str(train_tokenizer(synth.TOKENIZER_VOCAB))
    offsets = np.asarray(tokenizer.encode(text, add_special_tokens=False).offsets, np.int32)
    with tempfile.TemporaryDirectory() as directory:
        before = module_at(args.before, Path(directory))
    words = after.words_of(text, offsets)
    old_words = before.words_of(text, offsets)
    assert np.array_equal(words.offsets, old_words.offsets) and np.array_equal(words.first, old_words.first)
    assert np.array_equal(after.word_units(text, words.offsets), before.word_units(text, words.offsets))
    arms = {
        "words_of before": lambda: before.words_of(text, offsets),
        "words_of after": lambda: after.words_of(text, offsets),
        "word_units before": lambda: before.word_units(text, words.offsets),
        "word_units after": lambda: after.word_units(text, words.offsets),
    }
    rounds: dict[str, list[float]] = {name: [] for name in arms}
    for _ in range(args.rounds):
        for name, call in arms.items():
            rounds[name].append(round(per_call_us(call), 2))
    record = {
        "command": [Path(sys.executable).name, *sys.argv],
        "before": args.before,
        "text": {"code_points": len(text), "tokens": len(offsets), "words": len(words)},
        "calls_per_round": CALLS,
        "median_us": {name: round(statistics.median(values), 1) for name, values in rounds.items()},
        "rounds_us": rounds,
    }
    args.out.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    print(json.dumps({key: record[key] for key in ("text", "median_us")}))


if __name__ == "__main__":
    main()
