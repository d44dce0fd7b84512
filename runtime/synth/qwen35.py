"""What every synthetic member's Qwen3.5 backbone shares: its dimensions, text config, random
initialisation of the Gated DeltaNet parameters, and the split of its tensors into shards (engines.md §2).

Three Gated DeltaNet layers, then one gated full-attention layer; conv kernel 4; partial rotary
over a quarter of the head with interleaved M-RoPE sections; float32 recurrent state.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any

import torch

Shapes = list[tuple[str, tuple[int, ...]]]


@dataclass(frozen=True)
class Backbone:
    hidden: int
    layers: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    linear_k_heads: int
    linear_v_heads: int
    linear_head_dim: int
    mrope_section: tuple[int, int, int]


def text_config(backbone: Backbone, vocab: int, tie_embeddings: bool) -> dict[str, Any]:
    b = backbone
    return {
        "model_type": "qwen3_5_text",
        "vocab_size": vocab,
        "hidden_size": b.hidden,
        "intermediate_size": b.intermediate,
        "num_hidden_layers": b.layers,
        "num_attention_heads": b.heads,
        "num_key_value_heads": b.kv_heads,
        "head_dim": b.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 262144,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "tie_word_embeddings": tie_embeddings,
        "layer_types": ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(b.layers)],
        "full_attention_interval": 4,
        "linear_conv_kernel_dim": 4,
        "linear_key_head_dim": b.linear_head_dim,
        "linear_value_head_dim": b.linear_head_dim,
        "linear_num_key_heads": b.linear_k_heads,
        "linear_num_value_heads": b.linear_v_heads,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10000000,
            "partial_rotary_factor": 0.25,
            "mrope_interleaved": True,
            "mrope_section": list(b.mrope_section),
        },
        "mamba_ssm_dtype": "float32",
    }


def generator(seed: int, name: str) -> torch.Generator:
    """One tensor's random stream: independent of the order tensors are written in."""
    return torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))


def gated_delta_parameter(name: str, shape: tuple[int, ...], g: torch.Generator) -> torch.Tensor | None:
    """``A_log`` and ``dt_bias`` of a Gated DeltaNet layer; None for any other tensor."""
    if name.endswith("A_log"):
        return torch.log(torch.empty(shape).uniform_(1.0, 16.0, generator=g))
    if name.endswith("dt_bias"):
        # Mamba-style: softplus(dt_bias) log-uniform in [1e-3, 1e-1], so per-token decays stay realistic.
        dt = torch.exp(torch.empty(shape).uniform_(-6.9, -2.3, generator=g))
        return dt + torch.log(-torch.expm1(-dt))
    return None


def shard_plan(shapes: Shapes, shards: int) -> list[Shapes]:
    """Consecutive tensors split into ``shards`` groups of about equal element counts."""
    sizes = [max(1, int(torch.Size(shape).numel())) for _, shape in shapes]
    target, groups, current, filled = sum(sizes) / shards, [], [], 0
    for entry, count in zip(shapes, sizes, strict=True):
        if current and filled + count > target * (len(groups) + 1) and len(groups) < shards - 1:
            groups.append(current)
            current = []
        current.append(entry)
        filled += count
    groups.append(current)
    return groups
