"""What keeping freed memory costs: a process's resident memory after loading a model and answering requests.

    .venv/bin/python benchmarks/cpu-omnijev-plan/resident.py /tmp/omnijev-tiny > benchmarks/cpu-omnijev-plan/resident-keep.txt
    S1OMNI_MALLOC=system .venv/bin/python benchmarks/cpu-omnijev-plan/resident.py /tmp/omnijev-tiny > benchmarks/cpu-omnijev-plan/resident-system.txt

The package's model (the tiny synthetic OmniJev member: its torch reference) answers the benchmark's
``screenshot-1`` request ``--requests`` times (20); resident memory from ``/proc/self/statm`` after the load and
after the requests, and the process's peak (``ru_maxrss``).
"""

from __future__ import annotations

import argparse
import os
import resource

from s1omni.bench.workloads import screenshot
from s1omni.runtime.api import load_model


def resident_mib() -> float:
    with open("/proc/self/statm", encoding="ascii") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("package")
    parser.add_argument("--requests", type=int, default=20)
    args = parser.parse_args()
    model = load_model(args.package)
    body = {"model": model.id, **screenshot(1).body}
    loaded = resident_mib()
    for _ in range(args.requests):
        model.answer(body)
    print(
        f"S1OMNI_MALLOC={os.environ.get('S1OMNI_MALLOC', 'keep')}: resident {loaded:.0f} MiB after the load, "
        f"{resident_mib():.0f} MiB after {args.requests} requests, peak {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB"
    )


if __name__ == "__main__":
    main()
