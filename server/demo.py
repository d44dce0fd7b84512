"""The embedded demo member: what ``s1omni serve`` answers with when given no package or engine.

A tiny synthetic Vela 2.0 decoder (the real layout, tokenizer and heads, random weights) written
once under ``home()/demo``, with its registry entry in the home registry; its answers mean nothing.
"""

from __future__ import annotations

import logging
from pathlib import Path

from s1omni.runtime.api import DecisionModel, load_model
from s1omni.runtime.errors import PackageError
from s1omni.runtime.registry import Registry, home, write_entry

log = logging.getLogger("s1omni.server")

SIZE, SEED = "tiny", 0
NOTICE = "embedded demo member: a tiny synthetic Vela 2.0 decoder with random weights; its answers mean nothing"


def paths() -> tuple[Path, Path]:
    """The demo package directory and the home registry file that pins it."""
    return home() / "demo", home() / "registry.json"


def load(device: str) -> DecisionModel:
    """The demo model, writing its package first when it is missing or does not verify."""
    from s1omni.runtime.package import verify
    from s1omni.runtime.synth import vela2

    root, registry_file = paths()
    log.warning("serving the %s at %s", NOTICE, root)
    registry = Registry.load(registry_file)
    try:
        verify(root, registry)
    except PackageError as exc:
        log.info("writing the demo member (%s)", exc)
        write_entry(registry_file, vela2.write(root, SIZE, SEED))
        registry = Registry.load(registry_file)
    return load_model(root, registry, device)
