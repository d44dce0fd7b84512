"""The ``shared_context`` profile's forwards: each tree's blocks packed into one row behind its prefix
(``s1omni.runtime.runners.packing``, the export's ``packed`` graph), against ``exact``'s forwards."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from s1omni.runtime.engine import read_manifest
from s1omni.runtime.runners import onnxruntime_runner
from s1omni.runtime.runners.base import Block, Prefix, Tree
from s1omni.runtime.runners.onnxruntime_runner import OnnxRuntimeRunner
from s1omni.runtime.runners.packing import MIN_BLOCK_WIDTH, pack_blocks
from tests.cli import run_s1omni

# Rows of several blocks (packed), of one block (the continue graph), and one-token blocks, beside a
# tree without blocks; trees of different prefix widths (left-padded into one prefill).
TREES = [(50, 7, 30, 1, 64), (90, 3), (20, 12, 12, 15), (1, 1, 1), (40,), (64, 65, 70)]
# Packed and exact sum the same products in another order: float32 rounding apart, as validation's
# cpu-fp32 gate has it for hidden states (relative L2 5e-5), here as the largest absolute difference.
ROUNDING = 1e-5


def _tree(rng: np.random.Generator, prefix: int, *blocks: int) -> Tree:
    def block(length: int) -> Block:
        return Block(rng.integers(1, 2000, length), np.array(sorted({0, length // 2, length - 1}), np.int64))

    return Tree(Prefix(rng.integers(1, 2000, prefix)), tuple(block(length) for length in blocks))


@pytest.fixture(scope="module")
def runner(cpu_engine: Path) -> OnnxRuntimeRunner:
    runner = OnnxRuntimeRunner(cpu_engine)
    runner.open_packed()
    return runner


def _max_abs(found: list[list[np.ndarray]], expected: list[list[np.ndarray]]) -> float:
    pairs = [(a, b) for x, y in zip(found, expected, strict=True) for a, b in zip(x, y, strict=True)]
    assert all(a.shape == b.shape for a, b in pairs)
    return max(float(np.abs(a - b).max()) for a, b in pairs)


def test_packing_places_every_block_token_and_readout_once() -> None:
    blocks = [[Block(np.array([5, 6, 7]), np.array([2])), Block(np.array([8]), np.array([0]))], [Block(np.array([9, 10]), np.array([0, 1]))]]
    packed = pack_blocks(blocks, np.array([4, 10]))
    feeds = packed.feeds
    assert feeds["input_ids"].tolist() == [[5, 6, 7, 8], [9, 10, 0, 0]]
    assert feeds["position_ids"][0].tolist() == [[4, 5, 6, 4], [10, 11, 0, 0]]  # each block from its prefix's start
    assert feeds["block_owner"].tolist() == [0, 0, 1]
    width, block_width = 4, 3
    flat_ids = feeds["input_ids"].reshape(-1)
    for number, block in enumerate(block for row in blocks for block in row):
        index = feeds["block_index"][number]
        assert flat_ids[index[: len(block.ids)]].tolist() == block.ids.tolist()
        assert (index[len(block.ids) :] == index[len(block.ids) - 1]).all()  # padded with the block's last token
        back = feeds["packed_index"].reshape(-1)[index[: len(block.ids)]]
        assert back.tolist() == (number * block_width + np.arange(len(block.ids))).tolist()  # the two indices invert
    assert feeds["block_index"].max() < len(blocks) * width and feeds["readout_index"].tolist() == [[2, 3], [0, 1]]
    hidden = np.arange(2 * 2 * 1, dtype=np.float32).reshape(2, 2, 1)
    assert [part[:, 0].tolist() for part in packed.split(hidden)] == [[0.0], [1.0], [2.0, 3.0]]
    lone = pack_blocks([[Block(np.array([3]), np.array([0]))]], np.array([0]))
    assert lone.feeds["block_index"].shape == (1, MIN_BLOCK_WIDTH)  # the graph takes block rows of two or more
    with pytest.raises(ValueError, match="one or more tokens"):
        pack_blocks([[Block(np.array([], np.int64), np.array([], np.int64))]], np.array([0]))


def test_packed_forwards_answer_as_exact_within_float32_rounding(runner: OnnxRuntimeRunner) -> None:
    rng = np.random.default_rng(3)
    trees = [_tree(rng, *lengths) for lengths in TREES]
    exact, packed = runner.run(trees), runner.run_packed(trees)
    assert packed[4] == [] and _max_abs(packed, exact) <= ROUNDING
    alone = [runner.run_packed([tree])[0] for tree in trees]
    assert _max_abs(alone, exact) <= ROUNDING


def test_a_row_of_one_block_runs_the_continue_graph_as_exact_does(runner: OnnxRuntimeRunner) -> None:
    rng = np.random.default_rng(5)
    trees = [_tree(rng, 30, 700), _tree(rng, 12, 40)]
    for found, expected in zip(runner.run_packed(trees), runner.run(trees), strict=True):
        assert all(np.array_equal(a, b) for a, b in zip(found, expected, strict=True))


def test_packed_blocks_that_read_another_prefix_or_block_are_caught(runner: OnnxRuntimeRunner, monkeypatch: pytest.MonkeyPatch) -> None:
    """The comparison can fail: blocks started from the other tree's prefix state, and a block whose own
    keys are its neighbour's, are each far off exact."""
    rng = np.random.default_rng(9)
    trees = [_tree(rng, 40, 20, 25, 30), _tree(rng, 70, 22, 24)]
    exact = runner.run(trees)

    def wrong_owner(rows, starts, round_up=None):
        packed = pack_blocks(rows, starts, round_up)
        packed.feeds["block_owner"][:] = 1 - packed.feeds["block_owner"]
        return packed

    def neighbours_keys(rows, starts, round_up=None):
        packed = pack_blocks(rows, starts, round_up)
        packed.feeds["block_index"][[0, 1]] = packed.feeds["block_index"][[1, 0]]
        return packed

    for broken in (wrong_owner, neighbours_keys):
        monkeypatch.setattr(onnxruntime_runner, "pack_blocks", broken)
        assert _max_abs(runner.run_packed(trees), exact) > 100 * ROUNDING, broken.__name__


