"""A Vela 2.0 decoder member bound to a backbone runner: plan, execute, finish.

The same class serves the torch reference (from a verified package) and every engine (from an
engine directory): only the runner differs. Heads run on the CPU in float32 on the hidden states
the runner returns at the readout positions.

Every request has a scan budget: ``options.max_tokens``, else ``limits.max_scan_tokens`` (four
inputs on a CPU, 32 on a GPU). A question reading a part past it fails with
``scan_budget_exceeded`` unless it truncates (``overflow: truncate``), reading the first tokens.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..cpu_heads import heads_pool, readout_threads
from ..errors import DEADLINE_EXCEEDED, MAX_LENGTH_EXCEEDED, SCAN_BUDGET_EXCEEDED, RequestError, UsageError, item_error
from ..identity import Identity, identity_of
from ..package import VerifiedPackage
from ..runners.base import BackboneRunner, BlockReady, Tree, numerics
from .answers import Answerer, RawRow, RawSpan
from .calibration import BROAD, ROUTER, Calibration
from .dispatch import Dispatcher
from .heads import CandidateHead, SpanHead, read_tensors
from .layout import DecoderLayout, EncodedPart, RenderedBlock, Row, RowTrees, SchemaTooLong, Tokens, runner_tree
from .request import MAX_LABELS, MAX_LEVELS, MAX_OPTIONS, MIN_LEVELS, MIN_OPTIONS, QUESTION_TYPES, QuestionReader, ReadRequest

UNCOVERED_LOGIT = -30.0
# The default scan budget (``limits.max_scan_tokens``) in member inputs: four on a CPU, 32 on a GPU
# (vela2-decoder.md §4.4, wire-contract.md §5); ``options.max_tokens`` replaces it per request.
CPU_SCAN_INPUTS, GPU_SCAN_INPUTS = 4, 32
HEAD_PREFIXES = ("head.", "set_bias", "span2.")
# The readiness request of the reference family (vllm_srun/families/vela2/family.py GOLDEN_*).
GOLDEN_REQUEST = {
    "state": {
        "request": "Hi, I'm Tom Baker (tom.baker@example.com). What is the maximum daily dose of paracetamol for an adult?",
        "source": "For adults, the maximum dose of paracetamol is 4 grams in 24 hours.",
        "answer": "Adults can take up to 6 grams of paracetamol in 24 hours.",
    },
    "questions": {
        "domain": {
            "type": "choice",
            "instructions": "Which subject area is this request about?",
            "over": "request",
            "criteria": {
                "health": "medicine, clinical practice or nutrition",
                "math": "arithmetic, algebra or statistics",
                "other": "a subject that fits none of the listed areas",
            },
        },
        "jailbreak": {"type": "noul", "instructions": "Is this a prompt injection or jailbreak attempt?", "over": "request"},
        "urgency": {
            "type": "score",
            "instructions": "How urgent is this request?",
            "over": "request",
            "criteria": ["Routine", "Needs prompt attention", "Critical"],
        },
        "topics": {
            "type": "set",
            "instructions": "Which topics does the request mention?",
            "over": "request",
            "criteria": {"medication": "drugs or doses", "billing": "payments or invoices"},
        },
        "pii": {"preset": "pii", "over": "request"},
        "halu": {"preset": "halu"},
    },
}


@dataclass
class Vela2Plan:
    """A validated, tokenized request: its rows (None where the schema does not fit) and trees."""

    request: ReadRequest
    rows: list[tuple[Row, RowTrees | None]]
    trees: list[tuple[Tree, list[RenderedBlock]]] = field(default_factory=list)
    input_tokens: int = 0

    @property
    def question_count(self) -> int:
        return len(self.request.question_ids)

    @property
    def valid_count(self) -> int:
        return len(self.request.questions)

    def reasons(self) -> str:
        return "; ".join(f"{qid}: {error.get('message', error['error'])}" for qid, error in self.request.errors.items())


class PlanHidden(list):
    """One plan's entry of ``Vela2Model.forward``: per tree, per block, the hidden states at its readouts; and
    ``heads``, the head output of each read block (by ``id`` of its ``RenderedBlock``), begun on ``_HEAD_READOUTS``
    as soon as the runner handed the block over. The runner runs the longest blocks first (a span block carries
    its text again), so on a GPU the span head, most of a request's CPU work, and the candidate heads of all but
    the last call's blocks overlap the forwards of the other blocks (``benchmarks/README.md``, "Span heads during the forward")."""

    def __init__(self) -> None:
        super().__init__()
        self.heads: dict[int, Future[np.ndarray]] = {}


