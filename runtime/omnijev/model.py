"""OmniJev as a ``DecisionModel`` on the CPU reference path.

``plan`` validates the whole request before any model work (contract, image, tokens, layout);
``forward`` runs the vision tower once, the shared prefix once with the image embeddings at the
placeholders and its M-RoPE positions, and every (question, option) row as a block continuing from
the prefix's state; ``readout`` then runs the LM features and heads on the CPU (``execute`` is
both); ``finish`` calibrates and answers in the request's key order. This is ``MSO1.ask_branch``
(``tinnel123666888/OmniJev:mso/infer.py``) with the newer native executor's prefix reuse
(``ThinkFlowLab/system1-omni:src/models/omnijev/native/src/executor.rs``);
``forward(..., prefix_reuse=False)`` is that executor's ``execute_rows``: one plain causal
forward per row, for checking that reuse changes nothing (on the torch reference runner).

The same class serves a package on the torch reference (``from_package``) and an engine
(``s1omni.runtime.omnijev.engine``): only the vision tower, the backbone runner and what takes the
option-text log-probabilities against the tied embedding differ (the reference's numpy
``features.token_logprobs``; an engine's ``vocabulary.EngineLogProbs``, the same arithmetic in its
execution provider).
"""

from __future__ import annotations

import base64
import functools
import io
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from PIL import Image
from tokenizers import Tokenizer

from ..identity import Identity, identity_of
from ..package import VerifiedPackage, read_json
from ..runners.base import BackboneRunner, Block, Prefix, Tree, numerics, text_positions
from ..runners.torch_runner import TorchRunner, load_backbone
from . import contract, finish, layout
from .contract import ContractError, Kind, Question
from .features import option_features, token_logprobs
from .heads import Heads
from .image import ImageRefused, Pixels, Processor, decode_rgb
from .layout import Layout, Row, TokenIds
from .package import LANGUAGE_PREFIX
from .vision import VisionTower

PROCESSOR_CONFIG = "preprocessor_config.json"
# Rows continuing the prefix in one batch (the reference's MSO_BRANCH_CHUNK).
ROWS_PER_BATCH = 64
# The vision tower: the processor's patches in, one embedding per image placeholder out.
Vision = Callable[[Pixels], np.ndarray]
# log p(tokens[i] | hidden[i]) under the tied embedding: states [N, hidden] and token ids [N] in, float32 [N] out.
LogProbs = Callable[[np.ndarray, np.ndarray], np.ndarray]


@dataclass(frozen=True)
class Release:
    """What the model reads from the release's export manifest and config, from a package or an engine."""

    model_id: str
    token_ids: TokenIds
    calibration: finish.Calibration

    @classmethod
    def read(cls, manifest: dict[str, Any], config: dict[str, Any]) -> Release:
        token_ids = TokenIds(
            image=config["image_token_id"],
            option_open=manifest["option_tokens"][layout.OPTION_OPEN],
            option_close=manifest["option_tokens"][layout.OPTION_CLOSE],
        )
        return cls(manifest["model_id"], token_ids, finish.Calibration.from_manifest(manifest["calibration"]))


@dataclass(frozen=True)
class OmniJevPlan:
    questions: tuple[Question, ...]
    pixels: Pixels
    layout: Layout
    tree: Tree  # the prefix (image features not yet in) and one block per row, question by question
    preparation_seconds: float  # decode, preprocess and tokenize: part of the reported latency

    @property
    def input_tokens(self) -> int:
        return self.layout.input_tokens

    @property
    def question_count(self) -> int:
        return len(self.questions)

    @property
    def trees(self) -> list[tuple[Tree, tuple[tuple[Row, ...], ...]]]:
        """The runner trees with their rows, as Vela 2.0 plans list theirs (the validator reads both)."""
        return [(self.tree, self.layout.rows)]


@dataclass(frozen=True)
class Execution:
    mu: tuple[np.ndarray, ...]  # the head outputs, one array per question
    seconds: float  # vision, language, features and heads


