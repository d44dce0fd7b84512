#!/usr/bin/env bash
# The H200 runs behind the committed validation tables and benchmark records.
#
#   scripts/h200.sh SIZE OUT [STEPS]
#
# SIZE is a Vela 2.0 member (0.8B, 4B, 9B) or omnijev-4B (OmniJev-4B v1.1: its vision tower and language graphs;
# bench workloads screenshot-1,screenshot-12,screenshot-255 by default; merged and shared are Vela 2.0's checks).
#
# On a machine with one CUDA GPU and this package importable (the lent H200: python3 with torch,
# transformers and onnx, plus onnxruntime-gpu 1.31.1, polygraphy, starlette, uvicorn, prometheus_client
# and python-json-logger). STEPS is a comma-separated subset of synth,export,build,validate,bench
# (default: all, in that order; merged, merged-packed, shared and gpu-tests are asked for by name), so a run can be split over several calls of a
# machine that keeps /tmp between them:
#
#   synth     a synthetic Vela member of SIZE (0.8B, 4B, 9B; random weights, real shapes)
#   export    its backbone to ONNX, fused Gated DeltaNet graphs only ($RECURRENCE=both for the Scan graphs
#             too; TensorRT is not run here), timed: export-SIZE.txt has the wall time and the host's peak
#             memory in use against the size of the weights files
#   build     ONNX Runtime CUDA engines: one per $KERNELS (GatedDeltaNet, LinearAttention, ChunkedGatedDeltaRule: with
#             "/gdn16", as its q/k/v are float16; $S1OMNI_ORT_INCLUDE names ONNX Runtime's C API headers) and $PRECISIONS
#             (fp32, TF32 off, by default; bf16: weight GEMMs in bfloat16; tf32; suffixes: "/unfused" builds
#             with --no-op-fusion, "/graphs" with --cuda-graphs, "/gdn16" with --gated-delta-inputs fp16, "/merged" with --merged-projections,
#             "/mixers" with --fused-mixers ("/conv16" adds --bf16-convolutions, "/convop" --fused-short-convolutions and "/heads"
#             --fused-convolution-heads), "/gates" with --fused-delta-gates, "/onorms" with --fused-output-norms,
#             "/rotary" with --fused-head-rotary, "/silu" with
#             --fused-silu, "/norms" with --fused-residual-norms and "/convop" (ChunkedGatedDeltaRule only), "/attn" with --fused-attention in float32, "/attn16" with it in float16
#             (bf16 builds), "/vgraphs" with --vision-cuda-graphs (omnijev-4B); a variant without graphs, gdn16, mixers
#             or attn/attn16 builds with --no-cuda-graphs, --gated-delta-inputs fp32, --no-fused-mixers or
#             --no-fused-attention, so that a variant builds what it says whatever the build's defaults,
#             e.g. fp32/graphs; a bf16 before/after run: PRECISIONS=bf16/graphs,bf16/graphs/gdn16,bf16/graphs/gdn16/merged)
#   validate  each engine at the GPU gate against the float32 torch reference on the same GPU
#   merged    each engine's merged forwards against its forwards alone (s1omni validate --merged $MERGED, 8 by
#             default), at gpu (float32 engines) or gpu-reduced-alone (the others, with validate's reference records):
#             what the batching profile does
#   merged-packed  each engine's merged packed forwards against alone (--merged $MERGED --shared-context): what
#             batching does on packed rows, and what a server needs to pack batching's forwards
#   shared    each engine's packed forwards against its forwards alone (s1omni validate --shared-context), at the
#             same gate: what the shared_context profile does, and what serving it needs (bench workloads
#             NAME:shared_context, HTTP_PROFILE=shared_context)
#   gpu-tests the suite's GPU tests (pytest -m gpu, on the tiny member; gpu-tests.log; $GPU_TESTS: which test files,
#             default all), asked for by name
#   bench     the validated engines against the BF16 torch reference in the same run (timed twice
#             where flash-linear-attention imports: the torch fallback and reference+fla, its Triton
#             kernels; ratios against the faster); over HTTP too when $HTTP lists concurrency levels
#             (e.g. HTTP=1,8,16; the requests' profile $HTTP_PROFILE, exact by default; $SERVE_ARGS, space-separated,
#             go to every server, e.g. SERVE_ARGS=--instances=2); ALLOW_UNVALIDATED=1 times engines that missed their
#             gate (in process only: the server refuses them); $REQUESTS timed requests (12) after $WARMUP (2) untimed,
#             $PROFILE the profiled workload ('' for none); NO_HTTP_REFERENCE=1 serves the engines only (an arm
#             compared with another on the same machine whose run served the reference)
#
# Results land in OUT: validate-SIZE-KERNEL[-PRECISION].txt/.json, merged-SIZE-....txt/.json, bench.json, bench.png and the logs.
#
# Wall time on the lent H200 (16 cores): synth 0.8B 26 s, 9B 106 s; export 0.8B 57 s, 4B 72-77 s, 9B 92 s
# (benchmarks/README.md, "Export times on the H200"); build 4B 159 s, 9B 310 s; validate 9B 90 s with a
# saved reference; bench 9B 255 s. Steps that together outlast one 600 s call run as a detached chain
# (scripts/device.sh: started, fed the wheels of scripts/device-pack.sh and polled by calls that follow each
# other at once; scripts/device-chain.sh for the chain itself; a `pgrep -f` pattern also matches the polling
# call's own command line, which contains it). With S1OMNI_SCRATCH=/dev/shm/w the exports and engines go
# to memory: the 9B's 32 GB export does not fit the disk beside its package.
set -euo pipefail
size=${1:?size: 0.8B, 4B, 9B or omnijev-4B}
out=${2:?output directory}
steps=${3:-synth,export,build,validate,bench}
kernels=${KERNELS:-GatedDeltaNet}
precisions=${PRECISIONS:-fp32}
work=${S1OMNI_WORK:-/tmp/s1omni-work}
scratch=${S1OMNI_SCRATCH:-$work}  # exports and engines (a 9B export is 32 GB: /dev/shm where the disk is short)
export S1OMNI_HOME=$work/home PYTHONUNBUFFERED=1
mkdir -p "$out" "$work" "$scratch"
# The device image has no registry: install this tree (no dependencies) once per fresh machine.
python3 -c "import s1omni.runtime" 2>/dev/null || python3 -m pip install -q --no-deps --no-build-isolation -e . >&2
s1omni() { python3 -m s1omni "$@"; }
stamp() { echo "== $(date -u +%H:%M:%S) $*" >&2; }
wants() { [[ ",$steps," == *",$1,"* ]]; }

