"""The family table (``s1omni.runtime.families``) and the export and server layers' faces under its names."""

from __future__ import annotations

from pathlib import Path

import pytest

from s1omni.runtime.engine import load_engine_model, write_manifest
from s1omni.runtime.families import FAMILIES, UnknownFamily, family
from s1omni.runtime.package import detect_family, verify


def test_every_layer_has_a_face_for_every_family_and_no_other() -> None:
    from s1omni.export.families import EXPORT_FAMILIES
    from s1omni.server.families import RULES

    assert set(EXPORT_FAMILIES) == set(RULES) == set(FAMILIES) == {"vela2", "omnijev"}


def test_a_face_gives_the_family_s_own_parts(tiny_vela: Path) -> None:
    vela2, omnijev = family("vela2"), family("omnijev")
    assert detect_family(tiny_vela) == "vela2"
    assert vela2.gate().detect(tiny_vela) and not omnijev.gate().detect(tiny_vela)
    assert {"tiny", "4B"} <= set(omnijev.synth().SIZES) and "0.8B" in vela2.synth().SIZES
    assert omnijev.images and not vela2.images


def test_an_unknown_family_is_one_typed_error_in_every_layer(tiny_vela: Path, tmp_path: Path) -> None:
    from s1omni.export.families import export_family
    from s1omni.server.config import ServeConfig
    from s1omni.server.families import family_for
    from s1omni.server.metrics import Metrics

    for name in ("vela3", None, ["vela2"]):
        with pytest.raises(UnknownFamily, match="no model family .*; the families are vela2, omnijev"):
            family(name)  # type: ignore[arg-type]
    with pytest.raises(UnknownFamily, match="'vela3'"):
        verify(tiny_vela, family="vela3")
    with pytest.raises(UnknownFamily, match="'vela3'"):
        export_family("vela3")
    with pytest.raises(UnknownFamily, match="'vela3'"):
        family_for("vela3", ServeConfig(), Metrics())
    engine = tmp_path / "engine"
    engine.mkdir()
    member = {"name": "not-in-the-registry", "revision": "r1"}
    write_manifest(engine, {"stage": "engine", "family": "vela3", "member": member, "validation": {"passed": True}})
    with pytest.raises(UnknownFamily, match="'vela3'"):
        load_engine_model(engine)