@dataclass(frozen=True)
class RowReadout:
    zq: np.ndarray
    u: np.ndarray
    targets: np.ndarray  # hidden states at the positions predicting the option text, [T, H]


@dataclass(frozen=True)
class Forwarded:
    """One plan's share of ``forward``: its readouts per question and row."""

    readouts: list[list[RowReadout]]
    seconds: float  # vision and language


def _readouts(row: Row, kind: Kind) -> np.ndarray:
    """Row-relative positions to read: zq, u and (not for Score) each option-text predictor."""
    predictors = [position for position, _ in row.targets] if kind != Kind.SCORE else []
    return np.asarray([row.zq, row.u, *predictors], np.int64)


def _split(hidden: np.ndarray) -> RowReadout:
    return RowReadout(zq=hidden[0], u=hidden[1], targets=hidden[2:])


def _group(plan: OmniJevPlan, hidden: Sequence[np.ndarray]) -> list[list[RowReadout]]:
    """The hidden states of the plan's blocks, in order, as readouts per question and row."""
    flat = iter(hidden)
    return [[_split(next(flat)) for _ in rows] for rows in plan.layout.rows]


def plan_tree(questions: Sequence[Question], lay: Layout) -> Tree:
    """The runner tree of a layout: its prefix (positions, image placeholders) and a block per row."""
    blocks = tuple(
        Block(row.tokens, _readouts(row, question.kind))
        for question, rows in zip(questions, lay.rows, strict=True)
        for row in rows
    )
    return Tree(Prefix(lay.prefix, lay.positions, None, lay.image_index, lay.next_position), blocks)


