"""The decision heads in float32 NumPy: ``OptionScorer`` (Noul, Choice) and ``OrdinalScoreHead`` (Score).

Math as omnijev.md §7 documents a copy of OmniJev's ``mso/head.py`` (constructor arguments from
``ThinkFlowLab/system1-omni:tests/omnijev/generate_fixtures.py``: ``OptionScorer(2560, d_hidden=1024,
norm="softmax")``, ``OrdinalScoreHead(2560, d_hidden=512)``). Tensor names are those modules'
state dicts (``head.pt``, ``ord.pt``) under ``head.`` and ``ord.`` in ``heads.safetensors``
(the prefixes are inferred: the export's own ``heads.rs`` is not documented). GELU is the exact
erf form, torch's kernel as in those modules (``runtime.cpu_heads.gelu``); softplus uses torch's
threshold of 20; the cutpoint cumsum accumulates in float64, as torch's CPU cumsum does for float32.
The rest is numpy, its BLAS on one thread once heads are built (``runtime.cpu_heads``): the heads of
concurrent requests run on their own threads, and OpenBLAS's threads only oversubscribed the cores
(benchmarks/README.md "CPU heads": Choice over 12 options took 84 ms a call with them and scipy's
erf on 2 shared cores, 7 ms with numpy's BLAS on one thread, 3.7 ms with torch's GELU too).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file

from ..cpu_heads import gelu, single_threaded_numpy_blas

HEAD = "head."
ORDINAL = "ord."
# Every tensor the two heads read (``opt``/``que``/``z``/``cut`` are Linear, GELU, Linear).
MLPS = ("head.opt", "head.que", "ord.z", "ord.cut")
LINEARS = ("head.score", "head.abstain", "head.feat", "head.feat_lin")
NAMES = tuple(
    [f"{mlp}.{layer}.{part}" for mlp in MLPS for layer in (0, 2) for part in ("weight", "bias")]
    + [f"{linear}.{part}" for linear in LINEARS for part in ("weight", "bias")]
    + ["head.log_tau"]
)
FEATURES = 6
NOUL = 0


def sigmoid(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return (np.float32(1.0) / (np.float32(1.0) + np.exp(-x))).astype(np.float32)


def softplus(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return np.where(x > 20, x, np.log1p(np.exp(x))).astype(np.float32)


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max())
    return (e / e.sum()).astype(np.float32)


@dataclass(frozen=True)
class Heads:
    tensors: dict[str, np.ndarray]

    def __post_init__(self) -> None:
        single_threaded_numpy_blas()

    @classmethod
    def load(cls, path: str | Path) -> Heads:
        tensors = load_file(str(path))
        missing = [name for name in NAMES if name not in tensors]
        if missing:
            raise ValueError(f"heads.safetensors lacks {missing[0]}")
        return cls({name: tensors[name].astype(np.float32) for name in NAMES})

    @property
    def hidden_size(self) -> int:
        return int(self.tensors["head.opt.0.weight"].shape[1])

    def _linear(self, name: str, x: np.ndarray) -> np.ndarray:
        return x @ self.tensors[f"{name}.weight"].T + self.tensors[f"{name}.bias"]

    def _mlp(self, name: str, x: np.ndarray) -> np.ndarray:
        return self._linear(f"{name}.2", gelu(self._linear(f"{name}.0", x)))

    def option_scorer(self, u: np.ndarray, zq: np.ndarray, type_id: int, features: np.ndarray) -> np.ndarray:
        """mu ``[K]``: sigmoid of each option's logit for Noul; for Choice the softmax over the K
        logits and one abstain logit, without the abstain entry (so 1 - sum is its probability)."""
        g = np.tanh(self._mlp("head.que", zq.astype(np.float32)))
        h = self._mlp("head.opt", u.astype(np.float32)) * g[None, :]  # FiLM-style gating
        h = h + self._linear("head.feat", features)
        tau = np.exp(self.tensors["head.log_tau"][type_id])
        logits = (self._linear("head.score", h)[:, 0] + self._linear("head.feat_lin", features)[:, 0]) / tau
        if type_id == NOUL:
            return sigmoid(logits)
        abstain = self._linear("head.abstain", g)[0] / tau
        return softmax(np.append(logits, abstain).astype(np.float32))[:-1]

    def ordinal(self, zq: np.ndarray, u: np.ndarray) -> np.ndarray:
        """mu ``[L]`` from the cumulative link: CDF_l = sigmoid(theta_l - z), theta increasing."""
        z = self._mlp("ord.z", zq.astype(np.float32))[0]
        raw = self._mlp("ord.cut", u.astype(np.float32))[:, 0]
        steps = np.cumsum(softplus(raw[1:]), dtype=np.float64).astype(np.float32)
        theta = raw[0] + np.concatenate([np.zeros(1, np.float32), steps])
        cdf = sigmoid(theta - z)
        cdf[-1] = 1.0
        return np.maximum(np.diff(cdf, prepend=np.float32(0.0)), np.float32(1e-8)).astype(np.float32)
