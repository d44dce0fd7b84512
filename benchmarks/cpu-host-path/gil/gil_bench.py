"""Where a server's GIL goes: the host path of the router request on threads, sampled by py-spy's ``--gil``.

    .venv/bin/pip install --target /tmp/pyspy py-spy      # a tool of this benchmark only, not a dependency
    PYSPY=/tmp/pyspy/bin/py-spy .venv/bin/python benchmarks/cpu-host-path/gil/gil_bench.py --label after \\
        --out benchmarks/cpu-host-path/gil/after.json

A server answers requests on many threads (the event loop plans, head threads run heads during the
forward, request threads finish, the loop encodes) and Python runs one of them at a time: under load,
the time a request holds the GIL bounds its throughput whatever the GPU does (1 / that time). The
workload process runs ``--threads`` threads that each repeat one request's host path: ``plan``
(``Vela2Model.plan`` of ``calib/vela2`` case router-signals-600 on a 0.8B-shaped synthetic member,
``host_bench.model``), ``read`` (its heads over random hidden states, as ``host_bench``), ``finish`` and
``encode`` (``wire.encode``). py-spy attaches after a warm-up and samples only the thread that holds the
GIL, ``--rate`` times a second; a stage's GIL-held milliseconds a request are its samples over the rate
and the requests answered while sampling. ``chunks`` is the span head's word chunks, which run on the span
head's own threads. The record keeps the SHA-256 of the request's JSON answer: arms must answer the same
bytes. Samples are py-spy's, not exact: compare arms of one run of this machine.
``--label before`` with main's runtime first on the path, as ``host_bench.py`` says.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
STAGE = re.compile(r"stage_(plan|read|finish|encode)|SpanHead\.__call__\.<locals>\.score")


def workload(threads: int, ready: Path, done: Path) -> None:
    import numpy as np

    sys.path.insert(0, str(HERE.parent))
    from host_bench import case_request, model, states

    from s1omni.server import wire

    with tempfile.TemporaryDirectory() as directory:
        vela = model(np.random.default_rng(0), Path(directory), "0.8B")
    body = case_request()
    hidden = states(vela.plan(body), vela.runner.hidden_size, np.random.default_rng(1))

    def stage_plan():
        return vela.plan(body)

    def stage_read(plan):
        return vela.read([plan], hidden)[0]

    def stage_finish(plan, outputs):
        return vela.finish(plan, outputs)

    def stage_encode(answer):
        return wire.encode(answer)

    def request() -> bytes:
        plan = stage_plan()
        return stage_encode(stage_finish(plan, stage_read(plan)))

    answer = hashlib.sha256(request()).hexdigest()
    for _ in range(4):
        request()
    counts = [0] * threads
    started = threading.Event()

    def loop(index: int) -> None:
        started.wait()
        while not stop.is_set():
            request()
            counts[index] += 1

    stop = threading.Event()
    workers = [threading.Thread(target=loop, args=(i,)) for i in range(threads)]
    for worker in workers:
        worker.start()
    started.set()
    time.sleep(1.0)  # the threads settle before the sampler attaches
    partial = ready.with_suffix(".partial")  # renamed whole: the parent may read it as soon as it exists
    partial.write_text(json.dumps({"pid": os.getpid(), "answered": sum(counts), "at": time.perf_counter(), "answer": answer}))
    partial.rename(ready)
    parent = os.getppid()
    while not done.exists() and os.getppid() == parent:  # an orphan stops: its sampler is gone
        time.sleep(0.05)
    answered, at = sum(counts), time.perf_counter()
    stop.set()
    for worker in workers:
        worker.join()
    partial = done.with_suffix(".partial")
    partial.write_text(json.dumps({"answered": answered, "at": at}))
    partial.rename(done)


def stage_of(stack: str) -> str:
    match = STAGE.search(stack)
    if match is None:
        return "other"
    return match.group(1) or "chunks"


def plot(records: list[Path], out: Path) -> None:
    """Each record's GIL-held milliseconds a request, stacked by stage, records side by side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [json.loads(path.read_text()) for path in records]
    stages = ["plan", "read", "chunks", "finish", "encode", "other"]
    figure, axes = plt.subplots(figsize=(1.2 * len(runs) + 3, 4))
    names = [f"{run['label']}\n{path.stem}" for run, path in zip(runs, records, strict=True)]
    bottom = [0.0] * len(runs)
    for stage in stages:
        heights = [run["gil_ms_per_request"].get(stage, 0.0) for run in runs]
        axes.bar(names, heights, bottom=bottom, label=stage)
        bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    axes.set_ylabel("GIL held, ms a request")
    axes.set_title("router request's host path, 0.8B shapes, 4 threads (py-spy --gil)")
    axes.legend(fontsize=8, ncols=2)
    figure.tight_layout()
    figure.savefig(out, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--label", help="the arm's name (before: main's runtime first on the path)")
    parser.add_argument("--out", type=Path, required=True, help="the record, or the plot with --plot")
    parser.add_argument("--plot", type=Path, nargs="+", metavar="RECORD", help="plot these records' stages instead")
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=20.0, help="sampled seconds")
    parser.add_argument("--rate", type=int, default=250, help="py-spy samples a second")
    parser.add_argument("--workload", nargs=3, metavar=("THREADS", "READY", "DONE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.plot:
        plot(args.plot, args.out)
        return
    if args.workload:
        threads, ready, done = args.workload
        workload(int(threads), Path(ready), Path(done))
        return
    if not args.label:
        parser.error("--label is required to run an arm")
    pyspy = os.environ.get("PYSPY", "py-spy")
    with tempfile.TemporaryDirectory() as directory:
        ready, done, raw = (Path(directory) / name for name in ("ready", "done", "samples.txt"))
        process = subprocess.Popen([sys.executable, __file__, "--out", str(args.out), "--workload", str(args.threads), str(ready), str(done)])
        while not ready.exists():
            if process.poll() is not None:
                raise SystemExit(f"the workload exited: {process.returncode}")
            time.sleep(0.1)
        start = json.loads(ready.read_text())
        print(f"sampling {args.seconds:g} s of {args.threads} threads (pid {start['pid']})", file=sys.stderr)
        subprocess.run([pyspy, "record", "--gil", "--nonblocking", "-r", str(args.rate), "-f", "raw", "-o", str(raw),
                        "-d", str(int(args.seconds)), "--pid", str(start["pid"])], check=True, capture_output=True)  # fmt: skip
        done.write_text("")
        process.wait()
        end = json.loads(done.read_text())
        requests = end["answered"] - start["answered"]
        samples: collections.Counter[str] = collections.Counter()
        functions: collections.Counter[str] = collections.Counter()
        for line in raw.read_text().splitlines():
            stack, _, count = line.rpartition(" ")
            samples[stage_of(stack)] += int(count)
            for frame in {frame.split(" (")[0].strip() for frame in stack.split(";")}:
                functions[frame] += int(count)
    per_request = lambda count: round(count / args.rate * 1e3 / requests, 3)  # noqa: E731
    record = {
        "label": args.label,
        "command": " ".join([os.path.relpath(sys.executable), *sys.argv]),
        "runtime": os.environ.get("PYTHONPATH", "this checkout"),
        "machine": {"cpus": len(os.sched_getaffinity(0)), "load_average_1min": os.getloadavg()[0]},
        "threads": args.threads,
        "sampled_s": round(end["at"] - start["at"], 3),
        "requests": requests,
        "requests_per_s": round(requests / (end["at"] - start["at"]), 2),
        "answer_sha256": start["answer"],
        "gil_ms_per_request": {"total": per_request(sum(samples.values()))} | {stage: per_request(count) for stage, count in samples.most_common()},
        "top_functions_gil_ms_per_request": {name: per_request(count) for name, count in functions.most_common(40) if name},
    }
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps({k: record[k] for k in ("label", "requests_per_s", "gil_ms_per_request")}))


if __name__ == "__main__":
    main()
