"""The request's image: data-URL decoding, limits, Pillow's RGB, and the Qwen2-VL preprocessing.

Limits are wire-contract.md §11.3 (8 MiB decoded, PNG/JPEG only with matching magic bytes, at
most 4096 px per side, aspect ratio at most 200). Decoding is Pillow's ``Image.open(...).convert("RGB")``,
which is what the reference does (omnijev.md §3.1), but for the common PNG: 8-bit RGB or RGBA, whose
samples the PNG format fixes, go through libspng (``pyspng``, where it is installed), the alpha dropped as
``convert("RGB")`` drops it: the same array, faster (a 1600x900 screenshot's decode 8.1-8.6 ms against
Pillow's 12.1-12.9 plus its copy into numpy on a 2-core host; ``benchmarks/README.md``, "Where an OmniJev
plan goes"). Where libspng refuses the data, Pillow decodes it, so what is refused, and why, stays Pillow's;
every other PNG (palette, grey, 16-bit) and every JPEG is Pillow's alone.

Preprocessing is a port of transformers 5.17's torchvision-backed ``Qwen2VLImageProcessor``, the
processor the reference environment (with torchvision) loads, at ``MSO1``'s budget
(``tinnel123666888/OmniJev:mso/infer.py``: max_pixels 602,112): ``smart_resize`` to multiples of
patch x merge, a uint8 antialiased bicubic resize (torch's native uint8 kernel, as torchvision uses
on the CPU), a fused ``(x - mean/r) / (std/r)`` in float32, and the patch layout with the temporal
duplicate. transformers' PIL-backed processor resizes differently and does not reproduce the
reference; the tests hold this port to the reference's recorded pixel hashes
(``ThinkFlowLab/system1-omni:tests/omnijev/data/pixels.json``).
"""

from __future__ import annotations

import base64
import binascii
import io
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

try:
    import pyspng
except ImportError:  # not built for every platform: Pillow decodes everything there
    pyspng = None

MAX_IMAGE_BYTES = 8 * 1024 * 1024
MAX_SIDE = 4096
MAX_ASPECT = 200
FORMATS = {"data:image/png;base64": "png", "data:image/jpeg;base64": "jpeg"}
MAGIC = {"png": b"\x89PNG\r\n\x1a\n", "jpeg": b"\xff\xd8\xff"}
# IHDR, which a PNG must open with: its bit depth and colour type bytes (after the signature, the chunk's
# length and type, width and height), and the colour types libspng decodes here (truecolour, with alpha).
IHDR_BIT_DEPTH, IHDR_COLOUR_TYPE = 24, 25
SPNG_COLOUR_TYPES = (2, 6)
# Qwen3.5's processor values (engines.md §2) and MSO1's budget, for exports without a processor config.
DEFAULT_PROCESSOR = {
    "patch_size": 16,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
    "rescale_factor": 1 / 255,
    "size": {"shortest_edge": 65536},
}


class ImageRefused(ValueError):
    """An image the contract refuses; the message is the 422 detail."""


@dataclass(frozen=True)
class EncodedImage:
    format: str  # png | jpeg
    data: bytes
    width: int
    height: int


def read_data_url(url: str) -> EncodedImage:
    """Decode ``data:image/png|jpeg;base64,...`` and read the header; ``ImageRefused`` says why not."""
    prefix, comma, encoded = url.partition(",")
    if not comma:
        raise ImageRefused("invalid image data URL")
    if prefix not in FORMATS:
        raise ImageRefused("only inline PNG/JPEG images are supported")
    declared = FORMATS[prefix]
    if len(encoded) > 4 * math.ceil(MAX_IMAGE_BYTES / 3):
        raise ImageRefused("image exceeds 8 MiB")
    try:
        data = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ImageRefused(f"invalid base64 image: {exc}") from None
    if len(data) > MAX_IMAGE_BYTES:
        raise ImageRefused("image exceeds 8 MiB")
    if not data.startswith(MAGIC[declared]):
        raise ImageRefused("image format does not match its MIME type")
    try:
        with Image.open(io.BytesIO(data), formats=[declared.upper()]) as image:
            width, height = image.size
    except (OSError, ValueError, Image.DecompressionBombError) as exc:
        raise ImageRefused(f"invalid image: {exc}") from None
    if not (0 < width <= MAX_SIDE and 0 < height <= MAX_SIDE):
        raise ImageRefused(f"image must be at most {MAX_SIDE} pixels per side")
    if max(width, height) > MAX_ASPECT * min(width, height):
        raise ImageRefused(f"image aspect ratio must be at most {MAX_ASPECT}")
    return EncodedImage(declared, data, width, height)


