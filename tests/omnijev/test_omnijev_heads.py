"""The NumPy heads and LM features against the same math written with torch modules (omnijev.md §6-§7)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from s1omni.runtime.omnijev import features
from s1omni.runtime.omnijev.features import option_features, token_logprobs
from s1omni.runtime.omnijev.heads import Heads, gelu, softplus


def torch_mlp(tensors: dict[str, torch.Tensor], name: str, x: torch.Tensor) -> torch.Tensor:
    hidden = F.gelu(F.linear(x, tensors[f"{name}.0.weight"], tensors[f"{name}.0.bias"]))
    return F.linear(hidden, tensors[f"{name}.2.weight"], tensors[f"{name}.2.bias"])


def torch_option_scorer(t: dict[str, torch.Tensor], u, zq, type_id: int, feats) -> torch.Tensor:
    g = torch.tanh(torch_mlp(t, "head.que", zq))
    h = torch_mlp(t, "head.opt", u) * g[None, :] + F.linear(feats, t["head.feat.weight"], t["head.feat.bias"])
    tau = torch.exp(t["head.log_tau"][type_id])
    logit = F.linear(h, t["head.score.weight"], t["head.score.bias"]).squeeze(-1)
    logit = (logit + F.linear(feats, t["head.feat_lin.weight"], t["head.feat_lin.bias"]).squeeze(-1)) / tau
    if type_id == 0:
        return torch.sigmoid(logit)
    abstain = F.linear(g, t["head.abstain.weight"], t["head.abstain.bias"]).squeeze(-1) / tau
    return torch.softmax(torch.cat([logit, abstain[None]]), dim=0)[:-1]


def torch_ordinal(t: dict[str, torch.Tensor], zq, u) -> torch.Tensor:
    z = torch_mlp(t, "ord.z", zq).squeeze(-1)
    raw = torch_mlp(t, "ord.cut", u).squeeze(-1)
    theta = raw[0] + torch.cat([torch.zeros(1), torch.cumsum(F.softplus(raw[1:]), 0)])
    cdf = torch.sigmoid(theta - z)
    cdf = torch.cat([cdf[:-1], torch.ones(1)])
    return torch.cat([cdf[:1], cdf[1:] - cdf[:-1]]).clamp(min=1e-8)


@pytest.fixture(scope="module")
def heads_file(omnijev_package: Path) -> Path:
    return omnijev_package / "heads.safetensors"


def inputs(seed: int, k: int, hidden: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    u = (rng.standard_normal((k, hidden)) * 4).astype(np.float32)
    zq = (rng.standard_normal(hidden) * 4).astype(np.float32)
    feats = (rng.standard_normal((k, 6)) * 5).astype(np.float32)
    return u, zq, feats


@pytest.mark.parametrize(("type_id", "k"), [(0, 1), (1, 1), (1, 2), (1, 5), (1, 32)])
def test_option_scorer_matches_torch(heads_file: Path, type_id: int, k: int) -> None:
    heads = Heads.load(heads_file)
    reference = load_file(str(heads_file))
    u, zq, feats = inputs(10 * type_id + k, k, heads.hidden_size)
    ours = heads.option_scorer(u, zq, type_id, feats)
    with torch.no_grad():
        theirs = torch_option_scorer(
            reference, torch.from_numpy(u), torch.from_numpy(zq), type_id, torch.from_numpy(feats)
        )
    assert ours.dtype == np.float32 and ours.shape == (k,)
    np.testing.assert_allclose(ours, theirs.numpy(), rtol=0, atol=1e-6)
    if type_id == 1:
        assert 0.0 < ours.sum() < 1.0  # the rest is the abstain probability


@pytest.mark.parametrize("levels", [1, 2, 4, 10])
def test_ordinal_head_matches_torch(heads_file: Path, levels: int) -> None:
    heads = Heads.load(heads_file)
    reference = load_file(str(heads_file))
    u, zq, _ = inputs(100 + levels, levels, heads.hidden_size)
    ours = heads.ordinal(zq, u)
    with torch.no_grad():
        theirs = torch_ordinal(reference, torch.from_numpy(zq), torch.from_numpy(u))
    np.testing.assert_allclose(ours, theirs.numpy(), rtol=0, atol=1e-6)
    # The last CDF is forced to 1, so the levels close the distribution.
    assert ours.sum() == pytest.approx(1.0, abs=1e-5)
    assert (ours >= 1e-8).all()


def test_gelu_is_the_exact_erf_form() -> None:
    x = np.linspace(-6, 6, 1001, dtype=np.float32)
    np.testing.assert_allclose(gelu(x), F.gelu(torch.from_numpy(x), approximate="none").numpy(), rtol=0, atol=1e-6)
    tanh_form = F.gelu(torch.from_numpy(x), approximate="tanh").numpy()
    assert np.abs(gelu(x) - tanh_form).max() > 1e-4


def test_softplus_is_linear_above_torchs_threshold() -> None:
    x = np.asarray([-30, -1, 0, 1, 19.5, 20, 20.5, 80], np.float32)
    np.testing.assert_allclose(softplus(x), F.softplus(torch.from_numpy(x)).numpy(), rtol=1e-6, atol=0)


def test_heads_refuse_a_file_without_a_tensor(tmp_path: Path, heads_file: Path) -> None:
    from safetensors.torch import save_file

    tensors = load_file(str(heads_file))
    del tensors["head.log_tau"]
    save_file(tensors, str(tmp_path / "heads.safetensors"))
    with pytest.raises(ValueError, match="head.log_tau"):
        Heads.load(tmp_path / "heads.safetensors")


# ----------------------------------------------------------------------------- LM features


@pytest.mark.parametrize("chunk_elements", [1 << 24, 64])
def test_token_logprobs_match_a_full_float64_log_softmax(monkeypatch: pytest.MonkeyPatch, chunk_elements: int) -> None:
    monkeypatch.setattr(features, "CHUNK_ELEMENTS", chunk_elements)  # 64: many vocabulary chunks
    rng = np.random.default_rng(3)
    embedding = rng.standard_normal((301, 16)).astype(np.float32)
    hidden = (rng.standard_normal((7, 16)) * 3).astype(np.float32)
    tokens = rng.integers(0, 301, 7)
    ours = token_logprobs(embedding, hidden, tokens)
    # float32 logits, as the tied embedding gives them; the log-softmax itself in float64. numpy's BLAS and
    # torch's may sum a logit's 16 products in other orders (which kernel runs depends on the BLAS's
    # threading state): a few float32 ulps of logits up to ~40 (ulp 3.8e-6), hence 1e-5; a wrong
    # running softmax is off by far more.
    logits = (torch.from_numpy(hidden) @ torch.from_numpy(embedding).T).double()
    expected = torch.log_softmax(logits, dim=-1)[torch.arange(7), torch.from_numpy(tokens)]
    np.testing.assert_allclose(ours, expected.numpy(), rtol=1e-7, atol=1e-5)
    assert token_logprobs(embedding, hidden[:0], tokens[:0]).shape == (0,)


def test_option_features_by_hand() -> None:
    # Options: two tokens (-1, -3), one token (-2), no text. First tokens read at zq: -0.5, -0.25, none.
    picked = [np.asarray([-1.0, -3.0], np.float32), np.asarray([-2.0], np.float32), np.zeros(0, np.float32)]
    feats = option_features(picked, [-0.5, -0.25, None])
    sums = np.asarray([-4.0, -2.0, -1e4])
    spread = sums - (sums.max() + np.log(np.exp(sums - sums.max()).sum()))
    expected = np.asarray(
        [
            [-0.4, -2.0, 0.2, spread[0], -0.5, 1.0],
            [-0.2, -2.0, 0.1, spread[1], -0.25, 1.0],
            [0.0, 0.0, 0.0, spread[2], 0.0, 0.0],
        ],
        np.float32,
    )
    assert feats.dtype == np.float32
    np.testing.assert_allclose(feats, expected, rtol=0, atol=1e-6)


def test_a_plain_noul_has_all_zero_features() -> None:
    feats = option_features([np.zeros(0, np.float32)], [None])
    # log_softmax over one option is 0 whatever the masked sum.
    np.testing.assert_array_equal(feats, np.zeros((1, 6), np.float32))
