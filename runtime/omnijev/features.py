"""The six LM features per option: the backbone's own log-probability of the option text.

From ``tinnel123666888/OmniJev:mso/branch.py`` ``branch_forward`` (the same features as
``mso/v04.py`` ``lm_option_feats``; omnijev.md §6.2), per option k of a question:
sum of its text tokens' log-probs / 10, their mean (0 without text), token count / 10, the
log-softmax of the sums across the question's options (-1e4 for an option without text), the
first text token's log-prob read at ``zq``, and a has-text flag.

Log-probabilities come from the tied embedding over the whole vocabulary: float32 logits, taken a
vocabulary chunk at a time, with the log-sum-exp accumulated in float64 (as the native worker
does; the reference's float32 ``log_softmax`` agrees to about 1e-6).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

# Logit elements computed at once (rows x vocabulary chunk): 64 MiB of float32.
CHUNK_ELEMENTS = 1 << 24
NO_TEXT = -1e4


def token_logprobs(embedding: np.ndarray, hidden: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """log p(tokens[i] | hidden[i]) under ``softmax(hidden @ embedding.T)``: float32 ``[N]``."""
    count = len(tokens)
    if count == 0:
        return np.zeros(0, np.float32)
    hidden = np.ascontiguousarray(hidden, dtype=np.float32)
    tokens = np.asarray(tokens, dtype=np.int64)
    vocabulary = embedding.shape[0]
    chunk = max(1, CHUNK_ELEMENTS // count)
    peak = np.full(count, -np.inf)
    total = np.zeros(count)
    picked = np.zeros(count)
    rows = np.arange(count)
    for start in range(0, vocabulary, chunk):
        logits = (hidden @ embedding[start : start + chunk].T).astype(np.float64)
        new_peak = np.maximum(peak, logits.max(axis=1))
        total = total * np.exp(peak - new_peak) + np.exp(logits - new_peak[:, None]).sum(axis=1)
        peak = new_peak
        inside = (tokens >= start) & (tokens < start + logits.shape[1])
        picked[inside] = logits[rows[inside], tokens[inside] - start]
    return (picked - peak - np.log(total)).astype(np.float32)


def option_features(picked: Sequence[np.ndarray], first: Sequence[float | None]) -> np.ndarray:
    """Features ``[K, 6]`` (float32) of one question's options from their text tokens' log-probs."""
    sums = np.zeros(len(picked), np.float32)
    for k, values in enumerate(picked):
        for value in values:  # index_add order: one token after another
            sums[k] += np.float32(value)
    counts = np.asarray([len(values) for values in picked], np.float32)
    valid = counts > 0
    masked = np.where(valid, sums, np.float32(NO_TEXT)).astype(np.float64)
    shifted = masked - masked.max()
    spread = shifted - np.log(np.exp(shifted).sum())
    features = np.zeros((len(picked), 6), np.float32)
    features[:, 0] = sums / np.float32(10.0)
    features[:, 1] = np.where(valid, sums / np.maximum(counts, np.float32(1.0)), np.float32(0.0))
    features[:, 2] = counts / np.float32(10.0)
    features[:, 3] = spread
    features[:, 4] = [0.0 if value is None else value for value in first]
    features[:, 5] = valid
    return features
