"""Vela 2.0 from an engine directory: the heads, tokenizer, config and calibration ``s1omni export``
wrote, over the engine's backbone runner."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..engine import engine_runner
from ..identity import Identity
from .heads import read_tensors
from .model import Vela2Model


def load_engine(path: Path, manifest: dict[str, Any], device: str = "cpu") -> Vela2Model:
    """The model of an engine whose manifest (``manifest``) has been read and its files checked."""
    heads = read_tensors([path / "heads.safetensors"], ("head.", "set_bias", "span2.", "span_broad."))
    config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    calibration = json.loads((path / "calibration.json").read_text(encoding="utf-8"))
    return Vela2Model(
        Identity(**manifest["member"]),
        config,
        calibration,
        path / "tokenizer.json",
        heads,
        engine_runner(path, manifest, device),
    )
