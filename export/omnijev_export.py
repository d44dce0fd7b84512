"""What ``s1omni export`` writes for an OmniJev package (the rest of the export is ``s1omni.export.package_export``'s).

- ``prefill.onnx``/``continue.onnx``: the language backbone as ``s1omni.export.onnx_export`` traces every
  Qwen3.5 backbone, the prefill taking ``inputs_embeds`` so the image features go in at their
  placeholders (the runner looks the tokens up; the blocks are text and take token ids);
- ``vision.onnx``: the vision tower (``s1omni.export.vision_export``);
- ``embedding.safetensors``: the tied embedding in float32, the table the runner looks tokens up in
  and the LM head of the option-text log-probabilities (``s1omni.runtime.omnijev.features`` reads it in
  float32, as the reference path does from the float32 model);
- ``heads.safetensors`` (float32), ``tokenizer.json``, ``config.json``, the processor config,
  ``calibration.json`` and ``release.json``: the release manifest's fields the model reads
  (``s1omni.runtime.omnijev.model.Release``).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from safetensors.numpy import save_file

from s1omni.runtime import progress
from s1omni.runtime.omnijev import layout
from s1omni.runtime.omnijev.engine import EMBEDDING, EMBEDDING_TENSOR, RELEASE
from s1omni.runtime.omnijev.heads import Heads
from s1omni.runtime.omnijev.model import PROCESSOR_CONFIG
from s1omni.runtime.omnijev.package import LANGUAGE_PREFIX
from s1omni.runtime.omnijev.vision import VisionTower
from s1omni.runtime.package import VerifiedPackage
from s1omni.runtime.runners.torch_runner import load_backbone

from .onnx_export import export_model, move_into
from .vision_export import export_vision

RELEASE_FIELDS = ("model_id", "option_tokens", "max_pixels")


def _dump(path: Path, value: Any) -> None:
    path.write_text(json.dumps(value, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def write_omnijev(package: VerifiedPackage, stage: Path, recurrences: tuple[str, ...]) -> dict[str, Any]:
    """Write an OmniJev package's export files into ``stage``; the manifest fields they add."""
    root, details = package.root, package.details
    manifest, config = details["manifest"], details["config"]
    progress.note(f"loading the language model of {root}")
    backbone = load_backbone(config["text_config"], [root / s for s in details["shards"]], prefix=LANGUAGE_PREFIX)
    move_into(export_model(backbone, stage / "graphs", prefill_embeds=True, recurrences=recurrences, packed=False), stage)
    vision = export_vision(VisionTower.load(config["vision_config"], root / "vision.safetensors"), config["vision_config"], stage)
    progress.note("writing the embedding, heads, tokenizer and settings")
    save_file({EMBEDDING_TENSOR: backbone.embed_tokens.weight.detach().float().numpy()}, str(stage / EMBEDDING))
    save_file(Heads.load(root / "heads.safetensors").tensors, str(stage / "heads.safetensors"))
    copied = ["tokenizer.json", "config.json"] + ([PROCESSOR_CONFIG] if PROCESSOR_CONFIG in manifest["outputs"] else [])
    for name in copied:
        shutil.copyfile(root / name, stage / name)
    _dump(stage / "calibration.json", manifest["calibration"])
    _dump(stage / RELEASE, {field: manifest[field] for field in RELEASE_FIELDS})
    return {"max_tokens": layout.MAX_SEQUENCE, "vision_check": {"max_relative": vision}}
