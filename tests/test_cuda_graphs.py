"""CUDA-graph runs of the ONNX Runtime runner (``s1omni.runtime.runners.cuda_graphs``), checked on the CPU:
the same bucketed shapes and fixed per-graph buffers, with nothing to capture. The captures themselves
run in ``tests/test_engine_pipeline.py``'s GPU test."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnxruntime
import pytest

from s1omni.runtime.runners import cuda_graphs
from s1omni.runtime.runners.base import Block, Prefix, Tree, text_positions
from s1omni.runtime.runners.cuda_graphs import GRAPH_ID, GraphedSession, bucket
from s1omni.runtime.runners.onnxruntime_runner import OnnxRuntimeRunner
from tests.cuda_builds import build_cuda_engine, needs_cuda, validate_on_the_cpu


@pytest.fixture(scope="module")
def graphed_engine(cuda_engine: Callable[..., tuple[Path, str]]) -> Path:
    """A CUDA build with ``--cuda-graphs`` whose recurrence kernel (``LinearAttention``) also runs on the CPU."""
    return cuda_engine("--gated-delta-kernel", "LinearAttention", "--cuda-graphs")[0]


def _trees(seed: int) -> list[Tree]:
    """Three prefixes of unbucketed lengths, with blocks of several widths and readout counts."""
    rng = np.random.default_rng(seed)

    def block(length: int, reads: int) -> Block:
        return Block(rng.integers(1, 2048, length), np.sort(rng.choice(length, reads, replace=False)))

    return [
        Tree(Prefix(rng.integers(1, 2048, 23)), (block(9, 3), block(17, 1))),
        Tree(Prefix(rng.integers(1, 2048, 5)), (block(11, 11),)),
        Tree(Prefix(rng.integers(1, 2048, 40)), (block(30, 2), block(9, 4), block(3, 1))),
    ]


def _assert_same(got: list[list[np.ndarray]], want: list[list[np.ndarray]], atol: float = 2e-5) -> None:
    for got_tree, want_tree in zip(got, want, strict=True):
        for got_block, want_block in zip(got_tree, want_tree, strict=True):
            assert got_block.shape == want_block.shape
            np.testing.assert_allclose(got_block, want_block, rtol=0, atol=atol)


def test_buckets_cover_every_width_with_at_most_an_eighth_of_padding() -> None:
    widths = range(1, 20_000)
    buckets = [bucket(width) for width in widths]
    assert all(width <= rounded for width, rounded in zip(widths, buckets, strict=True))
    assert all(rounded == width for width, rounded in zip(widths, buckets, strict=True) if width <= 16)
    assert max((rounded - width) / width for width, rounded in zip(widths, buckets, strict=True)) < 0.125
    assert all(bucket(rounded) == rounded for rounded in buckets)  # a bucket is its own bucket
    assert [bucket(width) for width in (17, 129, 600, 2048, 2049)] == [18, 144, 640, 2048, 2304]
    per_octave = {octave: {b for b in set(buckets) if 2**octave < b <= 2 ** (octave + 1)} for octave in range(4, 14)}
    assert all(len(found) == 8 for found in per_octave.values())


def test_the_build_records_cuda_graphs(graphed_engine: Path) -> None:
    manifest = json.loads((graphed_engine / "manifest.json").read_text())
    assert manifest["cuda_graphs"] is True and manifest["target"] == "cuda"


def test_graph_runs_give_the_plain_runs_hidden_states_and_reuse_their_buffers(graphed_engine: Path) -> None:
    plain = OnnxRuntimeRunner(graphed_engine, device="cpu")
    graphed = OnnxRuntimeRunner(graphed_engine, device="cpu", cuda_graphs=True)
    _assert_same(graphed.run(_trees(0)), plain.run(_trees(0)))
    prefill, blocks = (len(session.graphs) for session in graphed._graphs)
    assert prefill == 1 and blocks >= 2  # one left-padded prefill of three rows; blocks grouped by length
    assert len(graphed._row_graphs) == blocks  # each continue graph's state rows gathered by a graph of their own
    _assert_same(graphed.run(_trees(1)), plain.run(_trees(1)))  # new tokens, same shapes: the same graphs
    assert [len(session.graphs) for session in graphed._graphs] == [prefill, blocks]
    assert len(graphed._row_graphs) == blocks
    buffers = next(iter(graphed._graphs[0].graphs.values())).inputs["input_ids"]
    assert buffers.shape() == [3, bucket(40)]  # the widest prefix, rounded up


def _packed_trees(seed: int) -> list[Tree]:
    """17 trees of a 9- and an 8-token block, prefixes 3 to 28 tokens: one length group whose packed call pads
    its rows (17 -> 18), packed width (17 -> 18) and block rows (34 -> 36) to buckets; the first tree's third
    block, of 30 tokens, is a length group of its own (the continue graph's)."""
    rng = np.random.default_rng(seed)

    def block(length: int) -> Block:
        return Block(rng.integers(1, 2048, length), np.sort(rng.choice(length, 2, replace=False)))

    trees = [Tree(Prefix(rng.integers(1, 2048, 3 + 5 * i % 26)), (block(9), block(8))) for i in range(17)]
    trees[0] = Tree(trees[0].prefix, (*trees[0].blocks, block(30)))
    return trees


def test_packed_graph_runs_give_the_plain_packed_runs_hidden_states_in_bucketed_shapes(graphed_engine: Path) -> None:
    plain = OnnxRuntimeRunner(graphed_engine, device="cpu")
    graphed = OnnxRuntimeRunner(graphed_engine, device="cpu", cuda_graphs=True)
    for runner in (plain, graphed):
        runner.open_packed()
    _assert_same(graphed.run_packed(_packed_trees(0)), plain.run_packed(_packed_trees(0)))
    shapes = [dict(key) for key in graphed._packed_graphs.graphs]
    assert [(shape["input_ids"], shape["block_index"], shape["block_owner"]) for shape in shapes] == [((18, 18), (36, 9), (36,))]
    _assert_same(graphed.run_packed(_packed_trees(1)), plain.run_packed(_packed_trees(1)))  # new tokens, same shapes: the same graph
    assert len(graphed._packed_graphs.graphs) == 1
    assert len(graphed._row_graphs) == 2  # the packed call's rows and the 30-token block's


def test_a_replayed_row_gather_reads_each_calls_owners(graphed_engine: Path) -> None:
    """Two calls of the same shapes (two prefixes, three blocks of 9 tokens) whose blocks belong to different
    prefixes: the second replays the first's graphs, the row gather's with the new owners."""
    rng = np.random.default_rng(7)

    def trees(first_blocks: int) -> list[Tree]:
        def blocks(count: int) -> tuple[Block, ...]:
            return tuple(Block(rng.integers(1, 2048, 9), np.array([2, 8])) for _ in range(count))

        # The shorter prefix stays the first row (trees go in ascending order of tokens): it owns two blocks, then one.
        return [Tree(Prefix(rng.integers(1, 2048, 5)), blocks(first_blocks)), Tree(Prefix(rng.integers(1, 2048, 20)), blocks(3 - first_blocks))]

    plain = OnnxRuntimeRunner(graphed_engine, device="cpu")
    graphed = OnnxRuntimeRunner(graphed_engine, device="cpu", cuda_graphs=True)
    for first_blocks in (2, 1):  # owners [0, 0, 1], then [0, 1, 1]
        chosen = trees(first_blocks)
        _assert_same(graphed.run(chosen), plain.run(chosen))
    assert [len(session.graphs) for session in graphed._graphs] == [1, 1] and len(graphed._row_graphs) == 1


def test_a_single_tree_runs_prefill_then_continue_in_fixed_shapes(graphed_engine: Path) -> None:
    plain = OnnxRuntimeRunner(graphed_engine, device="cpu")
    graphed = OnnxRuntimeRunner(graphed_engine, device="cpu", cuda_graphs=True)
    tree = _trees(2)[0]
    state = graphed.prefill(tree.prefix)
    assert state.mask.shape == (1, bucket(23)) and state.mask.sum() == 23  # padded on the left, masked
    want = plain.continue_blocks(plain.prefill(tree.prefix), tree.prefix, tree.blocks)
    _assert_same([graphed.continue_blocks(state, tree.prefix, tree.blocks)], [want])


def test_a_prefix_state_overwritten_by_a_later_prefill_is_refused(graphed_engine: Path) -> None:
    graphed = OnnxRuntimeRunner(graphed_engine, device="cpu", cuda_graphs=True)
    first, second = _trees(3)[0], _trees(4)[0]  # prefixes of one bucket
    state = graphed.prefill(first.prefix)
    graphed.prefill(second.prefix)
    with pytest.raises(RuntimeError, match="overwritten by a later prefill"):
        graphed.continue_blocks(state, first.prefix, first.blocks)


class _Recording:
    """A real session that notes the graph id each run names."""

    def __init__(self, session: onnxruntime.InferenceSession) -> None:
        self.session, self.graph_ids = session, []

    def run_with_iobinding(self, binding: onnxruntime.IOBinding, options: onnxruntime.RunOptions) -> None:
        self.graph_ids.append(int(options.get_run_config_entry(GRAPH_ID)))
        self.session.run_with_iobinding(binding, options)

    def __getattr__(self, name: str):
        return getattr(self.session, name)


def test_each_graph_warms_up_outside_any_graph_before_its_capture(graphed_engine: Path) -> None:
    """The CUDA EP captures a new graph id on its first run once the session has run at all, so a
    larger shape would allocate inside the capture: two runs outside any graph (-1) come first."""
    session = _Recording(onnxruntime.InferenceSession(str(graphed_engine / "prefill.onnx"), providers=["CPUExecutionProvider"]))
    graphs = GraphedSession(session, "cpu", 0)  # type: ignore[arg-type]

    def feeds(width: int) -> dict[str, np.ndarray]:
        return {"input_ids": np.ones((1, width), np.int64), "position_ids": text_positions(0, width)[:, None],
                "attention_mask": np.ones((1, width), np.int64), "readout_index": np.full((1, 1), width - 1, np.int64)}  # fmt: skip

    for width in (16, 16, 64, 16):
        graph = graphs.graph({name: value.shape for name, value in feeds(width).items()}, width)
        assert graph is not None
        graph.run(feeds(width))
    assert session.graph_ids == [-1, -1, 1, 1, -1, -1, 2, 1]


@pytest.mark.parametrize(
    ("limit", "value", "graphs"),
    [("MAX_GRAPHS", 1, [1, 1]), ("MAX_GRAPH_BYTES", 0, [0, 0]), ("MAX_SESSION_GRAPH_BYTES", 0, [0, 0]),
     ("MAX_GRAPH_TOKENS", 0, [0, 0]), ("MAX_GRAPH_TOKENS", 100, [0, 4])],  # fmt: skip
)
def test_shapes_past_the_graph_limits_run_outside_any_graph(
    graphed_engine: Path, monkeypatch: pytest.MonkeyPatch, limit: str, value: int, graphs: list[int]
) -> None:
    """Past the number of graphs, the tokens of a call or the bytes their buffers may take (one's, or all
    of a session's), runs still answer, uncaptured. At 100 tokens the prefill (3 rows of 40) runs
    uncaptured and the four continue calls (the blocks grouped by width, 3 to 33 tokens) are captured,
    reading the uncaptured prefill's state."""
    monkeypatch.setattr(cuda_graphs, limit, value)
    plain = OnnxRuntimeRunner(graphed_engine, device="cpu")
    graphed = OnnxRuntimeRunner(graphed_engine, device="cpu", cuda_graphs=True)
    for seed in (5, 6):
        _assert_same(graphed.run(_trees(seed)), plain.run(_trees(seed)))
    assert [len(session.graphs) for session in graphed._graphs] == graphs
    # The row gathers are captured only from a captured prefill's buffers, within the same limit on graphs.
    assert len(graphed._row_graphs) == (min(graphs[1], cuda_graphs.MAX_GRAPHS) if graphs[0] else 0)
    assert all(session.buffer_bytes <= cuda_graphs.MAX_SESSION_GRAPH_BYTES for session in graphed._graphs)


def test_graphed_engine_answers_as_the_reference_on_the_cpu(graphed_engine: Path, tiny_vela: Path, tmp_path: Path) -> None:
    """``s1omni validate`` runs the engine as it is served, buckets and buffers included: every bound of the
    cpu-fp32 gate holds with the padding."""
    engine = tmp_path / "engine"
    shutil.copytree(graphed_engine, engine)  # the shared build, whose manifest the validation changes
    report = validate_on_the_cpu(engine, tiny_vela, tmp_path / "report.json")
    summary = report["summary"]
    assert report["gate"]["name"] == "cpu-fp32" and summary["layouts_identical"] and summary["usage_identical"]
    assert summary["decisions"] == "340/340" and summary["span_sets"] == "26/26", summary  # the 4 refused questions are held apart, not counted
    assert summary["max_probability"] <= 1e-5 and summary["max_score"] <= 1e-5, summary


@pytest.mark.gpu
@needs_cuda
def test_replays_read_new_inputs_on_the_gpu(exported: Path, tmp_path: Path) -> None:
    """Captured once, replayed with new tokens in the same shapes: the graphs read their buffers anew
    each replay and agree with the plain CUDA runs (float32; kernels may differ with the padded shapes)."""
    engine = tmp_path / "engine"
    build_cuda_engine(exported, engine, "--cuda-graphs")
    plain = OnnxRuntimeRunner(engine, device="cuda", provider_options={"use_tf32": 0})
    graphed = OnnxRuntimeRunner(engine, device="cuda", provider_options={"use_tf32": 0}, cuda_graphs=True)
    for seed in (0, 1, 0, 2):  # the first run captures, the rest replay
        _assert_same(graphed.run(_trees(seed)), plain.run(_trees(seed)), atol=1e-4)
    assert [len(session.graphs) for session in graphed._graphs][0] == 1
    assert len(graphed._row_graphs) == len(graphed._graphs[1].graphs)  # the row gathers replayed as graphs too
    rng = np.random.default_rng(7)
    for first_blocks in (2, 1):  # one pair of graphs, the owners changing between replays
        trees = [Tree(Prefix(rng.integers(1, 2048, 5)), tuple(Block(rng.integers(1, 2048, 9), np.array([8])) for _ in range(first_blocks))),
                 Tree(Prefix(rng.integers(1, 2048, 20)), tuple(Block(rng.integers(1, 2048, 9), np.array([8])) for _ in range(3 - first_blocks)))]  # fmt: skip
        _assert_same(graphed.run(trees), plain.run(trees), atol=1e-4)
    # A far larger shape once the sessions have run, still under MAX_GRAPH_TOKENS: captured after its own
    # warm-up runs (the 4B member's 6,942-token case failed inside the capture without them).
    width = cuda_graphs.MAX_GRAPH_TOKENS - 96
    long = [Tree(Prefix(rng.integers(1, 2048, width)), (Block(rng.integers(1, 2048, 700), np.arange(0, 700, 7)),))]
    _assert_same(graphed.run(long), plain.run(long), atol=1e-4)
    assert [len(session.graphs) for session in graphed._graphs][0] == 3
