"""GPU memory of an engine's runners with and without one shared copy of the weights (issue 17's 4B out-of-memory).

    python3 benchmarks/h100-device-weights/memory.py ENGINE [--instances 1,2] > memory.json

Each case runs in a fresh process: CUDA initialised (torch), then INSTANCES runners of ENGINE as a server
with `batching` opens them (prefill, continue and packed sessions), each running one tree of the 0.8B router
request's shape (722-token prefix, blocks of 482 and 96 tokens). It reports the device memory in use over what
was in use before the first runner, after loading and after the forward, and the runners' hidden states'
SHA-256, which must be the same with and without sharing.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
from pathlib import Path


def case(engine: Path, instances: int, share: bool) -> dict:
    import numpy as np
    import torch

    from s1omni.runtime.engine import read_manifest
    from s1omni.runtime.runners.base import Block, Prefix, Tree
    from s1omni.runtime.runners.onnxruntime_runner import OnnxRuntimeRunner

    torch.cuda.init()
    free, total = torch.cuda.mem_get_info()
    manifest = read_manifest(engine)
    runners = []
    for _ in range(instances):
        runner = OnnxRuntimeRunner(engine, device="cuda", precision=manifest.get("precision", "fp32"),
                                   provider_options=manifest.get("provider_options"), cuda_graphs=bool(manifest.get("cuda_graphs")),
                                   share_weights=share)  # fmt: skip
        runner.open_packed()
        runners.append(runner)
    loaded = free - torch.cuda.mem_get_info()[0]
    rng = np.random.default_rng(0)
    tree = Tree(Prefix(rng.integers(1, 2048, 722)), tuple(Block(rng.integers(1, 2048, n), np.array([n - 1])) for n in (482, 96)))
    digests = {hashlib.sha256(b"".join(h.tobytes() for h in runner.run([tree])[0])).hexdigest() for runner in runners}
    return {"instances": instances, "shared": share, "loaded_gib": loaded / 2**30, "after_forward_gib": (free - torch.cuda.mem_get_info()[0]) / 2**30,
            "shared_weights_gib": runners[0].weights.bytes / 2**30 if share else None, "hidden_sha256": sorted(digests), "device_gib": total / 2**30}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("engine", type=Path)
    parser.add_argument("--instances", default="1,2")
    parser.add_argument("--case", help=argparse.SUPPRESS)  # INSTANCES:SHARE, one case in this process
    args = parser.parse_args()
    if args.case:
        instances, share = args.case.split(":")
        print(json.dumps(case(args.engine, int(instances), share == "1")))
        return
    results = []
    for instances in [int(n) for n in args.instances.split(",")]:
        for share in (False, True):
            done = subprocess.run([sys.executable, __file__, str(args.engine), "--case", f"{instances}:{int(share)}"], capture_output=True, text=True, check=False)
            print(done.stderr[-2000:], file=sys.stderr)
            results.append(json.loads(done.stdout) if done.returncode == 0 else {"instances": instances, "shared": share, "failed": done.stderr[-500:]})
            print(json.dumps(results[-1]), file=sys.stderr, flush=True)
    print(json.dumps({"engine": str(args.engine), "command": sys.argv, "cases": results}, indent=1))


if __name__ == "__main__":
    main()
