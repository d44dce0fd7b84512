"""Synthetic OmniJev members: the merged export's layout with deterministic random weights.

The layout is what ``ThinkFlowLab/system1-omni:recipe/omnijev/export.py`` writes (omnijev.md
§11.2-§11.3): a Qwen3.5 image-text ``config.json`` (``text_config`` + ``vision_config``), the
LoRA-merged BF16 language model in shards with ``model.safetensors.index.json``, the base vision
tower in ``vision.safetensors``, the FP32 decision and ordinal heads in ``heads.safetensors``, the
tokenizer and processor config, and ``omnijev_export.json`` written last with the SHA-256 of
every output. ``4B`` is the real Qwen3.5-4B shape (engines.md §2) with the real vocabulary of
248,079 and token ids; ``tiny`` keeps every path (3 Gated DeltaNet + 1 full-attention layer, GQA,
K != V linear heads, a 2-block vision tower) with a vocabulary of 2,083, its special tokens in the
same order at the same offsets. The same size and seed give byte-identical files.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from ..digest import sha256_file, sha256_json
from ..omnijev.package import INDEX, LANGUAGE_PREFIX, MANIFEST, REQUIRED_OUTPUTS
from ..omnijev.vision import VISION_PREFIX
from ..registry import Member
from ..staging import staged_directory
from .qwen35 import Backbone, gated_delta_parameter, generator, shard_plan, text_config
from .tokenizer import train_tokenizer

MAX_PIXELS = 768 * 28 * 28
TOKENIZER_VOCAB = 2048
# Qwen3.5's added tokens from <|endoftext|> (248044) on, in the Qwen3-VL order; 248045/248046
# (<|im_start|>, <|im_end|>), 248053/248054/248056/248057 (vision) and 248068/248069 (<think>)
# are confirmed by public token traces. Offsets 26-32 are filled; the option tokens close the range.
SPECIALS = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>",
    "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>", "<|fim_prefix|>",
    "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "<tool_response>",
    "</tool_response>", "<think>", "</think>",
]  # fmt: skip
OPTION_TOKENS = {"<|opt|>": 33, "<|/opt|>": 34}
SPECIAL_COUNT = 35
# The test stand-in's calibration (omnijev.md §8.1): every finishing path is exercised.
CALIBRATION = {"temperatures": {"noul": 1.1991, "choice": 1.1199, "score": 1.1909}, "noul_bias": 0.05310856608843584}
HEADS = {"norm": "softmax", "lm_features": True, "ordinal": True}
# The manifest fields the registry entry pins (omnijev.md §11.3); calibration and outputs are checked, not pinned.
PINNED_FIELDS = (
    "format", "model_id", "checkpoint_revision", "base_revision", "vocabulary", "option_tokens", "max_pixels", "heads",
)  # fmt: skip


@dataclass(frozen=True)
class Size:
    backbone: Backbone
    vision_depth: int
    vision_hidden: int
    vision_intermediate: int
    vision_heads: int
    option_hidden: int  # OptionScorer d_hidden
    ordinal_hidden: int  # OrdinalScoreHead d_hidden
    special_base: int  # id of <|endoftext|>; the vocabulary ends 35 ids later
    shards: int

    @property
    def vocabulary(self) -> int:
        return self.special_base + SPECIAL_COUNT


SIZES = {
    "tiny": Size(Backbone(64, 4, 128, 4, 2, 32, 2, 4, 16, (2, 1, 1)), 2, 32, 64, 2, 32, 16, TOKENIZER_VOCAB, 1),
    "4B": Size(Backbone(2560, 32, 9216, 16, 4, 256, 16, 32, 128, (11, 11, 10)), 24, 1024, 4096, 16, 1024, 512, 248044, 2),
}


def member_name(size: str, seed: int) -> str:
    return f"omnijev-synth-{size}-s{seed}"


def token_id(size: Size, token: str) -> int:
    offset = OPTION_TOKENS[token] if token in OPTION_TOKENS else SPECIALS.index(token)
    return size.special_base + offset


def config(size: Size) -> dict[str, Any]:
    text = {
        **text_config(size.backbone, size.vocabulary, tie_embeddings=True),
        "eos_token_id": token_id(size, "<|im_end|>"),
        "pad_token_id": token_id(size, "<|endoftext|>"),
    }
    vision = {
        "model_type": "qwen3_5_vision",
        "depth": size.vision_depth,
        "hidden_size": size.vision_hidden,
        "hidden_act": "gelu_pytorch_tanh",
        "intermediate_size": size.vision_intermediate,
        "num_heads": size.vision_heads,
        "in_channels": 3,
        "patch_size": 16,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "out_hidden_size": size.backbone.hidden,
        "num_position_embeddings": 2304,
    }
    return {
        "architectures": ["Qwen3_5ForConditionalGeneration"],
        "model_type": "qwen3_5",
        "image_token_id": token_id(size, "<|image_pad|>"),
        "video_token_id": token_id(size, "<|video_pad|>"),
        "vision_start_token_id": token_id(size, "<|vision_start|>"),
        "vision_end_token_id": token_id(size, "<|vision_end|>"),
        "tie_word_embeddings": True,
        "text_config": text,
        "vision_config": vision,
    }


def preprocessor_config() -> dict[str, Any]:
    """The checkpoint's processor config; its 401,408 budget is overridden by the manifest's max_pixels."""
    return {
        "image_processor_type": "Qwen2VLImageProcessorFast",
        "processor_class": "Qwen3VLProcessor",
        "do_resize": True,
        "resample": 3,
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
        "do_convert_rgb": True,
        "patch_size": 16,
        "temporal_patch_size": 2,
        "merge_size": 2,
        "size": {"shortest_edge": 65536, "longest_edge": 401408},
    }


def tokenizer_json(size: Size) -> str:
    """A trained byte-level BPE whose ids run without gaps to the vocabulary's end.

    The specials sit at their ids both in the model vocabulary (so ``tokenizers`` keeps those ids)
    and as added tokens (so text splits on them); unreachable fillers take the ids in between.
    """
    data = json.loads(train_tokenizer(TOKENIZER_VOCAB))
    vocab = data["model"]["vocab"]
    specials = {size.special_base + i: text for i, text in enumerate(SPECIALS)}
    specials.update({token_id(size, text): text for text in OPTION_TOKENS})
    for index in range(len(vocab), size.vocabulary):
        vocab[specials.get(index, f"<|synth_unused_{index}|>")] = index
    data["added_tokens"] = [
        {
            "id": i,
            "content": text,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
        for i, text in sorted(specials.items())
    ]
    return json.dumps(data, ensure_ascii=False, sort_keys=True) + "\n"


def _shapes(module: torch.nn.Module, prefix: str) -> list[tuple[str, tuple[int, ...]]]:
    return [(prefix + name, tuple(p.shape)) for name, p in module.named_parameters()]


def tensor_shapes(size_name: str) -> dict[str, list[tuple[str, tuple[int, ...]]]]:
    """Names and shapes per file: ``language`` (the shards), ``vision`` and ``heads``."""
    from transformers import Qwen3_5TextConfig, Qwen3_5VisionConfig
    from ..runners.qwen3_5 import modeling

    Qwen3_5TextModel, Qwen3_5VisionModel = modeling().Qwen3_5TextModel, modeling().Qwen3_5VisionModel

    size = SIZES[size_name]
    full = config(size)
    drop = ("model_type",)
    with torch.device("meta"):
        language = Qwen3_5TextModel(
            Qwen3_5TextConfig(**{k: v for k, v in full["text_config"].items() if k not in drop})
        )
        vision = Qwen3_5VisionModel(
            Qwen3_5VisionConfig(**{k: v for k, v in full["vision_config"].items() if k not in drop})
        )
    h, d, o = size.backbone.hidden, size.option_hidden, size.ordinal_hidden
    heads = [
        *[(f"head.{mlp}.0.{p}", (d, h) if p == "weight" else (d,)) for mlp in ("opt", "que") for p in ("weight", "bias")],
        *[(f"head.{mlp}.2.{p}", (d, d) if p == "weight" else (d,)) for mlp in ("opt", "que") for p in ("weight", "bias")],
        ("head.score.weight", (1, d)), ("head.score.bias", (1,)),
        ("head.abstain.weight", (1, d)), ("head.abstain.bias", (1,)),
        ("head.feat.weight", (d, 6)), ("head.feat.bias", (d,)),
        ("head.feat_lin.weight", (1, 6)), ("head.feat_lin.bias", (1,)),
        ("head.log_tau", (3,)),
        *[(f"ord.{mlp}.0.{p}", (o, h) if p == "weight" else (o,)) for mlp in ("z", "cut") for p in ("weight", "bias")],
        *[(f"ord.{mlp}.2.{p}", (1, o) if p == "weight" else (1,)) for mlp in ("z", "cut") for p in ("weight", "bias")],
    ]  # fmt: skip
    return {"language": _shapes(language, LANGUAGE_PREFIX), "vision": _shapes(vision, VISION_PREFIX), "heads": heads}


def _tensor(name: str, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """A deterministic random value for one tensor, scaled so activations stay O(1)."""
    g = generator(seed, name)
    gated_delta = gated_delta_parameter(name, shape, g)
    if gated_delta is not None:
        return gated_delta
    if len(shape) == 1:
        # Qwen3.5's RMSNorms scale by (1 + w); its gated RMSNorm and the vision LayerNorms by w.
        centred_at_one = name.endswith("weight") and (name.startswith(VISION_PREFIX) or "linear_attn.norm" in name)
        return (1.0 if centred_at_one else 0.0) + 0.1 * torch.randn(shape, generator=g)
    fan_in = torch.Size(shape[1:]).numel()
    # The LM features span tens of nats; small weights keep the heads' probabilities off 0 and 1.
    scale = 0.02 if name.startswith("head.feat") else 1.0
    return scale * torch.randn(shape, generator=g) / fan_in**0.5


def _save(path: Path, entries: list[tuple[str, tuple[int, ...]]], seed: int, dtype: torch.dtype) -> int:
    """Write the tensors; return their byte count (the index's ``total_size``)."""
    tensors = {name: _tensor(name, shape, seed).to(dtype).contiguous() for name, shape in entries}
    save_file(tensors, str(path), metadata={"format": "pt"})
    return sum(t.numel() * t.element_size() for t in tensors.values())


def _dump(path: Path, value: Any) -> None:
    path.write_text(json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")


def write(out: str | Path, size_name: str = "tiny", seed: int = 0) -> Member:
    """Write the member into ``out`` atomically (manifest last) and return its registry entry."""
    if size_name not in SIZES:
        raise ValueError(f"size must be one of {list(SIZES)}")
    size = SIZES[size_name]
    shapes = tensor_shapes(size_name)
    name = member_name(size_name, seed)
    full_config = config(size)
    with staged_directory(out, "package") as stage:
        groups = shard_plan(shapes["language"], size.shards)
        weight_map, total = {}, 0
        for index, group in enumerate(groups, start=1):
            shard = f"model-{index:05d}-of-{len(groups):05d}.safetensors"
            total += _save(stage / shard, group, seed, torch.bfloat16)
            weight_map.update({tensor: shard for tensor, _ in group})
        _dump(stage / INDEX, {"metadata": {"total_size": total}, "weight_map": weight_map})
        _save(stage / "vision.safetensors", shapes["vision"], seed, torch.bfloat16)
        _save(stage / "heads.safetensors", shapes["heads"], seed, torch.float32)
        _dump(stage / "config.json", full_config)
        _dump(stage / "preprocessor_config.json", preprocessor_config())
        (stage / "tokenizer.json").write_text(tokenizer_json(size), encoding="utf-8")
        outputs = {path.name: sha256_file(path) for path in sorted(stage.iterdir())}
        identity = sha256_json(outputs)
        manifest = {
            "format": "omnijev-merged/1",
            "model_id": f"synthetic/{name}",
            "checkpoint_revision": identity[:40],
            "base_model_id": f"synthetic/qwen3.5-{size_name}-random",
            "base_revision": sha256_json(full_config)[:40],
            "lora": {"rank": 32, "alpha": 64, "merged": "bfloat16"},
            "vocabulary": size.vocabulary,
            "option_tokens": {text: token_id(size, text) for text in OPTION_TOKENS},
            "max_pixels": MAX_PIXELS,
            "heads": HEADS,
            "calibration": CALIBRATION,
            "inputs": {},
            "outputs": outputs,
        }
        _dump(stage / MANIFEST, manifest)
        files = {**outputs, MANIFEST: sha256_file(stage / MANIFEST)}
    return Member(
        name=name,
        family="omnijev",
        repo=f"synthetic/{name}",
        revision=identity[:40],
        files=files,
        model_sha256=identity,
        manifest_sha256=files[MANIFEST],
        loaded_parameters=parameter_count(size_name),
        max_input_tokens=65_536,
        licence="apache-2.0",
        synthetic=True,
        extra={
            "manifest": {field: manifest[field] for field in PINNED_FIELDS},
            "required_outputs": list(REQUIRED_OUTPUTS),
            "image_token_id": full_config["image_token_id"],
            "weights": "random",
            "size": size_name,
            "seed": seed,
        },
    )


def parameter_count(size_name: str) -> int:
    """Parameters of the language model, vision tower and heads, from shapes alone."""
    return sum(torch.Size(s).numel() for group in tensor_shapes(size_name).values() for _, s in group)
