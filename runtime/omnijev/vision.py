"""The vision tower on the reference path: transformers' ``Qwen3_5VisionModel``, eager, float32 weights
(under the backbone reference's precision policy on a GPU).

It turns the processor's patches into one embedding per 2x2-merged patch group (the merger's
output, ``out_hidden_size`` = the language hidden size), which replace the image placeholders'
token embeddings. Weights come from ``vision.safetensors`` under ``model.visual.`` (the base
checkpoint's names; the export copies the tower unchanged, omnijev.md §11.2).

``grid_inputs`` computes what the tower derives from the image grid, with transformers' own
helpers: engines take these as inputs, since a graph cannot derive them for any grid.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..runners.torch_runner import precision_policy, read_prefixed, reference_device
from .image import Pixels

VISION_PREFIX = "model.visual."
CONFIG_BOOKKEEPING = ("architectures", "model_type", "transformers_version")
# How Qwen3_5VisionModel resamples its square learned position table to a grid (set in its __init__).
INTERPOLATION = {"mode": "bilinear", "align_corners": True}


def vision_config(config: dict[str, Any]):
    """transformers' ``Qwen3_5VisionConfig`` from a ``config.json``'s ``vision_config``."""
    from transformers import Qwen3_5VisionConfig

    return Qwen3_5VisionConfig(**{k: v for k, v in config.items() if k not in CONFIG_BOOKKEEPING})


def grid_inputs(grid: tuple[int, int, int], config: dict[str, Any]) -> dict[str, np.ndarray]:
    """The tower's grid-derived tensors for one image, as ``Qwen3_5VisionModel.forward`` computes them.

    ``position_ids`` ``[N, 2]``: each patch's (row, column) for the rotary embedding;
    ``interp_indices``/``interp_weights`` ``[N, 4]``: the bilinear taps into the learned position
    table; ``cu_seqlens``: the attention segments (one per frame). All in the patches' merge order.
    """
    from transformers.vision_utils import (
        get_vision_cu_seqlens,
        get_vision_interpolation_indices_and_weights,
        get_vision_position_ids,
    )

    thw = torch.tensor([grid], dtype=torch.long)
    merge = int(config["spatial_merge_size"])
    side = int(int(config["num_position_embeddings"]) ** 0.5)
    indices, weights = get_vision_interpolation_indices_and_weights(thw, side, spatial_merge_size=merge, **INTERPOLATION)
    return {
        "position_ids": get_vision_position_ids(thw, merge).numpy(),
        "interp_indices": indices.numpy(),
        "interp_weights": weights.float().numpy(),
        "cu_seqlens": get_vision_cu_seqlens(thw).long().numpy(),
    }


class VisionTower:
    def __init__(self, model: torch.nn.Module, device: str = "cpu", precision: str | None = None):
        """On ``device`` at ``precision``, the backbone reference's policy (``reference_device``): on a GPU, BF16
        autocast (the reference worker's, whose image features sit about 14% relative L2 from float32's,
        omnijev.md §12) or float32 with TF32 off; float32 on the CPU."""
        self.device, self.precision = reference_device(device, precision)
        self._torch_device = torch.device(device)
        self.model = model.to(self._torch_device)

    @classmethod
    def load(cls, config: dict[str, Any], path: Path, device: str = "cpu", precision: str | None = None) -> VisionTower:
        from ..runners.qwen3_5 import modeling

        vision = vision_config(config)
        vision._attn_implementation = "eager"
        with torch.device("meta"):
            model = modeling().Qwen3_5VisionModel(vision)
        state = {name: value.float() for name, value in read_prefixed([path], VISION_PREFIX).items()}
        model.load_state_dict(state, strict=True, assign=True)
        # The rotary frequencies are a non-persistent buffer: rebuilt from the config.
        model.rotary_pos_emb = type(model.rotary_pos_emb)(vision)
        return cls(model.float().eval(), device, precision)

    @torch.inference_mode()
    def __call__(self, pixels: Pixels) -> np.ndarray:
        """Image embeddings ``[pixels.tokens, out_hidden_size]`` (float32), in the placeholders' order."""
        grid = torch.tensor([pixels.grid], dtype=torch.long, device=self._torch_device)
        with precision_policy(self.precision):
            out = self.model(torch.from_numpy(pixels.values).to(self._torch_device), grid_thw=grid)
        return out.pooler_output.float().cpu().numpy()
