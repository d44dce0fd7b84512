"""Synthetic Vela 2.0 decoder members with the released layout and random deterministic weights.

The tensor names and shapes are the released members' (vela2-decoder.md §1.5): ``backbone.*`` is a
Qwen3.5 text model, ``head.*`` the candidate head, ``set_bias``, ``span2.*`` the router span head,
and ``broad_head.safetensors`` holds ``span_broad.*``. With the real configs the shapes add up to
the pinned parameter counts. The same size and seed give byte-identical files.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from ..digest import sha256_file, sha256_json
from ..registry import Member
from .. import progress
from ..staging import staged_directory
from .qwen35 import Backbone, gated_delta_parameter, generator, shard_plan, text_config
from .tokenizer import train_tokenizer

PII_TYPES = [
    "AGE", "CREDIT_CARD", "DATE_TIME", "DOMAIN_NAME", "EMAIL_ADDRESS", "GPE", "IBAN_CODE", "IP_ADDRESS", "NRP",
    "ORGANIZATION", "PERSON", "PHONE_NUMBER", "STREET_ADDRESS", "TITLE", "US_DRIVER_LICENSE", "US_SSN", "ZIP_CODE",
]  # fmt: skip


@dataclass(frozen=True)
class Size:
    backbone: Backbone
    vocab: int
    head_dim: int  # the candidate head's width d
    span_d: int
    slots: int
    shards: int
    weights_dtype: torch.dtype


# The released Qwen3.5 text configs (engines.md §2); ``tiny`` keeps every path (GQA, K != V heads,
# partial rotary) at a size a CPU runs in seconds.
SIZES = {
    "tiny": Size(Backbone(64, 4, 128, 4, 2, 32, 2, 4, 16, (2, 1, 1)), 2048, 32, 32, 16, 1, torch.float32),
    "0.8B": Size(Backbone(1024, 24, 3584, 8, 2, 256, 16, 16, 128, (11, 11, 10)), 248320, 256, 256, 64, 1, torch.bfloat16),
    "4B": Size(Backbone(2560, 32, 9216, 16, 4, 256, 16, 32, 128, (11, 11, 10)), 248320, 256, 256, 64, 3, torch.bfloat16),
    "9B": Size(Backbone(4096, 32, 12288, 16, 4, 256, 16, 32, 128, (11, 11, 10)), 248320, 256, 256, 64, 5, torch.bfloat16),
}
TOKENIZER_VOCAB = 2048
MAX_LENGTH = 16384


def member_name(size: str, seed: int, max_length: int = MAX_LENGTH) -> str:
    """A synthetic member's own name (never a released one); a shortened input limit is part of it."""
    return f"vela2-synth-{size}-s{seed}" + ("" if max_length == MAX_LENGTH else f"-L{max_length}")


def backbone_config(size: Size) -> dict[str, Any]:
    return {**text_config(size.backbone, size.vocab, tie_embeddings=size.backbone.hidden < 4096), "pad_token_id": 0}


def config(size_name: str, seed: int, max_length: int = MAX_LENGTH) -> dict[str, Any]:
    size = SIZES[size_name]
    return {
        "architectures": ["Vela2DecoderModel"],
        "model_type": "vela2-decoder",
        "format_version": 1,
        "model_name": member_name(size_name, seed, max_length),
        "backbone_config": backbone_config(size),
        "head_dim": size.head_dim,
        "span_head": {"d": size.span_d, "slots": size.slots},
        "span_layout": {"hybrid_rmax": 2048, "window": 1800, "stride": 1536, "window_above": 2048},
        "max_length": max_length,
        "pad_token_id": 0,
        "synthetic": {"size": size_name, "seed": seed, "weights": "random"},
    }


