#!/usr/bin/env bash
# Detached device chain, 2026-12-03 fourth session (issue 16, HEAD 220581a; step n's results are in
# benchmarks/h200-9B-attn16). Run with scripts/device.sh:
#   start CHAIN (carry .device/p1 and the chain), stage 2..5, poll "rc-b-bench|chain done", poll "chain done"
#  b  OmniJev-4B with the grid inputs kept (de12d5e): build and validate bf16/graphs/gdn16/mixers/attn16 with
#     --vision-cuda-graphs (vgraphs, profiled) and without, bench screenshot-1 and screenshot-12 against both
#     references (6 requests after 2 warm-ups)
#  t  the OmniJev engine's GPU tests (the vision CUDA graphs' capture and replay) beside the export
#  n  the 9B (synthesized beside b) with the 0.8B's and 4B's best options (gdn16, mixers, attn16): validate, and
#     where it passes, the router request against both references, profiled
set -u
source scripts/device-chain.sh
mkdir -p $R/b $R/n $R/t
bash scripts/h200.sh omnijev-4B $R/b synth > $R/b/chain-synth.log 2>&1; log "rc-b-synth $?"
(bash scripts/h200.sh 9B $R/n synth > $R/n/chain-synth.log 2>&1; log "rc-n-synth $?") &
synth9=$!
wait_for_wheels
(env GPU_TESTS="tests/omnijev/test_omnijev_engine.py" bash scripts/h200.sh omnijev-4B $R/t gpu-tests > $R/t/chain.log 2>&1; log "rc-t $?"; pack t) &
bash scripts/h200.sh omnijev-4B $R/b export > $R/b/chain-export.log 2>&1; log "rc-b-export $?"
V=bf16/graphs/gdn16/mixers/attn16/vgraphs,bf16/graphs/gdn16/mixers/attn16
env PRECISIONS=$V bash scripts/h200.sh omnijev-4B $R/b build,validate > $R/b/chain-validate.log 2>&1; log "rc-b-validate $?"; pack b
wait
env PRECISIONS=$V WORKLOADS=screenshot-1,screenshot-12 REQUESTS=6 PROFILE=screenshot-1 bash scripts/h200.sh omnijev-4B $R/b bench > $R/b/chain-bench.log 2>&1
log "rc-b-bench $?"; pack b
rm -rf /tmp/w/omnijev-4B /dev/shm/w
wait $synth9
V=bf16/graphs/gdn16/mixers/attn16
env PRECISIONS=$V bash scripts/h200.sh 9B $R/n export,build,validate > $R/n/chain-validate.log 2>&1; log "rc-n-validate $?"; pack n
if passed $R/n/validate-9B-GatedDeltaNet-bf16-graphs-gdn16-mixers-attn16.json; then
  env PRECISIONS=$V WORKLOADS=router REQUESTS=8 PROFILE=router bash scripts/h200.sh 9B $R/n bench > $R/n/chain-bench.log 2>&1
  log "rc-n-bench $?"; pack n
fi
log "chain done"
