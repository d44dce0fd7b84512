"""The ONNX Runtime runner: the exported ``prefill.onnx`` and ``continue.onnx`` on the CPU or CUDA EP.

``run`` batches the trees it is given as the reference batches a request's trees (``tree_batches``: at most
32 trees and 24,576 padded tokens a batch); per batch, the prefixes left-padded into one prefill call,
then its blocks right-padded into continue calls grouped by length, each block reading its owner's
state row. The bound keeps a call's memory finite: the fused graphs attend unchunked, so a prefill's
scores grow as rows x width^2 (one of 15 rows x 5,632 tokens, a merged batch with a windowed span
request, asked ONNX Runtime for 15 GB score tensors on the H200 and failed: benchmarks/h200-0.8B-mixers). The
state stays in ONNX Runtime values between the two calls (on the GPU under CUDA, through I/O
binding); a small Gather graph picks the owners' rows, so only token ids go in and only the
hidden states at the readouts come out.

Vision members' prefill graphs take ``inputs_embeds`` instead of token ids: the runner looks the
prefix tokens up in the engine's embedding table (the tied embedding, float32) and puts each
prefix's image features (``Prefix.embeds``) at its placeholders (``Prefix.embed_index``), as the
reference runner does before its forward; the blocks still go in as token ids.

With ``cuda_graphs`` (an engine built with ``--cuda-graphs``) both graphs run as CUDA graphs
(``s1omni.runtime.runners.cuda_graphs``, calls of up to ``MAX_GRAPH_TOKENS`` tokens): prefix widths, block
widths and readout counts are rounded up to buckets (prefixes padded on the left and masked, blocks
and readouts on the right), each shape's inputs are copied into its graph's buffers, and the blocks'
state rows are gathered straight into the continue graph's. A prefix state then lives in its graph's
buffers until the next prefill of the same shape, which ``continue_blocks`` checks; the gather from them
is a captured graph as well, one per pair of prefill and continue graphs (as a plain run it launches a
Gather per state tensor, 48 on the 0.8B member, each through ONNX Runtime's executor).

``run_packed`` (the ``shared_context`` profile, engines whose export has ``packed.onnx``; ``open_packed``
loads it) runs each batch's prefill as ``run`` does, then each length group of its blocks in one call of
the packed graph, each tree's blocks one after another in one row (``s1omni.runtime.runners.packing``),
reading the prefix state where the prefill left it: at most one copy of it per call, never one per
block. With ``cuda_graphs`` the packed calls are CUDA graphs too: their sizes (rows, packed and block
widths, block and readout counts) round up to buckets (``pack_blocks``), padded prefix rows repeat the
first row's state, and the rows' state is gathered straight into the graph's buffers, as for continue.

On CUDA the sessions take the graphs' weights from one copy of them on the device for the whole process
(``s1omni.runtime.runners.device_weights``): the prefill, continue and packed graphs of every instance read it.

Float32 inputs, outputs and state throughout. On CUDA the engine's manifest says how its matmuls
run: float32 (``fp32``), on TF32 tensor cores (``tf32``), or with the weight GEMMs in bfloat16
(``bf16``, rewritten at build time by ``s1omni.export.bf16_gemms``); every CUDA engine is held to the GPU gate.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime
from onnx import TensorProto, helper

from ..errors import EnvironmentMissing
from .base import Block, BlockReady, Prefix, Tree, pad_blocks, text_positions
from .capture_lock import device_run
from . import cuda_graphs
from .cuda_graphs import UNCAPTURED, Graph, GraphedSession, bucket, capture_options, run_options
from .device_weights import device_weights
from .packing import pack_blocks

# The opset and IR version of the small graphs the runtime writes itself (the row gather here, OmniJev's
# option log-probabilities): onnx writes its newest IR version by default; ONNX Runtime reads up to its own.
GATHER_OPSET = 18
GATHER_IR_VERSION = 8
# The custom op library an engine may carry (s1omni.export.gdn_library), registered with its sessions.
OP_LIBRARY = "libs1omni_gdn.so"
# A continue call may pad its blocks to at most this many times their tokens; wider spreads split.
PADDING_SLACK = 1.25
# What one call fewer is worth, in padded tokens (``length_groups``; ``OnnxRuntimeRunner.call_cost_tokens``). On
# the CUDA EP a call has a fixed cost, its ~1,000 kernels a few us each however few its tokens: the bf16 CUDA-graph
# engines' backbone times on an H100 (benchmarks/h100-convolution-heads) fit 6.4 ms + 7.2 us a token on the 0.8B
# member and 13.7 ms + 18.9 us on the 4B, a call worth ~900 and ~700 tokens, so 512 there would merge the router
# request's four short blocks into fewer calls. Timed on the 0.8B's validated engine (benchmarks/h100-call-groups,
# ab.py, H100): 512 made three calls of the four and the request 10% faster (p50 36.9 against 40.9 ms), 1,024 two
# calls and slower (43.4 ms); both changed some heads' answers from length grouping's (the padded blocks' bfloat16
# sums), and no engine has passed its gate grouped that way. So every runner groups by length alone; on the CPU a
# call costs its tokens (the tiny member's router request: 215 ms in four continue calls, 241 in three, 298 in two).
DEFAULT_CALL_COST_TOKENS = 0
# The reference's exact batching of a request's trees (vela2-decoder.md §2.9, from
# vllm-project/semantic-router:src/model-runtime/vllm_srun/families/vela2/members.py): a batch closes
# before it would pass 32 trees, or its widest tree x its tree count would pass 24,576 tokens.
MAX_BATCH_TREES = 32
MAX_BATCH_PADDED_TOKENS = 24_576


@dataclass(frozen=True)
class PrefixState:
    """What ``prefill`` returns: the state tensors of ``len(mask)`` prefixes, their key masks and block starts."""

    values: list[onnxruntime.OrtValue]  # one per state name, batch-major
    mask: np.ndarray  # int64 [B, P]: 1 where a prefix key is real (prefixes are left-padded)
    starts: np.ndarray  # int64 [B]: the position each prefix's blocks start at
    graph: Graph | None = None  # the CUDA graph whose buffers hold ``values``
    graph_run: int = 0  # ``graph.runs`` when they were written


def device_of(device: str) -> tuple[str, int]:
    """``cpu``, ``cuda`` or ``cuda:N`` as ONNX Runtime takes it: the kind (``cpu`` or ``cuda``) and the device id."""
    kind, _, index = str(device).partition(":")
    return ("cuda" if kind == "cuda" else "cpu"), int(index or 0)


def providers(device: str, device_id: int, options: Mapping[str, object]) -> list:
    """The execution providers of an engine on ``device``; ``options`` go to the CUDA EP (TF32 off unless they say so)."""
    if device == "cuda":
        # The CUDA EP dlopens cuBLAS/cuDNN by name: load them from the nvidia-* wheels torch brought.
        onnxruntime.preload_dlls()
        return [("CUDAExecutionProvider", {"use_tf32": 0, **options, "device_id": device_id}), "CPUExecutionProvider"]
    return ["CPUExecutionProvider"]


def session_options(device: str, engine_dir: Path) -> onnxruntime.SessionOptions:
    """The backbone sessions' options: on the CPU without ONNX Runtime's memory arena, which keeps the
    largest call's buffers (grown in powers of two) for the session's life, so a served engine would
    hold a long request's peak after it. Validating the tiny member (45 cases) peaks at 1.28 GB with it
    and 1.04 GB without (6.3 GB without it when attention was unchunked); the arena saves a third of
    the CPU time of the 18,557-token case (6.2 s against 9.5 s on 2 cores). An engine built with
    ``--gated-delta-kernel ChunkedGatedDeltaRule`` carries its op library (``OP_LIBRARY``), registered here."""
    options = onnxruntime.SessionOptions()
    options.enable_cpu_mem_arena = device != "cpu"
    if (engine_dir / OP_LIBRARY).is_file():
        options.register_custom_ops_library(str(engine_dir / OP_LIBRARY))
    return options


def embed(table: np.ndarray, prefixes: Sequence[Prefix], ids: np.ndarray) -> np.ndarray:
    """``[B, W, H]``: the left-padded prefix ids looked up in ``table``, image features at their placeholders."""
    embeds = table[ids]
    width = ids.shape[1]
    for row, prefix in enumerate(prefixes):
        if prefix.embeds is not None:
            embeds[row, width - len(prefix.ids) + np.asarray(prefix.embed_index)] = prefix.embeds
    return embeds


def _ascending_groups(sizes: Sequence[int], fits: Callable[[int, int, int], bool]) -> list[list[int]]:
    """Indices of ``sizes`` in ascending order of size, in groups each closed before the next index
    would make ``fits(count, widest, total)`` false (the newest is the widest); a lone index always fits."""
    groups: list[list[int]] = []
    current: list[int] = []
    total = 0
    for index in sorted(range(len(sizes)), key=lambda i: sizes[i]):
        size = sizes[index]
        if current and not fits(len(current) + 1, size, total + size):
            groups.append(current)
            current, total = [], 0
        current.append(index)
        total += size
    if current:
        groups.append(current)
    return groups


def tree_batches(tokens: Sequence[int]) -> list[list[int]]:
    """Indices of trees of these total ``tokens`` (prefix and blocks) in batches, in ascending order of
    tokens, each closed before it passes ``MAX_BATCH_TREES`` or ``MAX_BATCH_PADDED_TOKENS``; a tree over
    the token bound alone is a batch of its own."""
    return _ascending_groups(tokens, lambda count, widest, _: count <= MAX_BATCH_TREES and widest * count <= MAX_BATCH_PADDED_TOKENS)


def length_groups(lengths: Sequence[int], slack: float, call_tokens: int = 0) -> list[list[int]]:
    """Indices of ``lengths`` in groups whose padded size (widest x count) stays within ``slack`` x
    their tokens, or adds at most ``call_tokens`` padded tokens (what a call more would cost): one
    continue call per group, so a short block is not padded to the longest."""
    return _ascending_groups(
        lengths, lambda count, widest, total: widest * count <= slack * total or widest * count - total <= call_tokens
    )


def longest_first(groups: list[list[int]], lengths: Sequence[int]) -> list[list[int]]:
    """``length_groups``'s groups, the one holding the longest block first: its heads (a span block's, the
    most CPU work of a request) then run while the other groups' forwards do."""
    return sorted(groups, key=lambda group: -max(lengths[i] for i in group))


