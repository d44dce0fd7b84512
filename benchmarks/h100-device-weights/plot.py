"""memory.png from 0.8B-memory/memory.json: device memory of 1 and 2 runners, own copies against one shared copy.

    python3 benchmarks/h100-device-weights/plot.py
"""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = Path(__file__).parent


def main() -> None:
    cases = json.loads((HERE / "0.8B-memory" / "memory.json").read_text())["cases"]
    labels = [f"{case['instances']} instance{'s' * (case['instances'] > 1)}\n{'shared' if case['shared'] else 'own copies'}" for case in cases]
    loaded = [case["loaded_gib"] for case in cases]
    grown = [case["after_forward_gib"] - case["loaded_gib"] for case in cases]
    figure, axes = plt.subplots(figsize=(7, 4))
    axes.bar(labels, loaded, label="after loading (prefill, continue and packed sessions)")
    axes.bar(labels, grown, bottom=loaded, label="after one router-shaped forward each")
    for x, (base, extra) in enumerate(zip(loaded, grown, strict=True)):
        axes.text(x, base + extra + 0.2, f"{base + extra:.1f}", ha="center")
    axes.set_ylabel("device memory in use (GiB)")
    axes.set_title("0.8B bf16 engine, H100: each session's own weights or one shared copy (1.88 GiB)", fontsize=10)
    axes.legend(loc="upper left", fontsize=8)
    figure.tight_layout()
    figure.savefig(HERE / "memory.png", dpi=120)


if __name__ == "__main__":
    main()
