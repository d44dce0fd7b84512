"""OmniJev fixtures: the tiny synthetic member (registered in the session registry) and its model."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def omnijev_member(s1omni_home: Path):
    """The tiny synthetic OmniJev member (seed 0): its directory and registry entry."""
    from s1omni.runtime.registry import user_registry, write_entry
    from s1omni.runtime.synth import omnijev

    out = s1omni_home / "omnijev-tiny"
    member = omnijev.write(out, "tiny", 0)
    write_entry(user_registry(), member)
    return out, member


@pytest.fixture(scope="session")
def omnijev_package(omnijev_member) -> Path:
    return omnijev_member[0]


@pytest.fixture(scope="session")
def omnijev_model(omnijev_package: Path):
    """The tiny member on the torch reference runner, loaded the way the server loads it."""
    from s1omni.runtime.api import load_model

    return load_model(omnijev_package)
