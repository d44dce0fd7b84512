"""Image decoding and preprocessing: Pillow's RGB and the reference's HF processor, bit for bit.

The expected hashes are the reference's own (tests/fixtures/omnijev/processor_reference.json):
transformers 5.17's torchvision-backed ``Qwen2VLImageProcessor`` at max_pixels 602,112, run by
``ThinkFlowLab/system1-omni:tests/omnijev/generate_fixtures.py`` on the same images, which are
redrawn here.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import zlib
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pyspng
import pytest
from PIL import Image

from s1omni.runtime.omnijev import image as image_module
from s1omni.runtime.omnijev.image import (
    MAX_IMAGE_BYTES,
    ImageRefused,
    Processor,
    decode_rgb,
    read_data_url,
    smart_resize,
)

FIXTURE = Path(__file__).parents[1] / "fixtures" / "omnijev" / "processor_reference.json"
CASES = {case["name"]: case for case in json.loads(FIXTURE.read_text())["cases"]}
PROCESSOR = Processor.from_config(None, max_pixels=602112)


def pattern(width: int, height: int) -> np.ndarray:
    x = np.arange(width, dtype=np.int64)[None, :]
    y = np.arange(height, dtype=np.int64)[:, None]
    return np.stack([(x * 7 + y * 3) % 256, (x * y + 13) % 256, ((x ^ y) * 5) % 256], -1).astype(np.uint8)


def encode(image: Image.Image, fmt: str = "PNG", **options) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **options)
    return buffer.getvalue()


def image_bytes(name: str) -> bytes:
    """The reference's test images: RGB patterns, RGBA, 8-bit gray, a 64-colour palette, 16-bit gray, JPEG."""
    if name == "rgba":
        alpha = ((np.arange(300)[None, :] + np.arange(200)[:, None]) % 256).astype(np.uint8)[..., None]
        return encode(Image.fromarray(np.concatenate([pattern(300, 200), alpha], -1)))
    if name == "gray":
        return encode(Image.fromarray(pattern(200, 150)[..., 0]))
    if name == "palette":
        return encode(Image.fromarray(pattern(180, 120)).quantize(64))
    if name == "gray16":
        return encode(
            Image.fromarray(((np.arange(160)[None, :] * 400 + np.arange(100)[:, None] * 50) % 65536).astype(np.uint16))
        )
    if name == "jpeg":
        return encode(Image.fromarray(pattern(96, 64)), "JPEG", quality=90)
    return encode(Image.fromarray(pattern(*CASES[name]["size"])))