def decode_rgb(image: EncodedImage) -> np.ndarray:
    """The pixels as Pillow's ``convert("RGB")`` gives them: uint8 ``[H, W, 3]``."""
    if pyspng is not None and image.format == "png" and _truecolour_8bit(image.data):
        try:
            return pyspng.load(image.data, format="RGB")
        except RuntimeError:  # libspng refuses it: Pillow decides (see the module docstring)
            pass
    try:
        with Image.open(io.BytesIO(image.data), formats=[image.format.upper()]) as opened:
            return np.array(opened.convert("RGB"), dtype=np.uint8)
    except (OSError, ValueError) as exc:
        raise ImageRefused(f"invalid image: {exc}") from None


def _truecolour_8bit(data: bytes) -> bool:
    return len(data) > IHDR_COLOUR_TYPE and data[IHDR_BIT_DEPTH] == 8 and data[IHDR_COLOUR_TYPE] in SPNG_COLOUR_TYPES


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """Qwen2-VL's target size: multiples of ``factor``, area within [min_pixels, max_pixels], aspect kept."""
    if max(height, width) > MAX_ASPECT * min(height, width):
        raise ImageRefused(f"image aspect ratio must be at most {MAX_ASPECT}")
    resized_h = round(height / factor) * factor
    resized_w = round(width / factor) * factor
    if resized_h * resized_w > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        resized_h = max(factor, math.floor(height / beta / factor) * factor)
        resized_w = max(factor, math.floor(width / beta / factor) * factor)
    elif resized_h * resized_w < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        resized_h = math.ceil(height * beta / factor) * factor
        resized_w = math.ceil(width * beta / factor) * factor
    return resized_h, resized_w


@dataclass(frozen=True)
class Pixels:
    values: np.ndarray  # float32 [grid_h * grid_w, channels * temporal * patch * patch]
    grid: tuple[int, int, int]  # (t, h, w) in patches
    merge_size: int

    @property
    def tokens(self) -> int:
        """Image placeholders in the prompt: one per merge x merge group of patches."""
        t, h, w = self.grid
        return t * (h // self.merge_size) * (w // self.merge_size)


@dataclass(frozen=True)
class Processor:
    patch_size: int
    temporal_patch_size: int
    merge_size: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    rescale_factor: float
    min_pixels: int
    max_pixels: int

    @classmethod
    def from_config(cls, config: dict[str, Any] | None, max_pixels: int) -> Processor:
        """From a ``preprocessor_config.json`` (Qwen3.5's values where absent) at ``max_pixels``."""
        merged = {**DEFAULT_PROCESSOR, **(config or {})}
        size = merged.get("size") or {}
        return cls(
            patch_size=int(merged["patch_size"]),
            temporal_patch_size=int(merged["temporal_patch_size"]),
            merge_size=int(merged["merge_size"]),
            mean=tuple(float(v) for v in merged["image_mean"]),
            std=tuple(float(v) for v in merged["image_std"]),
            rescale_factor=float(merged["rescale_factor"]),
            min_pixels=int(size.get("shortest_edge", merged.get("min_pixels", 65536))),
            max_pixels=int(max_pixels),
        )

    def __call__(self, rgb: np.ndarray) -> Pixels:
        height, width = rgb.shape[:2]
        patch, merge, temporal = self.patch_size, self.merge_size, self.temporal_patch_size
        target = smart_resize(height, width, patch * merge, self.min_pixels, self.max_pixels)
        # CHW over HWC memory (channels-last), as torchvision's pil_to_tensor hands it over.
        image = torch.from_numpy(np.ascontiguousarray(rgb)).permute(2, 0, 1)[None]
        if target != (height, width):  # torchvision returns the image untouched at its own size
            image = F.interpolate(image, size=list(target), mode="bicubic", align_corners=False, antialias=True)
        # transformers fuses rescale and normalize: mean and std divided by the rescale factor, in float32.
        scale = np.float32(1.0 / self.rescale_factor)
        mean = (np.asarray(self.mean, np.float32) * scale)[:, None, None]
        std = (np.asarray(self.std, np.float32) * scale)[:, None, None]
        values = (image[0].numpy().astype(np.float32) - mean) / std
        channels, rows, cols = values.shape
        grid_h, grid_w = rows // patch, cols // patch
        blocks = values.reshape(channels, grid_h // merge, merge, patch, grid_w // merge, merge, patch)
        # [h/merge, w/merge, merge, merge, C, patch, patch], then the temporal copy after C.
        blocks = blocks.transpose(1, 4, 2, 5, 0, 3, 6)[:, :, :, :, :, None]
        blocks = np.broadcast_to(blocks, (*blocks.shape[:5], temporal, patch, patch))
        flat = np.ascontiguousarray(blocks.reshape(grid_h * grid_w, channels * temporal * patch * patch))
        return Pixels(flat, (1, grid_h, grid_w), merge)