def row_gather_graph(names: Sequence[str]) -> bytes:
    """``gathered.i = Gather(state.i, index)`` along the batch axis for every state tensor."""
    nodes, inputs, outputs = [], [helper.make_tensor_value_info("index", TensorProto.INT64, ["rows"])], []
    for i, _ in enumerate(names):
        inputs.append(helper.make_tensor_value_info(f"state.{i}", TensorProto.FLOAT, None))
        outputs.append(helper.make_tensor_value_info(f"gathered.{i}", TensorProto.FLOAT, None))
        nodes.append(helper.make_node("Gather", [f"state.{i}", "index"], [f"gathered.{i}"], axis=0))
    graph = helper.make_graph(nodes, "state_rows", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", GATHER_OPSET)], ir_version=GATHER_IR_VERSION)
    return model.SerializeToString()


class OnnxRuntimeRunner:
    name = "onnxruntime"

    def __init__(
        self,
        engine_dir: str | Path,
        device: str = "cpu",
        embedding: np.ndarray | None = None,
        precision: str = "fp32",
        provider_options: Mapping[str, object] | None = None,
        cuda_graphs: bool = False,
        share_weights: bool | None = None,
    ):
        """``embedding`` ``[vocabulary, hidden]``: the table a prefill graph taking ``inputs_embeds`` needs;
        ``precision``, ``provider_options`` and ``cuda_graphs``: the engine manifest's (``s1omni.export.build``).
        ``cuda_graphs`` on the CPU runs the same bucketed fixed-buffer path with nothing to capture.
        ``share_weights`` (default: on CUDA): the graphs' external weights come from the process's one copy
        of them on the device (``device_weights``), shared with every other runner of the engine."""
        engine_dir = Path(engine_dir)
        self.device, self._device_id = device_of(device)
        self.precision = precision
        # Padded tokens a call fewer is worth when blocks are grouped (``length_groups``); an attribute, so that one
        # process can time groupings side by side (benchmarks/h100-call-groups/ab.py).
        self.call_cost_tokens = DEFAULT_CALL_COST_TOKENS
        backbone = providers(self.device, self._device_id, {**(provider_options or {}), **capture_options(cuda_graphs, self.device)})
        share = self.device == "cuda" if share_weights is None else share_weights
        self.weights = device_weights(engine_dir, self.device, self._device_id) if share else None
        self._engine_dir, self._backbone = engine_dir, backbone
        self._prefill = self._session("prefill.onnx")
        self._continue = self._session("continue.onnx")
        self._graphs = (
            (GraphedSession(self._prefill, self.device, self._device_id), GraphedSession(self._continue, self.device, self._device_id))
            if cuda_graphs
            else None
        )
        # A graph-enabled session's runs outside every graph say so (see ``cuda_graphs``).
        self._uncaptured = run_options(UNCAPTURED) if cuda_graphs else None
        if self.device == "cuda" and "CUDAExecutionProvider" not in self._prefill.get_providers():
            raise EnvironmentMissing("onnxruntime has no CUDA execution provider here (pip install 's1omni[gpu]', without onnxruntime)")
        self._embedding = embedding
        first = self._prefill.get_inputs()[0].name
        if (first == "inputs_embeds") != (embedding is not None):
            wanted = "an embedding table" if embedding is None else "no embedding table"
            raise ValueError(f"{engine_dir}: prefill.onnx takes {first}, so its runner needs {wanted}")
        outputs = self._prefill.get_outputs()
        self.hidden_size = int(outputs[0].shape[-1])
        self._names = [output.name for output in outputs[1:]]
        expected = {f"past_{name}" for name in self._names}
        if expected - {value.name for value in self._continue.get_inputs()}:
            raise ValueError(f"{engine_dir}: continue.onnx does not take the state prefill.onnx returns")
        # The state-row gather is captured too, as one graph per (prefill graph, continue or packed graph) pair
        # (``_gather_rows``): a plain run launches one Gather per state tensor through ONNX Runtime's executor.
        self._rows = onnxruntime.InferenceSession(row_gather_graph(self._names), providers=backbone)
        self._row_graphs: dict[tuple[int, int], Graph] = {}
        self._packed: onnxruntime.InferenceSession | None = None
        self._packed_graphs: GraphedSession | None = None

    def _session(self, graph: str) -> onnxruntime.InferenceSession:
        options = session_options(self.device, self._engine_dir)
        if self.weights is not None:
            self.weights.add_to(options, self._engine_dir / graph)
        return onnxruntime.InferenceSession(str(self._engine_dir / graph), options, providers=self._backbone)

    @property
    def can_pack(self) -> bool:
        """Whether the engine has the packed graph ``run_packed`` runs (exports before it have none)."""
        return (self._engine_dir / "packed.onnx").is_file()

    def open_packed(self) -> None:
        """Load the packed graph (a third session: only servers that enable ``shared_context`` or ``batching``
        pay for it, with its own copy of the weights where they are not shared)."""
        if self._packed is None:
            if not self.can_pack:
                raise ValueError(f"{self._engine_dir} has no packed.onnx: export and build the engine again for shared_context")
            self._packed = self._session("packed.onnx")
            if self._graphs:
                self._packed_graphs = GraphedSession(self._packed, self.device, self._device_id)

    @device_run
    def prefill(self, prefix: Prefix) -> PrefixState:
        return self._prefill_batch([prefix])

    @device_run
    def continue_blocks(self, state: PrefixState, prefix: Prefix, blocks: Sequence[Block]) -> list[np.ndarray]:
        """Hidden states at each block's readouts, every block continuing from ``state`` (one prefix)."""
        if not blocks:
            return []
        return self._continue_grouped(state, np.zeros(len(blocks), np.int64), blocks)

    @device_run
    def run(self, trees: Sequence[Tree], ready: BlockReady | None = None) -> list[list[np.ndarray]]:
        """Per batch of ``tree_batches``, one prefill call, then its blocks in continue calls grouped by
        length, the longest group first (trees without blocks are skipped); each group's blocks go to
        ``ready`` once their call is done."""
        busy = [index for index, tree in enumerate(trees) if tree.blocks]
        out: list[list[np.ndarray]] = [[] for _ in trees]
        for batch in tree_batches([trees[index].tokens for index in busy]):
            chosen = [busy[position] for position in batch]
            state = self._prefill_batch([trees[index].prefix for index in chosen])
            owners = np.array([row for row, index in enumerate(chosen) for _ in trees[index].blocks], np.int64)
            places = [(index, number) for index in chosen for number in range(len(trees[index].blocks))]
            done = None if ready is None else lambda position, rows: ready(*places[position], rows)
            hidden = iter(self._continue_grouped(state, owners, [block for index in chosen for block in trees[index].blocks], done))
            for index in chosen:
                out[index] = [next(hidden) for _ in trees[index].blocks]
        return out

    @device_run
    def run_packed(self, trees: Sequence[Tree], ready: BlockReady | None = None) -> list[list[np.ndarray]]:
        """``run``'s answers from the packed graph (``open_packed`` first): per batch of ``tree_batches`` one
        prefill call, then per length group of its blocks (``length_groups``, as ``run`` groups them, so
        that a block row is not padded to a much longer block's width) one packed call, whose rows are
        the group's trees, each holding its blocks of the group one after another. A group of one block
        per tree runs as ``run`` runs it (the continue graph): a row of one block has nothing to pack, and
        the packed graph attends to a block's own keys unchunked where the CPU's continue graph attends
        64 queries at a time. Groups run and reach ``ready`` as in ``run``."""
        if self._packed is None:
            raise RuntimeError("the packed graph is not loaded: open_packed() first")
        busy = [index for index, tree in enumerate(trees) if tree.blocks]
        out: list[list[np.ndarray]] = [[np.empty(0)] * len(tree.blocks) for tree in trees]
        for batch in tree_batches([trees[index].tokens for index in busy]):
            chosen = [busy[position] for position in batch]
            state = self._prefill_batch([trees[index].prefix for index in chosen])
            places = [(row, number) for row, index in enumerate(chosen) for number in range(len(trees[index].blocks))]
            lengths = [len(trees[chosen[row]].blocks[number].ids) for row, number in places]
            for group in longest_first(length_groups(lengths, PADDING_SLACK, self.call_cost_tokens), lengths):
                taken = sorted(places[i] for i in group)
                rows = sorted({row for row, _ in taken})
                blocks = [[trees[chosen[row]].blocks[number] for owner, number in taken if owner == row] for row in rows]
                if len(taken) == len(rows):  # a block a row packs nothing: the continue graph's call, exact's own
                    hidden = iter(self._continue_batch(state, np.array(rows, np.int64), [row[0] for row in blocks]))
                else:
                    hidden = iter(self._packed_call(state, np.array(rows, np.int64), blocks))
                for row, number in taken:
                    out[chosen[row]][number] = next(hidden)
                    if ready is not None:
                        ready(chosen[row], number, out[chosen[row]][number])
        return out

    def _packed_call(self, state: PrefixState, rows: np.ndarray, blocks: Sequence[Sequence[Block]]) -> list[np.ndarray]:
        """One packed call over ``blocks`` (per prefix row of ``state`` in ``rows``, its blocks); their hidden
        states in order. A call of some of the state's rows reads a copy of those rows (one per prefix)."""
        self._check_current(state)
        graphs = self._packed_graphs
        if graphs is not None:  # padded rows: the first row's prefix again, without blocks
            extra = bucket(len(rows)) - len(rows)
            rows, blocks = np.concatenate([rows, np.full(extra, rows[0], np.int64)]), [*blocks, *[[]] * extra]
        packed = pack_blocks(blocks, state.starts[rows], bucket if graphs is not None else None)
        feeds = {**packed.feeds, "past_mask": state.mask[rows]}
        tokens = max(feeds["input_ids"].size, feeds["block_index"].size)
        graph = self._replay(graphs, state, rows, feeds, tokens) if graphs is not None else None
        if graph is not None:
            return packed.split(graph.outputs["hidden"].numpy())
        every = len(rows) == len(state.starts) and bool((rows == np.arange(len(rows))).all())
        values = state.values if every else self._owner_rows(state, rows)
        binding = self._packed.io_binding()
        for name, value in feeds.items():
            binding.bind_cpu_input(name, value)
        for name, value in zip(self._names, values, strict=True):
            binding.bind_ortvalue_input(f"past_{name}", value)
        binding.bind_output("hidden", "cpu")
        self._packed.run_with_iobinding(binding, self._uncaptured)
        return packed.split(binding.copy_outputs_to_cpu()[0])

    def _prefill_batch(self, prefixes: Sequence[Prefix]) -> PrefixState:
        width = max(len(prefix.ids) for prefix in prefixes)
        width = bucket(width) if self._graphs else width
        ids = np.zeros((len(prefixes), width), np.int64)
        mask = np.zeros((len(prefixes), width), np.int64)
        positions = np.zeros((3, len(prefixes), width), np.int64)
        for row, prefix in enumerate(prefixes):
            if prefix.embeds is not None and self._embedding is None:
                raise ValueError("this engine's prefill takes token ids: it has no place for image embeddings")
            length = len(prefix.ids)
            ids[row, width - length :] = prefix.ids
            mask[row, width - length :] = 1
            positions[:, row, width - length :] = prefix.positions if prefix.positions is not None else text_positions(0, length)
        first = {"input_ids": ids} if self._embedding is None else {"inputs_embeds": embed(self._embedding, prefixes, ids)}
        feeds = {**first, "position_ids": positions, "attention_mask": mask, "readout_index": np.full((len(prefixes), 1), width - 1, np.int64)}
        starts = np.array([prefix.start for prefix in prefixes], np.int64)
        graph = self._graphs[0].graph({name: value.shape for name, value in feeds.items()}, ids.size) if self._graphs else None
        if graph is not None:
            graph.run(feeds)
            values = [graph.outputs[name] for name in self._names]
            return PrefixState(values=values, mask=mask, starts=starts, graph=graph, graph_run=graph.runs)
        binding = self._prefill.io_binding()
        for name, value in feeds.items():
            binding.bind_cpu_input(name, value)
        binding.bind_output("hidden", "cpu")  # one readout per row, unused: the blocks' readouts are what counts
        for name in self._names:
            binding.bind_output(name, self.device, self._device_id)
        self._prefill.run_with_iobinding(binding, self._uncaptured)
        return PrefixState(values=binding.get_outputs()[1:], mask=mask, starts=starts)

    def _continue_grouped(self, state: PrefixState, owners: np.ndarray, blocks: Sequence[Block],
                          done: Callable[[int, np.ndarray], None] | None = None) -> list[np.ndarray]:  # fmt: skip
        """``_continue_batch`` over length groups (see ``length_groups``), the longest first; results in block
        order, and each block's to ``done`` (its index, its rows) as its call ends."""
        out: list[np.ndarray] = [np.empty(0)] * len(blocks)
        lengths = [len(block.ids) for block in blocks]
        for group in longest_first(length_groups(lengths, PADDING_SLACK, self.call_cost_tokens), lengths):
            for index, hidden in zip(group, self._continue_batch(state, owners[group], [blocks[i] for i in group]), strict=True):
                out[index] = hidden
                if done is not None:
                    done(index, hidden)
        return out

    @staticmethod
    def _check_current(state: PrefixState) -> None:
        """Refuse a prefix state that a later prefill of the same shape overwrote (CUDA graph buffers)."""
        if state.graph is not None and state.graph.runs != state.graph_run:
            raise RuntimeError("this prefix state was overwritten by a later prefill of the same shape (CUDA graph buffers)")

    def _continue_batch(self, state: PrefixState, owners: np.ndarray, blocks: Sequence[Block]) -> list[np.ndarray]:
        self._check_current(state)
        ids, readouts = pad_blocks(blocks, bucket if self._graphs else None)
        width = ids.shape[1]
        positions = (state.starts[owners][:, None] + np.arange(width, dtype=np.int64)[None, :])[None].repeat(3, axis=0)
        feeds = {"input_ids": ids, "position_ids": positions, "past_mask": state.mask[owners], "readout_index": readouts}
        graph = self._replay(self._graphs[1], state, owners, feeds, ids.size) if self._graphs else None
        if graph is not None:
            hidden = graph.outputs["hidden"].numpy()
        else:
            binding = self._continue.io_binding()
            for name, value in feeds.items():
                binding.bind_cpu_input(name, value)
            for name, value in zip(self._names, self._owner_rows(state, owners), strict=True):
                binding.bind_ortvalue_input(f"past_{name}", value)
            binding.bind_output("hidden", "cpu")
            self._continue.run_with_iobinding(binding, self._uncaptured)
            hidden = binding.copy_outputs_to_cpu()[0]
        return [hidden[row, : len(block.readouts)] for row, block in enumerate(blocks)]

    def _replay(self, graphs: GraphedSession, state: PrefixState, owners: np.ndarray, feeds: Mapping[str, np.ndarray],
                tokens: int) -> Graph | None:  # fmt: skip
        """The captured graph of a call continuing from ``state`` (its ``owners`` rows, gathered into the graph's
        buffers), run on ``feeds``; None where ``graphs`` does not capture a call of these shapes."""
        past = {f"past_{name}": [len(owners), *value.shape()[1:]] for name, value in zip(self._names, state.values, strict=True)}
        graph = graphs.graph({**{name: value.shape for name, value in feeds.items()}, **past}, tokens)
        if graph is not None:
            self._gather_rows(state, owners, graph, list(past))
            graph.run(feeds)
        return graph

    def _gather_rows(self, state: PrefixState, owners: np.ndarray, graph: Graph, names: Sequence[str]) -> None:
        """``owners``' rows of ``state`` into ``graph``'s inputs ``names``: replayed as a graph of the row gather
        where the state lives in a prefill graph's buffers (one per pair of graphs, at most ``MAX_GRAPHS``), else
        a plain run."""
        into = [graph.inputs[name] for name in names]
        key = (id(state.graph), id(graph))
        rows = self._row_graphs.get(key)
        if rows is None and state.graph is not None and len(self._row_graphs) < cuda_graphs.MAX_GRAPHS:
            index = onnxruntime.OrtValue.ortvalue_from_shape_and_type([len(owners)], np.int64, self.device, self._device_id)
            binding = self._row_binding(state, into)
            binding.bind_ortvalue_input("index", index)
            rows = Graph(self._rows, {"index": index}, dict(zip(names, into, strict=True)), binding, run_options(len(self._row_graphs) + 1))
            self._row_graphs[key] = rows
        if rows is None:
            self._owner_rows(state, owners, into=into)
        else:
            rows.run({"index": owners})

    def _owner_rows(
        self, state: PrefixState, owners: np.ndarray, into: Sequence[onnxruntime.OrtValue] | None = None
    ) -> list[onnxruntime.OrtValue]:
        """Each block's row of every state tensor, gathered where the state lives (into the buffers ``into``, if given)."""
        binding = self._row_binding(state, into)
        binding.bind_cpu_input("index", owners)
        self._rows.run_with_iobinding(binding, self._uncaptured)
        return binding.get_outputs()

    def _row_binding(self, state: PrefixState, into: Sequence[onnxruntime.OrtValue] | None) -> onnxruntime.IOBinding:
        """The row gather's binding of ``state``'s tensors and of its outputs (into ``into``, or new values where the
        state lives); the caller binds the index."""
        binding = self._rows.io_binding()
        for i, value in enumerate(state.values):
            binding.bind_ortvalue_input(f"state.{i}", value)
            if into is None:
                binding.bind_output(f"gathered.{i}", self.device, self._device_id)
            else:
                binding.bind_ortvalue_output(f"gathered.{i}", into[i])
        return binding
