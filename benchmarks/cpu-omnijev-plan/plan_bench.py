"""Where an OmniJev request's plan goes: ``OmniJevModel.plan`` of the 1600x900 screenshot request, step by step.

    .venv/bin/s1omni synth omnijev --size tiny --out /tmp/omnijev-tiny
    .venv/bin/python benchmarks/cpu-omnijev-plan/plan_bench.py --package /tmp/omnijev-tiny --out benchmarks/cpu-omnijev-plan/after.json
    S1OMNI_MALLOC=system .venv/bin/python benchmarks/cpu-omnijev-plan/plan_bench.py --package /tmp/omnijev-tiny --out benchmarks/cpu-omnijev-plan/before.json

The plan is host work before any model work, the same for the reference and every engine: the H200 profile
of a one-option screenshot request puts it at 33.0 of 157.2 ms (``benchmarks/h200-omnijev-4B-attn16``). The
request is the benchmark's ``screenshot-1`` (``s1omni.bench.workloads``); the tiny member gives the synthetic
members' tokenizer and the 4B's processor settings (the same ``preprocessor_config.json`` values and
``max_pixels``). Each step is timed on its own, in ``plan``'s order and on ``plan``'s own functions, after one
warm-up: p50 / p95 (nearest rank) of ``--repeats`` wall milliseconds, with the image path as ``plan`` runs it
(each step on the previous one's fresh output, not on one array over and over); ``plan`` whole is timed first,
with the minor page faults a plan takes, as a process that has just loaded the model runs it. ``before.json`` ran with glibc's malloc defaults (``S1OMNI_MALLOC=system``), ``after.json`` with the
freed memory kept, as every model-loading process keeps it (``s1omni.runtime.host_memory``). The load average
before and after is recorded: this machine may be shared.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import resource
import sys

import numpy as np
import PIL
import torch
import torch.nn.functional as F
from PIL import Image

from s1omni.bench.stats import quantiles_ms
from s1omni.bench.workloads import screenshot
from s1omni.runtime import host_memory
from s1omni.runtime.api import load_model
from s1omni.runtime.omnijev import contract, layout
from s1omni.runtime.omnijev.image import decode_rgb, smart_resize
from s1omni.runtime.omnijev.model import plan_tree


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--package", required=True, help="an OmniJev package (the tiny synthetic member will do)")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    model = load_model(args.package)
    body = {"model": model.id, **screenshot(1).body}
    request = contract.compile_request(body, model.names)
    encoded = request.image
    png = Image.open(io.BytesIO(encoded.data), formats=["PNG"])
    png.load()
    rgb = decode_rgb(encoded)
    processor = model.processor
    factor = processor.patch_size * processor.merge_size
    target = smart_resize(*rgb.shape[:2], factor, processor.min_pixels, processor.max_pixels)
    pixels = processor(rgb)
    planned = layout.plan_layout(request.questions, model.tokenizer, pixels.tokens, pixels.grid, pixels.merge_size, model.token_ids)
    chw = torch.from_numpy(rgb).permute(2, 0, 1)[None]

    def open_and_decode() -> None:
        with Image.open(io.BytesIO(encoded.data), formats=["PNG"]) as image:
            image.load()

    steps = {
        "contract (JSON checks, base64, image header)": lambda: contract.compile_request(body, model.names),
        "PNG decode (Pillow)": open_and_decode,
        "convert('RGB')": lambda: png.convert("RGB"),
        "to numpy": lambda: np.array(png.convert("RGB"), dtype=np.uint8),
        "resize (bicubic, antialiased, uint8)": lambda: F.interpolate(chw, size=list(target), mode="bicubic", align_corners=False, antialias=True),
        "processor whole (resize, normalize, patches)": lambda: processor(rgb),
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
    record = {
        "command": sys.argv,
        "machine": {"cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(), "python": platform.python_version(),
                    "pillow": PIL.__version__, "torch": torch.__version__, "numpy": np.__version__},  # fmt: skip
        "image": {"size": list(png.size), "png_bytes": len(encoded.data), "resized": list(target), "patches": list(pixels.values.shape)},
        "repeats": args.repeats,
        "kept_freed_memory": host_memory.keep_freed_memory(),
        "minor_page_faults_per_plan": faults,
        "load_average": {"before": before, "after": os.getloadavg()},
        "steps": results,
    }
    with open(args.out, "w", encoding="utf-8") as out:
        json.dump(record, out, indent=1)
        out.write("\n")
    for name, figures in results.items():
        print(f"{name:58s} {figures['p50_ms']:8.2f} {figures['p95_ms']:8.2f}")
    print(f"minor page faults a plan: {faults:.0f} (freed memory kept: {record['kept_freed_memory']})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
