"""The benchmark record: machine facts, the JSON file, and its plot.

The plot is drawn from the record alone, so it can be redrawn from a committed record anywhere.
Format 2 added the reference subjects (``references``: the torch fallback, and ``reference+fla``
where flash-linear-attention ran) and took every engine's ratio against the faster one.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

FORMAT = "s1omni-bench/2"
NAN = float("nan")  # a figure a run lacks (every request failed) is left out of the plot
PACKAGES = (
    "torch", "transformers", "onnxruntime", "onnxruntime-gpu", "numpy", "tokenizers", "starlette", "uvicorn", "aiohttp",
    "flash-linear-attention", "fla-core", "triton",
)  # fmt: skip


def _cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or None


def _versions() -> dict[str, str]:
    found = {}
    for name in PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return found


def _nvidia_smi() -> list[dict[str, str]]:
    """Driver and board facts as ``nvidia-smi`` reports them (none without the tool)."""
    if shutil.which("nvidia-smi") is None:
        return []
    fields = ("name", "driver_version", "memory.total", "pci.bus_id")
    out = subprocess.run(
        ["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    return [
        dict(zip(fields, (part.strip() for part in line.split(",")), strict=True))
        for line in out.stdout.splitlines()
        if line.strip()
    ]


def machine() -> dict[str, Any]:
    import onnxruntime
    import torch

    gpus = [
        {
            "name": torch.cuda.get_device_name(i),
            "capability": "sm_{}{}".format(*torch.cuda.get_device_capability(i)),
            "memory_gib": round(torch.cuda.get_device_properties(i).total_memory / 2**30, 1),
        }
        for i in range(torch.cuda.device_count())
    ]
    smi = _nvidia_smi()
    return {
        "hostname": platform.node(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpu_affinity": len(os.sched_getaffinity(0)),
        "gpu_count": len(gpus),
        "gpus": gpus,
        "driver": smi[0]["driver_version"] if smi else None,
        "nvidia_smi": smi,
        "cuda": torch.version.cuda,
        "torch": torch.__version__,
        "onnxruntime": onnxruntime.__version__,
        "onnxruntime_providers": onnxruntime.get_available_providers(),
        "packages": _versions(),
    }


def write(record: dict[str, Any], out: Path) -> Path:
    """``out/bench.json``, replaced atomically (paths in the settings are written as strings)."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / "bench.json"
    temporary = path.with_suffix(".json.tmp")
    temporary.write_text(json.dumps(record, indent=1, ensure_ascii=False, default=str) + "\n", encoding="utf-8")
    os.replace(temporary, path)
    return path


def label(name: str, facts: dict[str, Any]) -> str:
    """A subject's name, with its kernels for a reference (``reference+fla [torch+fla 0.6.0]``)."""
    if "kernels" not in facts:
        return name
    version = f" {facts['fla_version']}" if facts.get("fla_version") else ""
    return f"{name} [{facts['kernels']}{version}]"


def _bars(ax: Any, groups: dict[str, dict[str, Any]], subjects: dict[str, str], title: str) -> None:
    """p50 as a solid bar and p95 as a light bar behind it, one group per label, one colour per subject
    (``subjects``: name to legend label)."""
    width = 0.8 / len(subjects)
    for i, (subject, shown) in enumerate(subjects.items()):
        x = [j + (i - (len(subjects) - 1) / 2) * width for j in range(len(groups))]
        summaries = [group.get(subject, {}) for group in groups.values()]
        ax.bar(x, [s.get("p95_ms", NAN) for s in summaries], width, color=f"C{i}", alpha=0.3, label=f"{shown} p95")
        ax.bar(x, [s.get("p50_ms", NAN) for s in summaries], width * 0.6, color=f"C{i}", label=f"{shown} p50")
    ax.set_xticks(range(len(groups)), list(groups), rotation=30, ha="right")
    ax.set_yscale("log")
    ax.set_ylabel("latency (ms, log)")
    ax.set_title(title)
    ax.legend(fontsize="small")


def plot(record: dict[str, Any], path: Path) -> Path:
    """Latency p50/p95 per workload (and per HTTP concurrency), and HTTP throughput against concurrency."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = record["workloads"]
    runs = record["http"]["runs"] if record["http"] else []
    panels = (1 if workloads else 0) + (2 if runs else 0)
    figure, axes = plt.subplots(1, panels, figsize=(6.5 * panels, 5), squeeze=False)
    axes = list(axes[0])
    figure.suptitle(f"{record['member']['id']} on {record['settings']['device']} ({record['started'][:19]}Z)")
    if workloads:
        groups = {entry["name"]: entry["results"] for entry in workloads}
        subjects = {name: label(name, facts) for name, facts in record["subjects"].items()}
        _bars(axes.pop(0), groups, subjects, "in process (runner.run or model.answer)")
    if runs:
        subjects = list(dict.fromkeys(run["subject"] for run in runs))
        levels = sorted({run["concurrency"] for run in runs})
        table = {(run["subject"], run["concurrency"]): run for run in runs}
        groups = {f"c={level}": {subject: table.get((subject, level), {}) for subject in subjects} for level in levels}
        shown = {name: label(name, record["subjects"].get(name, {})) for name in subjects}
        _bars(axes.pop(0), groups, shown, f"HTTP, {record['http']['workload']} (closed loop)")
        ax = axes.pop(0)
        for i, subject in enumerate(subjects):
            ax.plot(
                levels,
                [table.get((subject, level), {}).get("requests_per_s", NAN) for level in levels],
                "o-",
                color=f"C{i}",
                label=subject,
            )
        ax.set_xlabel("concurrent clients (closed loop)")
        ax.set_ylabel("requests/s")
        ax.set_ylim(bottom=0)
        ax.set_xticks(levels)
        ax.set_title("HTTP throughput")
        ax.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path
