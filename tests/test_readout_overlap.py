"""Heads begun during the forward: the runner hands each block over as its call ends, the longest group
first, and ``Vela2Model.forward`` starts the head of each read block it gets, span or candidate
(``PlanHidden``); the answers are those of the heads run after the forward, bit for bit."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from s1omni.runtime.engine import read_manifest
from s1omni.runtime.runners.base import Block, Prefix, Tree
from s1omni.runtime.runners.onnxruntime_runner import OnnxRuntimeRunner, length_groups, longest_first
from s1omni.runtime.vela2.engine import load_engine
from s1omni.runtime.vela2.model import PlanHidden, Vela2Model

CASES = Path(__file__).resolve().parents[1] / "calib" / "vela2" / "cases.json"


@pytest.fixture(scope="module")
def engine_model(cpu_engine: Path) -> Vela2Model:
    return load_engine(cpu_engine, read_manifest(cpu_engine))


def _router_request() -> dict:
    cases = {case["name"]: case for case in json.loads(CASES.read_text())["cases"]}
    return cases["router-signals-600"]["request"]


def test_longest_group_runs_first() -> None:
    lengths = [482, 114, 96, 208, 134, 1221]
    groups = length_groups(lengths, 1.25)
    ordered = longest_first(groups, lengths)
    assert sorted(map(sorted, ordered)) == sorted(map(sorted, groups))  # the same groups, reordered
    assert ordered[0] == [5]
    widest = [max(lengths[i] for i in group) for group in ordered]
    assert widest == sorted(widest, reverse=True)


def test_runner_hands_every_block_over_once_as_returned(cpu_engine: Path) -> None:
    rng = np.random.default_rng(3)

    def block(length: int) -> Block:
        return Block(rng.integers(1, 2000, length), np.array([0, length - 1], np.int64))

    trees = [Tree(Prefix(rng.integers(1, 2000, 40)), (block(5), block(90), block(6))), Tree(Prefix(rng.integers(1, 2000, 12)), ()),
             Tree(Prefix(rng.integers(1, 2000, 25)), (block(30),))]  # fmt: skip
    runner = OnnxRuntimeRunner(cpu_engine)
    handed: list[tuple[int, int, np.ndarray]] = []
    out = runner.run(trees, lambda tree, number, rows: handed.append((tree, number, rows)))
    assert sorted((tree, number) for tree, number, _ in handed) == [(0, 0), (0, 1), (0, 2), (2, 0)]
    assert all(rows is out[tree][number] for tree, number, rows in handed)  # what run returns, not a copy
    assert [len(trees[tree].blocks[number].ids) for tree, number, _ in handed][0] == 90  # the longest first
    plain = runner.run(trees)
    assert all(np.array_equal(a, b) for x, y in zip(out, plain, strict=True) for a, b in zip(x, y, strict=True))


def test_heads_begin_in_the_forward_and_answer_as_after_it(engine_model: Vela2Model, monkeypatch: pytest.MonkeyPatch) -> None:
    body = _router_request()
    plan = engine_model.plan(body)
    read = [block for _, blocks in plan.trees for block in blocks if block.read]
    assert any(block.is_span for block in read) and any(not block.is_span for block in read), "the router request has both heads"
    hidden = engine_model.forward([plan])[0]
    assert isinstance(hidden, PlanHidden) and set(hidden.heads) == {id(block) for block in read}
    late = engine_model.read([plan], [list(tree) for tree in hidden])[0]  # a plain list: every head after the forward
    early = engine_model.readout(plan, hidden)
    assert early.keys() == late.keys() == set(hidden.heads)
    assert all(np.array_equal(early[key], late[key]) for key in late)
    assert engine_model.finish(plan, early) == engine_model.finish(plan, late)

    # The started heads are what readout uses: with both heads gone, readout still answers from them.
    def refused(*_: object) -> np.ndarray:
        raise AssertionError("a head ran again after the forward")

    monkeypatch.setattr(engine_model, "_read_span", refused)
    monkeypatch.setattr(engine_model.candidate, "blocks", refused)
    again = engine_model.readout(plan, hidden)
    assert all(np.array_equal(again[key], late[key]) for key in late)
    with pytest.raises(AssertionError, match="ran again"):
        engine_model.read([plan], [list(tree) for tree in hidden])


def test_late_candidates_start_only_span_heads(engine_model: Vela2Model, monkeypatch: pytest.MonkeyPatch) -> None:
    """``early_candidates`` off (an A/B's before arm): only span heads start, and the answers stay the same."""
    plan = engine_model.plan(_router_request())
    early = engine_model.readout(plan, engine_model.forward([plan])[0])
    monkeypatch.setattr(engine_model, "early_candidates", False)
    hidden = engine_model.forward([plan])[0]
    assert set(hidden.heads) == {id(block) for _, blocks in plan.trees for block in blocks if block.read and block.is_span}
    late = engine_model.readout(plan, hidden)
    assert late.keys() == early.keys() and all(np.array_equal(early[key], late[key]) for key in early)


def test_each_forward_keeps_its_own_heads(engine_model: Vela2Model) -> None:
    """One plan forwarded twice (a merged check runs a plan alone and merged) gets two sets of heads, each
    read from its own forward's rows."""
    plan = engine_model.plan(_router_request())
    first, second = engine_model.forward([plan])[0], engine_model.forward([plan, engine_model.plan(_router_request())])[0]
    assert first.heads.keys() == second.heads.keys()
    assert all(first.heads[key] is not second.heads[key] for key in first.heads)
    for hidden in (first, second):
        plain = engine_model.read([plan], [list(tree) for tree in hidden])[0]
        started = engine_model.readout(plan, hidden)
        assert all(np.array_equal(started[key], plain[key]) for key in plain)