def warmup_png() -> bytes:
    """The worker's warm-up image: 96 x 64, pixel (x, y) = (x, y, 128)."""
    x, y = np.meshgrid(np.arange(96), np.arange(64))
    pixels = np.stack([x, y, np.full_like(x, 128)], axis=-1).astype(np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


class OmniJevModel:
    family = "omnijev"
    validation: dict[str, Any] | None = None  # a validated engine's: the gate it met (``runtime.engine.served_validation``)

    def __init__(
        self,
        identity: Identity,
        release: Release,
        tokenizer: Tokenizer,
        processor: Processor,
        vision: Vision,
        runner: BackboneRunner,
        heads: Heads,
        logprobs: LogProbs,
    ):
        self.identity = identity
        self.id = release.model_id
        self.engine = runner.name
        self.device = runner.device
        self.tokenizer = tokenizer
        self.processor = processor
        self.vision = vision
        self.runner = runner
        self.heads = heads
        self.calibration = release.calibration
        self.token_ids = release.token_ids
        self.names = contract.served_names(self.id, identity.name)
        self.logprobs = logprobs

    @classmethod
    def from_package(cls, package: VerifiedPackage, device: str = "cpu", precision: str | None = None) -> OmniJevModel:
        """The torch reference over a verified package, in the released float32 weights; ``precision`` as
        Vela 2.0's reference takes it (on a GPU bf16, BF16 autocast, by default, or fp32 with TF32 off), for
        the backbone and the vision tower alike."""
        root, details = package.root, package.details
        manifest, config = details["manifest"], details["config"]
        processor_config = read_json(root / PROCESSOR_CONFIG) if PROCESSOR_CONFIG in manifest["outputs"] else None
        backbone = load_backbone(config["text_config"], [root / s for s in details["shards"]], prefix=LANGUAGE_PREFIX)
        runner = TorchRunner(backbone, device, precision)
        return cls(
            identity_of(package),
            Release.read(manifest, config),
            Tokenizer.from_file(str(root / "tokenizer.json")),
            Processor.from_config(processor_config, manifest["max_pixels"]),
            VisionTower.load(config["vision_config"], root / "vision.safetensors", device, runner.precision),
            runner,
            Heads.load(root / "heads.safetensors"),
            functools.partial(token_logprobs, backbone.embed_tokens.weight.detach().float().cpu().numpy()),
        )

    def card(self) -> dict[str, Any]:
        identity = self.identity
        validation = {"validation": self.validation} if self.validation is not None else {}
        return validation | {
            "id": self.id,
            "object": "model",
            "family": self.family,
            "member": identity.name,
            "revision": identity.revision,
            "synthetic": identity.synthetic,
            "engine": self.engine,
            "device": self.device,
            "precision": self.runner.precision,
            # One request per forward, as the reference worker runs it: exact is the one profile.
            "profile": "exact",
            "profiles": [{"name": "exact", "numerics": numerics(self.runner.precision), "description": self.backbone_description()}],
            "modalities": ["image", "text"],
            "question_types": [kind.label for kind in Kind],
            "limits": {
                "max_body_bytes": contract.MAX_BODY,
                "max_questions": contract.MAX_QUESTIONS,
                "max_options": contract.MAX_OPTIONS,
                "max_rows": contract.MAX_ROWS,
                "max_question_tokens": layout.MAX_SEQUENCE,
                "max_input_tokens": layout.MAX_PROCESSED,
                "max_option_text_tokens": layout.MAX_TARGETS,
                "max_pixels": self.processor.max_pixels,
            },
        }

    def backbone_description(self) -> str:
        return f"the reference layout and head math, one request a forward; {self.runner.name}/{self.runner.precision} backbone"

    def golden_request(self) -> dict[str, Any]:
        """The worker's warm-up: every kind, a region, an option text and a rubric (wire-contract.md §11.7)."""
        url = "data:image/png;base64," + base64.b64encode(warmup_png()).decode("ascii")
        return {
            "model": self.id,
            "state": {"images": [url]},
            "questions": {
                "noul": {
                    "type": "noul",
                    "instructions": "The image is mostly blue.",
                    "region": {"box": [0, 0, 48, 32]},
                },
                "choice": {
                    "type": "choice",
                    "instructions": "Which colour dominates?",
                    "criteria": {"red": None, "green": "Mostly green", "blue": None},
                },
                "score": {
                    "type": "score",
                    "instructions": "How bright is the image?",
                    "levels": ["dark", "medium", "bright"],
                },
            },
        }

    def plan(self, body: dict[str, Any]) -> OmniJevPlan:
        """The whole request validated and laid out; ``ContractError`` (422) says what is refused."""
        start = time.perf_counter()
        request = contract.compile_request(body, self.names)
        try:
            pixels = self.processor(decode_rgb(request.image))
        except ImageRefused as exc:
            raise ContractError(422, str(exc)) from None
        planned = layout.plan_layout(
            request.questions, self.tokenizer, pixels.tokens, pixels.grid, pixels.merge_size, self.token_ids
        )
        tree = plan_tree(request.questions, planned)
        return OmniJevPlan(request.questions, pixels, planned, tree, time.perf_counter() - start)

    def forward(self, plans: Sequence[OmniJevPlan], prefix_reuse: bool = True) -> list[Forwarded]:
        """The vision tower and the backbone per plan; ``prefix_reuse=False`` runs one plain forward per row instead."""
        out = []
        for plan in plans:
            start = time.perf_counter()
            features = self.vision(plan.pixels)
            hidden = self._reused(plan, features) if prefix_reuse else self._plain(plan, features)
            out.append(Forwarded(hidden, time.perf_counter() - start))
        return out

    def readout(self, plan: OmniJevPlan, forwarded: Forwarded) -> Execution:
        """The LM features and heads of one plan on its entry of ``forward``."""
        start = time.perf_counter()
        mu = self._heads(plan, forwarded.readouts)
        return Execution(mu, forwarded.seconds + time.perf_counter() - start)

    def execute(self, plans: Sequence[OmniJevPlan], prefix_reuse: bool = True) -> list[Execution]:
        """``forward``, then each plan's ``readout``: head outputs per plan."""
        forwarded = self.forward(plans, prefix_reuse)
        return [self.readout(plan, entry) for plan, entry in zip(plans, forwarded, strict=True)]

    def read(self, plans: Sequence[OmniJevPlan], hidden: Sequence[Sequence[np.ndarray]]) -> list[Execution]:
        """Head outputs from hidden states computed elsewhere (per plan's one tree, per block): the validator's path."""
        return [self.readout(plan, Forwarded(_group(plan, blocks), 0.0)) for plan, blocks in zip(plans, hidden, strict=True)]

    def image_features(self, values: np.ndarray, grid: tuple[int, int, int]) -> np.ndarray:
        """The vision tower over processed patches of ``grid`` (what the validator feeds)."""
        return self.vision(Pixels(values, grid, self.processor.merge_size))

    def finish(self, plan: OmniJevPlan, result: Execution, digits: int | None = finish.DIGITS) -> dict[str, Any]:
        """The response; ``digits=None`` leaves every value unrounded (the validator's comparison)."""
        total = plan.preparation_seconds + result.seconds
        answers = {
            question.id: finish.answer(question, mu, self.calibration, total, plan.question_count, digits)
            for question, mu in zip(plan.questions, result.mu, strict=True)
        }
        return {"model": self.id, "answers": answers, "usage": {"input_tokens": plan.input_tokens, "output_tokens": 0}}

    def expired(self, plan: OmniJevPlan) -> dict[str, Any]:
        """OmniJev has no per-question errors: a request that could not run in time is refused whole."""
        raise ContractError(503, contract.BUSY)

    def answer(self, body: dict[str, Any]) -> dict[str, Any]:
        plan = self.plan(body)
        return self.finish(plan, self.execute([plan])[0])

    # ------------------------------------------------------------------------- execution

    def _reused(self, plan: OmniJevPlan, features: np.ndarray) -> list[list[RowReadout]]:
        """The prefix once, then every row as a block continuing from its state."""
        prefix = replace(plan.tree.prefix, embeds=features)
        state = self.runner.prefill(prefix)
        blocks = plan.tree.blocks
        hidden: list[np.ndarray] = []
        for start in range(0, len(blocks), ROWS_PER_BATCH):
            hidden += self.runner.continue_blocks(state, prefix, blocks[start : start + ROWS_PER_BATCH])
        return _group(plan, hidden)

    def _plain(self, plan: OmniJevPlan, features: np.ndarray) -> list[list[RowReadout]]:
        """One plain causal forward over prefix + row per row, on the torch reference runner (its layer functions
        and precision policy, as ``_reused`` runs under)."""
        lay, prefix = plan.layout, replace(plan.tree.prefix, embeds=features)
        hidden = []
        for block in plan.tree.blocks:
            positions = np.concatenate([lay.positions, text_positions(lay.next_position, len(block.ids))], axis=1)
            states = self.runner.forward(np.concatenate([lay.prefix, block.ids]), positions, prefix)
            hidden.append(states[len(lay.prefix) + block.readouts])
        return _group(plan, hidden)

    def _heads(self, plan: OmniJevPlan, readouts: list[list[RowReadout]]) -> tuple[np.ndarray, ...]:
        # Every option-text log-probability of the request in one pass over the vocabulary: the
        # predictors of each text token, and each row's zq for its first text token.
        states, tokens = [], []
        for question, rows, read in zip(plan.questions, plan.layout.rows, readouts, strict=True):
            if question.kind == Kind.SCORE:
                continue
            for row, row_read in zip(rows, read, strict=True):
                states.extend(row_read.targets)
                tokens.extend(token for _, token in row.targets)
                if row.first is not None:
                    states.append(row_read.zq)
                    tokens.append(row.first)
        logprobs = iter(self.logprobs(np.stack(states), np.asarray(tokens, np.int64)) if states else ())
        out = []
        for question, rows, read in zip(plan.questions, plan.layout.rows, readouts, strict=True):
            zq = read[0].zq  # the question's zq is its first row's, as the reference takes it
            u = np.stack([row_read.u for row_read in read])
            if question.kind == Kind.SCORE:
                out.append(self.heads.ordinal(zq, u))
                continue
            picked, first = [], []
            for row in rows:
                picked.append(np.asarray([next(logprobs) for _ in row.targets], np.float32))
                first.append(None if row.first is None else float(next(logprobs)))
            out.append(self.heads.option_scorer(u, zq, question.kind, option_features(picked, first)))
        return tuple(out)
