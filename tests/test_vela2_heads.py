"""A plan's candidate blocks read in one call (``CandidateHead.blocks``) are bitwise each block read alone.

The reference is the candidate head as it read one block at a time, every product in that block's
own shapes: answers must stay byte-identical, and a BLAS product's rounding depends on its shape.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from s1omni.runtime.cpu_heads import gelu
from s1omni.runtime.synth import vela2 as synth
from s1omni.runtime.vela2.heads import CandidateHead, layer_norm
from s1omni.runtime.vela2.request import QUESTION_TYPES


def _alone(head: CandidateHead, candidates: np.ndarray, query: np.ndarray) -> np.ndarray:
    """One block's logits, as the head computed them before blocks were read together."""
    t = head.t
    c = layer_norm(candidates.astype(np.float32), t["candidate_norm.weight"], t["candidate_norm.bias"])
    g = layer_norm(query.astype(np.float32), t["query_norm.weight"], t["query_norm.bias"])
    bilinear = (c @ t["key.weight"].T) @ (t["query.weight"] @ g) / np.float32(math.sqrt(head.d))
    hidden = c @ t["candidate_mlp.weight"].T + t["candidate_mlp.bias"] + t["query_mlp.weight"] @ g
    return (bilinear + (gelu(hidden) @ t["scalar.weight"].T)[:, 0]).astype(np.float32)


def _assert_bitwise(got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == want.dtype == np.float32 and got.shape == want.shape
    assert got.tobytes() == want.tobytes(), f"max |difference| {np.abs(got - want).max()}"


def test_golden_request_reads_every_kind_bitwise_as_block_by_block(tiny_model) -> None:
    """The golden request (choice, noul, score, set, two spans) on the tiny member: every candidate
    block's output equals the one-block reference bit for bit, and the JSON answer is the same bytes."""
    plan = tiny_model.plan(tiny_model.golden_request())
    hidden = tiny_model.forward([plan])[0]
    outputs = tiny_model.read([plan], hidden)[0]
    reference, kinds = {}, set()
    for (_, blocks), states in zip(plan.trees, hidden, strict=True):
        for block, rows in zip(blocks, states, strict=True):
            if not block.read:
                continue
            kinds.add(block.question.kind)
            if block.is_span:  # the span head is not batched: its output is carried over
                reference[id(block)] = outputs[id(block)]
                continue
            logits = _alone(tiny_model.candidate, rows[:-1], rows[-1])
            reference[id(block)] = logits + tiny_model.set_bias if block.question.type == "set" else logits
    assert kinds == set(QUESTION_TYPES)
    assert outputs.keys() == reference.keys()
    for key, logits in reference.items():
        _assert_bitwise(outputs[key], logits)
    want = json.dumps(tiny_model.finish(plan, reference))
    assert json.dumps(tiny_model.finish(plan, outputs)) == want
    assert json.dumps(tiny_model.answer(tiny_model.golden_request())) == want


@pytest.mark.parametrize("size", list(synth.SIZES))
def test_blocks_of_every_size_and_row_count_are_bitwise_each_alone(size: str) -> None:
    """Random head tensors of each member's shapes, blocks of 2 to 40 options: the head that put
    every block's rows through one product (rows stacked) fails this at every size."""
    rng = np.random.default_rng(0)
    shapes = [(name[5:], shape) for name, shape in synth.tensor_shapes(size)["model"] if name.startswith("head.")]
    head = CandidateHead({name: (rng.standard_normal(shape) / math.sqrt(shape[-1])).astype(np.float32) for name, shape in shapes})
    hidden = synth.SIZES[size].backbone.hidden
    blocks = [rng.standard_normal((n + 1, hidden)).astype(np.float32) for n in (2, 3, 4, 5, 9, 16, 40, 2)]
    got = head.blocks([rows[:-1] for rows in blocks], np.stack([rows[-1] for rows in blocks]))
    assert len(got) == len(blocks)
    for logits, rows in zip(got, blocks, strict=True):
        _assert_bitwise(logits, _alone(head, rows[:-1], rows[-1]))
    _assert_bitwise(head(blocks[0][:-1], blocks[0][-1]), got[0])
