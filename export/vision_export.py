"""ONNX export of a vision member's tower (transformers' ``Qwen3_5VisionModel``): ``vision.onnx``.

``(pixel_values [N, D], position_ids [N, 2], interp_indices [N, 4], interp_weights [N, 4],
cu_seqlens [F + 1]) -> image_embeds [N / merge^2, out_hidden]``, N dynamic. What depends on the
image grid (rotary positions, position-table taps, attention segments) is computed outside by
``s1omni.runtime.omnijev.vision.grid_inputs`` and fed in; the patches come in the processor's merge
order, which the merger consumes as it is.

The trace is the model's own forward with those tensors passed as its precomputed kwargs. One
construct is replaced while tracing: eager attention splits the sequence per segment with
``cu_seqlens.tolist()`` lengths, which no trace can follow, so it attends once with a
block-diagonal mask instead (one segment for an image: a zero mask, the same softmax).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import MethodType

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime
import torch
from torch import nn

from s1omni.runtime import progress
from s1omni.runtime.omnijev.engine import VISION_GRAPH
from s1omni.runtime.omnijev.image import Pixels
from s1omni.runtime.omnijev.vision import VisionTower, grid_inputs
from s1omni.runtime.runners.qwen3_5 import modeling

from .onnx_export import OPSET, quiet_third_party, to_onnx
from .patches import _bias

_qwen3_5 = modeling()
apply_rotary_pos_emb_vision, eager_attention_forward = _qwen3_5.apply_rotary_pos_emb_vision, _qwen3_5.eager_attention_forward

INPUTS = ["pixel_values", "position_ids", "interp_indices", "interp_weights", "cu_seqlens"]
EXAMPLE_GRID = (2, 6, 8)  # two frames (two segments); any grid traces the same graph
CHECK_GRIDS = ((1, 4, 4), (1, 14, 20), (2, 4, 6))  # images, and two frames: two segments
# Largest difference allowed, relative to the largest magnitude of the tower's output (structural, as export.onnx_check).
RELATIVE = 1e-4


def segment_bias(cu_seqlens: torch.Tensor, length: int) -> torch.Tensor:
    """``[1, 1, N, N]`` additive mask: a patch attends to the patches of its own segment only."""
    steps = torch.arange(length, device=cu_seqlens.device)
    segment = (steps[:, None] >= cu_seqlens[None, 1:]).sum(-1)
    return _bias((segment[:, None] == segment[None, :])[None])


def segment_attention_forward(self, hidden_states: torch.Tensor, cu_seqlens: torch.Tensor, position_embeddings, **kwargs) -> torch.Tensor:
    """``Qwen3_5VisionAttention.forward`` (eager) with its split per segment as a mask."""
    seq_length = hidden_states.shape[0]
    query, key, value = self.qkv(hidden_states).reshape(seq_length, 3, self.num_heads, -1).permute(1, 0, 2, 3).unbind(0)
    cos, sin = position_embeddings
    query, key = apply_rotary_pos_emb_vision(query, key, cos, sin)
    query, key, value = (x.transpose(0, 1).unsqueeze(0) for x in (query, key, value))
    out, _ = eager_attention_forward(self, query, key, value, segment_bias(cu_seqlens, seq_length), scaling=self.scaling)
    return self.proj(out.reshape(seq_length, -1).contiguous())


@contextmanager
def segment_attention(model: nn.Module) -> Iterator[None]:
    """Install the masked attention on every block of ``model`` for the duration of the block."""
    try:
        for block in model.blocks:
            block.attn.forward = MethodType(segment_attention_forward, block.attn)
        yield
    finally:
        for block in model.blocks:
            block.attn.__dict__.pop("forward", None)


class VisionForward(nn.Module):
    """The tower's forward from its grid-derived inputs: image embeddings, one per merged patch group."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, pixel_values, position_ids, interp_indices, interp_weights, cu_seqlens):
        precomputed = {"position_ids": position_ids, "interp_indices": interp_indices, "interp_weights": interp_weights}
        return self.model(pixel_values, grid_thw=None, cu_seqlens=cu_seqlens, **precomputed).pooler_output


def example(tower: VisionTower, config: dict, grid: tuple[int, int, int]) -> dict[str, np.ndarray]:
    """Random patches of ``grid`` and their grid inputs: the feeds of ``vision.onnx``."""
    patch = tower.model.patch_embed
    width = patch.in_channels * patch.temporal_patch_size * patch.patch_size**2
    values = np.random.default_rng(sum(grid)).standard_normal((grid[0] * grid[1] * grid[2], width)).astype(np.float32)
    return {"pixel_values": values, **grid_inputs(grid, config)}


def export_vision(tower: VisionTower, config: dict, out_dir: Path, opset: int = OPSET) -> dict[str, float]:
    """Trace ``tower`` into ``out_dir / vision.onnx`` and check it; the largest relative difference per grid."""
    merge_unit = int(config["spatial_merge_size"]) ** 2
    groups = torch.export.Dim("groups", min=1)
    patches = {0: merge_unit * groups}
    shapes = (patches, patches, patches, patches, {0: torch.export.Dim("segments", min=2)})
    args = tuple(torch.from_numpy(value) for value in example(tower, config, EXAMPLE_GRID).values())
    progress.note(f"tracing vision ({len(tower.model.blocks)} blocks)")
    # Size-oblivious, as the backbone's trace: one segment is not a special case.
    with (
        torch.no_grad(),
        quiet_third_party(),
        segment_attention(tower.model),
        torch.fx.experimental._config.patch(backed_size_oblivious=True),
    ):
        program = torch.export.export(VisionForward(tower.model), args, dynamic_shapes=shapes, strict=False)
    graph = to_onnx(program, shapes, INPUTS, ["image_embeds"], opset)
    ir.save(graph, out_dir / VISION_GRAPH)
    onnx.checker.check_model(str(out_dir / VISION_GRAPH))
    return check_vision(tower, config, out_dir / VISION_GRAPH)


def check_vision(tower: VisionTower, config: dict, path: Path) -> dict[str, float]:
    """The graph against the untouched tower at two grids; raises past ``RELATIVE``."""
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    merge = int(config["spatial_merge_size"])
    report = {}
    for grid in CHECK_GRIDS:
        feeds = example(tower, config, grid)
        expected = tower(Pixels(feeds["pixel_values"], grid, merge))
        found = session.run(None, feeds)[0]
        report["x".join(map(str, grid))] = float(np.abs(found - expected).max() / max(float(np.abs(expected).max()), 1e-30))
    progress.note(f"checked vision: {report}")
    if max(report.values()) > RELATIVE:
        raise RuntimeError(f"the exported vision graph differs from the transformers tower: {report}")
    return report