def data_url(raw: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64," + base64.b64encode(raw).decode()


def sha256(array: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest()


EXPECTED_MODES = {"rgba": "RGBA", "gray": "L", "palette": "P", "gray16": "I;16", "jpeg": "RGB"}


@pytest.mark.parametrize("name", list(CASES))
def test_decode_equals_pillow_and_the_reference(name: str) -> None:
    raw = image_bytes(name)
    mime = "image/jpeg" if name == "jpeg" else "image/png"
    assert Image.open(io.BytesIO(raw)).mode == EXPECTED_MODES.get(name, "RGB")
    encoded = read_data_url(data_url(raw, mime))
    assert (encoded.width, encoded.height) == tuple(CASES[name]["size"])
    rgb = decode_rgb(encoded)
    pillow = np.asarray(Image.open(io.BytesIO(raw)).convert("RGB"))
    assert rgb.dtype == np.uint8 and rgb.shape == pillow.shape
    np.testing.assert_array_equal(rgb, pillow)
    assert sha256(rgb) == CASES[name]["rgb_sha256"]


@pytest.mark.parametrize("name", list(CASES))
def test_processor_equals_the_references_hf_processor_bit_for_bit(name: str) -> None:
    mime = "image/jpeg" if name == "jpeg" else "image/png"
    pixels = PROCESSOR(decode_rgb(read_data_url(data_url(image_bytes(name), mime))))
    case = CASES[name]
    assert list(pixels.grid) == case["image_grid_thw"]
    assert list(pixels.values.shape) == case["pixel_values_shape"]
    assert pixels.values.dtype == np.float32
    assert sha256(pixels.values) == case["pixel_values_sha256"]
    assert pixels.tokens == case["image_grid_thw"][1] * case["image_grid_thw"][2] // 4


@pytest.mark.parametrize("name", ["rgb_upscale", "rgb_odd", "rgba", "palette", "gray16"])
def test_processor_equals_transformers_when_torchvision_is_installed(name: str) -> None:
    pytest.importorskip("torchvision", reason="transformers' Qwen2VLImageProcessor needs torchvision")
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor

    hf = Qwen2VLImageProcessor(
        patch_size=16, temporal_patch_size=2, merge_size=2, image_mean=[0.5] * 3, image_std=[0.5] * 3,
        min_pixels=65536, max_pixels=602112,
    )  # fmt: skip
    rgb = np.asarray(Image.open(io.BytesIO(image_bytes(name))).convert("RGB"))
    expected = hf(images=[Image.fromarray(rgb)], return_tensors="pt")
    ours = PROCESSOR(rgb)
    np.testing.assert_array_equal(ours.values, expected["pixel_values"].numpy())
    assert list(ours.grid) == expected["image_grid_thw"][0].tolist()


def test_the_pil_backed_processor_is_not_the_reference() -> None:
    """Why the port: transformers' PIL backend resizes differently from the reference's."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    pil = Qwen2VLImageProcessorPil(
        patch_size=16, temporal_patch_size=2, merge_size=2, image_mean=[0.5] * 3, image_std=[0.5] * 3,
        min_pixels=65536, max_pixels=602112,
    )  # fmt: skip
    rgb = np.asarray(Image.open(io.BytesIO(image_bytes("rgb_odd"))).convert("RGB"))
    values = np.asarray(pil(images=[Image.fromarray(rgb)], return_tensors="np")["pixel_values"], np.float32)
    assert values.shape == tuple(CASES["rgb_odd"]["pixel_values_shape"])
    assert sha256(values) != CASES["rgb_odd"]["pixel_values_sha256"]


def test_processor_reads_its_config_and_the_manifest_budget() -> None:
    processor = Processor.from_config(
        {"patch_size": 16, "merge_size": 2, "temporal_patch_size": 2, "image_mean": [0.5] * 3, "image_std": [0.5] * 3,
         "rescale_factor": 1 / 255, "size": {"shortest_edge": 65536, "longest_edge": 401408}},
        max_pixels=602112,
    )  # fmt: skip
    assert processor == PROCESSOR  # the config's 401,408 gives way to MSO1's 602,112


@pytest.mark.parametrize(
    ("height", "width", "expected"),
    [
        (48, 64, (224, 320)),  # below min_pixels: scaled up
        (1080, 1920, (576, 1024)),  # above max_pixels: scaled down
        (4096, 4096, (768, 768)),  # the largest image: 576 tokens
        (20, 2000, (32, 2560)),
    ],
)
def test_smart_resize_keeps_the_budget(height: int, width: int, expected: tuple[int, int]) -> None:
    resized = smart_resize(height, width, 32, 65536, 602112)
    assert resized == expected
    assert resized[0] % 32 == 0 and resized[1] % 32 == 0
    assert resized[0] * resized[1] <= 602112


# ----------------------------------------------------------------------------- refusals


def png(width: int, height: int) -> bytes:
    return encode(Image.new("RGB", (width, height), (40, 90, 160)))


@pytest.mark.parametrize(
    ("url", "detail"),
    [
        ("no comma here", "invalid image data URL"),
        ("data:image/gif;base64,R0lGODlh", "only inline PNG/JPEG images are supported"),
        ("data:image/png,abcd", "only inline PNG/JPEG images are supported"),
        ("https://example.com/a.png", "invalid image data URL"),
        ("data:image/png;base64,@@@@", "invalid base64 image"),
        ("data:image/png;base64," + "A" * (4 * (MAX_IMAGE_BYTES // 3 + 1) + 4), "image exceeds 8 MiB"),
        ("data:image/jpeg;base64," + base64.b64encode(png(8, 8)).decode(), "image format does not match its MIME type"),
        ("data:image/png;base64," + base64.b64encode(b"\x89PNG\r\n\x1a\nnot a png").decode(), "invalid image"),
        (data_url(png(4097, 8)), "image must be at most 4096 pixels per side"),
        (data_url(png(201, 1)), "image aspect ratio must be at most 200"),
    ],
)
def test_data_url_refusals(url: str, detail: str) -> None:
    with pytest.raises(ImageRefused) as refused:
        read_data_url(url)
    assert str(refused.value).startswith(detail)


def test_decoded_size_is_limited_to_8_mib() -> None:
    # 4 * ceil(8 MiB / 3) base64 characters may decode to one byte more than 8 MiB.
    raw = b"\x89PNG\r\n\x1a\n" + b"\0" * (MAX_IMAGE_BYTES + 1 - 8)
    with pytest.raises(ImageRefused, match="image exceeds 8 MiB"):
        read_data_url(data_url(raw))


def test_an_aspect_ratio_of_200_is_accepted() -> None:
    encoded = read_data_url(data_url(png(200, 1)))
    assert (encoded.width, encoded.height) == (200, 1)
    assert PROCESSOR(decode_rgb(encoded)).grid == (1, 2, 228)  # 32 x 3648 px


def test_a_truncated_png_is_refused_at_decode() -> None:
    raw = png(64, 64)
    encoded = read_data_url(data_url(raw[: len(raw) // 2]))
    with pytest.raises(ImageRefused, match="invalid image"):
        decode_rgb(encoded)


def _with_chunk(raw: bytes, kind: bytes, payload: bytes) -> bytes:
    """``raw`` with a chunk inserted after IHDR (8 bytes of signature, then IHDR's 25)."""
    chunk = len(payload).to_bytes(4, "big") + kind + payload + zlib.crc32(kind + payload).to_bytes(4, "big")
    return raw[:33] + chunk + raw[33:]


def _spng_calls(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    calls: list[bytes] = []

    def load(data: bytes, format: str | None = None) -> np.ndarray:
        calls.append(data)
        return pyspng.load(data, format=format)

    monkeypatch.setattr(image_module, "pyspng", SimpleNamespace(load=load))
    return calls


@pytest.mark.parametrize(
    ("name", "fast"),
    [("rgb-noise", True), ("rgba", True), ("rgb-transparent-colour", True), ("gray", False), ("palette", False), ("gray16", False)],
)
def test_8_bit_truecolour_pngs_go_through_libspng_and_decode_as_pillow(monkeypatch: pytest.MonkeyPatch, name: str, fast: bool) -> None:
    """libspng takes 8-bit RGB and RGBA (a tRNS colour key changes nothing in RGB) and gives Pillow's array;
    the other PNGs never reach it."""
    noise = np.random.default_rng(5).integers(0, 256, (90, 130, 3), dtype=np.uint8)
    made = {"rgb-noise": encode(Image.fromarray(noise)), "rgb-transparent-colour": encode(Image.fromarray(noise), transparency=(1, 2, 3))}
    raw = made.get(name) or image_bytes(name)
    calls = _spng_calls(monkeypatch)
    rgb = decode_rgb(read_data_url(data_url(raw)))
    np.testing.assert_array_equal(rgb, np.asarray(Image.open(io.BytesIO(raw)).convert("RGB")))
    assert rgb.dtype == np.uint8 and rgb.flags.writeable
    assert calls == ([raw] if fast else [])


def test_a_png_libspng_refuses_is_pillows_to_decide(monkeypatch: pytest.MonkeyPatch) -> None:
    """An unknown critical chunk: libspng refuses the file, Pillow skips the chunk and decodes it; the answer is
    Pillow's. A truncated file both refuse is refused with Pillow's reason."""
    raw = _with_chunk(encode(Image.fromarray(pattern(40, 30))), b"ZZZZ", b"??")
    with pytest.raises(RuntimeError):
        pyspng.load(raw, format="RGB")
    calls = _spng_calls(monkeypatch)
    np.testing.assert_array_equal(decode_rgb(read_data_url(data_url(raw))), pattern(40, 30))
    assert len(calls) == 1
    truncated = encode(Image.fromarray(pattern(64, 64)))
    with pytest.raises(ImageRefused, match="invalid image"):
        decode_rgb(read_data_url(data_url(truncated[: len(truncated) // 2])))
    assert len(calls) == 2


def test_without_libspng_pillow_decodes_every_png(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(image_module, "pyspng", None)
    for name in ("rgba", "gray", "palette"):
        raw = image_bytes(name)
        np.testing.assert_array_equal(decode_rgb(read_data_url(data_url(raw))), np.asarray(Image.open(io.BytesIO(raw)).convert("RGB")))