case $size in
  omnijev-*) family=omnijev member=${size#omnijev-} workloads=screenshot-1,screenshot-12,screenshot-255 profile=screenshot-12 ;;
  *) family=vela2 member=$size workloads=backbone,router,long-span profile=backbone-128 ;;
esac
pkg=$work/$family-$member exp=$scratch/export-$size
variants=()  # kernel:precision
for kernel in ${kernels//,/ }; do
  for precision in ${precisions//,/ }; do variants+=("$kernel:$precision"); done
done
# kernel:precision[/unfused][/graphs][/gdn16][/merged][/mixers][/conv16][/convop][/silu][/norms][/attn|/attn16][/vgraphs] -> kernel[-precision][-unfused]...[-vgraphs],
# the precision where it is not fp32
SUFFIXES=(unfused graphs gdn16 merged mixers conv16 convop heads gates onorms silu norms rotary attn attn16 vgraphs)
has() { [[ "/$1/" == *"/$2/"* ]]; }
name() {
  local p=${1#*:} n=${1%:*} suffix
  [ "${p%%/*}" = fp32 ] || n+="-${p%%/*}"
  for suffix in "${SUFFIXES[@]}"; do
    if has "$p" "$suffix"; then n+="-$suffix"; fi
  done
  echo "$n"
}
engine() { echo "$scratch/engine-$size-$(name "$1")"; }

if wants synth; then
  stamp "synth $size"
  [ -d "$pkg" ] || s1omni synth "$family" --size "$member" --out "$pkg"
fi
if wants export; then
  stamp "export $size"
  if [ ! -d "$exp" ]; then
    # Timed, with the host's peak memory in use (sampled every 0.5 s; the export's worker processes count too;
    # files in /dev/shm do not, so an export written there is not counted as memory).
    base=$(awk '/MemTotal/{t=$2} /MemAvailable/{a=$2} /^Shmem:/{s=$2} END{print t-a-s}' /proc/meminfo)
    (peak=0; while :; do
       used=$(awk '/MemTotal/{t=$2} /MemAvailable/{a=$2} /^Shmem:/{s=$2} END{print t-a-s}' /proc/meminfo)
       [ "$used" -le "$peak" ] || { peak=$used; echo "$peak" > "$out/export-$size.peak"; }
       sleep 0.5
     done) & sampler=$!
    started=$(date +%s.%N)
    s1omni export "$pkg" --out "$exp" --recurrence "${RECURRENCE:-fused}" 2>&1 | tee "$out/export-$size.log"
    ended=$(date +%s.%N)
    kill "$sampler"
    weights=$(du -bc "$exp"/weights*.data 2>/dev/null | tail -n 1 | cut -f1 || echo 0)  # every weights file
    # The ratio is parenthesised: a bare > among printf's arguments would redirect its output to a file.
    awk -v s="$started" -v e="$ended" -v p="$(cat "$out/export-$size.peak")" -v b="$base" -v w="$weights" -v size="$size" 'BEGIN {
      printf "export %s: %.0f s, peak host memory %.1f GB over the %.1f GB in use before, weights %.1f GB (%.2fx)\n",
        size, e - s, (p - b) / 1048576, b / 1048576, w / 1e9, (w > 0 ? (p - b) * 1024 / w : 0) }' | tee "$out/export-$size.txt"
  fi
fi
if wants build; then
  for variant in "${variants[@]}"; do
    stamp "build onnxruntime/cuda $(name "$variant")"
    precision=${variant#*:} flags=()
    if has "$precision" unfused; then flags+=(--no-op-fusion); fi
    if has "$precision" graphs; then flags+=(--cuda-graphs); else flags+=(--no-cuda-graphs); fi  # graphs are the build default
    # Explicit either way, so a variant's name says what it built.
    if has "$precision" gdn16; then flags+=(--gated-delta-inputs fp16); else flags+=(--gated-delta-inputs fp32); fi
    if has "$precision" merged; then flags+=(--merged-projections); fi
    if has "$precision" mixers; then flags+=(--fused-mixers); else flags+=(--no-fused-mixers); fi
    if has "$precision" conv16; then flags+=(--bf16-convolutions); fi
    if has "$precision" convop; then flags+=(--fused-short-convolutions); fi
    if has "$precision" heads; then flags+=(--fused-convolution-heads); fi
    if has "$precision" gates; then flags+=(--fused-delta-gates); fi
    if has "$precision" onorms; then flags+=(--fused-output-norms); fi
    if has "$precision" rotary; then flags+=(--fused-head-rotary); fi
    if has "$precision" silu; then flags+=(--fused-silu); fi
    if has "$precision" norms; then flags+=(--fused-residual-norms); fi
    if has "$precision" attn; then flags+=(--fused-attention --attention-inputs fp32)
    elif has "$precision" attn16; then flags+=(--fused-attention --attention-inputs fp16)
    else flags+=(--no-fused-attention); fi
    if has "$precision" vgraphs; then flags+=(--vision-cuda-graphs); fi
    s1omni build "$exp" --backend onnxruntime --target cuda --gated-delta-kernel "${variant%:*}" --precision "${precision%%/*}" \
      "${flags[@]}" --out "$(engine "$variant")"
  done
fi
failed=0
if wants validate; then
  for variant in "${variants[@]}"; do
    stamp "validate $(name "$variant")"
    report=$out/validate-$size-$(name "$variant")
    s1omni validate "$(engine "$variant")" --package "$pkg" --reference "$work/reference-$size" --reference-device cuda \
      --report "$report.json" > "$report.txt" 2> "$report.log" || failed=1
    tail -n 4 "$report.txt"
  done
fi
if wants merged; then
  for variant in "${variants[@]}"; do
    stamp "merged $(name "$variant")"
    report=$out/merged-$size-$(name "$variant")
    s1omni validate "$(engine "$variant")" --merged "${MERGED:-8}" --package "$pkg" --reference "$work/reference-$size" \
      --report "$report.json" > "$report.txt" 2> "$report.log" || failed=1
    tail -n 4 "$report.txt"
  done
fi
if wants merged-packed; then
  for variant in "${variants[@]}"; do
    stamp "merged-packed $(name "$variant")"
    report=$out/merged-packed-$size-$(name "$variant")
    s1omni validate "$(engine "$variant")" --merged "${MERGED:-8}" --shared-context --package "$pkg" --reference "$work/reference-$size" \
      --report "$report.json" > "$report.txt" 2> "$report.log" || failed=1
    tail -n 2 "$report.log"
  done
fi
if wants shared; then
  for variant in "${variants[@]}"; do
    stamp "shared $(name "$variant")"
    report=$out/shared-$size-$(name "$variant")
    s1omni validate "$(engine "$variant")" --shared-context --package "$pkg" --reference "$work/reference-$size" \
      --report "$report.json" > "$report.txt" 2> "$report.log" || failed=1
    tail -n 2 "$report.log"
  done
fi
if wants gpu-tests; then
  stamp "gpu-tests"
  # The tests start `s1omni` from beside the interpreter (tests/server/serving.py); pip may have put it elsewhere.
  python=$(python3 -c 'import sys; print(sys.executable)')
  beside=$(dirname "$python")/s1omni
  [ -e "$beside" ] || printf '#!/bin/sh\nexec %s -m s1omni "$@"\n' "$python" > "$beside" && chmod +x "$beside"
  # The two OpenAPI test modules hold no GPU test and import validators the device image lacks (jsonschema,
  # openapi-spec-validator): their import error would stop the collection of the rest.
  python3 -m pytest -q -m gpu -rs -p no:cacheprovider --ignore=tests/test_openapi.py --ignore=tests/server/test_server_openapi.py \
    ${GPU_TESTS:-tests} > "$out/gpu-tests.log" 2>&1 || failed=1
  tail -n 5 "$out/gpu-tests.log"
fi
if wants bench; then
  stamp "bench"
  engines=()
  for variant in "${variants[@]}"; do engines+=(--engine "$(engine "$variant")"); done
  extra=()
  [ -z "${HTTP:-}" ] || extra=(--http --concurrency "$HTTP" --http-profile "${HTTP_PROFILE:-exact}")
  for arg in ${SERVE_ARGS:-}; do extra+=("--serve-arg=$arg"); done
  [ -z "${ALLOW_UNVALIDATED:-}" ] || extra+=(--allow-unvalidated)
  [ -z "${NO_HTTP_REFERENCE:-}" ] || extra+=(--no-http-reference)
  s1omni bench --package "$pkg" "${engines[@]}" --device cuda --workloads "${WORKLOADS:-$workloads}" \
    --tokens 128,600,2048 --requests "${REQUESTS:-12}" --warmup "${WARMUP:-2}" "${extra[@]}" --profile "${PROFILE-$profile}" \
    --out "$out" 2> "$out/bench-$size.log" || { tail -n 20 "$out/bench-$size.log"; exit 1; }
  tail -n 30 "$out/bench-$size.log"
fi
stamp "done"
exit "$failed"
