"""Synthetic members for tests, written into the session's s1omni home (see conftest)."""

from __future__ import annotations

from pathlib import Path


def make_vela_member(out: Path, seed: int = 0, max_length: int | None = None) -> Path:
    """A tiny synthetic Vela member at ``out`` with its entry in the session registry."""
    from s1omni.runtime.registry import user_registry, write_entry
    from s1omni.runtime.synth import vela2

    member = vela2.write(out, "tiny", seed, **({"max_length": max_length} if max_length else {}))
    write_entry(user_registry(), member)
    return out
