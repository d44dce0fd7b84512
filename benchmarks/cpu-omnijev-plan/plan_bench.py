"""Where an OmniJev request's plan goes: ``OmniJevModel.plan`` of the 1600x900 screenshot request, step by step.

    .venv/bin/s1omni synth omnijev --size tiny --out /tmp/omnijev-tiny
    for format in png jpeg; do
      .venv/bin/python benchmarks/cpu-omnijev-plan/plan_bench.py --package /tmp/omnijev-tiny --format $format \\
        --out benchmarks/cpu-omnijev-plan/$format-kept.json
      S1OMNI_MALLOC=system .venv/bin/python benchmarks/cpu-omnijev-plan/plan_bench.py --package /tmp/omnijev-tiny \\
        --format $format --out benchmarks/cpu-omnijev-plan/$format-system.json
    done

The plan is host work before any model work, the same for the reference and every engine: the H200 profile
of a one-option screenshot request puts it at 33.0 of 157.2 ms (``benchmarks/h200-omnijev-4B-attn16``). The
request is the benchmark's ``screenshot-1`` (``s1omni.bench.workloads``), its PNG as it is (``--format png``)
or re-encoded as a JPEG of quality 90 (``jpeg``); the tiny member gives the synthetic members' tokenizer and
the 4B's processor settings (the same ``preprocessor_config.json`` values and ``max_pixels``).

``plan`` whole is timed first, with the minor page faults a plan takes, as a process that has just loaded the
model runs it; then each step on its own, in ``plan``'s order and on ``plan``'s own functions, and the image
path as ``plan`` runs it (each step on the previous one's fresh output, not on one array over and over); for a
PNG, last, ``plan`` whole with the PNG decoded by libspng and by Pillow alone (``image.pyspng`` set aside) in
``--rounds`` alternating rounds. Figures are p50 / p95 (nearest rank) of ``--repeats`` wall milliseconds after
one warm-up. ``*-system.json`` ran with glibc's malloc defaults (``S1OMNI_MALLOC=system``), ``*-kept.json``
with freed memory kept, as every model-loading process keeps it (``s1omni.runtime.host_memory``). The load
average before and after is recorded: this machine may be shared.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import os
import platform
import resource
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import PIL
import pyspng
import torch
import torch.nn.functional as F
from PIL import Image

from s1omni.bench.stats import quantiles_ms
from s1omni.bench.workloads import SCREENSHOT_SIZE, screenshot, screenshot_url
from s1omni.runtime import host_memory
from s1omni.runtime.api import load_model
from s1omni.runtime.omnijev import contract, image, layout
from s1omni.runtime.omnijev.image import decode_rgb, smart_resize
from s1omni.runtime.omnijev.model import plan_tree

JPEG_QUALITY = 90


def screenshot_body(model_id: str, image_format: str) -> dict[str, Any]:
    body = {"model": model_id, **screenshot(1).body}
    if image_format == "jpeg":
        png = base64.b64decode(screenshot_url(*SCREENSHOT_SIZE).partition(",")[2])
        buffer = io.BytesIO()
        Image.open(io.BytesIO(png)).convert("RGB").save(buffer, format="JPEG", quality=JPEG_QUALITY)
        body["state"] = {"images": ["data:image/jpeg;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")]}
    return body


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--package", required=True, help="an OmniJev package (the tiny synthetic member will do)")
    parser.add_argument("--format", choices=["png", "jpeg"], default="png", help="the screenshot's encoding")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=4, help="alternating rounds of plan whole, libspng then Pillow (PNG)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    model = load_model(args.package)
    body = screenshot_body(model.id, args.format)
    request = contract.compile_request(body, model.names)
    encoded = request.image
    opened = Image.open(io.BytesIO(encoded.data), formats=[encoded.format.upper()])
    opened.load()
    rgb = decode_rgb(encoded)
    processor = model.processor
    target = smart_resize(*rgb.shape[:2], processor.patch_size * processor.merge_size, processor.min_pixels, processor.max_pixels)
    pixels = processor(rgb)
    planned = layout.plan_layout(request.questions, model.tokenizer, pixels.tokens, pixels.grid, pixels.merge_size, model.token_ids)
    chw = torch.from_numpy(rgb).permute(2, 0, 1)[None]

    def pillow_decode() -> None:
        with Image.open(io.BytesIO(encoded.data), formats=[encoded.format.upper()]) as fresh:
            fresh.load()

    steps: dict[str, Callable[[], Any]] = {
        "contract (JSON checks, base64, image header)": lambda: contract.compile_request(body, model.names),
        "decode (Pillow)": pillow_decode,
        "convert('RGB') (Pillow)": lambda: opened.convert("RGB"),
        "to numpy (Pillow)": lambda: np.array(opened.convert("RGB"), dtype=np.uint8),
    }
    if args.format == "png":
        steps["decode (libspng, RGB)"] = lambda: pyspng.load(encoded.data, format="RGB")
    steps |= {
        "decode_rgb (as plan decodes this image)": lambda: decode_rgb(encoded),
        "resize (bicubic, antialiased, uint8)": lambda: F.interpolate(chw, size=list(target), mode="bicubic", align_corners=False, antialias=True),
        "processor (resize, normalize, patches)": lambda: processor(rgb),
        "image path as plan runs it (decode_rgb, then processor)": lambda: processor(decode_rgb(encoded)),
        "layout (tokenize, rows)": lambda: layout.plan_layout(
            request.questions, model.tokenizer, pixels.tokens, pixels.grid, pixels.merge_size, model.token_ids
        ),
        "tree": lambda: plan_tree(request.questions, planned),
    }
    before = os.getloadavg()
    # plan whole first, as a serving process runs it after the load: the steps below, each on one array over
    # and over, change what glibc's heap holds (its mmap threshold rises to the largest block freed).
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    results = {"plan whole": quantiles_ms(lambda: model.plan(body), args.repeats)}
    faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults) / (args.repeats + 1)
    results |= {name: quantiles_ms(step, args.repeats) for name, step in steps.items()}
    decoders = []
    for _ in range(args.rounds if args.format == "png" else 0):
        row = {}
        for decoder, module in (("libspng", pyspng), ("pillow", None)):
            image.pyspng = module
            row[decoder] = quantiles_ms(lambda: model.plan(body), args.repeats)["p50_ms"]
        decoders.append(row)
    image.pyspng = pyspng
    record = {
        "command": sys.argv,
        "machine": {"cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(), "python": platform.python_version(),
                    "pillow": PIL.__version__, "pyspng": pyspng.__version__, "torch": torch.__version__, "numpy": np.__version__},  # fmt: skip
        "image": {"format": args.format, "size": list(opened.size), "bytes": len(encoded.data), "resized": list(target),
                  "patches": list(pixels.values.shape)},  # fmt: skip
        "repeats": args.repeats,
        "kept_freed_memory": host_memory.keep_freed_memory(),
        "minor_page_faults_per_plan": faults,
        "load_average": {"before": before, "after": os.getloadavg()},
        "steps": results,
        "plan_p50_ms_by_png_decoder": decoders,
    }
    with open(args.out, "w", encoding="utf-8") as out:
        json.dump(record, out, indent=1)
        out.write("\n")
    for name, figures in results.items():
        print(f"{name:58s} {figures['p50_ms']:8.2f} {figures['p95_ms']:8.2f}")
    print(f"minor page faults a plan: {faults:.0f} (freed memory kept: {record['kept_freed_memory']})")
    if decoders:
        print("plan p50 ms by PNG decoder, alternating rounds:", decoders)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