def calibration() -> dict[str, Any]:
    """Every key the runtime reads, with the reference fixture's values (vela2-decoder.md §1.4)."""
    pii_labels = {name: f"a {name.lower().replace('_', ' ')} in the text" for name in PII_TYPES}
    return {
        "temperature": {"choice": 1.3, "score": 1.1, "set": 1.05, "span": 0.4},
        "thresholds": {"set:*": 0.3, "span:*": 0.5, "span:halu": 0.55, "span:toxic": 0.1},
        "pii_types": PII_TYPES,
        "pii_length_rule": {
            "anchors": [
                {"n_tokens": 21, "threshold": 0.75},
                {"n_tokens": 126, "threshold": 0.05},
                {"n_tokens": 1022, "threshold": 0.005919},
            ]
        },
        "pii_buckets": [
            {"name": "short", "max_tokens": 128, "threshold": 0.5},
            {"name": "long", "max_tokens": 1 << 30, "threshold": 0.1},
        ],
        "pii_sparse_gate": {"K": 3, "t_sparse": 0.1, "probe_threshold": 0.5},
        "pii_schema": {"text": "Mark the personal information in the text.", "labels": pii_labels},
        "halu_schema": {
            "text": "Mark every claim of the answer that the context does not support.",
            "labels": {"unsupported": "a claim not supported by the context"},
        },
        "relevance_schema": {
            "text": "How relevant is the context to the request?",
            "levels": {
                "irrelevant": "The context has nothing to do with the request.",
                "partial": "The context touches the request but does not answer it.",
                "relevant": "The context answers the request.",
            },
            "values": [0.0, 0.5, 1.0],
        },
        "broad_head": {"temperature": 1.0, "threshold": 0.55, "router_label_sets": []},
        "noul_calibration": {"T": 2.0, "b": 0.25, "default": False},
    }


def _backbone_shapes(size: Size) -> list[tuple[str, tuple[int, ...]]]:
    from transformers import Qwen3_5TextConfig
    from ..runners.qwen3_5 import modeling

    with torch.device("meta"):
        model = modeling().Qwen3_5TextModel(Qwen3_5TextConfig(**backbone_config(size)))
    return [(f"backbone.{name}", tuple(p.shape)) for name, p in model.named_parameters()]


def _span_shapes(prefix: str, hidden: int, d: int, slots: int) -> list[tuple[str, tuple[int, ...]]]:
    return [
        (f"{prefix}.wn.weight", (hidden,)), (f"{prefix}.wn.bias", (hidden,)),
        (f"{prefix}.ln.weight", (hidden,)), (f"{prefix}.ln.bias", (hidden,)),
        (f"{prefix}.slot.weight", (slots, hidden)),
        (f"{prefix}.K.weight", (d, hidden)), (f"{prefix}.Q.weight", (d, hidden)),
        (f"{prefix}.M.weight", (d, hidden)), (f"{prefix}.M.bias", (d,)),
        (f"{prefix}.N.weight", (d, hidden)), (f"{prefix}.v.weight", (1, d)),
        (f"{prefix}.o.weight", (1, hidden)), (f"{prefix}.o.bias", (1,)),
    ]  # fmt: skip


def tensor_shapes(size_name: str) -> dict[str, list[tuple[str, tuple[int, ...]]]]:
    """Names and shapes per file group: ``model`` (the shards) and ``broad`` (broad_head.safetensors)."""
    size = SIZES[size_name]
    h, d = size.backbone.hidden, size.head_dim
    head = [
        ("head.candidate_norm.weight", (h,)), ("head.candidate_norm.bias", (h,)),
        ("head.query_norm.weight", (h,)), ("head.query_norm.bias", (h,)),
        ("head.key.weight", (d, h)), ("head.query.weight", (d, h)),
        ("head.candidate_mlp.weight", (d, h)), ("head.candidate_mlp.bias", (d,)),
        ("head.query_mlp.weight", (d, h)), ("head.scalar.weight", (1, d)),
    ]  # fmt: skip
    model = _backbone_shapes(size) + head + [("set_bias", ())] + _span_shapes("span2", h, size.span_d, size.slots)
    return {"model": model, "broad": _span_shapes("span_broad", h, size.span_d, size.slots)}