# Heads begun during a forward: a span head fans its word chunks out to the span head's own threads.
_HEAD_READOUTS = heads_pool(readout_threads(), "s1omni-head-readout")


def head_tensors(package: VerifiedPackage) -> dict[str, np.ndarray]:
    """Every head tensor of a verified package as float32: candidate head, set bias, both span heads."""
    root = package.root
    heads = read_tensors([root / name for name in package.details["shards"]], HEAD_PREFIXES)
    if package.details["broad_head"]:
        heads |= read_tensors([root / "broad_head.safetensors"], ("span_broad.",))
    return heads


class Vela2Model:
    family = "vela2"
    validation: dict[str, Any] | None = None  # a validated engine's: the gate it met (``runtime.engine.served_validation``)
    packed_check: dict[str, Any] | None = None  # an engine's packed forwards against exact (``s1omni validate --shared-context``)
    merged_packed_check: dict[str, Any] | None = None  # its merged packed forwards against alone (``--merged N --shared-context``)
    # Whether candidate heads start during the forward too, as span heads do (off: after it, for an A/B of the two)
    early_candidates = True

    def __init__(
        self,
        identity: Identity,
        config: dict[str, Any],
        calibration: dict[str, Any],
        tokenizer_path: Path,
        heads: dict[str, np.ndarray],
        runner: BackboneRunner,
        noul_calibration: bool | None = None,
    ):
        from tokenizers import Tokenizer

        self.identity = identity
        self.id = identity.name
        self.config = config
        self.runner = runner
        self.engine = runner.name
        self.device = runner.device
        self.calibration = Calibration(calibration)
        self.candidate = CandidateHead({k[5:]: v for k, v in heads.items() if k.startswith("head.")})
        self.set_bias = np.float32(heads["set_bias"])
        self.spans = {ROUTER: SpanHead({k[6:]: v for k, v in heads.items() if k.startswith("span2.")}, "span2.")}
        broad = {k[11:]: v for k, v in heads.items() if k.startswith("span_broad.")}
        if broad:
            self.spans[BROAD] = SpanHead(broad, "span_broad.")
        tokenizer = Tokenizer.from_file(str(tokenizer_path))
        tokenizer.no_padding()
        tokenizer.no_truncation()
        self.tokens = Tokens(tokenizer)
        self.reader = QuestionReader(self.calibration, broad_head=BROAD in self.spans)
        self.layout = DecoderLayout(config, Dispatcher(self.calibration, BROAD in self.spans), self.tokens)
        enabled = self.calibration.noul_default() if noul_calibration is None else noul_calibration
        self.max_input_tokens = int(config["max_length"])
        scan_inputs = CPU_SCAN_INPUTS if self.device == "cpu" else GPU_SCAN_INPUTS
        self.max_scan_tokens = scan_inputs * self.max_input_tokens
        # What ``overflow: truncate`` reads of a part: one input on a CPU, the scan budget on a GPU.
        self.truncate_tokens = self.max_input_tokens if self.device == "cpu" else self.max_scan_tokens
        self.answerer = Answerer(self.calibration, noul_calibration=enabled, report_heads=BROAD in self.spans)

    @classmethod
    def from_package(cls, package: VerifiedPackage, device: str = "cpu", precision: str | None = None) -> Vela2Model:
        """The torch reference runner over a verified package."""
        from ..runners.torch_runner import TorchRunner

        details = package.details
        shards = [package.root / name for name in details["shards"]]
        runner = TorchRunner.from_package(details["config"]["backbone_config"], shards, device, precision)
        config, calibration = details["config"], details["calibration"]
        return cls(identity_of(package), config, calibration, package.root / "tokenizer.json", head_tensors(package), runner)

    # -- the card --------------------------------------------------------------------------------

    def card(self) -> dict[str, Any]:
        identity = self.identity
        card: dict[str, Any] = {
            "id": self.id,
            "object": "model",
            "owned_by": identity.repo.split("/")[0],
            "family": self.family,
            "repo": identity.repo,
            "revision": identity.revision,
            "model_sha256": identity.model_sha256,
            "manifest_sha256": identity.manifest_sha256,
            "surfaces": ["decisions"],
            "question_types": list(QUESTION_TYPES),
            "limits": {
                "max_input_tokens": self.max_input_tokens,
                "max_scan_tokens": self.max_scan_tokens,
                "min_options": MIN_OPTIONS,
                "max_options": MAX_OPTIONS,
                "min_levels": MIN_LEVELS,
                "max_levels": MAX_LEVELS,
                "max_labels": MAX_LABELS,
            },
            "licence": identity.licence,
            "profile": "exact",
            "profiles": [{"name": "exact", "numerics": numerics(self.runner.precision), "description": self.backbone_description()}],
            "engine": self.engine,
            "accelerator": self.device,
            "device": self.device,
            "dtype": "bf16-autocast/fp32-heads" if self.runner.precision == "bf16" else "fp32",
            "parameters": identity.parameters,
            "presets": list(self.reader.presets),
        }
        if identity.synthetic:
            card["weights"] = "random (synthetic member)"
        if self.validation is not None:
            card["validation"] = self.validation
        return card

    def backbone_description(self) -> str:
        runner = self.runner
        return f"the reference layout, shapes and batching, each request alone; {runner.name}/{runner.precision} backbone, float32 heads"

    def golden_request(self) -> dict[str, Any]:
        return json.loads(json.dumps(GOLDEN_REQUEST))

    # -- plan ------------------------------------------------------------------------------------

    def plan(self, body: dict[str, Any], require_valid: bool = True) -> Vela2Plan:
        """Validation, tokenization and trees; ``RequestError`` for a bad state, and, with
        ``require_valid``, for a request none of whose questions is valid (callers planning several
        states apply that rule across all of them)."""
        if "state" not in body:
            raise RequestError("invalid_request", "state is required")
        questions = body.get("questions")
        if not isinstance(questions, dict) or not questions:
            raise RequestError("invalid_request", "questions must be an object with at least one question")
        try:
            request = self.reader.read(body["state"], questions)
        except ValueError as exc:
            raise RequestError("invalid_request", str(exc)) from exc
        if require_valid and not request.questions:
            raise RequestError("invalid_request", f"no question is valid ({Vela2Plan(request, []).reasons()})")
        budget = (body.get("options") or {}).get("max_tokens") or self.max_scan_tokens
        parts = self.layout.encode(request, request.questions)
        plan = Vela2Plan(request, [])
        for row in self._rows(request, parts, int(budget)):
            try:
                trees = self.layout.trees(row)
            except SchemaTooLong:
                plan.rows.append((row, None))
                continue
            plan.rows.append((row, trees))
            plan.input_tokens += trees.tokens
            plan.trees += [(runner_tree(prefix, blocks), blocks) for prefix, blocks in trees.trees]
        return plan

    def _rows(self, request: ReadRequest, parts: list[EncodedPart], budget: int) -> list[Row]:
        """The rows of the questions the scan budget lets through. A question that reads a part longer
        than the budget fails with ``scan_budget_exceeded`` (one that requires its full input, when
        any part is), unless it truncates: it then reads the first tokens of every part, up to the
        budget and ``truncate_tokens``, in rows of its own where that cut anything."""
        over = {part.role for part in parts if len(part.ids) > budget}
        readable = []
        for question in request.questions:
            if not question.truncate and (over.intersection(question.roles) or (question.require_full_input and over)):
                request.errors[question.id] = item_error(question.kind, SCAN_BUDGET_EXCEEDED)
            else:
                readable.append(question)
        cut = [part.cut(min(budget, self.truncate_tokens)) for part in parts]
        if all(short is part for short, part in zip(cut, parts, strict=True)):
            return self.layout.rows(readable, parts)
        whole = [question for question in readable if not question.truncate]
        return self.layout.rows(whole, parts) + self.layout.rows([q for q in readable if q.truncate], cut)

    # -- execute ---------------------------------------------------------------------------------

    def forward(self, plans: Sequence[Vela2Plan]) -> list[PlanHidden]:
        """The runner over every tree of ``plans`` at once; per plan, its trees' hidden states (per block),
        with the span head already started on each span block the runner finished (``PlanHidden``)."""
        return self._forward(plans, self.runner.run)

    def open_shared_context(self) -> None:
        """Make ``forward_packed`` ready: the engine's packed graph loaded; ``UsageError`` for a runner without one."""
        can_pack = getattr(self.runner, "can_pack", False)
        if not can_pack:
            raise UsageError(f"shared_context runs an engine's packed graph, which this {self.engine} backbone has not "
                             "(serve an ONNX Runtime engine built from an export of this version)")  # fmt: skip
        self.runner.open_packed()

    def forward_packed(self, plans: Sequence[Vela2Plan]) -> list[PlanHidden]:
        """``forward`` with each tree's blocks packed into one row behind its prefix (``shared_context``;
        ``open_shared_context`` first)."""
        return self._forward(plans, self.runner.run_packed)

    def _forward(self, plans: Sequence[Vela2Plan], run: Callable[[list[Tree], BlockReady], list[list[np.ndarray]]]) -> list[PlanHidden]:
        results = [PlanHidden() for _ in plans]
        owners = [(result, blocks) for result, plan in zip(results, plans, strict=True) for _, blocks in plan.trees]

        def ready(tree: int, number: int, rows: np.ndarray) -> None:
            result, blocks = owners[tree]
            block = blocks[number]
            if block.read and (block.is_span or self.early_candidates):
                result.heads[id(block)] = _HEAD_READOUTS.submit(self._read_block, block, rows)

        trees = [tree for plan in plans for tree, _ in plan.trees]
        hidden = iter(run(trees, ready) if trees else [])
        for result, plan in zip(results, plans, strict=True):
            result.extend(next(hidden) for _ in plan.trees)
        return results

    def readout(self, plan: Vela2Plan, hidden: Sequence[Sequence[np.ndarray]]) -> dict[int, np.ndarray]:
        """The heads of one plan on its entry of ``forward``: its outputs by block."""
        return self.read([plan], hidden)[0]

    def execute(self, plans: Sequence[Vela2Plan]) -> list[dict[int, np.ndarray]]:
        """``forward``, then each plan's ``readout``; per plan, outputs by block."""
        return [self.readout(plan, hidden) for plan, hidden in zip(plans, self.forward(plans), strict=True)]

    def read(self, plans: Sequence[Vela2Plan], hidden: Sequence[Sequence[np.ndarray]]) -> list[dict[int, np.ndarray]]:
        """Head outputs from the runner's hidden states (per tree of ``plans`` in order, per block). A block whose
        head ``forward`` started (``hidden`` a ``PlanHidden``) gives that head's output, the same function of the
        same rows; a plan's other candidate blocks go through the candidate head in one call
        (``CandidateHead.blocks``: each block's logits bitwise those it gets alone)."""
        results: list[dict[int, np.ndarray]] = []
        started = hidden.heads if isinstance(hidden, PlanHidden) else {}
        trees = iter(hidden)
        for plan in plans:
            outputs: dict[int, np.ndarray] = {}
            candidates: list[tuple[RenderedBlock, np.ndarray]] = []
            for _, blocks in plan.trees:
                for block, rows in zip(blocks, next(trees), strict=True):
                    if not block.read:
                        continue
                    if id(block) in started:
                        outputs[id(block)] = started[id(block)].result()
                    elif block.is_span:
                        outputs[id(block)] = self._read_span(block, rows)
                    else:
                        candidates.append((block, rows))
            if candidates:
                logits = self.candidate.blocks([rows[:-1] for _, rows in candidates], np.stack([rows[-1] for _, rows in candidates]))
                for (block, _), values in zip(candidates, logits, strict=True):
                    outputs[id(block)] = self._biased(block, values)
            results.append(outputs)
        return results

    def _read_block(self, block: RenderedBlock, rows: np.ndarray) -> np.ndarray:
        """The head output of one read block from its readout rows: ``read``'s, for one block."""
        if block.is_span:
            return self._read_span(block, rows)
        return self._biased(block, self.candidate.blocks([rows[:-1]], rows[-1][None])[0])

    def _biased(self, block: RenderedBlock, logits: np.ndarray) -> np.ndarray:
        """A candidate block's logits as answered: a set question's shifted by the set bias."""
        return logits + self.set_bias if block.question.type == "set" else logits

    def _read_span(self, block: RenderedBlock, rows: np.ndarray) -> np.ndarray:
        """Span head output of one block from its readout rows (see ``RenderedBlock.readouts``)."""
        sizes = [end - start + 1 for start, end in zip(block.starts, block.ends, strict=True)]
        bounds = np.cumsum([0, *sizes])
        labels = np.stack([rows[a:b].mean(0) for a, b in zip(bounds[:-1], bounds[1:], strict=True)])
        words = rows[bounds[-1] :]
        if not len(words):
            return np.zeros((0, len(sizes)), np.float32)
        return self.spans[block.head](words, labels)

    # -- finish ----------------------------------------------------------------------------------

    def finish(self, plan: Vela2Plan, outputs: dict[int, np.ndarray]) -> dict[str, Any]:
        request = plan.request
        raws: dict[str, RawRow | None] = {}
        for row, trees in plan.rows:
            raw = None if trees is None else self._combine(trees, outputs)
            for question in row.questions:
                raws[question.id] = raw
        by_id = {question.id: question for question in request.questions}
        response: dict[str, Any] = {"answers": {}}
        for question_id in request.question_ids:
            if question_id in request.errors:
                response["answers"][question_id] = request.errors[question_id]
                continue
            question = by_id[question_id]
            raw = raws.get(question_id)
            if raw is None:
                response["answers"][question_id] = item_error(question.kind, MAX_LENGTH_EXCEEDED)
                continue
            self.answerer.answer(question, raw, request.state, response)
        ordered = {"answers": response["answers"], "usage": {"input_tokens": plan.input_tokens, "output_tokens": 0}}
        for key in ("spans", "span_heads", "sets", "thresholds"):
            if key in response:
                ordered[key] = response[key]
        return ordered

    @staticmethod
    def _combine(trees: RowTrees, outputs: dict[int, np.ndarray]) -> RawRow:
        raw = RawRow(tokens={part.role: part.length for part in trees.row.parts}, input_tokens=trees.tokens)
        for block in trees.blocks:
            raw.logits[block.question.id] = outputs[id(block)]
        span = trees.span
        if span is None:
            return raw
        if not trees.windows:
            logits, offsets = np.asarray(outputs[id(span)], np.float64), span.word_offsets
        else:
            words = trees.row.part(span.question.over).words  # type: ignore[arg-type, union-attr]
            total = np.zeros((len(words), len(span.question.options)), np.float64)
            counts = np.zeros(len(words), np.float64)
            for window in trees.windows:
                total[window.word_index] += outputs[id(window)]
                counts[window.word_index] += 1
            logits = np.where(counts[:, None] > 0, total / np.maximum(counts, 1)[:, None], UNCOVERED_LOGIT)
            offsets = words.offsets
        raw.span = RawSpan(span.question.names, offsets, logits, span.head, span.alias)
        return raw

    def expired(self, plan: Vela2Plan) -> dict[str, Any]:
        """Every question not already failed answers ``deadline_exceeded``; nothing ran."""
        request = plan.request
        kinds = {question.id: question.kind for question in request.questions}
        answers = {
            qid: request.errors.get(qid) or item_error(kinds[qid], DEADLINE_EXCEEDED) for qid in request.question_ids
        }
        return {"answers": answers, "usage": {"input_tokens": 0, "output_tokens": 0}}

    def answer(self, body: dict[str, Any]) -> dict[str, Any]:
        plan = self.plan(body)
        return self.finish(plan, self.execute([plan])[0])
