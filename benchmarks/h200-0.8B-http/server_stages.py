"""Where each millisecond of a served request goes, per HTTP level: the median of each stage the server
logs per request (``s1omni.server.timing``), over the requests a bench run timed at that level.

    python3 benchmarks/h200-0.8B-http/server_stages.py bench.json serve-1.log > server-stages.json

The level of a request is the bench run whose [started, finished) holds the request's log time; the
warm-up requests fall before the first run's start and are left out.
"""

from __future__ import annotations

import json
import re
import statistics
import sys
from datetime import datetime, timezone

LINE = re.compile(r"^(\S+ \S+) INFO s1omni\.server: POST /v1/systemone 200 code=ok .*? tokens=\d+ (?P<stages>.*) ms$")
STAGE = re.compile(r"(\w+)=([0-9.]+)")


def main(bench_path: str, log_path: str) -> None:
    bench = json.load(open(bench_path, encoding="utf-8"))
    subject = next(name for name in bench["http"]["servers"] if name != "reference")
    runs = [(datetime.fromisoformat(run["started"]), datetime.fromisoformat(run["finished"]), run) for run in bench["http"]["runs"] if run["subject"] == subject]
    levels: dict[int, list[dict[str, float]]] = {run["concurrency"]: [] for _, _, run in runs}
    for line in open(log_path, encoding="utf-8"):
        match = LINE.match(line)
        if not match:
            continue
        when = datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f").replace(tzinfo=timezone.utc)
        for started, finished, run in runs:
            if started <= when < finished:
                levels[run["concurrency"]].append({name: float(value) for name, value in STAGE.findall(match.group("stages"))})
    out = {
        "subject": subject,
        "profile": bench["http"]["profile"],
        "levels": {
            str(level): {"requests": len(rows), "median_ms": {name: round(statistics.median(row[name] for row in rows), 3) for name in rows[0]}}
            for level, rows in levels.items()
            if rows
        },
    }
    json.dump(out, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main(*sys.argv[1:3])