def _tensor(name: str, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """A deterministic random value for one tensor, scaled so activations stay O(1)."""
    g = generator(seed, name)
    leaf = name.rsplit(".", 2)[-2] if "." in name else name
    if name == "set_bias":
        return torch.tensor(-0.5)
    gated_delta = gated_delta_parameter(name, shape, g)
    if gated_delta is not None:
        return gated_delta
    if name.endswith("bias") and len(shape) == 1:
        return 0.1 * torch.randn(shape, generator=g)
    if len(shape) == 1:
        # Qwen3.5's RMSNorm scales by (1 + w); its gated RMSNorm and the heads' LayerNorms by w.
        zero_centred = name.startswith("backbone.") and "linear_attn.norm" not in name
        return (0.0 if zero_centred else 1.0) + 0.1 * torch.randn(shape, generator=g)
    if leaf == "slot":
        return 0.5 * torch.randn(shape, generator=g)
    fan_in = shape[-1] if len(shape) == 2 else shape[-1] * shape[1]
    scale = 2.0 if leaf == "scalar" else 1.0
    return scale * torch.randn(shape, generator=g) / fan_in**0.5


def _save(path: Path, entries: list[tuple[str, tuple[int, ...]]], seed: int, dtype: torch.dtype) -> None:
    tensors = {}
    for name, shape in entries:
        value = _tensor(name, shape, seed)
        tensors[name] = value.to(dtype if name.startswith("backbone.") else torch.float32).contiguous()
    save_file(tensors, str(path), metadata={"format": "pt"})


def write(out: str | Path, size_name: str = "tiny", seed: int = 0, max_length: int = MAX_LENGTH) -> Member:
    """Write the member into ``out`` atomically and return its registry entry."""
    if size_name not in SIZES:
        raise ValueError(f"size must be one of {list(SIZES)}")
    size = SIZES[size_name]
    shapes = tensor_shapes(size_name)
    with staged_directory(out, "package") as stage:
        groups = shard_plan(shapes["model"], size.shards)
        weight_map = {}
        for index, group in enumerate(progress.track(groups, f"writing {size_name} shards", unit="shard"), start=1):
            shard = f"model-{index:05d}-of-{len(groups):05d}.safetensors"
            _save(stage / shard, group, seed, size.weights_dtype)
            weight_map.update({name: shard for name, _ in group})
        _save(stage / "broad_head.safetensors", shapes["broad"], seed, torch.float32)
        total = sum((stage / s).stat().st_size for s in set(weight_map.values()))
        _dump(stage / "model.safetensors.index.json", {"metadata": {"total_size": total}, "weight_map": weight_map})
        _dump(stage / "config.json", config(size_name, seed, max_length))
        _dump(stage / "calibration.json", calibration())
        (stage / "tokenizer.json").write_text(train_tokenizer(TOKENIZER_VOCAB), encoding="utf-8")
        weights = sorted(set(weight_map.values())) + ["broad_head.safetensors"]
        digests = {name: sha256_file(stage / name) for name in weights}
        _dump(stage / "MODEL_MANIFEST.json", {"format": "vela2-decoder-release/1", "files_sha256": digests})
        loaded = sorted(p.name for p in stage.iterdir())
        files = {name: digests.get(name) or sha256_file(stage / name) for name in loaded}
        (stage / "SHA256SUMS").write_text("".join(f"{files[n]}  {n}\n" for n in loaded), encoding="utf-8")
    name = member_name(size_name, seed, max_length)
    identity = sha256_json(digests)
    return Member(
        name=name,
        family="vela2",
        repo=f"synthetic/{name}",
        revision=identity[:40],
        files=files,
        model_sha256=identity,
        manifest_sha256=files["MODEL_MANIFEST.json"],
        loaded_parameters=parameter_count(size_name),
        max_input_tokens=max_length,
        licence="apache-2.0",
        synthetic=True,
        # A copy may be tried on the GPU; its consent gate decides (s1omni.runtime.reduced_copy).
        extra={"weights": "random", "size": size_name, "seed": seed, "reduced_copies": {"fp8": ["cuda"]}},
    )


def _dump(path: Path, value: Any) -> None:
    path.write_text(json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")


def parameter_count(size_name: str) -> int:
    """Parameters the member's tensors hold, from shapes alone (nothing is allocated)."""
    return sum(int(torch.Size(s).numel()) for group in tensor_shapes(size_name).values() for _, s in group)