def test_the_packed_graph_is_loaded_only_when_asked_for(cpu_engine: Path, tmp_path: Path) -> None:
    runner = OnnxRuntimeRunner(cpu_engine)
    assert runner.can_pack
    with pytest.raises(RuntimeError, match="open_packed"):
        runner.run_packed([])
    engine = tmp_path / "engine"
    shutil.copytree(cpu_engine, engine)
    (engine / "packed.onnx").unlink()  # an engine built from an export before the packed graph
    older = OnnxRuntimeRunner(engine)
    assert not older.can_pack
    with pytest.raises(ValueError, match="no packed.onnx"):
        older.open_packed()


def test_validate_shared_context_records_the_verdict_serving_needs(cpu_engine: Path, tmp_path: Path) -> None:
    engine = tmp_path / "engine"
    shutil.copytree(cpu_engine, engine)  # the session's engine is shared: its manifest stays as it is
    result = run_s1omni("validate", str(engine), "--shared-context", "--report", str(tmp_path / "packed.json"))
    assert result.returncode == 0, result.stderr
    assert "PASSED gate cpu-fp32 (packed (shared_context) against alone)" in result.stderr
    report = json.loads((tmp_path / "packed.json").read_text(encoding="utf-8"))
    assert read_manifest(engine)["shared_context"] == {key: value for key, value in report.items() if key != "table"}
    summary = report["summary"]
    same, total = map(int, summary["decisions"].split("/"))
    assert (report["check"], report["cases"]) == ("shared_context", 45) and same == total > 0
    assert summary["span_sets"].split("/")[0] == summary["span_sets"].split("/")[1] and summary["max_probability"] <= 1e-5


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (("--shared-context", "--exact", "X"), "--shared-context judges the engine against itself"),
    ],
)
def test_shared_context_misused_is_a_usage_error(cpu_engine: Path, extra: tuple[str, ...], message: str) -> None:
    result = run_s1omni("validate", str(cpu_engine), *extra)
    assert result.returncode == 2 and message in result.stderr
