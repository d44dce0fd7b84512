#!/usr/bin/env bash
# The H200 run behind the committed validation table and benchmark record.
#
#   scripts/h200.sh SIZE OUT [WORKLOADS]
#
# On a machine with one CUDA GPU and this package importable (the lent H200: python3 with torch,
# transformers and onnx, plus onnxruntime-gpu 1.31.1, polygraphy, starlette and uvicorn): writes a
# synthetic Vela member of SIZE (0.8B, 4B, 9B; random weights), exports it, builds the ONNX Runtime
# CUDA engine, validates it at the GPU gate against the float32 torch reference on the same GPU (TF32
# off), then benchmarks the engine against the BF16 torch reference in the same run. Results land in
# OUT: validate-SIZE.txt (the table), validate-SIZE.json, bench.json, bench.png and the logs.
set -euo pipefail
size=${1:?size: 0.8B, 4B or 9B}
out=${2:?output directory}
workloads=${3:-backbone,router,long-span}
work=${S1OMNI_WORK:-/tmp/s1omni-work}
export S1OMNI_HOME=$work/home PYTHONUNBUFFERED=1
mkdir -p "$out" "$work"
s1omni() { python3 -m server.cli "$@"; }
stamp() { echo "== $(date -u +%H:%M:%S) $*" >&2; }

pkg=$work/vela2-$size exp=$work/export-$size eng=$work/engine-$size
stamp "synth $size"
[ -d "$pkg" ] || s1omni synth vela2 --size "$size" --out "$pkg"
stamp "export"
[ -d "$exp" ] || s1omni export "$pkg" --out "$exp" 2>&1 | tee "$out/export-$size.log"
stamp "build onnxruntime/cuda"
s1omni build "$exp" --backend onnxruntime --target cuda --out "$eng"
stamp "validate"
set +e
s1omni validate "$eng" --package "$pkg" --reference "$work/reference-$size" --reference-device cuda \
  --report "$out/validate-$size.json" > "$out/validate-$size.txt" 2> "$out/validate-$size.log"
validated=$?
set -e
cat "$out/validate-$size.txt"
tail -n 3 "$out/validate-$size.log"
stamp "bench"
s1omni bench --package "$pkg" --engine "$eng" --device cuda --workloads "$workloads" --tokens 128,600,2048 \
  --requests 16 --warmup 2 --http --concurrency 1,8,16 --profile backbone-128 --out "$out" \
  $([ "$validated" = 0 ] || echo --allow-unvalidated) 2> "$out/bench-$size.log"
stamp "done (validation exit $validated)"
exit "$validated"
