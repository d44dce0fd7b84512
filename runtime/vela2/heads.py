"""The Vela 2.0 heads on the CPU, in float32 (LayerNorm eps 1e-5, exact erf GELU).

Candidate head, per block: ``l_i = <K c_i, Q g> / sqrt(d) + w . GELU(Wc c_i + b + Wq g)`` with
``c_i = LN_c(h_i)`` at the option endpoints and ``g = LN_q(h_q)`` at the block's last token.
Span head, per block: words are LayerNormed and centred over the block's words; labels are the
LayerNormed means of their label blocks plus a slot embedding, centred when there are two or more;
``s_wj = <K x_w, Q y_j> / sqrt(d) + v . GELU(M x_w + b + N y_j)``
(vllm-project/semantic-router:src/model-runtime/vllm_srun/heads/{candidate,span}.py; vela2-decoder.md §3).

Arithmetic is numpy's, its BLAS on one thread (``runtime.cpu_heads``, applied when a head is built),
but for the GELU: torch's (``cpu_heads.gelu``), the reference heads' own and, over the span head's
[words, labels, d], 2.4 ns an element single-threaded where scipy's erf took 11.2.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ..cpu_heads import gelu, heads_pool, single_threaded_numpy_blas
from ..errors import PackageError

CANDIDATE_TENSORS = frozenset(
    {"candidate_norm.weight", "candidate_norm.bias", "query_norm.weight", "query_norm.bias", "key.weight",
     "query.weight", "candidate_mlp.weight", "candidate_mlp.bias", "query_mlp.weight", "scalar.weight"}
)  # fmt: skip
SPAN_TENSORS = frozenset(
    {"wn.weight", "wn.bias", "ln.weight", "ln.bias", "slot.weight", "K.weight", "Q.weight", "M.weight", "M.bias",
     "N.weight", "v.weight", "o.weight", "o.bias"}
)  # fmt: skip
# Words scored per step of the span head: bounds the [words, labels, d] GELU input to a few MiB.
WORD_CHUNK = 64
# The chunks run on these threads: numpy and torch release the GIL in their loops, and each chunk's
# values are computed by the same single-threaded operations whichever thread runs it, so the scores
# are bitwise those of one thread. A chunk does a block's word-side work: its projections and the
# GELU over [words, labels, d], most of a span block's head time.
_CHUNK_THREADS = heads_pool(min(8, len(os.sched_getaffinity(0))), "s1omni-span-head")


def layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, eps: float = 1e-5) -> np.ndarray:
    mean = x.mean(-1, keepdims=True)
    var = np.square(x - mean).mean(-1, keepdims=True)
    return ((x - mean) / np.sqrt(var + np.float32(eps)) * weight + bias).astype(np.float32)


def read_tensors(paths: Sequence[Path], prefixes: tuple[str, ...]) -> dict[str, np.ndarray]:
    """Tensors of safetensors files whose names start with one of ``prefixes``, as float32 numpy."""
    from safetensors import safe_open

    out = {}
    for path in paths:
        with safe_open(str(path), framework="pt") as handle:
            for name in handle.keys():  # noqa: SIM118 - safe_open is not iterable
                if name.startswith(prefixes):
                    out[name] = handle.get_tensor(name).float().numpy()
    return out


def _strict(tensors: dict[str, np.ndarray], expected: frozenset[str], prefix: str) -> dict[str, np.ndarray]:
    if set(tensors) != expected:
        missing, extra = sorted(expected - set(tensors)), sorted(set(tensors) - expected)
        raise PackageError(f"{prefix}* tensors differ from the head's: missing {missing}, unexpected {extra}")
    return tensors


class CandidateHead:
    def __init__(self, tensors: dict[str, np.ndarray]):
        t = _strict(tensors, CANDIDATE_TENSORS, "head.")
        self.t = t
        self.d = t["key.weight"].shape[0]
        single_threaded_numpy_blas()

    def parameters(self) -> int:
        return sum(v.size for v in self.t.values())

    def __call__(self, candidates: np.ndarray, query: np.ndarray) -> np.ndarray:
        """Logits ``[n]`` of option endpoint states ``[n, H]`` against the query state ``[H]``."""
        return self.blocks([candidates], query[None])[0]

    def blocks(self, candidates: Sequence[np.ndarray], queries: np.ndarray) -> list[np.ndarray]:
        """Logits per block: block ``i``'s option endpoint states ``candidates[i]`` ``[n_i, H]``
        against its query state ``queries[i]`` (``queries`` ``[B, H]``), bitwise what the block gets
        alone. The LayerNorms run over every block's rows at once (elementwise and per-row work,
        the same for a row wherever it sits); each product runs per block in the shapes one block
        gives it, because a BLAS product's rounding depends on its row count (OpenBLAS picks
        kernels by shape: stacking the blocks' rows moved logits by up to 2.3e-6, and answers with
        them). The GELU runs per block too: torch's tail elements take its scalar path."""
        t = self.t
        c = layer_norm(np.concatenate(candidates).astype(np.float32), t["candidate_norm.weight"], t["candidate_norm.bias"])
        g = layer_norm(np.asarray(queries, np.float32), t["query_norm.weight"], t["query_norm.bias"])
        scale = np.float32(math.sqrt(self.d))
        logits = []
        for rows, query in zip(np.split(c, np.cumsum([len(b) for b in candidates])[:-1]), g, strict=True):
            bilinear = (rows @ t["key.weight"].T) @ (t["query.weight"] @ query) / scale
            hidden = rows @ t["candidate_mlp.weight"].T + t["candidate_mlp.bias"] + t["query_mlp.weight"] @ query
            logits.append((bilinear + (gelu(hidden) @ t["scalar.weight"].T)[:, 0]).astype(np.float32))
        return logits


class SpanHead:
    def __init__(self, tensors: dict[str, np.ndarray], prefix: str):
        t = _strict(tensors, SPAN_TENSORS, prefix)
        self.t = t
        self.d = t["K.weight"].shape[0]
        self.slots = t["slot.weight"].shape[0]
        single_threaded_numpy_blas()

    def parameters(self) -> int:
        return sum(v.size for v in self.t.values())

    def __call__(self, words: np.ndarray, labels: np.ndarray) -> np.ndarray:
        """Scores ``[W, L]`` of word states ``[W, H]`` against label states ``[L, H]``."""
        t = self.t
        x = layer_norm(words.astype(np.float32), t["wn.weight"], t["wn.bias"])
        x = x - x.mean(0, keepdims=True)
        count = labels.shape[0]
        y = layer_norm(labels.astype(np.float32), t["ln.weight"], t["ln.bias"])
        y = y + t["slot.weight"][np.minimum(np.arange(count), self.slots - 1)]
        if count > 1:
            y = y - y.mean(0, keepdims=True)
        label_query = y @ t["Q.weight"].T
        label_side = y @ t["N.weight"].T
        v = t["v.weight"][0]
        scores = np.empty((len(x), count), np.float32)

        def score(start: int) -> None:
            chunk = x[start : start + WORD_CHUNK]
            bilinear = (chunk @ t["K.weight"].T) @ label_query.T / np.float32(math.sqrt(self.d))
            word_side = chunk @ t["M.weight"].T + t["M.bias"]
            scores[start : start + WORD_CHUNK] = bilinear + gelu(word_side[:, None, :] + label_side[None, :, :]) @ v

        list(_CHUNK_THREADS.map(score, range(0, len(x), WORD_CHUNK)))  # re-raises a chunk's exception
        return scores
