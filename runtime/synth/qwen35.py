"""The Qwen3.5 text config every synthetic member's backbone uses (engines.md §2).

Three Gated DeltaNet layers, then one gated full-attention layer; conv kernel 4; partial rotary
over a quarter of the head with interleaved M-RoPE sections; float32 recurrent state.
"""

from __future__ import annotations

from typing import Any


def text_config(
    *,
    vocab: int,
    hidden: int,
    intermediate: int,
    layers: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    linear_k_heads: int,
    linear_v_heads: int,
    linear_head_dim: int,
    mrope_section: tuple[int, int, int],
    tie_embeddings: bool,
) -> dict[str, Any]:
    return {
        "model_type": "qwen3_5_text",
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": intermediate,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 262144,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "tie_word_embeddings": tie_embeddings,
        "layer_types": ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(layers)],
        "full_attention_interval": 4,
        "linear_conv_kernel_dim": 4,
        "linear_key_head_dim": linear_head_dim,
        "linear_value_head_dim": linear_head_dim,
        "linear_num_key_heads": linear_k_heads,
        "linear_num_value_heads": linear_v_heads,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10000000,
            "partial_rotary_factor": 0.25,
            "mrope_interleaved": True,
            "mrope_section": list(mrope_section),
        },
        "mamba_ssm_dtype": "float32",
    }
