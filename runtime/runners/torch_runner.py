"""The reference runner: transformers' own Qwen3.5 text model, eager.

On the CPU it runs in float32; on a GPU it follows the reference dtype policy (float32 weights,
BF16 autocast; the model's own code keeps the gated-delta gates and norms in float32). The
prefix runs once with a cache; the blocks of a tree continue from copies of that cache in one
right-padded batch, so each block sees the prefix and itself only.
"""

from __future__ import annotations

import contextlib
import copy
import gc
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import safe_open

from .base import Block, Prefix, Tree, pad_blocks, run_one_by_one, text_positions

BACKBONE_PREFIX = "backbone."


def text_config(backbone_config: dict[str, Any]):
    """transformers' ``Qwen3_5TextConfig`` from a package's ``backbone_config`` (bookkeeping keys dropped)."""
    from transformers import Qwen3_5TextConfig

    fields = {k: v for k, v in backbone_config.items() if k not in ("architectures", "transformers_version", "model_type")}
    return Qwen3_5TextConfig(**fields)


def read_prefixed(paths: Sequence[Path], prefix: str) -> dict[str, torch.Tensor]:
    """The tensors named ``prefix*`` in safetensors files, with the prefix stripped."""
    tensors = {}
    for path in paths:
        with safe_open(str(path), framework="pt") as handle:
            for name in handle.keys():  # noqa: SIM118 - safe_open is not iterable
                if name.startswith(prefix):
                    tensors[name[len(prefix) :]] = handle.get_tensor(name)
    return tensors


def eager_config(backbone_config: dict[str, Any]):
    """``text_config`` with eager attention, the implementation the reference and the export run."""
    config = text_config(backbone_config)
    config._attn_implementation = "eager"
    return config


def empty_backbone(config):
    """The Qwen3.5 text model of ``config`` with its weights on the ``meta`` device (no storage) and its
    non-persistent buffers (the rotary frequencies) rebuilt from the config."""
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5TextModel

    with torch.device("meta"):
        model = Qwen3_5TextModel(config)
    model.rotary_emb = type(model.rotary_emb)(config=config)
    return model.eval()


def load_backbone(backbone_config: dict[str, Any], shards: Sequence[Path], prefix: str = BACKBONE_PREFIX):
    """The Qwen3.5 text model with the ``backbone.*`` tensors loaded strictly, in float32."""
    model = empty_backbone(eager_config(backbone_config))
    state = {name: value.float() for name, value in read_prefixed(shards, prefix).items()}
    model.load_state_dict(state, strict=True, assign=True)
    return model.float().eval()


def release_gpu_memory() -> None:
    """Hand the GPU memory of dropped torch models back to the device: torch's caching allocator keeps
    freed blocks, and an engine or server loaded next needs them (a 9B float32 engine ran out of memory
    on the H200 beside a dropped 9B reference). Only where torch already runs on CUDA in this process."""
    gc.collect()  # so that no reference cycle keeps the weights alive
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


class TorchRunner:
    name = "torch"

    def __init__(self, model, device: str = "cpu", precision: str | None = None):
        """``precision`` bf16 (the reference's GPU policy: BF16 autocast) or fp32 (TF32 off on a GPU)."""
        self.device = "cuda" if str(device).startswith("cuda") else "cpu"
        self.precision = precision or ("bf16" if self.device == "cuda" else "fp32")
        if self.device == "cpu" and self.precision != "fp32":
            raise ValueError("the CPU reference runs in float32")
        if self.device == "cuda" and self.precision == "fp32":
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False
        self.model = model.to(device)
        self.hidden_size = int(model.config.hidden_size)
        self._torch_device = torch.device(device)

    @classmethod
    def from_package(
        cls, backbone_config: dict[str, Any], shards: Sequence[Path], device: str = "cpu", precision: str | None = None
    ) -> TorchRunner:
        return cls(load_backbone(backbone_config, shards), device, precision)

    def _autocast(self):
        if self.precision == "bf16":
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def _embeddings(self, ids: torch.Tensor, prefix: Prefix | None = None) -> torch.Tensor:
        embeds = self.model.embed_tokens(ids)
        if prefix is not None and prefix.embeds is not None:
            index = torch.as_tensor(prefix.embed_index, device=embeds.device)
            embeds[0, index] = torch.as_tensor(prefix.embeds, device=embeds.device, dtype=embeds.dtype)
        return embeds

    @torch.inference_mode()
    def prefill(self, prefix: Prefix) -> Any:
        ids = torch.as_tensor(prefix.ids, dtype=torch.long, device=self._torch_device)[None]
        positions = prefix.positions if prefix.positions is not None else text_positions(0, len(prefix.ids))
        position_ids = torch.as_tensor(positions, device=self._torch_device)[:, None, :]
        with self._autocast():
            out = self.model(
                inputs_embeds=self._embeddings(ids, prefix),
                position_ids=position_ids,
                use_cache=True,
            )
        return out.past_key_values

    @torch.inference_mode()
    def continue_blocks(self, state: Any, prefix: Prefix, blocks: Sequence[Block]) -> list[np.ndarray]:
        """Hidden states at each block's readouts, every block continuing from ``state``."""
        if not blocks:
            return []
        ids, readouts = pad_blocks(blocks)
        count, width = ids.shape
        cache = copy.deepcopy(state)
        cache.reorder_cache(torch.zeros(count, dtype=torch.long, device=self._torch_device))
        positions = text_positions(prefix.start, width)
        position_ids = torch.as_tensor(np.broadcast_to(positions[:, None, :], (3, count, width)).copy(), device=self._torch_device)
        block_ids = torch.as_tensor(ids, device=self._torch_device)
        with self._autocast():
            hidden = self.model(
                inputs_embeds=self._embeddings(block_ids),
                position_ids=position_ids,
                past_key_values=cache,
                use_cache=True,
            ).last_hidden_state
        hidden = hidden.float().cpu().numpy()
        return [hidden[row, block.readouts] for row, block in enumerate(blocks)]

    def run(self, trees: Sequence[Tree]) -> list[list[np.ndarray]]:
        return run_one_by_one(self, trees)

    @torch.inference_mode()
    def forward(self, ids: np.ndarray, positions: np.ndarray | None = None) -> np.ndarray:
        """One plain causal forward over ``ids`` (all hidden states, ``[len, H]``): the tree's definition."""
        tokens = torch.as_tensor(ids, dtype=torch.long, device=self._torch_device)[None]
        positions = positions if positions is not None else text_positions(0, len(ids))
        with self._autocast():
            out = self.model(inputs_embeds=self._embeddings(tokens), position_ids=torch.as_tensor(positions)[:, None, :])
        return out.last_hidden_state[0].float().cpu().numpy()
