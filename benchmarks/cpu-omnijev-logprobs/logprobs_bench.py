"""OmniJev's option-text log-probabilities at the 4B's vocabulary on the host: the reference's numpy
``features.token_logprobs`` (numpy's BLAS on one thread, as every process that runs heads limits it:
``s1omni.runtime.cpu_heads``) against an engine's ``vocabulary.EngineLogProbs`` on the CPU EP.

    .venv/bin/python benchmarks/cpu-omnijev-logprobs/logprobs_bench.py --out benchmarks/cpu-omnijev-logprobs/record.json

The table is random, ``[248,079, 2,560]`` float32 (2.5 GB, the 4B's tied embedding's shape); the states are
random, ``--tokens`` of them (8 and 40 by default: a one-option and a several-option screenshot). Each
figure is the p50 / p95 (nearest rank) of ``--repeats`` calls after one warm-up; the record carries the largest difference
between the two. The load average before and after is recorded: this machine may be shared.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys

import numpy as np
import onnxruntime

from s1omni.bench.stats import quantiles_ms
from s1omni.runtime.cpu_heads import single_threaded_numpy_blas
from s1omni.runtime.omnijev.features import token_logprobs
from s1omni.runtime.omnijev.vocabulary import EngineLogProbs

VOCABULARY, HIDDEN = 248_079, 2_560


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", default="8,40")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    single_threaded_numpy_blas()
    rng = np.random.default_rng(0)
    embedding = rng.standard_normal((VOCABULARY, HIDDEN), dtype=np.float32) * np.float32(0.02)
    engine = EngineLogProbs(embedding)
    load = os.getloadavg()
    runs = []
    for count in (int(value) for value in args.tokens.split(",")):
        hidden = rng.standard_normal((count, HIDDEN), dtype=np.float32)
        tokens = rng.integers(0, VOCABULARY, count)
        difference = float(np.abs(token_logprobs(embedding, hidden, tokens) - engine(hidden, tokens)).max())
        runs.append({
            "tokens": count,
            "numpy": quantiles_ms(lambda: token_logprobs(embedding, hidden, tokens), args.repeats),
            "onnxruntime_cpu": quantiles_ms(lambda: engine(hidden, tokens), args.repeats),
            "max_abs_difference": difference,
        })  # fmt: skip
        print(json.dumps(runs[-1]))
    record = {
        "command": ["benchmarks/cpu-omnijev-logprobs/logprobs_bench.py", *sys.argv[1:]],
        "machine": {"cpus": os.cpu_count(), "processor": platform.processor(), "onnxruntime": onnxruntime.__version__, "numpy": np.__version__},
        "table": [VOCABULARY, HIDDEN],
        "repeats": args.repeats,
        "load_average": {"before": load, "after": os.getloadavg()},
        "runs": runs,
    }
    with open(args.out, "w", encoding="utf-8") as out:
        json.dump(record, out, indent=1)
        out.write("\n")


if __name__ == "__main__":
    main()
