#!/usr/bin/env bash
# Detached device chain, 2026-12-03 third session (issue 16: OmniJev-4B on HEAD ceaa79b: log-softmax as one op,
# libspng PNG decode, freed host memory kept). Run with scripts/device.sh:
#   start benchmarks/h200-omnijev-4B-head/chain.sh (carry .device/p1 and the chain), stage 2..5, poll "chain done"
#  b  OmniJev-4B: synth, export, build and validate bf16/graphs/gdn16/mixers/attn16 (gpu-reduced), bench it
#     against both references: screenshot-1, screenshot-12 (5 requests after 2 warm-ups), profile screenshot-1
#  t  the log-probability GPU test (tests/omnijev/test_omnijev_vocabulary.py) beside the export
#  c  (screenshot-255/) screenshot-255 on the same engine, 1 request after 1 warm-up (the references take ~58 s)
set -u
source scripts/device-chain.sh
mkdir -p $R/b $R/c $R/t
bash scripts/h200.sh omnijev-4B $R/b synth > $R/b/chain-synth.log 2>&1; log "rc-b-synth $?"
wait_for_wheels
(env GPU_TESTS="tests/omnijev/test_omnijev_vocabulary.py" bash scripts/h200.sh omnijev-4B $R/t gpu-tests > $R/t/chain.log 2>&1; log "rc-t $?"; pack t) &
bash scripts/h200.sh omnijev-4B $R/b export > $R/b/chain-export.log 2>&1; log "rc-b-export $?"
wait
V=bf16/graphs/gdn16/mixers/attn16
env PRECISIONS=$V bash scripts/h200.sh omnijev-4B $R/b build,validate > $R/b/chain-validate.log 2>&1; log "rc-b-validate $?"; pack b
if passed $R/b/validate-omnijev-4B-GatedDeltaNet-bf16-graphs-gdn16-mixers-attn16.json; then
  env PRECISIONS=$V WORKLOADS=screenshot-1,screenshot-12 REQUESTS=5 PROFILE=screenshot-1 bash scripts/h200.sh omnijev-4B $R/b bench > $R/b/chain-bench.log 2>&1
  log "rc-b-bench $?"; pack b
  env PRECISIONS=$V WORKLOADS=screenshot-255 REQUESTS=1 WARMUP=1 PROFILE= bash scripts/h200.sh omnijev-4B $R/c bench > $R/c/chain-bench.log 2>&1
  log "rc-c-bench $?"; pack c
fi
log "chain done"
